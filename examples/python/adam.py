"""One data-parallel AdamW step from Python: the adam workload scheduled by hand into CoCoNeT's
fused(RS-C-AG) with sliced moments, then run by the reference interpreter and by the compiled
executor on NumPy arrays, on in-process ranks, and compared (the same steps as examples/adam.cc).

    PYTHONPATH=build/release/python python3 examples/python/adam.py [ranks=2] [N=1000]
"""
import sys

import numpy as np

import tandem

ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 2
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000

# Each rank holds its own bf16 gradient g (Local) and the same f32 weights w and moments m, v
# (Replicated); an AllReduce sums the gradients, then every rank updates w, m and v in place.
adam = tandem.workloads.adam()
print("=== the program as written\n", adam, sep="")

s = tandem.Schedule(adam)
# 1. split the AllReduce into a ReduceScatter and an AllGather.
rs, ag = s.split("g_sum")
# 2. reorder the AllGather past the update: AdamW runs on this rank's slice, the results are gathered.
s.reorder(ag, ["w1"])
# 3. as_slice: m and v are only used through their slices, so each rank stores 1/ranks of them.
s.as_slice("m")
s.as_slice("v")
# 4. fuse the update into the ReduceScatter: it runs on each chunk as soon as it is reduced.
s.fuse([rs, "m1", "v1", "w1.ag"])
s.name = "fused(RS-C-AG)+slice(m,v)"
assert s.plan() == tandem.schedule(adam, s.name).plan(), "the recipe of that name differs"
print("=== the plan\n", s.plan(), sep="")

rng = np.random.default_rng(0)
inputs = {
    "g": [rng.standard_normal(n, dtype=np.float32) for _ in range(ranks)],  # rounded to bf16
    "w": rng.standard_normal(n, dtype=np.float32),
    "m": rng.standard_normal(n, dtype=np.float32),
    "v": rng.random(n, dtype=np.float32),
}
scalars = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step=3,
               grad_scale=1.0 / ranks)

reference = tandem.run(adam, inputs, scalars)  # the interpreter, on the program as written
compiled = tandem.compile(s)  # emitted as C++, compiled by the system compiler (or cached)
got = compiled.run(inputs, scalars)

# Bitwise: the schedule keeps the order of every sum on in-process ranks.
same = all(np.array_equal(got[name][r], reference[name][r])
           for name in ("w", "m", "v") for r in range(ranks))
worst = max(float(np.abs(got[name][r] - reference[name][r]).max())
            for name in ("w", "m", "v") for r in range(ranks))
print(f"compiled vs reference on {ranks} ranks: w, m, v; max |diff| {worst:.3g} (bitwise): "
      f"{'OK' if same else 'MISMATCH'}")
sys.exit(0 if same else 1)
