"""Under `mpirun -np N`, one process a rank: a DSL program run with comm=tandem.mpi_world() computes,
on each process, that rank's piece of what the same program computes on N in-process ranks; in
place and on copies; and tandem's collectives on NumPy arrays and torch tensors. Every rank checks
its own piece; a failing rank prints why and ends the job (a rank left waiting would hang)."""

import numpy as np

import tandem
from _mpi_checks import run_on_every_rank

SCALARS = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step=2)


def part(n, ranks, r):
    base, extra = divmod(n, ranks)
    begin = r * base + min(r, extra)
    return slice(begin, begin + base + (1 if r < extra else 0))


def check(world):
    ranks, rank = world.size, world.rank
    assert ranks >= 2, "launch with mpirun -np 2 or more"
    n = 37  # no rank count from 2 to 4 divides it
    rng = np.random.default_rng(0)  # the same inputs on every process: the expected values too
    whole = {"g": [rng.standard_normal(n, dtype=np.float32) for _ in range(ranks)],
             "w": rng.standard_normal(n, dtype=np.float32),
             "m": rng.standard_normal(n, dtype=np.float32),
             "v": rng.random(n, dtype=np.float32)}
    scalars = dict(SCALARS, grad_scale=1.0 / ranks)
    compiled = tandem.compile(tandem.schedule(tandem.workloads.adam(tandem.F32), "fused(RS-C-AG)+slice(m,v)"))
    want = compiled.run(whole, scalars)  # on in-process ranks, in this process

    # On copies: this rank's inputs; the result is this rank's piece (of m and v, which the
    # schedule stores sliced, this rank's slice: the others are other processes').
    mine = {"g": whole["g"][rank], "w": whole["w"], "m": whole["m"], "v": whole["v"]}
    got = compiled.run(mine, scalars, comm=world)
    np.testing.assert_allclose(got["w"], want["w"][rank], rtol=1e-6, atol=1e-7)
    for k in ("m", "v"):
        np.testing.assert_allclose(got[k], want[k][rank][part(n, ranks, rank)], rtol=1e-6, atol=1e-7, err_msg=k)

    # In place, set up once and run twice (a training loop's calls): w, m, v are updated where
    # they lie; m and v are this rank's slices.
    arrays = {"g": whole["g"][rank].copy(), "w": whole["w"].copy(),
              "m": whole["m"][part(n, ranks, rank)].copy(), "v": whole["v"][part(n, ranks, rank)].copy()}
    bound = compiled.bind(arrays, comm=world)
    got = bound.run(scalars)
    assert got["w"] is arrays["w"]
    np.testing.assert_allclose(arrays["w"], want["w"][rank], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(arrays["v"], want["v"][rank][part(n, ranks, rank)], rtol=1e-6, atol=1e-7)
    # The second step from the first's state (g is scratch after a run: give it again).
    arrays["g"][:] = whole["g"][rank]
    second = dict(whole, w=want["w"][0], m=want["m"][0], v=want["v"][0])
    want2 = compiled.run(second, dict(scalars, step=3))
    bound.run(dict(scalars, step=3))
    np.testing.assert_allclose(arrays["w"], want2["w"][rank], rtol=1e-6, atol=1e-7)

    # The same in the communicator's memory (world.empty: the shared arena, where the collectives
    # read the peers' buffers where they lie instead of the ring): the same values.
    shared = {k: world.empty(v.shape) for k, v in arrays.items()}
    assert all(a.dtype == np.float32 and a.flags.writeable for a in shared.values())
    for k in shared:
        shared[k][:] = {"g": whole["g"][rank], "w": whole["w"]}.get(k, whole[k][part(n, ranks, rank)])
    compiled.bind(shared, comm=world).run(scalars)
    np.testing.assert_allclose(shared["w"], want["w"][rank], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(shared["m"], want["m"][rank][part(n, ranks, rank)], rtol=1e-6, atol=1e-7)
    c = world.empty((2, 3))
    c[:] = rank + 1
    world.all_reduce(c)
    np.testing.assert_array_equal(c, np.full((2, 3), ranks * (ranks + 1) / 2))

    # The interpreter, a program as written, under MPI.
    p = tandem.Program("sum")
    x = p.input(tandem.F32, ["N"], tandem.Local, "x")
    p.output(tandem.AllReduce(tandem.Sum, x), "total")
    got = tandem.run(p, {"x": np.full(5, rank + 1, np.float32)}, comm=world)
    np.testing.assert_array_equal(got["total"], np.full(5, ranks * (ranks + 1) / 2, np.float32))

    # Collectives on the caller's arrays.
    a = np.arange(6, dtype=np.float32) * (rank + 1)
    assert world.all_reduce(a) is a
    np.testing.assert_array_equal(a, np.arange(6) * ranks * (ranks + 1) / 2)
    b = np.full(3, rank, np.float32)
    world.broadcast(b, 1)
    np.testing.assert_array_equal(b, np.ones(3))

    # Errors, before any rank communicates (every rank raises the same).
    for call, message in [
        (lambda: compiled.run({**mine, "g": [mine["g"]] * ranks}, scalars, comm=world),
         "under MPI each process gives its own rank's array, not a list"),
        (lambda: compiled.run(mine, scalars, comm=world, ranks=ranks + 1),
         f"ranks={ranks + 1} under MPI: the job has {ranks} processes"),
        (lambda: world.broadcast(b, ranks), f"root {ranks} is not a rank of {ranks}"),
        (lambda: tandem.run(p, {"x": np.ones(5, np.float32)}, comm="world"), "expected a tandem.Communicator"),
    ]:
        try:
            call()
        except tandem.Error as e:
            assert message in str(e), (message, str(e))
        else:
            raise AssertionError(f"no error: {message}")

    try:
        import torch
    except ImportError:
        return  # python3-torch is not installed: the DLPack path is tested in-process only
    t = torch.ones(4) * (rank + 1)
    world.all_reduce(t)
    assert torch.equal(t, torch.full((4,), ranks * (ranks + 1) / 2))


def main():
    world = run_on_every_rank(check)
    if world.rank == 0:
        print(f"dsl_across_processes: {world.size} processes agree with in-process ranks")


if __name__ == "__main__":
    main()
