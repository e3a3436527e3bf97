#!/usr/bin/env python3
"""PyTorch's side of the attention comparison (docs/benchmarks.md, "Attention: fused and blocked").

Causal attention forward + backward on PyTorch 1.13's unfused path (bench/tandem_gpt_model.py's
causal_attention: the whole T x T square, its upper triangle masked; PyTorch has no fused CPU
attention before 2.1), at the shapes bench_attention times tandem's kernels: batch 1, H heads of
64, f32, no dropout. Timed as bench_attention times: forward, then backward into q, k and v;
a warm-up, then the median of --reps. Run it with OMP_WAIT_POLICY=PASSIVE (the fair setting for
PyTorch beside another process) and the same --threads as bench_attention.

Installs nothing: with Debian's python3-torch absent it says so and exits 0.
Usage: pytorch_attention.py [--seq 1024,2048] [--heads 25] [--head-size 64] [--threads 2] [--reps 5]
"""
import argparse
import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("pytorch_attention: torch is not installed (Debian: apt-get install python3-torch); skipped")
    sys.exit(0)

from tandem_gpt_model import causal_attention  # beside this file


def time_once(t, heads, hs):
    shape = (1, heads, t, hs)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    dy = torch.randn(shape)
    start = time.perf_counter()
    y = causal_attention(q, k, v, lambda att: att)
    mid = time.perf_counter()
    y.backward(dy)
    end = time.perf_counter()
    return (mid - start) * 1e3, (end - mid) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", default="1024,2048")
    ap.add_argument("--heads", type=int, default=25)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    print(f"PyTorch {torch.__version__}, {a.threads} threads, unfused causal attention, batch 1, "
          f"{a.heads} heads of {a.head_size}, f32")
    for t in (int(s) for s in a.seq.split(",")):
        time_once(t, a.heads, a.head_size)  # warm-up
        runs = [time_once(t, a.heads, a.head_size) for _ in range(a.reps)]
        fwd = statistics.median(r[0] for r in runs)
        bwd = statistics.median(r[1] for r in runs)
        total = statistics.median(r[0] + r[1] for r in runs)
        print(f"T {t}: pytorch unfused  fwd {fwd:.1f} ms  bwd {bwd:.1f} ms  total {total:.1f} ms")


if __name__ == "__main__":
    main()
