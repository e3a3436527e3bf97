#!/usr/bin/env python3
"""Issue 41's two Python figures, one process a rank (docs/python.md):

    PYTHONPATH=build/release/python mpirun -np 2 python3 bench/python_torch_fused_adamw.py

1. A PyTorch GPT training step (bench/tandem_gpt_model.py's GPT-2, f32) on the job's processes,
   each its rows of the batch: DistributedDataParallel(gloo) + torch.optim.AdamW ("ddp"), the same
   DDP with tandem.torch.allreduce_hook, tandem's shared-memory collectives, + AdamW ("hook": the
   fused optimizer's transport, PyTorch's unfused update: the like-for-like pair), the same model
   with no DDP and tandem.torch.DistributedFusedAdamW ("fused"; its schedule the tuner's record
   when one exists, else its default; --schedule names one), and the same model's forward and
   backward alone ("local": no exchange, no update), run in turns of --block consecutive steps
   (the order rotating each round). --optimizer lamb: LAMB instead (a plain PyTorch LAMB, below,
   behind both DDPs; tandem.torch.DistributedFusedLAMB). Printed, as medians over the rounds of the
   slowest rank's time a step: the whole step of each, its phases, and the optimizer-and-exchange
   part: the whole step less the forward and backward alone (DDP's exchange runs inside its
   backward, the fused one in step()).
2. The per-call cost of a compiled program run from Python: Bound.run (the adam schedule bound
   in place on arrays from world.empty) at 16 elements and at 16 Mi elements (64 MiB of weights),
   median over many calls; docs/benchmarks.md compares it with the same call from C++.

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


def torch_lamb(torch):
    """LAMB in plain PyTorch, as a user without a fused one would write it (PyTorch ships none):
    DistributedFusedLAMB's formula (bias-corrected moments, weight decay inside the direction, the
    trust ratio ||w|| / ||r|| per tensor), one tensor after the other, in place where it can."""

    class LAMB(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                b1, b2 = group["betas"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    st = self.state[p]
                    if not st:
                        st["step"], st["m"], st["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                    st["step"] += 1
                    m, v, g = st["m"], st["v"], p.grad
                    m.mul_(b1).add_(g, alpha=1 - b1)
                    v.mul_(b2).addcmul_(g, g, value=1 - b2)
                    denom = (v / (1 - b2 ** st["step"])).sqrt_().add_(group["eps"])
                    r = (m / (1 - b1 ** st["step"])).div_(denom).add_(p, alpha=group["weight_decay"])
                    w_norm, r_norm = float(p.norm()), float(r.norm())
                    trust = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
                    p.sub_(r, alpha=group["lr"] * trust)

    return LAMB


class FlatBucket:
    """One DDP bucket holding every gradient: what allreduce_hook is handed, for timing it alone."""

    def __init__(self, buffer):
        self._buffer = buffer

    def buffer(self):
        return self._buffer


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
    data = [torch.randint(0, 256, (a.batch, a.seq + 1), generator=g)
            for _ in range((max(1, a.steps // a.block) + 1) * a.block)]

    def model():
        torch.manual_seed(0)
        return GPT(256, a.seq, a.layers, a.channels, a.heads, 0.0)

    def batch(i):
        b = data[i][rank * rows:(rank + 1) * rows]
        return b[:, :-1].contiguous(), b[:, 1:].contiguous()

    # Three set up, then run in turns, a block of consecutive steps each (no barrier inside a
    # block: a step's time is what a training loop sees, the ranks kept together by the exchange
    # alone), so that a drift in the machine's load hits all alike; the turns' order rotates each
    # round, as a variant's place in it changed its times on a busy machine. "local" is the same
    # model's forward and backward with no exchange and no optimizer: what either step would cost
    # with nothing to exchange or update.
    lamb = a.optimizer == "lamb"
    unfused = torch_lamb(torch) if lamb else torch.optim.AdamW
    fused_class = tandem.torch.DistributedFusedLAMB if lamb else tandem.torch.DistributedFusedAdamW
    runs = {}
    for name in a.order.split(","):
        net = model()
        if name in ("ddp", "hook"):
            net = torch.nn.parallel.DistributedDataParallel(net)
            if name == "hook":
                net.register_comm_hook(world, tandem.torch.allreduce_hook)
            opt = unfused(net.parameters(), lr=3e-4, weight_decay=0.0)
        elif name == "fused":
            opt = fused_class(net.parameters(), lr=3e-4, weight_decay=0.0, comm=world,
                              schedule=a.schedule)
        elif name == "local":
            opt = torch.optim.SGD(net.parameters(), lr=0.0)  # only its zero_grad is called
        else:
            raise SystemExit(f"--order: unknown variant {name!r} (ddp, hook, fused, local)")
        runs[name] = (net, opt, {"forward": [], "backward": [], "step": [], "whole": []})
    names = list(runs)
    if "local" not in runs or "fused" not in runs:
        raise SystemExit("--order must name fused and local (the ratios are against them)")
    rounds = max(1, a.steps // a.block)
    for r in range(rounds + 1):  # the first round warms up
        for name in names[r % len(names):] + names[:r % len(names)]:
            net, opt, times = runs[name]
            phases = {"forward": 0.0, "backward": 0.0, "step": 0.0}
            world.barrier()
            start = time.perf_counter()
            for i in range(a.block):
                x, y = batch(r * a.block + i)
                t0 = time.perf_counter()
                opt.zero_grad()
                loss = net(x, y)
                if r == 0 and i == 0 and abs(loss.item() - math.log(256)) > 0.5:
                    raise AssertionError(f"{name}: first loss {loss.item()}, not near ln 256")
                t1 = time.perf_counter()
                loss.backward()
                t2 = time.perf_counter()
                if name != "local":
                    opt.step()
                t3 = time.perf_counter()
                phases["forward"] += t1 - t0
                phases["backward"] += t2 - t1
                phases["step"] += t3 - t2
            whole = time.perf_counter() - start
            if r > 0:
                times["whole"].append(whole / a.block)
                for k, v in phases.items():
                    times[k].append(v / a.block)
    # Each round's times as the slowest rank's (a synchronous job goes at its slowest rank's pace;
    # "local", with no exchange, would otherwise show one rank's time alone).
    for name, (_, _, times) in runs.items():
        for k, v in times.items():
            both = np.array(v, np.float32)
            world.all_reduce(both, op=tandem.Max)
            times[k] = [float(t) for t in both]
    local = median_ms(runs["local"][2]["whole"])
    local_phases = {k: median_ms(v) for k, v in runs["local"][2].items()}
    results = {}
    for name in [n for n in names if n != "local"]:
        net, opt, times = runs[name]
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        other = flat.clone()
        world.broadcast(other, 0)
        if not torch.equal(flat, other):
            raise AssertionError(f"{name}: ranks hold different weights after training")
        med = {k: median_ms(v) for k, v in times.items()}
        # The optimizer and the exchange: the step less the same forward and backward with neither
        # (DDP's exchange runs inside its backward, the fused one's in step()).
        results[name] = (med["whole"], med["whole"] - local, med)
    # The optimizer and the exchange alone, each call started together (a barrier) and timed as
    # the slowest rank's, in turns: DDP's exchange as one all-reduce of every gradient (DDP's
    # buckets coalesced: gloo's, or allreduce_hook on one bucket) and the average, then the
    # unfused optimizer's step; the fused optimizer's step(), its gradients zeroed first (outside
    # the time).
    alone_names = [n for n in names if n != "local"]
    grads = {n: torch.cat([p.grad.reshape(-1) for p in runs[n][0].parameters()])
             for n in alone_names if n != "fused"}
    alone = {n: [] for n in alone_names}
    for i in range(a.parts + 1):
        for name in alone_names[i % len(alone_names):] + alone_names[:i % len(alone_names)]:
            opt = runs[name][1]
            if name == "fused":
                opt.zero_grad()
            world.barrier()
            t0 = time.perf_counter()
            if name == "ddp":
                torch.distributed.all_reduce(grads[name])
                grads[name].div_(ranks)
            elif name == "hook":
                tandem.torch.allreduce_hook(world, FlatBucket(grads[name])).wait()
            opt.step()
            if i > 0:
                alone[name].append(time.perf_counter() - t0)
    for name, v in alone.items():
        both = np.array(v, np.float32)
        world.all_reduce(both, op=tandem.Max)
        alone[name] = median_ms([float(t) for t in both])
    if rank == 0:
        n = sum(p.numel() for p in model().parameters())
        opt_name = "LAMB" if lamb else "AdamW"
        labels = {"ddp": f"DDP(gloo)+{opt_name}", "hook": f"DDP(tandem hook)+{opt_name}",
                  "fused": fused_class.__name__}
        print(f"GPT {a.layers} layers, C {a.channels}, T {a.seq}, batch {a.batch} on {ranks} processes, "
              f"{n / 1e6:.2f} M parameters, {torch.get_num_threads()} threads each, {opt_name}:")
        for name, (step, part, med) in results.items():
            print(f"  {labels[name]:24s} step {step:8.1f} ms   optimizer+exchange {part:8.1f} ms   (forward "
                  f"{med['forward']:.1f}, backward {med['backward']:.1f}, step() {med['step']:.1f})")
        print(f"  {'no exchange, no update':24s} step {local:8.1f} ms   (forward "
              f"{local_phases['forward']:.1f}, backward {local_phases['backward']:.1f})")
        fused = runs["fused"][1]
        print(f"  fused schedule: {fused.schedule}"
              + (f" (the tuner's, chunks of {fused.chunk_bytes} bytes)" if fused.tuning_record else ""))
        print(f"  optimizer+exchange alone (started together, {a.parts} calls in turns): "
              + ", ".join(f"{labels[k]} {v:.2f} ms" for k, v in alone.items()))
        for name in [k for k in results if k != "fused"]:
            what = "like for like in transport" if name == "hook" else "the issue's baseline"
            print(f"  ratio {name}/fused ({what}): whole step "
                  f"{results[name][0] / results['fused'][0]:.2f}x, optimizer+exchange alone "
                  f"{alone[name] / alone['fused']:.2f}x")
    torch.distributed.destroy_process_group()


def call_overhead(a, world):
    compiled = tandem.compile(tandem.schedule(tandem.workloads.adam(tandem.F32), "fused(RS-C-AG)+slice(m,v)"))
    for n, calls in ((16, a.calls), (16 << 20, 10)):
        base, extra = divmod(n, world.size)
        mine = base + (1 if world.rank < extra else 0)
        # In the shared arena, as a training script's buffers are (DistributedFusedAdamW's).
        arrays = {k: world.empty(size) for k, size in (("g", n), ("w", n), ("m", mine), ("v", mine))}
        for a_ in arrays.values():
            a_[:] = 0
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
    p.add_argument("--steps", type=int, default=30, help="timed steps of each (in blocks)")
    p.add_argument("--parts", type=int, default=20, help="calls of the optimizer+exchange alone")
    p.add_argument("--block", type=int, default=5, help="consecutive steps a turn")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--schedule", default=None,
                   help="the fused optimizer's recipe (default: the tuner's record, else its default)")
    p.add_argument("--order", default="ddp,hook,fused,local",
                   help="the turns' first order (it rotates each round): ddp (gloo), hook (DDP with "
                   "tandem.torch.allreduce_hook), fused and local (the forward and backward alone); "
                   "fused and local are needed")
    p.add_argument("--optimizer", choices=("adamw", "lamb"), default="adamw",
                   help="AdamW (torch.optim.AdamW, DistributedFusedAdamW) or LAMB (a PyTorch "
                   "LAMB, DistributedFusedLAMB)")
    p.add_argument("--threads", type=int, default=0, help="torch threads a process (0: cores / processes)")
    p.add_argument("--no-calls", action="store_true", help="skip the Bound.run per-call figures")
    p.add_argument("--only-calls", action="store_true", help="the Bound.run per-call figures alone")
    a = p.parse_args()
    world = tandem.mpi_world()
    try:
        import torch
    except ImportError:
        torch = None
        if world.rank == 0:
            print("PyTorch is not installed (python3-torch): the GPT step is skipped")
    try:
        if torch is not None and not a.only_calls:
            torch.set_num_threads(a.threads or max(1, (os.cpu_count() or 1) // world.size))
            gpt_step(a, world, torch)
        if not a.no_calls:
            call_overhead(a, world)
    except BaseException:
        import traceback

        traceback.print_exc()
        tandem.abort_mpi_job(1)


if __name__ == "__main__":
    main()
