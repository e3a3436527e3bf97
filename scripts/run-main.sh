#!/usr/bin/env bash
# The main job of `make run`: `tandem train` with its defaults, a small GPT trained on the
# built-in synthetic corpus across 4 in-process ranks (2-way data- and 2-way tensor-parallel),
# about 25 s on 2 cores (300 steps); the loss falls from ~5.5 (uniform over bytes) as it learns.
# Extra arguments go to `tandem train` (e.g. scripts/run-main.sh build/release --steps 50).
set -euo pipefail
build=${1:-build/release}
shift || true
exec "$build/tandem" train "$@"
