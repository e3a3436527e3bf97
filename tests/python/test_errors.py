"""Bad input raises tandem.Error with a message that names what is wrong, and never crashes the
interpreter."""
import numpy as np
import pytest

import tandem


def axpy():
    p = tandem.Program("axpy")
    x = p.input(tandem.F32, ["N"], tandem.Local, "x")
    y = p.input(tandem.F32, ["N"], tandem.Replicated, "y")
    a = p.scalar("a")
    p.output(tandem.AllReduce(tandem.Sum, a * x) + y, "out")
    return p


def ones(n, dtype=np.float32):
    return np.ones(n, dtype=dtype)


@pytest.mark.parametrize(
    "inputs, scalars, message",
    [
        ({"x": [ones(4), ones(5)], "y": ones(4)}, {"a": 1}, r"input 'x' on rank 1: expected shape \[4\]"),
        ({"x": [ones(4), ones(4)], "y": ones(4, np.float64)}, {"a": 1}, "expected a float32 array, got float64"),
        ({"x": [ones(4), ones(4)], "y": np.ones((4, 2), np.float32)[:, 0]}, {"a": 1}, "not C-contiguous"),
        ({"x": [ones(4), [1.0] * 4], "y": ones(4)}, {"a": 1}, "expected a NumPy float32 array, got list"),
        ({"x": [ones(4), ones(4)], "y": ones((2, 2))}, {"a": 1}, "expected 1 dimension"),
        ({"x": [ones(4), ones(4), ones(4)], "y": ones(4)}, {"a": 1}, None),  # 3 ranks: fine
        ({"x": [ones(4), ones(4)]}, {"a": 1}, "no value given for input y"),
        ({"x": [ones(4), ones(4)], "y": ones(4), "z": ones(4)}, {"a": 1}, "has no input 'z'; its inputs: x, y"),
        ({"x": [ones(4), ones(4)], "y": ones(4)}, {}, "no value given for scalar a"),
        ({"x": [ones(4), ones(4)], "y": ones(4)}, {"a": "one"}, "scalar 'a': expected a number"),
        ({"x": [ones(4), ones(4)], "y": ones(4)}, {"a": 1, "b": 2}, "has no scalar 'b'"),
    ],
)
def test_bad_arguments_of_a_run(inputs, scalars, message):
    if message is None:
        got = tandem.run(axpy(), inputs, scalars)
        np.testing.assert_array_equal(got["out"][2], np.full(4, 4.0, np.float32))
        return
    with pytest.raises(tandem.Error, match=message):
        tandem.run(axpy(), inputs, scalars)


def test_rank_counts():
    inputs = {"x": [ones(4)] * 2, "y": ones(4)}
    with pytest.raises(tandem.Error, match="input 'x': 2 arrays given for 3 ranks"):
        tandem.run(axpy(), inputs, {"a": 1}, ranks=3)
    with pytest.raises(tandem.Error, match="ranks must be between 1 and"):
        tandem.run(axpy(), {"x": ones(4), "y": ones(4)}, {"a": 1}, ranks=0)
    with pytest.raises(tandem.Error, match="rank count must be a multiple of it, not 3"):
        tandem.run(tandem.workloads.pipeline_stage(), {}, ranks=3)
    with pytest.raises(tandem.Error, match="symbol N is 4 by input 'x' but 6 by input 'y'"):
        tandem.run(axpy(), {"x": [ones(4)], "y": ones(6)}, {"a": 1})


def test_bad_names_and_schedules():
    with pytest.raises(tandem.Error, match="unknown workload 'adamm'"):
        tandem.workloads.by_name("adamm")
    with pytest.raises(tandem.Error, match=r"'fused\(XX-C\)' is not a schedule part"):
        tandem.schedule(tandem.workloads.adam(), "fused(XX-C)")
    with pytest.raises(tandem.Error, match="overlaps a collective with the matmul"):  # none here
        tandem.schedule(tandem.workloads.adam(), "ol(MM,AR-C)")
    with pytest.raises(tandem.Error, match="executor 'gpu': the executors are"):
        tandem.run(axpy(), {"x": ones(4), "y": ones(4)}, {"a": 1}, executor="gpu")
    s = tandem.Schedule(tandem.workloads.adam())
    with pytest.raises(tandem.Error, match=r"split\(w1\): the stage is w1 = update"):
        s.split("w1")  # not an AllReduce
    with pytest.raises(tandem.Error, match="nope"):
        s.fuse(["nope"])
    with pytest.raises(tandem.Error, match="expected a tandem.Program or tandem.Schedule, got str"):
        tandem.run("adam", {})


def test_bad_programs():
    p, q = tandem.Program("p"), tandem.Program("q")
    a = p.input(tandem.F32, ["N"], tandem.Local, "a")
    b = q.input(tandem.F32, ["N"], tandem.Local, "b")
    with pytest.raises(tandem.Error, match="different programs"):
        a + b
    with pytest.raises(tandem.Error, match="not a truth value"):
        if a < 1:
            pass
    with pytest.raises(tandem.Error, match="dimension 1"):
        p.input(tandem.F32, ["N", 2.5], tandem.Local, "c")
    with pytest.raises(tandem.Error, match="allgather"):
        tandem.AllGather(a)  # Local has no slices to gather
    with pytest.raises(tandem.Error, match="no stage named 'zz'"):
        p["zz"]
    with pytest.raises(TypeError):
        a + "one"
    assert issubclass(tandem.InternalError, tandem.Error)
