"""Under `mpirun -np 2`: a small PyTorch MLP trained with tandem.torch.DistributedFusedAdamW (no
DDP) and with DDP(gloo) + torch.optim.AdamW behind tandem.torch.allreduce_hook ends with the
weights of PyTorch's own DDP(gloo) + torch.optim.AdamW, each rank on its own half of every batch.
Tolerance: 2e-6 absolute after 6 steps at lr 1e-2 moving the weights by about 6e-2 (measured:
1.5e-7; the gradients' average and AdamW's arithmetic in another order: float32 rounding, amplified
where Adam divides by a small second moment); 1e-6 for the hook (measured: 0, a sum of 2 being
the same in either order). Skipped, saying so, when
python3-torch is not installed."""
import socket

import numpy as np

from _mpi_checks import run_with_torch

STEPS, BATCH = 6, 16
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.999), 1e-8, 0.05


def make_model(torch):
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                               torch.nn.GELU(), torch.nn.Linear(32, 4))


def batches(torch, rank, ranks):
    """The same global batches on every rank; each rank takes its rows."""
    g = torch.Generator().manual_seed(99)
    rows = BATCH // ranks
    for _ in range(STEPS):
        x, y = torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 4, generator=g)
        yield x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]


def train(torch, model, optimizer, rank, ranks):
    for x, y in batches(torch, rank, ranks):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def ddp(torch, hook_comm=None):
    model = torch.nn.parallel.DistributedDataParallel(make_model(torch))
    if hook_comm is not None:
        import tandem.torch

        model.register_comm_hook(hook_comm, tandem.torch.allreduce_hook)
    return model, torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)


def check(world, torch):
    import tandem.torch

    rank, ranks = world.rank, world.size
    # gloo's rendezvous: rank 0's free port, sent to the others with tandem's broadcast.
    port = np.zeros(1, np.float32)
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    world.broadcast(port, 0)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{int(port[0])}",
                                         rank=rank, world_size=ranks)
    torch.set_num_threads(1)  # two processes on a loaded machine: no thread pool fights

    model, opt = ddp(torch)
    want = train(torch, model, opt, rank, ranks)
    model, opt = ddp(torch, hook_comm=world)
    hooked = train(torch, model, opt, rank, ranks)
    model = make_model(torch)
    opt = tandem.torch.DistributedFusedAdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                             weight_decay=WD, comm=world)
    fused = train(torch, model, opt, rank, ranks)

    start = [p.detach() for p in make_model(torch).parameters()]
    moved = max(float((a - b).abs().max()) for a, b in zip(want, start))
    assert moved > 1e-2, f"training moved the weights by {moved} only: the test would prove nothing"
    for name, got, tol in (("allreduce_hook", hooked, 1e-6), ("DistributedFusedAdamW", fused, 2e-6)):
        diff = max(float((a - b).abs().max()) for a, b in zip(got, want))
        print(f"rank {rank}: {name}: max |w - w_ddp| = {diff:.3g} (tolerance {tol:g}; the weights "
              f"moved {moved:.3g})")
        assert diff <= tol, f"{name}: weights differ from DDP + AdamW's by {diff} > {tol}"
    torch.distributed.destroy_process_group()


def main():
    run_with_torch(check, "torch_training: {size} processes match DDP(gloo) + AdamW")


if __name__ == "__main__":
    main()
