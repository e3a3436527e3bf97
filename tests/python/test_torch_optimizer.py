"""DistributedFusedAdamW on the world of one rank a process started without mpirun is: its schedule
(the caller's recipe, the tuner's record, else the default), its moments as that schedule stores
them, and torch.optim.AdamW's weights after a few steps. The 2-process check against DDP is
tests/python/mpi/torch_training.py."""
import pytest

import tandem

from conftest import need_torch

STEPS, LR, WD = 4, 1e-2, 0.05


def model(torch):
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(5, 9), torch.nn.Tanh(), torch.nn.Linear(9, 3))


def train(torch, net, opt):
    g = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        x, y = torch.randn(6, 5, generator=g), torch.randn(6, 3, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def reference(torch):
    net = model(torch)
    return train(torch, net, torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD))


@pytest.mark.parametrize("schedule", [None, "AR-C", "fused(RS-C-AG)+slice(m,v)"])
def test_matches_torch_adamw_under_each_schedule(schedule):
    torch = need_torch()
    import tandem.torch

    net = model(torch)
    opt = tandem.torch.DistributedFusedAdamW(net.parameters(), lr=LR, weight_decay=WD,
                                             schedule=schedule)
    n = sum(p.numel() for p in net.parameters())
    if schedule is not None:
        assert opt.schedule == schedule and opt.tuning_record is None
    # Moments whole under AR-C, this rank's slice (all of it, on one rank) otherwise.
    assert opt._m.numel() == n and opt._v.numel() == n
    got = train(torch, net, opt)
    for a, b in zip(got, reference(torch)):
        assert float((a - b).abs().max()) <= 2e-6


def test_takes_the_tuners_record(monkeypatch, tmp_path):
    torch = need_torch()
    import tandem.torch

    adam = tandem.workloads.adam(tandem.F32)
    with monkeypatch.context() as m:  # a record of the plan executor: nothing compiled
        m.setenv("TANDEM_CACHE_DIR", str(tmp_path))
        record = tandem.tune(adam, {"N": 4096}, ranks=1, schedules=["RS-C-AG"], chunks=[],
                             executor="plan", reps=1, warmup=0).record
    asked = []

    def tuned(program, sizes, comm=None):
        asked.append((str(program), sizes, comm))
        return record

    monkeypatch.setattr(tandem, "tuned", tuned)
    net = model(torch)
    opt = tandem.torch.DistributedFusedAdamW(net.parameters(), lr=LR, weight_decay=WD)
    n = sum(p.numel() for p in net.parameters())
    assert asked == [(str(adam), {"N": n}, opt.comm)]
    assert opt.tuning_record is record and opt.schedule == record.winner
    assert opt.chunk_bytes == record.chunk_bytes
    got = train(torch, net, opt)
    for a, b in zip(got, reference(torch)):
        assert float((a - b).abs().max()) <= 2e-6


def test_bad_arguments():
    torch = need_torch()
    import tandem.torch

    net = model(torch)
    with pytest.raises(tandem.Error, match="schedule must be a recipe name"):
        tandem.torch.DistributedFusedAdamW(net.parameters(), schedule=3)
    with pytest.raises(tandem.Error, match="nonsense"):
        tandem.torch.DistributedFusedAdamW(model(torch).parameters(), schedule="nonsense")
    with pytest.raises(tandem.Error, match="dense float32 CPU parameters"):
        tandem.torch.DistributedFusedAdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))])
