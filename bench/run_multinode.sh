#!/usr/bin/env bash
# 4 MPI ranks as 2 nodes of 2, two ways: the forced grouping on one host (TANDEM_RANKS_PER_NODE=2,
# every byte between ranks of different nodes over TCP loopback) and two namespaced hosts joined
# by a veth pair (scripts/netns-hosts.sh, as root; left out with a note elsewhere), and first one
# node of 2 ranks for the node's own part. In each: bench_collectives' all-reduce rows (tandem
# hierarchical or Direct, tandem flat ring, MPI_Allreduce) and bench_adam_step (the fused Adam
# step against MPI_Allreduce + AdamW). bench/multinode_model.py fits docs/multi-node.md's model
# on the output:
#   bench/run_multinode.sh build/release | tee out.txt; bench/multinode_model.py out.txt
# Usage: bench/run_multinode.sh [BUILD_DIR] [--sizes MIB,...] [--adam-size 64Mi] [--reps N]
set -euo pipefail
build=${1:-build/release}
shift || true
sizes=1,4,16,64,256
adam=64Mi
reps=5
while [ $# -gt 0 ]; do
  case $1 in
    --sizes) sizes=$2; shift 2;;
    --adam-size) adam=$2; shift 2;;
    --reps) reps=$2; shift 2;;
    *) echo "run_multinode.sh: error: unknown flag '$1' (--sizes, --adam-size, --reps)" >&2; exit 2;;
  esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
for b in bench_collectives bench_adam_step; do
  [ -x "$build/bench/$b" ] || { echo "run_multinode.sh: error: $build/bench/$b is not built" >&2; exit 1; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
collectives=("$build/bench/bench_collectives" --sizes "$sizes" --reps "$reps" --warmup 1)
adam_step=("$build/bench/bench_adam_step" --sizes "$adam" --dtypes f32 --reps "$reps" --warmup 1 --tune-reps 1)

echo "# run_multinode.sh on $(hostname), $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"

# shellcheck source=bench/steps_common.sh
. "$here/bench/steps_common.sh"

echo
echo "## one node: mpirun -np 2 (the node's part of the model: Direct all-reduce, Adam on one node)"
one=(mpirun -np 2 --oversubscribe)
run_limited "${one[@]}" "${collectives[@]}"
run_limited "${one[@]}" "${adam_step[@]}"

echo
echo "## two hosts in network namespaces, 2 ranks each, TCP over a veth pair"
hosts=("$here/scripts/netns-hosts.sh" mpirun)
run_limited "${hosts[@]}" "${collectives[@]}"
run_limited "${hosts[@]}" "${adam_step[@]}"

echo
echo "## forced nodes: TANDEM_RANKS_PER_NODE=2 mpirun -np 4 --oversubscribe --mca btl tcp,self"
forced=(env TANDEM_RANKS_PER_NODE=2 mpirun -np 4 --oversubscribe --mca btl tcp,self)
run_limited "${forced[@]}" "${collectives[@]}"
run_limited "${forced[@]}" "${adam_step[@]}"
