#!/usr/bin/env python3
"""PyTorch's side of the single-rank GPT step comparison (docs/benchmarks.md).

The same GPT-2 model as tandem's nn/ (bench/tandem_gpt_model.py: pre-LayerNorm blocks, fused
QKV, causal attention, tanh-GELU MLP of 4x width, tied LM head, byte vocabulary, GPT-2's
initialisation), the same sizes and thread count, timed the way bench_gpt_step times tandem:
zero the gradients, forward, loss, backward.
Prints the median step time and one `ratio`-style line a script can read.

Installs nothing: with Debian's python3-torch absent it says so and exits 0.
Usage: pytorch_gpt_step.py [--threads 2] [--steps 10] [--layers 4] [--d-model 256] [--heads 4]
                           [--seq-len 128] [--batch 8] [--dropout 0.0]
"""
import argparse
import math
import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("pytorch_gpt_step: torch is not installed (Debian: apt-get install python3-torch); skipped")
    sys.exit(0)

from tandem_gpt_model import GPT  # beside this file


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dropout", type=float, default=0.0)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = GPT(256, a.seq_len, a.layers, a.d_model, a.heads, a.dropout).train()
    n = a.batch * a.seq_len
    tokens = torch.tensor([(i * 7 + 3) % 256 for i in range(n)]).view(a.batch, a.seq_len)
    targets = torch.tensor([(i * 7 + 10) % 256 for i in range(n)]).view(a.batch, a.seq_len)

    times = []
    first = None
    for step in range(-1, a.steps):  # step -1 warms up
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=False)
        loss = model(tokens, targets)
        loss.backward()
        t1 = time.perf_counter()
        if step >= 0:
            times.append((t1 - t0) * 1e3)
        else:
            first = loss.item()
    # The check before the timing means anything: a loss near ln 256 at initialisation.
    if not abs(first - math.log(256)) < 0.5:
        print(f"pytorch_gpt_step: CHECK FAILED, first loss {first:.3f} is not near ln 256 = 5.545")
        sys.exit(1)
    med = statistics.median(times)
    print(f"PyTorch {torch.__version__} GPT step ({a.layers} layers, d {a.d_model}, {a.heads} heads, "
          f"T {a.seq_len}, B {a.batch}, dropout {a.dropout}, {torch.get_num_threads()} threads): "
          f"median {med:.1f} ms (min {min(times):.1f}, max {max(times):.1f}) over {a.steps} steps")
    print(f"pytorch_step_ms {med:.2f}")


if __name__ == "__main__":
    main()
