#!/usr/bin/env bash
# The Megatron layer and the pipeline stage on links of several speeds: where an overlapped
# schedule (ol(MM,...)) wins, and where it cannot. Each bench retunes for each transport (the
# tuning cache knows the machine, not the link), on:
#   - in-process ranks and MPI processes of one host: the collectives are copies and adds on the
#     cores the GEMMs run on, so an overlap only moves that work onto the GEMM's core;
#   - 2 hosts (scripts/netns-hosts.sh, as root), the veth pair unlimited and limited to each
#     --rates value (Mbit/s each way): a link whose transfers take wire time but no CPU, as a
#     NIC's do, so the GEMM can run while the bytes move. The Megatron layer runs 1 rank a host
#     (its all-reduce crosses the link); the pipeline stage 2 a host, one group on each (its
#     hand-off crosses the link, its group's reduction does not).
# Each configuration --runs times. The benches print the tuned winner, the schedules timed beside
# it, and the perfect-overlap bound from the same run.
# Usage: bench/run_links.sh [BUILD_DIR] [--rates 1000,2000] [--runs 3] [--reps 15]
set -euo pipefail
build=${1:-build/release}
shift || true
rates=1000,2000
runs=3
reps=15
while [ $# -gt 0 ]; do
  case $1 in
    --rates) rates=$2; shift 2;;
    --runs) runs=$2; shift 2;;
    --reps) reps=$2; shift 2;;
    *) echo "run_links.sh: error: unknown flag '$1' (--rates, --runs, --reps)" >&2; exit 2;;
  esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
layer=("$build/bench/bench_megatron_layer" --retune --reps "$reps" --tune-reps 1)
stage=("$build/bench/bench_pipeline_stage" --retune --reps "$reps" --tune-reps 1)
for b in "${layer[0]}" "${stage[0]}"; do
  [ -x "$b" ] || { echo "run_links.sh: error: $b is not built" >&2; exit 1; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "# run_links.sh on $(hostname), $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), AVX-512: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)"

# shellcheck source=bench/steps_common.sh
. "$here/bench/steps_common.sh"

# COMMAND on NP in-process ranks (its default), NP MPI processes of this host, and two hosts of
# PER_HOST ranks each, the link unlimited and at each rate.
on_every_transport() {  # NP PER_HOST COMMAND...
  local np=$1 per_host=$2
  shift 2
  run_limited "$@"
  run_limited mpirun -np "$np" --oversubscribe "$@"
  run_limited "$here/scripts/netns-hosts.sh" -n "$per_host" mpirun "$@"
  for r in ${rates//,/ }; do
    run_limited "$here/scripts/netns-hosts.sh" -n "$per_host" --rate-mbit "$r" mpirun "$@"
  done
}

for i in $(seq "$runs"); do
  echo
  echo "## run $i of $runs"
  on_every_transport 2 1 "${layer[@]}"
  on_every_transport 4 2 "${stage[@]}"
done
