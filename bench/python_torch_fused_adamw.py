#!/usr/bin/env python3
"""Issue 41's two Python figures, one process a rank (docs/python.md):

    PYTHONPATH=build/release/python mpirun -np 2 python3 bench/python_torch_fused_adamw.py

1. A PyTorch GPT training step (bench/tandem_gpt_model.py's GPT-2, f32) on the job's processes,
   each its rows of the batch: DistributedDataParallel(gloo) + torch.optim.AdamW against the same
   model with no DDP and tandem.torch.DistributedFusedAdamW. Printed: the median whole step, and
   the median of its optimizer-and-exchange part, taken as (backward + step) minus a backward with
   no exchange (DDP's no_sync) for DDP, whose exchange runs inside the backward, and as step() for
   the fused optimizer, whose exchange is the step.
2. The per-call cost of a compiled program run from Python: Bound.run (the adam schedule bound
   in place) at 16 elements and at 16 Mi elements (64 MiB of weights), median over many calls.
   The same program's C++ call is bench/adam_step.cc's to compare with (not run here).

Checks before timing: the first loss is near ln 256, and after the timed steps every rank holds
the same weights (both ways). Timings on a busy machine are not claims."""
import argparse
import math
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import tandem  # noqa: E402


def median_ms(samples):
    return 1e3 * statistics.median(samples)


def gpt_step(a, world, torch):
    from tandem_gpt_model import GPT

    import tandem.torch

    rank, ranks = world.rank, world.size
    port = np.zeros(1, np.float32)
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    world.broadcast(port, 0)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{int(port[0])}",
                                         rank=rank, world_size=ranks)
    rows = a.batch // ranks
    g = torch.Generator().manual_seed(5)
    data = [torch.randint(0, 256, (a.batch, a.seq + 1), generator=g) for _ in range(a.steps + 2)]

    def model():
        torch.manual_seed(0)
        return GPT(256, a.seq, a.layers, a.channels, a.heads, 0.0)

    def batch(i):
        b = data[i][rank * rows:(rank + 1) * rows]
        return b[:, :-1].contiguous(), b[:, 1:].contiguous()

    results = {}
    for name in ("ddp", "fused"):
        net = model()
        if name == "ddp":
            net = torch.nn.parallel.DistributedDataParallel(net)
            opt = torch.optim.AdamW(net.parameters(), lr=3e-4, weight_decay=0.0)
        else:
            opt = tandem.torch.DistributedFusedAdamW(net.parameters(), lr=3e-4, weight_decay=0.0, comm=world)
        steps, parts = [], []
        for i in range(a.steps + 2):
            x, y = batch(i)
            world.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = net(x, y)
            if i == 0 and abs(loss.item() - math.log(256)) > 0.5:
                raise AssertionError(f"{name}: first loss {loss.item()}, not near ln 256")
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            if i >= 2:  # two warm-up steps
                steps.append(t3 - t0)
                parts.append(t3 - t1 if name == "ddp" else t3 - t2)
        if name == "ddp":  # the backward alone, no exchange: subtracted from backward + step
            backward = []
            for i in range(a.steps):
                x, y = batch(i)
                with net.no_sync():
                    loss = net(x, y)
                    t0 = time.perf_counter()
                    loss.backward()
                    backward.append(time.perf_counter() - t0)
            parts = [p - statistics.median(backward) for p in parts]
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        other = flat.clone()
        world.broadcast(other, 0)
        if not torch.equal(flat, other):
            raise AssertionError(f"{name}: ranks hold different weights after training")
        results[name] = (median_ms(steps), median_ms(parts))
    if rank == 0:
        n = sum(p.numel() for p in model().parameters())
        print(f"GPT {a.layers} layers, C {a.channels}, T {a.seq}, batch {a.batch} on {ranks} processes, "
              f"{n / 1e6:.2f} M parameters, {torch.get_num_threads()} threads each:")
        for name, (step, part) in results.items():
            label = "DDP(gloo)+AdamW" if name == "ddp" else "DistributedFusedAdamW"
            print(f"  {label:24s} step {step:8.1f} ms   optimizer+exchange {part:8.1f} ms")
        print(f"  ratio ddp/fused: step {results['ddp'][0] / results['fused'][0]:.2f}x, "
              f"optimizer+exchange {results['ddp'][1] / results['fused'][1]:.2f}x")
    torch.distributed.destroy_process_group()


def call_overhead(a, world):
    compiled = tandem.compile(tandem.schedule(tandem.workloads.adam(tandem.F32), "fused(RS-C-AG)+slice(m,v)"))
    for n, calls in ((16, a.calls), (16 << 20, 10)):
        base, extra = divmod(n, world.size)
        mine = base + (1 if world.rank < extra else 0)
        arrays = {"g": np.zeros(n, np.float32), "w": np.zeros(n, np.float32),
                  "m": np.zeros(mine, np.float32), "v": np.zeros(mine, np.float32)}
        bound = compiled.bind(arrays, comm=world)
        scalars = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, step=1, grad_scale=0.5)
        times = []
        for _ in range(calls):
            world.barrier()
            t0 = time.perf_counter()
            bound.run(scalars)
            times.append(time.perf_counter() - t0)
        if world.rank == 0:
            print(f"Bound.run, adam fused(RS-C-AG)+slice(m,v), N = {n}: median {1e6 * statistics.median(times):.1f} us "
                  f"a call over {calls} calls (the run itself included)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--channels", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--calls", type=int, default=2000)
    a = p.parse_args()
    world = tandem.mpi_world()
    try:
        import torch
    except ImportError:
        torch = None
        if world.rank == 0:
            print("PyTorch is not installed (python3-torch): the GPT step is skipped")
    try:
        if torch is not None:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world.size))
            gpt_step(a, world, torch)
        call_overhead(a, world)
    except BaseException:
        import traceback

        traceback.print_exc()
        tandem.abort_mpi_job(1)


if __name__ == "__main__":
    main()
