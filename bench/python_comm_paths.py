#!/usr/bin/env python3
"""Where the time of DistributedFusedAdamW's step goes, one process a rank (docs/python.md):

    PYTHONPATH=build/release/python mpirun -np 2 python3 bench/python_comm_paths.py [N ...]

For each size N (float32 elements), the median per call of:
- world.all_reduce on a NumPy array from the heap, and on one from world.empty (the shared arena,
  which the Direct algorithms need: a heap buffer takes the ring);
- the adam program scheduled fused(RS-C-AG)+slice(m,v), bound (Compiled.bind) with its gradient
  and weights on the heap, then in the arena: the optimizer's whole step;
- the same schedule on one in-process rank (no exchange): the update loop alone;
- torch.optim.AdamW's step on one flat tensor of N (foreach), no exchange, when PyTorch is here.
Checks first: the arena's bound run and the heap's leave the same weights. Timings on a busy
machine are not claims."""
import statistics
import sys
import time

import numpy as np

import tandem

SCHEDULE = "fused(RS-C-AG)+slice(m,v)"
SCALARS = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, step=1, grad_scale=0.5)


def timed(world, fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        world.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def part(n, ranks, rank):
    base, extra = divmod(n, ranks)
    return base + (1 if rank < extra else 0)


def main():
    world = tandem.mpi_world()
    sizes = [int(a) for a in sys.argv[1:]] or [1 << 16, 440_000, 4 << 20, 16 << 20]
    compiled = tandem.compile(tandem.schedule(tandem.workloads.adam(tandem.F32), SCHEDULE))
    rng = np.random.default_rng(world.rank)
    rows = []
    for n in sizes:
        reps = max(5, min(200, (64 << 20) // max(1, 4 * n)))
        row = {"N": n}
        grad = rng.standard_normal(n, dtype=np.float32)
        weights = np.linspace(-1, 1, n, dtype=np.float32)
        finals = {}
        for where in ("heap", "arena"):
            alloc = (lambda k: np.zeros(k, np.float32)) if where == "heap" else (lambda k: world.empty(k))
            buf = alloc(n)
            buf[:] = 1
            row[f"all_reduce {where}"] = timed(world, lambda: world.all_reduce(buf), reps)
            g, w = alloc(n), alloc(n)
            mine = part(n, world.size, world.rank)
            m, v = np.zeros(mine, np.float32), np.zeros(mine, np.float32)
            w[:] = weights
            g[:] = grad
            bound = compiled.bind({"g": g, "w": w, "m": m, "v": v}, comm=world)
            bound.run(SCALARS)
            finals[where] = w.copy()
            row[f"bound {where}"] = timed(world, lambda: bound.run(SCALARS), reps)
            del bound
        if not np.array_equal(finals["heap"], finals["arena"]):
            raise AssertionError(f"N={n}: the arena's run and the heap's differ")
        one = {"g": np.ones(n, np.float32), "w": weights.copy(), "m": np.zeros(n, np.float32),
               "v": np.zeros(n, np.float32)}
        s1 = dict(SCALARS, grad_scale=1.0)
        row["update, 1 rank"] = timed(world, lambda: compiled.run(one, s1, ranks=1, in_place=True), reps)
        try:
            import torch

            p = torch.nn.Parameter(torch.zeros(n))
            p.grad = torch.ones(n)
            opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.0)
            row["torch AdamW, 1 rank"] = timed(world, opt.step, reps)
        except ImportError:
            pass
        rows.append(row)
    if world.rank == 0:
        keys = list(rows[0])
        print(f"{world.size} processes; median ms a call")
        print(" | ".join(f"{k:>18s}" for k in keys))
        for r in rows:
            print(" | ".join(f"{r[k]:>18d}" if k == "N" else f"{r.get(k, float('nan')):>18.3f}" for k in keys))


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        import traceback

        traceback.print_exc()
        tandem.abort_mpi_job(1)
