#!/usr/bin/env bash
# The step benchmarks of docs/benchmarks.md, each on 2 in-process ranks and on 2 MPI processes,
# then the cross ratios: tandem on in-process ranks against the baseline on MPI processes (a
# PyTorch DDP user's MPI_Allreduce + fused optimizer loop), from the medians the two runs print.
# Usage: bench/run_steps.sh [BUILD_DIR] [extra flags for the optimizer benchmarks, e.g. --sizes 64Mi]
set -euo pipefail
build=${1:-build/release}
shift || true
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpirun=(mpirun --oversubscribe)
for b in adam_step lamb_step; do
  "$build/bench/bench_$b" "$@" | tee "$out/$b.thread"
  "${mpirun[@]}" -np 2 "$build/bench/bench_$b" "$@" | tee "$out/$b.mpi"
done
"$build/bench/bench_megatron_layer" | tee "$out/megatron.thread"
"${mpirun[@]}" -np 2 "$build/bench/bench_megatron_layer" | tee "$out/megatron.mpi"
"$build/bench/bench_pipeline_stage" | tee "$out/pipeline.thread"
"${mpirun[@]}" -np 4 "$build/bench/bench_pipeline_stage" | tee "$out/pipeline.mpi"

echo
echo "tandem on in-process ranks against the DDP baseline on MPI processes:"
cat "$out"/*.thread "$out"/*.mpi | awk '
  $1 == "median" && $2 ~ /_thread_tandem_ms$/ { k = $2; sub(/_thread_tandem_ms$/, "", k); tandem[k] = $3 }
  $1 == "median" && $2 ~ /_mpi_baseline_ms$/ { k = $2; sub(/_mpi_baseline_ms$/, "", k); base[k] = $3 }
  END { for (k in tandem) if (k in base) printf "ratio %s_thread_vs_mpi_baseline %.3f\n", k, base[k] / tandem[k] }' | sort
