"""DistributedFusedAdamW and DistributedFusedLAMB on the world of one rank a process started without
mpirun is: the schedule (the caller's recipe, the tuner's record, else the default), the moments as
that schedule stores them, torch.optim.AdamW's weights and the reference LAMB's (lamb_reference.py)
after a few steps, state_dict() and load_state_dict() resuming bitwise, and the errors of bad
arguments and bad states. The 2-process checks are tests/python/mpi/torch_training.py (against DDP)
and tests/python/mpi/torch_lamb_state.py (LAMB and the state)."""
import io

import pytest

import tandem

from conftest import need_torch
from lamb_reference import ReferenceLAMB

STEPS, LR, WD = 4, 1e-2, 0.05


def model(torch):
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(5, 9), torch.nn.Tanh(), torch.nn.Linear(9, 3))


def train(torch, net, opt, steps=STEPS, first=0):
    """Steps first .. first + steps - 1 of the one sequence of batches."""
    g = torch.Generator().manual_seed(3)
    for i in range(first + steps):
        x, y = torch.randn(6, 5, generator=g), torch.randn(6, 3, generator=g)
        if i < first:
            continue
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


def fake_tuner(monkeypatch, tmp_path, program):
    """A record of `program` at N = 4096 (the plan executor's: nothing compiled), made in a
    throwaway cache, and tandem.tuned replaced by a function that returns it and notes what it
    was asked: returns (record, asked)."""
    with monkeypatch.context() as m:
        m.setenv("TANDEM_CACHE_DIR", str(tmp_path))
        record = tandem.tune(program, {"N": 4096}, ranks=1, schedules=["RS-C-AG"], chunks=[],
                             executor="plan", reps=1, warmup=0).record
    asked = []

    def tuned(program, sizes, comm=None):
        asked.append((str(program), sizes, comm))
        return record

    monkeypatch.setattr(tandem, "tuned", tuned)
    return record, asked


def test_takes_the_tuners_record(monkeypatch, tmp_path):
    torch = need_torch()
    import tandem.torch

    adam = tandem.workloads.adam(tandem.F32)
    record, asked = fake_tuner(monkeypatch, tmp_path, adam)
    net = model(torch)
    opt = tandem.torch.DistributedFusedAdamW(net.parameters(), lr=LR, weight_decay=WD)
    n = sum(p.numel() for p in net.parameters())
    assert asked == [(str(adam), {"N": n}, opt.comm)]
    assert opt.tuning_record is record and opt.schedule == record.winner
    assert opt.chunk_bytes == record.chunk_bytes
    got = train(torch, net, opt)
    for a, b in zip(got, reference(torch)):
        assert float((a - b).abs().max()) <= 2e-6


def test_lamb_takes_the_lamb_programs_record(monkeypatch, tmp_path):
    # The tuner binds no segments, so DistributedFusedLAMB reads the record of `lamb` (the same
    # stages, the same recipes) at its parameter count and runs lamb_bucket under its winner.
    torch = need_torch()
    import tandem.torch

    lamb = tandem.workloads.lamb(tandem.F32)
    record, asked = fake_tuner(monkeypatch, tmp_path, lamb)
    # An empty parameter among them: it has no segment (segments hold an element each).
    params = list(model(torch).parameters()) + [torch.nn.Parameter(torch.zeros(0))]
    opt = tandem.torch.DistributedFusedLAMB(params, lr=LR, weight_decay=WD)
    assert asked == [(str(lamb), {"N": 84}, opt.comm)]
    assert opt.tuning_record is record and opt.schedule == record.winner
    for p in params:
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in params]
    opt.step()
    assert all(not torch.equal(a, b) for a, b in zip(params[:-1], before[:-1]))


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


def test_lamb_matches_the_reference_lamb():
    # Tolerance 2e-7 absolute after 4 steps at lr 1e-2 (the weights move by 1.5e-2; measured:
    # 1.5e-8, half an ulp of the largest weight): the norms' sums of squares in another order.
    torch = need_torch()
    import tandem.torch

    net = model(torch)
    opt = tandem.torch.DistributedFusedLAMB(net.parameters(), lr=LR, weight_decay=WD)
    assert opt.schedule == "fused(RS-C-AG)+slice(m,v)" and opt.tuning_record is None
    got = train(torch, net, opt)
    ref_net = model(torch)
    ref = ReferenceLAMB(torch, ref_net.parameters(), LR, (0.9, 0.999), 1e-6, WD)
    g = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        x, y = torch.randn(6, 5, generator=g), torch.randn(6, 3, generator=g)
        ref_net.zero_grad()
        torch.nn.functional.mse_loss(ref_net(x), y).backward()
        ref.step([p.grad for p in ref_net.parameters()])
    start = [p.detach() for p in model(torch).parameters()]
    moved = max(float((a - b).abs().max()) for a, b in zip(got, start))
    diff = max(float((a - b).abs().max()) for a, b in zip(got, ref_net.parameters()))
    assert moved > 1e-2 and diff <= 2e-7, (moved, diff)


@pytest.mark.parametrize("kind", ["DistributedFusedAdamW", "DistributedFusedLAMB"])
def test_state_dict_resumes_bitwise(kind):
    torch = need_torch()
    import tandem.torch

    make = getattr(tandem.torch, kind)
    net = model(torch)
    whole = train(torch, net, make(net.parameters(), lr=LR, weight_decay=WD))  # STEPS steps
    net = model(torch)
    opt = make(net.parameters(), lr=LR, weight_decay=WD)
    half = STEPS // 2
    train(torch, net, opt, steps=half)
    saved = io.BytesIO()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, saved)
    saved.seek(0)
    ck = torch.load(saved)
    assert ck["optimizer"]["state"]["step"] == half
    net = model(torch)
    opt = make(net.parameters(), lr=0.5, weight_decay=0.0)  # the state's replace these
    net.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optimizer"])
    assert opt.param_groups[0]["lr"] == LR and opt.param_groups[0]["weight_decay"] == WD
    got = train(torch, net, opt, steps=STEPS - half, first=half)
    assert all(torch.equal(a, b) for a, b in zip(got, whole))


def test_bad_hyper_parameters_and_states():
    torch = need_torch()
    import tandem.torch

    for kind in (tandem.torch.DistributedFusedAdamW, tandem.torch.DistributedFusedLAMB):
        params = list(model(torch).parameters())
        for kw, message in ((dict(lr=-1), "lr must be a number >= 0, not -1"),
                            (dict(betas=(0.9,)), "betas must be two numbers"),
                            (dict(betas=(0.9, 1.0)), r"betas\[1\] must be a number in \[0, 1\)"),
                            (dict(eps=-1e-8), "eps must be a number >= 0"),
                            (dict(weight_decay="x"), "weight_decay must be a number >= 0")):
            with pytest.raises(ValueError, match=kind.__name__ + ": " + message):
                kind(params, **kw)
    net = model(torch)
    lamb = tandem.torch.DistributedFusedLAMB(net.parameters())
    good = lamb.state_dict()
    adam_state = tandem.torch.DistributedFusedAdamW(model(torch).parameters()).state_dict()
    small = tandem.torch.DistributedFusedLAMB(torch.nn.Linear(2, 2).parameters()).state_dict()

    def changed(**kw):
        return {"state": dict(good["state"], **kw), "param_groups": good["param_groups"]}

    name = "DistributedFusedLAMB.load_state_dict: "
    for bad, message in (
            ([1, 2], "expected what state_dict\\(\\) returns"),
            ({"state": {}, "param_groups": []}, "the state has no optimizer, numel"),
            (adam_state, "the state is DistributedFusedAdamW's, not DistributedFusedLAMB's"),
            (small, "the state is of 6 parameter elements; this optimizer's parameters hold 84"),
            (changed(ranks=2), "the state was saved by a job of 2 processes, this one has 1"),
            (changed(moments=[0, 40], rank=1), r"the state holds elements \[0, 40\) of the moments \(rank 1's\)"),
            (changed(exp_avg=torch.zeros(84, dtype=torch.float64)),
             "state\\['exp_avg'\\] must be a float32 tensor of 84 elements, got a torch.float64"),
            (changed(step=-1), "state\\['step'\\] must be an int >= 0, not -1"),
            ({"state": good["state"], "param_groups": [dict(good["param_groups"][0], lr=-2)]},
             "lr must be a number >= 0, not -2")):
        with pytest.raises(ValueError, match=name + message):
            lamb.load_state_dict(bad)
