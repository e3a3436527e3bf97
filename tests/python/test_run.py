"""The tandem Python package computes what NumPy computes: workloads run by the reference
interpreter, the plan runner and the compiled executor on 1-4 in-process ranks and sizes that do
not divide by the rank count, and schedules applied from Python."""
import numpy as np
import pytest

import tandem
from conftest import ADAM_SCALARS, adam_inputs

SCALARS = ADAM_SCALARS
SIZES = [1, 13, 37]  # one element, and sizes no rank count from 2 to 4 divides


def adam_numpy(inputs, ranks):
    """AdamW as include/tandem/dsl/workloads.h states it, in float64."""
    s = SCALARS
    g1 = sum(g.astype(np.float64) for g in inputs["g"]) / ranks
    m1 = s["beta1"] * inputs["m"] + (1 - s["beta1"]) * g1
    v1 = s["beta2"] * inputs["v"] + (1 - s["beta2"]) * g1 * g1
    mhat = m1 / (1 - s["beta1"] ** s["step"])
    vhat = v1 / (1 - s["beta2"] ** s["step"])
    w = inputs["w"].astype(np.float64)
    w1 = w - s["lr"] * (mhat / (np.sqrt(vhat) + s["eps"]) + s["weight_decay"] * w)
    return {"w": w1, "m": m1, "v": v1}


@pytest.fixture(scope="module")
def adam():
    return tandem.workloads.adam(tandem.F32)


@pytest.fixture(scope="module")
def compiled_adam(adam):
    # Compiled once (seconds the first time, then from the JIT's cache), run at every size.
    return tandem.compile(tandem.schedule(adam, "fused(RS-C-AG)+slice(m,v)"))


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("n", SIZES)
def test_adam_interpreted_compiled_and_numpy_agree(adam, compiled_adam, ranks, n):
    inputs = adam_inputs(ranks, n, seed=ranks * 100 + n)
    scalars = dict(SCALARS, grad_scale=1.0 / ranks)
    interpreted = tandem.run(adam, inputs, scalars)
    compiled = compiled_adam.run(inputs, scalars)
    want = adam_numpy(inputs, ranks)
    assert sorted(interpreted) == ["m", "v", "w"] and sorted(compiled) == ["m", "v", "w"]
    for name in want:
        assert len(interpreted[name]) == ranks and len(compiled[name]) == ranks
        for r in range(ranks):
            got = interpreted[name][r]
            assert got.dtype == np.float32 and got.shape == (n,)
            np.testing.assert_allclose(got, want[name], rtol=2e-5, atol=1e-6)
            # The sliced moments come back whole, as the program declares them.
            np.testing.assert_allclose(compiled[name][r], got, rtol=1e-6, atol=1e-7)
    # The caller's arrays are copied, never changed.
    np.testing.assert_array_equal(inputs["w"], adam_inputs(ranks, n, ranks * 100 + n)["w"])


def test_schedule_built_step_by_step_is_the_recipe_and_computes_the_same(adam):
    s = tandem.Schedule(adam)
    rs, ag = s.split("g_sum")
    assert (rs, ag) == ("g_sum.rs", "g_sum.ag")
    assert s.reorder(ag, ["w1"]) == ["m1.ag", "v1.ag", "w1.ag"]
    s.as_slice("m")
    s.as_slice("v")
    s.fuse([rs, "m1", "v1", "w1.ag"])
    s.name = "fused(RS-C-AG)+slice(m,v)"
    recipe = tandem.schedule(adam, s.name)
    assert s.plan() == recipe.plan()
    assert "reduce_scatter.sum(g)" in str(s.program) and "allreduce" not in str(s.program)

    ranks, n = 3, 11
    inputs = adam_inputs(ranks, n, seed=7)
    scalars = dict(SCALARS, grad_scale=1.0 / ranks)
    as_written = tandem.run(adam, inputs, scalars)
    # The interpreter runs the rewritten program (split, reorder, slices); the plan runner all of it.
    for executor in ["reference", "plan"]:
        scheduled = tandem.run(s, inputs, scalars, executor=executor)
        for name in as_written:
            for r in range(ranks):
                np.testing.assert_allclose(scheduled[name][r], as_written[name][r], rtol=1e-6)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_a_program_written_in_python(ranks):
    # A row-parallel matmul: x sliced by columns, w by rows; the AllReduce sums the partial
    # products, then a bias and a GELU-free epilogue; K = 7 does not divide by 2 or 3.
    p = tandem.Program("row_parallel")
    x = p.input(tandem.F32, ["B", "K"], tandem.Sliced(1), "x")
    w = p.input(tandem.F32, ["K", "H"], tandem.Sliced(0), "w")
    bias = p.input(tandem.F32, ["H"], tandem.Replicated, "bias")
    alpha = p.scalar("alpha")
    y = tandem.AllReduce(tandem.Sum, x @ w).named("y")
    out = tandem.max(alpha * y + bias, 0.0) - 1 / (1 + tandem.exp(-y))
    p.output(out, "out")
    assert "y = allreduce.sum" in str(p) and p.symbols == ["B", "H", "K"]

    rng = np.random.default_rng(ranks)
    B, K, H = 3, 7, 5
    X = rng.standard_normal((B, K), dtype=np.float32)
    W = rng.standard_normal((K, H), dtype=np.float32)
    b = rng.standard_normal(H, dtype=np.float32)
    cuts = np.cumsum([0] + [K // ranks + (1 if r < K % ranks else 0) for r in range(ranks)])
    inputs = {
        "x": [np.ascontiguousarray(X[:, cuts[r] : cuts[r + 1]]) for r in range(ranks)],
        "w": [W[cuts[r] : cuts[r + 1]] for r in range(ranks)],
        "bias": b,
    }
    Y = X.astype(np.float64) @ W
    want = np.maximum(0.5 * Y + b, 0.0) - 1 / (1 + np.exp(-Y))
    for executor in ["reference", "plan"]:
        got = tandem.run(p, inputs, {"alpha": 0.5}, executor=executor)
        for r in range(ranks):
            np.testing.assert_allclose(got["out"][r], want, rtol=1e-5, atol=1e-5)


def test_sliced_pieces_and_gathers():
    # Symbols come from the arrays: a Sliced input's extent is the sum of its pieces (4 + 3 + 3).
    p = tandem.Program("gather")
    x = p.input(tandem.F32, ["N"], tandem.Sliced(0), "x")
    p.output(tandem.AllGather(x * 2), "all")
    p.output(tandem.ReduceScatter(tandem.Max, p.input(tandem.F32, ["N"], tandem.Local, "l")), "top")
    pieces = [np.arange(4, dtype=np.float32), np.arange(3, dtype=np.float32) + 10,
              np.arange(3, dtype=np.float32) + 20]
    local = [np.full(10, r, dtype=np.float32) for r in range(3)]
    got = tandem.run(p, {"x": pieces, "l": local})
    for r in range(3):
        np.testing.assert_array_equal(got["all"][r], np.concatenate(pieces) * 2)
        np.testing.assert_array_equal(got["top"][r], np.full(len(pieces[r]), 2, dtype=np.float32))


def test_a_ring_shift():
    # Each rank's Local value goes to the next rank: rank r gets rank r - 1's, on every executor.
    p = tandem.Program("ring")
    kv = p.input(tandem.F32, ["N"], tandem.Local, "kv")
    p.output(tandem.Shift(kv * 2), "next")
    assert "shift(" in str(p)
    local = [np.arange(7, dtype=np.float32) + 10 * r for r in range(3)]
    for executor in ["reference", "plan"]:
        got = tandem.run(p, {"kv": local}, executor=executor)
        for r in range(3):
            np.testing.assert_array_equal(got["next"][r], local[(r - 1) % 3] * 2)
    with pytest.raises(tandem.Error, match="Shift takes a Local operand"):
        tandem.Shift(tandem.AllReduce(tandem.Sum, kv))


def test_bf16_inputs_are_rounded_from_float32():
    p = tandem.Program("round")
    g = p.input(tandem.BF16, ["N"], tandem.Local, "g")
    p.output(tandem.cast(tandem.AllReduce(tandem.Sum, g), tandem.F32), "s")
    a = np.array([1.0, 1 + 2**-9, 3.0], dtype=np.float32)  # 1 + 2^-9 rounds to 1 in bf16
    got = tandem.run(p, {"g": [a, a]})
    np.testing.assert_array_equal(got["s"][0], [2.0, 2.0, 6.0])


def test_workloads_and_printing():
    assert {"adam", "lamb", "megatron_layer", "pipeline_stage"} <= set(tandem.workloads.names())
    assert str(tandem.workloads.by_name("adam")) == str(tandem.workloads.adam())
    layer = tandem.workloads.megatron_layer(bias=False)
    assert "bias" not in layer.inputs and layer.outputs == ["out"]
    assert tandem.workloads.pipeline_stage().groups == 2
    names = tandem.schedules(tandem.workloads.adam())
    assert names[0] == "AR-C" and "fused(RS-C-AG)+slice(m,v)" in names
    assert "Runs a Program or Schedule" in tandem.run.__doc__


def test_lamb_bucket_takes_segments_one_lamb_a_segment():
    # One rank: each segment's trust ratio is bitwise that of lamb run on the segment alone
    # (workloads.h); 2 ranks, a boundary cutting a segment: the plan runner and the reference
    # interpreter agree (within float32 rounding: the cross-rank sum of a norm's parts).
    bucket, lamb = tandem.workloads.lamb_bucket(tandem.F32), tandem.workloads.lamb(tandem.F32)
    bounds = [0, 20, 21, 37]
    inputs = adam_inputs(1, 37, seed=5)
    scalars = dict(SCALARS, grad_scale=1.0)
    got = tandem.run(bucket, inputs, scalars, segments=bounds)
    for b, e in zip(bounds, bounds[1:]):
        part = tandem.run(lamb, {k: [a[b:e] for a in v] if isinstance(v, list) else v[b:e]
                                 for k, v in inputs.items()}, scalars)
        for name in ("w", "m", "v"):
            np.testing.assert_array_equal(got[name][0][b:e], part[name][0])
    inputs = adam_inputs(2, 37, seed=6)
    scalars = dict(SCALARS, grad_scale=0.5)
    want = tandem.run(bucket, inputs, scalars, segments=bounds)
    planned = tandem.run(tandem.schedule(bucket, "fused(RS-C-AG)+slice(m,v)"), inputs, scalars,
                         segments=bounds, executor="plan")
    for r in range(2):
        np.testing.assert_allclose(planned["w"][r], want["w"][r], rtol=1e-6, atol=1e-7)


def test_segments_errors():
    bucket = tandem.workloads.lamb_bucket(tandem.F32)
    inputs = adam_inputs(1, 10, seed=1)
    scalars = dict(SCALARS, grad_scale=1.0)
    for segments, message in (
            (None, "program 'lamb_bucket' cuts its tensors into segments .*give their bounds"),
            ([0, 4, 4, 10], "segment bounds must ascend strictly .* bound 2 is 4 after 4"),
            ([1, 10], "the segments' first bound is 1, not 0"),
            ([0, 4, 9], "the segments end at 9")):
        with pytest.raises(tandem.Error, match=message):
            tandem.run(bucket, inputs, scalars, segments=segments)
    with pytest.raises(tandem.Error, match="program 'adam' has no segment op"):
        tandem.run(tandem.workloads.adam(tandem.F32), inputs, scalars, segments=[0, 10])
