"""Under `mpirun -np 2`: tandem.torch.DistributedFusedLAMB, each rank on its own half of every batch,
ends with the weights of the plain-PyTorch reference LAMB (tests/python/lamb_reference.py) stepped
with the average of the two halves' gradients; and for both fused optimizers, 3 steps, then
state_dict() (each rank's own, through torch.save), a new model and optimizer, load_state_dict()
and 3 more steps give bitwise the weights of 6 uninterrupted steps. Tolerance for LAMB: 2e-7
absolute after 6 steps at lr 1e-2 moving the weights by 2.9e-2 (measured: 1.5e-8, half an ulp of
the largest weight; the norms' sums of squares, per rank and then across the ranks, in another
order than torch's). Skipped, saying so, when python3-torch is not installed."""
import io
import os
import sys

from _mpi_checks import run_with_torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from lamb_reference import ReferenceLAMB  # noqa: E402

STEPS, BATCH = 6, 16
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.999), 1e-6, 0.05


def make_model(torch):
    torch.manual_seed(1234)
    # Uneven tensor sizes (37 x 9 = 333 elements in the first) so that a slice boundary cuts a
    # tensor: its norms then add both ranks' parts.
    return torch.nn.Sequential(torch.nn.Linear(9, 37), torch.nn.GELU(), torch.nn.Linear(37, 5),
                               torch.nn.GELU(), torch.nn.Linear(5, 4))


def batch(torch, step):
    """The global batch of `step`, the same on every rank."""
    g = torch.Generator().manual_seed(99 + step)
    return torch.randn(BATCH, 9, generator=g), torch.randn(BATCH, 4, generator=g)


def rows(x, rank, ranks):
    n = BATCH // ranks
    return x[rank * n:(rank + 1) * n]


def train(torch, model, optimizer, rank, ranks, first, last):
    for step in range(first, last):
        x, y = batch(torch, step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(rows(x, rank, ranks)), rows(y, rank, ranks)).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def reference_lamb(torch, ranks):
    """The reference LAMB on the average of every rank's gradient, all computed here."""
    model = make_model(torch)
    params = list(model.parameters())
    ref = ReferenceLAMB(torch, params, LR, BETAS, EPS, WD)
    for step in range(STEPS):
        x, y = batch(torch, step)
        total = [torch.zeros_like(p) for p in params]
        for r in range(ranks):
            model.zero_grad()
            torch.nn.functional.mse_loss(model(rows(x, r, ranks)), rows(y, r, ranks)).backward()
            for t, p in zip(total, params):
                t.add_(p.grad)
        ref.step([t * (1.0 / ranks) for t in total])
    return [p.detach().clone() for p in params]


def check(world, torch):
    import tandem.torch

    rank, ranks = world.rank, world.size
    torch.set_num_threads(1)  # two processes on a loaded machine: no thread pool fights
    model = make_model(torch)
    opt = tandem.torch.DistributedFusedLAMB(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                            weight_decay=WD, comm=world)
    got = train(torch, model, opt, rank, ranks, 0, STEPS)
    want = reference_lamb(torch, ranks)
    start = [p.detach() for p in make_model(torch).parameters()]
    moved = max(float((a - b).abs().max()) for a, b in zip(want, start))
    diff = max(float((a - b).abs().max()) for a, b in zip(got, want))
    print(f"rank {rank}: DistributedFusedLAMB ({opt.schedule}): max |w - w_reference| = {diff:.3g} "
          f"(tolerance 2e-7; the weights moved {moved:.3g})")
    assert moved > 1e-2, f"training moved the weights by {moved} only: the test would prove nothing"
    assert diff <= 2e-7, f"DistributedFusedLAMB: weights differ from the reference's by {diff}"

    for kind in (tandem.torch.DistributedFusedAdamW, tandem.torch.DistributedFusedLAMB):
        def make(net):
            return kind(net.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, comm=world)

        model = make_model(torch)
        whole = train(torch, model, make(model), rank, ranks, 0, STEPS)
        model = make_model(torch)
        opt = make(model)
        train(torch, model, opt, rank, ranks, 0, STEPS // 2)
        saved = io.BytesIO()  # as a file a rank would hold it
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, saved)
        saved.seek(0)
        ck = torch.load(saved)
        begin, end = ck["optimizer"]["state"]["moments"]
        assert end - begin < sum(p.numel() for p in model.parameters()), "moments not sliced"
        model = make_model(torch)
        opt = make(model)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        resumed = train(torch, model, opt, rank, ranks, STEPS // 2, STEPS)
        same = all(torch.equal(a, b) for a, b in zip(resumed, whole))
        print(f"rank {rank}: {kind.__name__}: {STEPS // 2} steps + state + {STEPS // 2} steps "
              f"{'equal' if same else 'DIFFER from'} {STEPS} steps, bitwise")
        assert same, f"{kind.__name__}: the resumed run's weights differ from the uninterrupted one's"


def main():
    run_with_torch(check, "torch_lamb_state: {size} processes match the reference LAMB and resume bitwise")


if __name__ == "__main__":
    main()
