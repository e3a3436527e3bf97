#!/bin/bash
# Assembles the git-ignored GPU bundle .device/ on a machine without a GPU: emits every program
# of programs.txt with build/release/tandem (reference results for one rank), adds the Open MPI
# runtime (make_bundle.sh) and builds the programs for sm_90 (build.sh). Then, on the GPU
# machine, from the repository root: bash .device/run.sh
#   bench/cuda/prepare.sh [--no-build] [DIR]    DIR defaults to .device; TANDEM overrides the binary
# Needs the CUDA 13 toolkit with NCCL's headers (nvcc), Debian 12's Open MPI 4.1.4 and gcc.
# TANDEM_OLD=<another tandem binary> also emits the lines of programs.txt marked `old` with it
# (before and after a change in one run); the bundle's programs.txt lists what was emitted.
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
: >"$B/programs.txt"
for entry in "${progs[@]}"; do
  read -r name workload dtype schedule tag <<<"$entry"
  bin=$TANDEM
  if [[ $tag == old ]]; then
    [[ -n ${TANDEM_OLD:-} ]] || continue
    [[ -x $TANDEM_OLD ]] || { echo "prepare: no $TANDEM_OLD" >&2; exit 1; }
    bin=$TANDEM_OLD
  fi
  args=("$workload" --schedule "$schedule" --target cuda --ranks 1 -o "$B/src/$name")
  [[ $dtype == - ]] || args+=(--dtype "$dtype")
  "$bin" emit "${args[@]}"
  echo "$entry" >>"$B/programs.txt"
done
cp "$here/run.sh" "$here/env.sh" "$here/README.md" "$B/"
"$here/make_bundle.sh" "$B"
if [[ $build == 1 ]]; then
  "$here/build.sh" "$B"
fi
echo "prepare: bundle in $B ($(du -sh "$B" | cut -f1)); on the GPU machine: bash $(basename "$B")/run.sh"
