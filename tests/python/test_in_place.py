"""Runs in place read and update the caller's NumPy arrays and PyTorch tensors where they lie: the
same values as a run on copies, in the caller's own objects; and every array a run in place cannot
take (strided, another dtype, read-only, another device, shared by two ranks, the wrong piece) is
one tandem.Error naming it."""
import numpy as np
import pytest

import tandem
from conftest import ADAM_SCALARS, adam_inputs, need_torch

SCALARS = ADAM_SCALARS
RECIPE = "fused(RS-C-AG)+slice(m,v)"  # m and v stored sliced: in place, each rank gives its slice


def part(n, ranks, r):
    """Rank r's rows of n, as the library slices them (the first n % ranks ranks one row more)."""
    base, extra = divmod(n, ranks)
    begin = r * base + min(r, extra)
    return slice(begin, begin + base + (1 if r < extra else 0))


def in_place_pieces(whole, ranks, n):
    """Each rank's own arrays: the whole g and w, its slice of m and v (all copies)."""
    return {
        "g": [g.copy() for g in whole["g"]],
        "w": [whole["w"].copy() for _ in range(ranks)],
        "m": [whole["m"][part(n, ranks, r)].copy() for r in range(ranks)],
        "v": [whole["v"][part(n, ranks, r)].copy() for r in range(ranks)],
    }


@pytest.fixture(scope="module")
def compiled_adam():
    return tandem.compile(tandem.schedule(tandem.workloads.adam(tandem.F32), RECIPE))


@pytest.mark.parametrize("ranks, n", [(1, 5), (2, 13), (3, 37)])
def test_numpy_in_place_matches_copies(compiled_adam, ranks, n):
    whole = adam_inputs(ranks, n, seed=n)
    scalars = dict(SCALARS, grad_scale=1.0 / ranks)
    want = compiled_adam.run(whole, scalars)
    mine = in_place_pieces(whole, ranks, n)
    got = compiled_adam.run(mine, scalars, in_place=True)
    for r in range(ranks):
        assert got["w"][r] is mine["w"][r] and got["m"][r] is mine["m"][r]  # the caller's own
        np.testing.assert_allclose(mine["w"][r], want["w"][r], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(mine["m"][r], want["m"][r][part(n, ranks, r)], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(mine["v"][r], want["v"][r][part(n, ranks, r)], rtol=1e-6, atol=1e-7)
    assert not np.array_equal(mine["w"][0], whole["w"])  # it did change them


def test_interpreter_in_place_on_a_program_as_written():
    p = tandem.Program("scale")
    x = p.input(tandem.F32, ["N"], tandem.Replicated, "x")
    tandem.update(x, x * 2.0)
    arrays = [np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32) + 1]
    got = tandem.run(p, {"x": arrays}, in_place=True)
    assert got["x"][0] is arrays[0]
    np.testing.assert_array_equal(arrays[0], [0, 2, 4, 6])
    np.testing.assert_array_equal(arrays[1], [2, 4, 6, 8])


def test_torch_in_place_f32_and_bf16(compiled_adam):
    torch = need_torch()
    ranks, n = 2, 11
    whole = adam_inputs(ranks, n, seed=7)
    scalars = dict(SCALARS, grad_scale=0.5)
    want = compiled_adam.run(whole, scalars)
    mine = {k: [torch.from_numpy(a) for a in v] for k, v in in_place_pieces(whole, ranks, n).items()}
    got = compiled_adam.run(mine, scalars, in_place=True)
    for r in range(ranks):
        assert got["w"][r] is mine["w"][r]
        np.testing.assert_allclose(mine["w"][r].numpy(), want["w"][r], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(mine["v"][r].numpy(), want["v"][r][part(n, ranks, r)], rtol=1e-6, atol=1e-7)
    # A bf16 gradient as a torch.bfloat16 tensor, read where it lies; a copy run rounds the same
    # float32 values to bf16, so both compute the same.
    adam16 = tandem.compile(tandem.schedule(tandem.workloads.adam(tandem.BF16), RECIPE))
    whole = adam_inputs(ranks, n, seed=8)
    whole["g"] = [torch.from_numpy(g).bfloat16().float().numpy() for g in whole["g"]]
    want = adam16.run(whole, scalars)
    mine = {k: [torch.from_numpy(a) for a in v] for k, v in in_place_pieces(whole, ranks, n).items()}
    mine["g"] = [g.bfloat16() for g in mine["g"]]
    adam16.run(mine, scalars, in_place=True)
    for r in range(ranks):
        np.testing.assert_allclose(mine["w"][r].numpy(), want["w"][r], rtol=1e-6, atol=1e-7)


def test_torch_tensors_are_read_by_copy_runs_too():
    torch = need_torch()
    p = tandem.Program("axpy")
    x = p.input(tandem.F32, ["N"], tandem.Local, "x")
    p.output(tandem.AllReduce(tandem.Sum, x * 3.0), "out")
    xs = [torch.arange(5, dtype=torch.float32), torch.ones(5)]
    got = tandem.run(p, {"x": xs})
    np.testing.assert_array_equal(got["out"][1], 3 * (np.arange(5) + 1))
    np.testing.assert_array_equal(xs[1].numpy(), np.ones(5))  # copied, never changed


def scale_program(dtype=tandem.F32):
    p = tandem.Program("scale")
    x = p.input(dtype, ["N"], tandem.Local, "x")
    tandem.update(x, x * 2.0)
    return p


def read_only(a):
    a.flags.writeable = False
    return a


class OnAnotherDevice:
    """What a CUDA tensor shows a DLPack consumer first: its device (kDLCUDA = 2, device 0)."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("a consumer must not export memory it cannot read")


@pytest.mark.parametrize(
    "make, in_place, message",
    [
        (lambda np_, t: np.ones((4, 2), np.float32)[:, 0], True, "input 'x' on rank 0: the array is not C-contiguous"),
        (lambda np_, t: np.ones(4, np.float64), True, "in place, the array must have the input's dtype, float32; got float64"),
        (lambda np_, t: np.ones(4, np.float64), False, r"expected a float32 array, got float64 \(convert with a.astype"),
        (lambda np_, t: read_only(np.ones(4, np.float32)), True, "the array is read-only, and a run in place writes"),
        (lambda np_, t: OnAnotherDevice(), True, "the tensor is on device cuda:0; tandem reads CPU memory"),
        (lambda np_, t: [1.0] * 4, True, "expected a NumPy array or a tensor with __dlpack__ .* got list"),
    ],
)
def test_bad_arrays_in_place(make, in_place, message):
    with pytest.raises(tandem.Error, match=message):
        tandem.run(scale_program(), {"x": [make(np, None)]}, in_place=in_place)


def test_bad_torch_tensors():
    torch = need_torch()
    p = scale_program()
    cases = [
        (torch.ones(4, 2)[:, 0], r"not C-contiguous \(shape \[4\], strides \[2\]; pass t.contiguous"),
        (torch.ones(8)[::2], "not C-contiguous"),
        (torch.ones(4, dtype=torch.float16), "must have the input's dtype, float32; got torch.float16"),
        (torch.ones(4, requires_grad=True), "could not be exported with DLPack: .*detach"),
        (torch.empty(4, device="meta"), "on device meta, which DLPack cannot export"),
    ]
    for tensor, message in cases:
        with pytest.raises(tandem.Error, match=message):
            tandem.run(p, {"x": [tensor]}, in_place=True)
    with pytest.raises(tandem.Error, match=r"expected a float32 array, got torch.float64 \(convert with t.float\(\)\)"):
        tandem.run(p, {"x": [torch.ones(4, dtype=torch.float64)]})
    # The same tensor again after a failed run: nothing was consumed for good.
    t = torch.ones(4)
    tandem.run(p, {"x": [t]}, in_place=True)
    tandem.run(p, {"x": [t]}, in_place=True)
    np.testing.assert_array_equal(t.numpy(), np.full(4, 4.0, np.float32))


def test_in_place_needs_memory_of_each_rank_and_the_stored_piece(compiled_adam):
    x = np.ones(4, np.float32)
    with pytest.raises(tandem.Error, match="input 'x' on rank 1 shares memory with input 'x' on rank 0"):
        tandem.run(scale_program(), {"x": x}, ranks=2, in_place=True)
    with pytest.raises(tandem.Error, match="shares memory"):  # overlapping views
        base = np.ones(6, np.float32)
        tandem.run(scale_program(), {"x": [base[:4], base[2:]]}, in_place=True)
    whole = adam_inputs(2, 10, seed=1)
    mine = in_place_pieces(whole, 2, 10)
    mine["m"] = [np.zeros(10, np.float32) for _ in range(2)]  # whole, where the slice is stored
    with pytest.raises(tandem.Error, match=r"N is 10 by input 'g' but 20 by input 'm' \(in place, each rank gives its slice of 'm'"):
        compiled_adam.run(mine, dict(SCALARS, grad_scale=0.5), in_place=True)
    mine["m"] = [np.zeros(4, np.float32) for _ in range(2)]  # slices, of the wrong size
    with pytest.raises(tandem.Error, match=r"input 'm' on rank 0: expected shape \[5\] .*; in place, this rank's slice"):
        compiled_adam.run(mine, dict(SCALARS, grad_scale=0.5), in_place=True, symbols={"N": 10})
