"""A PyTorch training script with tandem's fused LAMB (the gradients reduce-scattered, LAMB with each
parameter's trust ratio on this rank's slice, the parameters all-gathered, one program) that saves
a checkpoint and resumes from it: every rank saves the model's state and its own optimizer state
(its slice of the moments, the step count, the hyper-parameters) to a file of its own. One
process a rank:

    PYTHONPATH=build/release/python mpirun -np 2 python3 examples/python/torch_lamb_resume.py [DIR]

(run alone, it is a job of one rank; DIR defaults to a temporary folder). It trains 40 steps, saves,
then starts again from the files, as a restarted job would, for 40 more, and checks the weights
against 80 uninterrupted steps: a resumed run is bitwise the same."""
import importlib.util
import os
import sys
import tempfile

import tandem

if importlib.util.find_spec("torch") is None:
    print("SKIPPED: PyTorch is not installed (Debian: python3-torch)")
    sys.exit(0)

import torch  # noqa: E402

import tandem.torch  # noqa: E402

world = tandem.mpi_world()
torch.set_num_threads(1)
STEPS = 80


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    return model, tandem.torch.DistributedFusedLAMB(model.parameters(), lr=1e-2, weight_decay=0.01)


def train(model, optimizer, first, last):
    """Steps first .. last - 1 of a regression task every rank draws the same way, each rank on
    its rows of every batch; returns this rank's mean loss over the last 20 steps."""
    data = torch.Generator().manual_seed(1)
    truth = 0.25 * torch.randn(16, 1, generator=data)
    rows = 32 // world.size
    mine = slice(world.rank * rows, (world.rank + 1) * rows)
    losses = []
    for step in range(last):
        x = torch.randn(32, 16, generator=data)
        if step < first:
            continue
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[mine]), torch.sin(x @ truth)[mine])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return sum(losses[-20:]) / 20


folder = sys.argv[1] if len(sys.argv) > 1 else None
with tempfile.TemporaryDirectory() as scratch:
    # Every rank's own file (a temporary folder is per process: fine, each rank reads its own).
    path = os.path.join(folder or scratch, f"rank-{world.rank}.pt")
    model, optimizer = make()
    early = train(model, optimizer, 0, STEPS // 2)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)

    model, optimizer = make()  # as a restarted job would: new objects, then the saved state
    checkpoint = torch.load(path)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    late = train(model, optimizer, STEPS // 2, STEPS)

    straight, straight_optimizer = make()
    train(straight, straight_optimizer, 0, STEPS)
same = all(torch.equal(a, b) for a, b in zip(model.parameters(), straight.parameters()))
if world.rank == 0:
    print(f"{world.size} rank(s), schedule {optimizer.schedule}: loss {early:.4f} after "
          f"{STEPS // 2} steps, {late:.4f} after {STEPS} (resumed at {STEPS // 2}); "
          f"{'bitwise' if same else 'NOT'} the weights of {STEPS} uninterrupted steps")
assert late < early, "training did not reduce the loss"
assert same, "the resumed run's weights differ from the uninterrupted run's"
