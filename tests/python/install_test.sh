#!/usr/bin/env bash
# scripts/install-python.sh installs the built package into a virtual environment, where `import
# tandem` works from outside the source and build trees with no PYTHONPATH and runs a program
# compiled; a build folder without the extension is refused with one line.
# Usage: install_test.sh SOURCE_DIR BUILD_DIR PYTHON
set -euo pipefail
src=$1 build=$2 python=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv --without-pip --system-site-packages "$tmp/venv"
"$src/scripts/install-python.sh" "$tmp/venv/bin/python" "$build"
cd "$tmp"
env -u PYTHONPATH "$tmp/venv/bin/python" - <<'PY'
import numpy as np
import tandem

assert tandem.__file__.startswith(__import__("sys").prefix), tandem.__file__
p = tandem.workloads.adam(tandem.F32)
s = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step=1, grad_scale=0.5)
rng = np.random.default_rng(0)
inputs = {"g": [rng.standard_normal(5, dtype=np.float32) for _ in range(2)],
          "w": np.ones(5, np.float32), "m": np.zeros(5, np.float32), "v": np.zeros(5, np.float32)}
got = tandem.compile(tandem.schedule(p, "AR-C")).run(inputs, s)  # the JIT, from the package
want = tandem.run(p, inputs, s)  # the reference interpreter
assert all(np.allclose(got[k][r], want[k][r], rtol=1e-6, atol=1e-7) for k in want for r in range(2))
print("installed tandem runs from", tandem.__file__)
PY
if out=$("$src/scripts/install-python.sh" "$tmp/venv/bin/python" "$tmp/no-build" 2>&1); then
  echo "a build without the extension was installed: $out" >&2
  exit 1
fi
[[ $out == *"has no _tandem extension: build it first"* ]] || { echo "unexpected: $out" >&2; exit 1; }
echo "install_test: passed"
