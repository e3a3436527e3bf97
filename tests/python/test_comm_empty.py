"""Communicator.empty: arrays in the communicator's memory (under MPI the shared arena), here on the
world of one rank a process started without mpirun is; they view it as NumPy arrays and PyTorch
tensors, outlive the call that made them, and bad arguments are one tandem.Error."""
import gc

import numpy as np
import pytest

import tandem

from conftest import need_torch


@pytest.fixture(scope="module")
def world():
    return tandem.mpi_world()


def test_empty_gives_writable_arrays_of_the_shape_and_dtype(world):
    a = world.empty(10)
    assert a.shape == (10,) and a.dtype == np.float32 and a.flags.writeable and a.flags.c_contiguous
    a[:] = np.arange(10)
    b = world.empty((3, 4), np.float16)
    assert b.shape == (3, 4) and b.dtype == np.float16
    b[:] = 1
    assert world.empty(0).shape == (0,)
    assert world.empty([2, 0, 5], "int32").shape == (2, 0, 5)
    # Separate memory: writing one leaves the other.
    np.testing.assert_array_equal(a, np.arange(10, dtype=np.float32))
    world.all_reduce(a)  # one rank: the sum is itself
    np.testing.assert_array_equal(a, np.arange(10, dtype=np.float32))


def test_memory_lives_while_a_view_does(world):
    views = [world.empty(1 << 16)[100:200] for _ in range(4)]  # the arrays themselves are gone
    for i, v in enumerate(views):
        v[:] = i
    gc.collect()
    fresh = [world.empty(1 << 16) for _ in range(4)]  # must not reuse the views' memory
    for f in fresh:
        f[:] = -1
    for i, v in enumerate(views):
        np.testing.assert_array_equal(v, np.full(100, i, np.float32))


def test_torch_views_it(world):
    torch = need_torch()
    t = torch.from_numpy(world.empty(8)).zero_()
    t += 2
    world.all_reduce(t)
    assert torch.equal(t, torch.full((8,), 2.0))
    flat = torch.from_numpy(world.empty(6))
    w = flat[2:6].view(2, 2)
    del flat
    gc.collect()
    w.fill_(3)  # the storage is still there
    assert float(w.sum()) == 12


@pytest.mark.parametrize(
    "args, message",
    [
        ((-1,), r"shape -1 has a negative extent"),
        (((2, -3),), r"shape \(2, -3\) has a negative extent"),
        (("ten",), r"shape 'ten' is neither an extent nor a sequence of extents"),
        (((2, 1.5),), r"shape \(2, 1.5\) holds 1.5, not an extent"),
        ((4, "float99"), r"dtype 'float99' is not a NumPy dtype"),
        ((4, object), r"dtype object is not numeric"),
        ((4, "U3"), r"dtype <U3 is not numeric"),
        (((1 << 40, 1 << 40),), r"is more bytes than an address space holds"),
        ((1 << 70,), r"has an extent too large"),
        ((True,), r"holds True, not an extent"),
        ((1 << 39,), r"arena .* has no free block of 2199023255552 bytes"),  # 2 TiB of 1
    ],
)
def test_bad_arguments(world, args, message):
    with pytest.raises(tandem.Error, match=message):
        world.empty(*args)
