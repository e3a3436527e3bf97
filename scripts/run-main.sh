#!/usr/bin/env bash
# The main job of `make run`. Until the trainer exists: the collective benchmark on in-process ranks.
set -euo pipefail
build=${1:-build/release}
if [[ -x $build/bench/bench_collectives ]]; then
  exec "$build/bench/bench_collectives" --quick
fi
exec "$build/bench/bench_gemm"
