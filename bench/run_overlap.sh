#!/usr/bin/env bash
# Where an overlapped schedule (ol(MM,...)) wins on the Megatron layer, and where it cannot.
# bench_megatron_layer, retuned for each transport (the tuning cache knows the machine, not the
# link), on:
#   - 2 in-process ranks and 2 MPI processes of one host: the all-reduce is copies and adds on the
#     cores the GEMMs run on, so an overlap only moves that work onto the GEMM's core;
#   - 2 hosts of 1 rank (scripts/netns-hosts.sh, as root), the veth pair unlimited and limited to
#     each --rates value (Mbit/s each way): a link whose transfers take wire time but no CPU, as a
#     NIC's do, so the GEMM can run while the bytes move.
# Each configuration --runs times; bench_megatron_layer prints the tuned winner, the fastest
# schedule without an overlap timed beside it, and the perfect-overlap bound from the same run.
# Usage: bench/run_overlap.sh [BUILD_DIR] [--rates 1000,2000,4000] [--runs 3] [--reps 15]
#                             [--ranks-per-host 1]
set -euo pipefail
build=${1:-build/release}
shift || true
rates=1000,2000,4000
runs=3
reps=15
per_host=1
while [ $# -gt 0 ]; do
  case $1 in
    --rates) rates=$2; shift 2;;
    --runs) runs=$2; shift 2;;
    --reps) reps=$2; shift 2;;
    --ranks-per-host) per_host=$2; shift 2;;
    *) echo "run_overlap.sh: error: unknown flag '$1' (--rates, --runs, --reps, --ranks-per-host)" >&2; exit 2;;
  esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
layer=("$build/bench/bench_megatron_layer" --retune --reps "$reps" --tune-reps 1)
[ -x "${layer[0]}" ] || { echo "run_overlap.sh: error: ${layer[0]} is not built" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "# run_overlap.sh on $(hostname), $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), AVX-512: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)"

# Each run under a time limit, its failure recorded, the next one run regardless.
run() {
  echo "\$ $*"
  local status=0
  timeout -k 10 -s TERM 900 "$@" 2>&1 || status=$?
  [ "$status" = 0 ] || echo "(exit status $status)"
  return 0
}

for i in $(seq "$runs"); do
  echo
  echo "## run $i of $runs"
  run "${layer[@]}"
  run mpirun -np 2 --oversubscribe "${layer[@]}"
  run "$here/scripts/netns-hosts.sh" -n "$per_host" mpirun "${layer[@]}"
  for r in ${rates//,/ }; do
    run "$here/scripts/netns-hosts.sh" -n "$per_host" --rate-mbit "$r" mpirun "${layer[@]}"
  done
done
