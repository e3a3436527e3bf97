#!/bin/bash
# Assembles the git-ignored GPU bundle .device/ on a machine without a GPU: emits every program
# of programs.txt with build/release/tandem (reference results for one rank), adds the Open MPI
# runtime (make_bundle.sh) and builds the programs for sm_90 (build.sh). Then, on the GPU
# machine, from the repository root: bash .device/run.sh
#   bench/cuda/prepare.sh [--no-build] [DIR]    DIR defaults to .device; TANDEM overrides the binary
# Needs the CUDA 13 toolkit with NCCL's headers (nvcc), Debian 12's Open MPI 4.1.4 and gcc.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build=1
if [[ ${1:-} == --no-build ]]; then
  build=0
  shift
fi
B="${1:-$root/.device}"
TANDEM="${TANDEM:-$root/build/release/tandem}"
[[ -x $TANDEM ]] || { echo "prepare: no $TANDEM; build tandem first (make build)" >&2; exit 1; }

rm -rf "${B:?}/src" "${B:?}/bin"
mkdir -p "$B/src" "$B/bin"
# --ranks 1: the check needs reference results for the rank count it runs with (-np 1).
mapfile -t progs < <(grep -v '^#' "$here/programs.txt" | grep -v '^[[:space:]]*$')
for entry in "${progs[@]}"; do
  read -r name workload dtype schedule <<<"$entry"
  args=("$workload" --schedule "$schedule" --target cuda --ranks 1 -o "$B/src/$name")
  [[ $dtype == - ]] || args+=(--dtype "$dtype")
  "$TANDEM" emit "${args[@]}"
done
cp "$here/run.sh" "$here/env.sh" "$here/programs.txt" "$here/README.md" "$B/"
"$here/make_bundle.sh" "$B"
if [[ $build == 1 ]]; then
  "$here/build.sh" "$B"
fi
echo "prepare: bundle in $B ($(du -sh "$B" | cut -f1)); on the GPU machine: bash $(basename "$B")/run.sh"
