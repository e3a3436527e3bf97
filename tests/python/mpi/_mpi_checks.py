"""What the mpirun scripts share: run a check on every process, and end the whole job when one
raises (a rank that only exited would leave the others waiting in a collective)."""
import importlib.util
import sys
import traceback

import tandem


def run_on_every_rank(check, *args):
    """check(world, *args) on this process, then a barrier; the job aborted with status 1 on any
    exception (its traceback printed first). Returns the world communicator."""
    world = tandem.mpi_world()
    try:
        check(world, *args)
        world.barrier()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        tandem.abort_mpi_job(1)
    return world


def run_with_torch(check, done):
    """run_on_every_rank(check, torch) where PyTorch is installed, then rank 0 prints `done` (its
    "{size}" the process count); where it is not, rank 0 says the script was skipped and why."""
    world = tandem.mpi_world()
    if importlib.util.find_spec("torch") is None:
        if world.rank == 0:
            print("SKIPPED: PyTorch is not installed (Debian: python3-torch; scripts/install-deps.sh)")
        return
    import torch

    run_on_every_rank(check, torch)
    if world.rank == 0:
        print(done.format(size=world.size))
