#!/usr/bin/env python3
"""PyTorch's side of the end-to-end training races against `tandem train` (docs/benchmarks.md).

The same GPT as tandem's (bench/tandem_gpt_model.py: GPT-2 blocks, tied head, byte vocabulary,
GPT-2's initialisation as nn::gpt_init), or with --arch llama the same Llama (RMSNorm, rotary
positions, SwiGLU, grouped-query attention, tied head), trained the way a PyTorch CPU user trains it on one
machine: torch.nn.parallel.DistributedDataParallel over the gloo backend, one process per rank
(spawned here with torch.multiprocessing, or started by `torchrun --standalone --nproc_per_node
2`), torch.optim.AdamW with PyTorch's defaults except lr, betas, eps and weight decay, which are
tandem's (--lr 0.003, betas (0.9, 0.95), eps 1e-8, weight decay 0), and tandem's learning-rate
schedule (linear warm-up over --lr-warmup steps, then cosine decay to --min-lr-ratio x lr over the
whole run). With --nproc 1 it is one process and no DDP at all (no process group, no wrapper):
what a PyTorch user runs on one machine. Dropout 0; the global batch --batch is split evenly over
the processes; each process uses --threads threads: torch.set_num_threads for PyTorch's own loops
and OPENBLAS_NUM_THREADS for its GEMMs (Debian's torch calls OpenBLAS, which
torch.set_num_threads does not reach), with OMP_WAIT_POLICY=PASSIVE unless the environment sets
it (PyTorch's OpenMP helpers otherwise spin and take the cores from the other process; the line
printed says which policy ran).

Precision: --precision fp32 (the default) trains in f32; --precision bf16 runs the forward and
the loss under torch.autocast('cpu', dtype=torch.bfloat16), as a PyTorch CPU user writes it: the
matmuls on bf16 operands (autocast's CPU list), the rest as autocast decides, the backward
outside the context, the master weights and AdamW in f32. Before training, rank 0 checks that
autocast's matmuls really run in bf16 on this CPU (the result's dtype, and a 1024^3 matmul timed
in bf16 against f32) and prints one line saying so.

Data: `tandem train` without --data trains on its built-in synthetic grammar (src/data/data.cc),
which this script does not reproduce; it samples random windows of --seq-len + 1 bytes from a
corpus of random bytes instead (or from --data FILE, bytes as tokens, as `tandem train --data`).
Tokens per second do not depend on the token values: same shapes, same work.

A step is what tandem's step is: zero the gradients, sample the batch, forward, loss, backward
(DDP all-reduces the gradients during it), AdamW step, learning-rate update. The first
--warmup-steps steps are not timed; then --steps steps are, each on rank 0's clock (tandem times
its lead rank the same way). Checks before the figures mean anything: the first loss is near
ln 256, and after the run every rank holds the same weights.
Prints the median step time and tokens/s (global tokens per step / median step time):
  median ddp_step_ms X
  tokens_per_s ddp X

Installs nothing: with torch absent (Debian: apt-get install python3-torch) it says so and
exits 0.
The keys stay `ddp` with --nproc 1 too, so that the race scripts read every run alike.
Usage: pytorch_ddp_gpt.py [--nproc 2] [--threads 1] [--precision fp32] [--warmup-steps 3]
                          [--steps 10] [--layers 4] [--d-model 256] [--heads 4] [--seq-len 128]
                          [--arch gpt2|llama] [--kv-heads N] [--ffn N]
                          [--batch 16] [--lr 0.003] [--lr-warmup 30] [--min-lr-ratio 0.1]
                          [--seed 1] [--data FILE]
"""
import argparse
import math
import os
import socket
import statistics
import sys
import time


def threads_flag():
    """--threads, read before torch loads: OpenMP and OpenBLAS read their settings then."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_known_args()[0].threads


# Set before torch loads OpenMP and OpenBLAS (spawned ranks inherit the environment). Debian's
# torch calls BLAS through OpenBLAS's pthread build, which torch.set_num_threads does not reach:
# without OPENBLAS_NUM_THREADS each process's GEMMs would use every core.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ["OPENBLAS_NUM_THREADS"] = str(max(1, threads_flag()))

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError:
    print("pytorch_ddp_gpt: torch is not installed (Debian: apt-get install python3-torch); "
          "skipped")
    sys.exit(0)

from tandem_gpt_model import GPT, Llama  # beside this file

VOCAB = 256  # bytes, as tandem's


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2,
                    help="processes when not under torchrun (1: one process, no DDP)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: the forward and the loss under torch.autocast('cpu', bfloat16)")
    ap.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2",
                    help="llama: tandem's Llama block (bench/tandem_gpt_model.py's Llama)")
    ap.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0: --heads)")
    ap.add_argument("--ffn", type=int, default=0, help="llama: the SwiGLU width (0: 4 x d_model)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step, all ranks together")
    ap.add_argument("--lr", type=float, default=0.003, help="peak learning rate (tandem's default)")
    ap.add_argument("--lr-warmup", type=int, default=30, help="as tandem train --warmup")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1, help="as tandem's")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", help="train on this file's bytes instead of random bytes")
    a = ap.parse_args(argv)
    for name in ("nproc", "threads", "steps", "layers", "d_model", "heads", "seq_len", "batch"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.warmup_steps < 0:
        ap.error("--warmup-steps must be at least 0")
    if a.d_model % a.heads != 0:
        ap.error(f"--heads {a.heads} must divide --d-model {a.d_model}")
    return a


def learning_rate(a, step, total):
    """tandem's learning_rate (src/train/train_config.cc) for a run of `total` steps."""
    if a.lr_warmup > 0 and step < a.lr_warmup:
        return a.lr * (step + 1) / a.lr_warmup
    min_lr = a.lr * a.min_lr_ratio
    span = total - a.lr_warmup
    if span <= 1:
        return a.lr
    t = min(1.0, (step - a.lr_warmup) / (span - 1))
    return min_lr + 0.5 * (a.lr - min_lr) * (1.0 + math.cos(math.pi * t))


def load_corpus(a):
    if a.data:
        with open(a.data, "rb") as f:
            data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    else:
        g = torch.Generator().manual_seed(a.seed)
        data = torch.randint(0, VOCAB, (1 << 20,), generator=g)
    if data.numel() < a.seq_len + 1:
        raise SystemExit(f"pytorch_ddp_gpt: the corpus has {data.numel()} tokens, fewer than "
                         f"--seq-len + 1 = {a.seq_len + 1}")
    return data


def autocast(a):
    """The context the forward and the loss run in: autocast to bf16, or nothing for fp32."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16")


def median_ms(fn, reps=7):
    fn()  # warm-up: oneDNN creates its primitive, OpenMP its threads
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def autocast_line(a):
    """Whether autocast's matmuls run in bf16 here: the dtype they return, and a 1024^3 matmul
    on bf16 operands timed against f32 on this process's threads (bf16 at about f32's rate or
    slower means converted or emulated, not native bf16 arithmetic)."""
    n = 1024
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    with autocast(a):
        dtypes = {torch.mm(x, w).dtype, (x @ w).dtype, F.linear(x, w).dtype}
    xb, wb = x.bfloat16(), w.bfloat16()
    f32_ms = median_ms(lambda: torch.mm(x, w))
    bf16_ms = median_ms(lambda: torch.mm(xb, wb))
    gflops = lambda ms: 2.0 * n ** 3 / (ms * 1e6)
    verdict = ("matmuls run in bf16, faster than f32" if dtypes == {torch.bfloat16}
               and f32_ms / bf16_ms >= 1.2 else "matmuls NOT faster in bf16 than f32 here")
    return (f"autocast bf16 check: mm, @ and F.linear under autocast return "
            f"{', '.join(sorted(str(d) for d in dtypes))}; oneDNN in this torch: "
            f"{torch.backends.mkldnn.is_available()}; "
            f"{n}^3 matmul on {torch.get_num_threads()} threads: f32 {gflops(f32_ms):.0f} "
            f"GFLOP/s, bf16 {gflops(bf16_ms):.0f} GFLOP/s ({f32_ms / bf16_ms:.2f}x): {verdict}")


def worker(rank, world, a):
    torch.set_num_threads(a.threads)
    if world == 1:  # one process: no process group, no DDP
        run(rank, world, a)
        return
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        run(rank, world, a)
    finally:
        dist.destroy_process_group()


def run(rank, world, a):
    lead = rank == 0
    check = autocast_line(a) if lead and a.precision == "bf16" else None
    if world > 1:
        dist.barrier()  # the other ranks wait here, idle, while rank 0 times its check
    local_batch = a.batch // world
    torch.manual_seed(a.seed)  # the same weights on every rank (DDP broadcasts rank 0's too)
    if a.arch == "llama":
        model = Llama(VOCAB, a.layers, a.d_model, a.heads, a.kv_heads or a.heads,
                      a.ffn or 4 * a.d_model).train()
    else:
        model = GPT(VOCAB, a.seq_len, a.layers, a.d_model, a.heads, 0.0).train()
    ddp = DDP(model) if world > 1 else model
    opt = torch.optim.AdamW(ddp.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.0)
    total = a.warmup_steps + a.steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: learning_rate(a, s, total) / a.lr)

    corpus = load_corpus(a)
    sampler = torch.Generator().manual_seed(a.seed * 1000003 + rank)  # each rank its own windows
    window = torch.arange(a.seq_len + 1)

    times, first_loss = [], None
    for step in range(total):
        t0 = time.perf_counter()
        opt.zero_grad()
        starts = torch.randint(0, corpus.numel() - a.seq_len, (local_batch, 1), generator=sampler)
        seqs = corpus[starts + window]  # (B/world, T + 1)
        with autocast(a):  # the forward and the loss; the backward outside, as autocast's docs say
            loss = ddp(seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous())
        loss.backward()
        opt.step()
        sched.step()
        value = loss.item()
        t1 = time.perf_counter()
        if step == 0:
            first_loss = value
        if step >= a.warmup_steps:
            times.append((t1 - t0) * 1e3)

    # The checks, after the run and on every rank together (a rank that stopped alone would leave
    # the other waiting in a collective): a loss near ln 256 at initialisation, a finite last
    # loss, and the ranks' weights still identical.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    if world > 1:
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    spread = (hi - lo).abs().max().item()
    failures = []
    if not abs(first_loss - math.log(VOCAB)) < 0.5:
        failures.append(f"rank {rank}'s first loss {first_loss:.3f} is not near ln 256 = 5.545")
    if not math.isfinite(value):
        failures.append(f"rank {rank}'s last loss is {value}")
    if spread != 0.0:
        failures.append(f"the ranks' weights differ by up to {spread:g}")
    if failures:
        raise SystemExit("pytorch_ddp_gpt: CHECK FAILED, " + "; ".join(failures))
    if not lead:
        return

    med = statistics.median(times)
    tokens = a.batch * a.seq_len
    params = sum(p.numel() for p in model.parameters())
    how = (f"DDP (gloo), {world} processes" if world > 1 else "one process (no DDP)")
    precision = ("bf16 (autocast bf16, f32 master weights)" if a.precision == "bf16"
                 else "fp32")
    if check:
        print(check)
    print(f"PyTorch {torch.__version__} {how} x {torch.get_num_threads()} "
          f"threads (OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}), "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, precision {precision}: "
          f"{'Llama' if a.arch == 'llama' else 'GPT'} {a.layers} layers, "
          f"d {a.d_model}, {a.heads} heads, {params / 1e6:.2f}M parameters, T {a.seq_len}, batch "
          f"{a.batch} ({local_batch} per rank), AdamW; median {med:.1f} ms (min {min(times):.1f}, "
          f"max {max(times):.1f}) over {a.steps} steps after {a.warmup_steps} warm-up; "
          f"loss {first_loss:.4f} -> {value:.4f}")
    print(f"median ddp_step_ms {med:.2f}")
    print(f"tokens_per_s ddp {tokens / (med / 1e3):.0f}")
    sys.stdout.flush()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    a = parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: one rank each
        world = int(os.environ["WORLD_SIZE"])
        if a.batch % world != 0:
            raise SystemExit(f"pytorch_ddp_gpt: --batch {a.batch} must divide by {world} processes")
        worker(int(os.environ["RANK"]), world, a)
        return
    if a.batch % a.nproc != 0:
        raise SystemExit(f"pytorch_ddp_gpt: --batch {a.batch} must divide by --nproc {a.nproc}")
    if a.nproc == 1:  # one process, this one
        worker(0, 1, a)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    try:
        mp.spawn(worker, args=(a.nproc, a), nprocs=a.nproc, join=True)
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:  # a rank failed
        print(f"pytorch_ddp_gpt: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
