"""A PyTorch training script whose optimizer step is tandem's fused program: the gradients
reduce-scattered, AdamW on this rank's slice inside the reduce-scatter, the parameters all-gathered,
in the parameters' and gradients' own memory. One process a rank:

    PYTHONPATH=build/release/python mpirun -np 2 python3 examples/python/torch_fused_adamw.py

(run alone, it is a job of one rank). Each rank trains on its own rows of every batch, as with
DistributedDataParallel, but with no DDP: DistributedFusedAdamW averages the gradients itself."""
import importlib.util
import sys

import tandem

if importlib.util.find_spec("torch") is None:
    print("SKIPPED: PyTorch is not installed (Debian: python3-torch)")
    sys.exit(0)

import torch  # noqa: E402

import tandem.torch  # noqa: E402

world = tandem.mpi_world()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
optimizer = tandem.torch.DistributedFusedAdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)  # as usual

# A regression task every rank draws the same way; each rank takes its rows of every batch.
data = torch.Generator().manual_seed(1)
truth = 0.25 * torch.randn(16, 1, generator=data)
rows = 32 // world.size
losses = []
for step in range(300):
    x = torch.randn(32, 16, generator=data)
    y = torch.sin(x @ truth)
    x, y = x[world.rank * rows:(world.rank + 1) * rows], y[world.rank * rows:(world.rank + 1) * rows]
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    scheduler.step()
    losses.append(loss.item())
first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20  # this rank's, over 20 steps
if world.rank == 0:
    print(f"{world.size} rank(s), schedule {optimizer.schedule}: loss {first:.4f} -> {last:.4f}")
assert last < 0.5 * first, "training did not reduce the loss"
