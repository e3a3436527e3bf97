"""Under `mpirun -np 2`: tandem.train(backend="mpi", dp=2, callback=...) trains the tiny model with
one process a rank. Every process's callback gets every step's metrics, its losses finite and the
same on both ranks, bit for bit (the loss is all-reduced); they equal the run's returned losses
and, within 2e-4 (the C++ suites' tolerance for a run over MPI against one on threads,
tests/train/mpi), those of the same run on 2 in-process ranks (backend="thread", run by rank 0);
and a callback that raises on rank 1 alone stops both ranks after that step, raising on rank 1."""
import math

import numpy as np

import tandem
from _mpi_checks import run_on_every_rank

# The plan executor: nothing compiled, a step takes milliseconds.
SETTINGS = dict(model="tiny", tp=1, batch=4, seq_len=32, steps=4, eval_every=0, executor="plan",
                quiet=True, seed=5)


def same_on_every_rank(world, values):
    """Whether rank 0's float64 values are these, bit for bit (sent as float32 words)."""
    mine = np.array(values, np.float64).view(np.float32)
    theirs = mine.copy()
    world.broadcast(theirs, 0)
    agree = np.array([1.0 if np.array_equal(mine, theirs) else 0.0], np.float32)
    world.all_reduce(agree, op=tandem.Min)
    return agree[0] == 1.0


def check(world):
    rank, ranks = world.rank, world.size
    seen = []
    r = tandem.train(**SETTINGS, backend="mpi", dp=ranks, callback=seen.append)
    losses = [m["loss"] for m in seen]
    assert [m["step"] for m in seen] == list(range(1, SETTINGS["steps"] + 1)), seen
    assert all(x is not None and math.isfinite(x) for x in losses), losses
    assert losses == r["losses"], (losses, r["losses"])
    assert same_on_every_rank(world, losses), f"rank {rank}: losses differ between the ranks"
    if rank == 0:
        threads = tandem.train(**SETTINGS, backend="thread", dp=ranks)["losses"]
        diff = max(abs(a - b) for a, b in zip(losses, threads))
        print(f"losses over MPI {losses}; on threads {threads}: max difference {diff:.3g} "
              f"(tolerance 2e-4)")
        assert len(threads) == len(losses) and diff <= 2e-4

    def stop_on_rank_1(m):
        if rank == 1 and m["step"] == 2:
            raise ValueError("rank 1 has seen enough")

    try:
        r = tandem.train(**SETTINGS, backend="mpi", dp=ranks, callback=stop_on_rank_1)
        assert rank != 1, "rank 1's callback raised, but tandem.train returned"
        assert r["end_step"] == 2, f"rank {rank} ran to step {r['end_step']}, not 2"
    except ValueError as e:
        assert rank == 1 and "rank 1 has seen enough" in str(e), e
    print(f"rank {rank}: the callbacks ran on every rank, losses equal; a raise on rank 1 stopped all")


def main():
    world = run_on_every_rank(check)
    if world.rank == 0:
        print(f"train_mpi: tandem.train on {world.size} processes")


if __name__ == "__main__":
    main()
