"""What the mpirun scripts share: run a check on every process, and end the whole job when one
raises (a rank that only exited would leave the others waiting in a collective)."""
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
