#!/usr/bin/env bash
# The data-parallel exchange of docs/benchmarks.md, side by side in one run, interleaved and
# repeated: `tandem train` at dp=2 with the exchange after the backward, overlapped with it, and
# overlapped with the optimizer state in the host tier and in a file tier, LAMB (one program per bucket,
# a trust ratio per tensor) overlapped, AdamW with --clip-grad-norm (the reductions overlapped, the updates after
# the norm); optionally a sweep of bucket sizes. Same model, batch, threads and backend for every variant; prints each variant's
# median step time and the ratios against "overlap" (state in memory) and "after".
# Usage: bench/run_exchange.sh [BUILD_DIR] [--reps 3] [--warmup-steps 2] [--steps 8]
#            [--backend thread|mpi] [--model "--layers 8 --d-model 512 --heads 8 --seq-len 128 --batch 8"]
#            [--buckets "1 4 16"] [--file-dir DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/steps_common.sh
source "$here/steps_common.sh"
build=build/release
if [[ $# -gt 0 && $1 != --* ]]; then
  build=$1
  shift
fi
reps=3 warmup=2 steps=8 backend=thread buckets="" file_dir=${TMPDIR:-/tmp}
model="--layers 8 --d-model 512 --heads 8 --seq-len 128 --batch 8"
while [[ $# -gt 0 ]]; do
  case $1 in
    --reps) reps=$2 ;;
    --warmup-steps) warmup=$2 ;;
    --steps) steps=$2 ;;
    --backend) backend=$2 ;;
    --model) model=$2 ;;
    --buckets) buckets=$2 ;;
    --file-dir) file_dir=$2 ;;
    *) echo "run_exchange: unknown flag $1 (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
  shift 2
done
tandem=$build/tandem
[[ -x $tandem ]] || { echo "run_exchange: $tandem not found: build tandem first" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

declare -A flags=(
  [after]="--grad-exchange after"
  [overlap]="--grad-exchange overlap"
  [host]="--grad-exchange overlap --optimizer-state host"
  [file]="--grad-exchange overlap --optimizer-state file:$file_dir"
  [lamb]="--grad-exchange overlap --optimizer lamb"
  [clip]="--grad-exchange overlap --clip-grad-norm 1"
)
variants="after overlap host file lamb clip"
for b in $buckets; do
  flags[bucket$b]="--grad-exchange overlap --bucket-mb $b"
  variants+=" bucket$b"
done

run() {  # VARIANT LOG; prints the median step time in ms
  local m v metrics=$out/metrics.jsonl
  read -r -a m <<<"$model"
  read -r -a v <<<"${flags[$1]}"
  local cmd=("$tandem" train --backend "$backend" --dp 2 --tp 1 --pp 1 "${m[@]}" "${v[@]}" --dropout 0
             --steps $((warmup + steps)) --eval-every 0 --threads 1 --quiet --metrics "$metrics")
  [[ $backend == mpi ]] && cmd=(mpirun -np 2 --oversubscribe --bind-to none "${cmd[@]}")
  rm -f "$metrics"
  echo "${cmd[*]}" >"$2"
  "${cmd[@]}" >>"$2" 2>&1 || { cat "$2" >&2; echo "run_exchange: tandem train failed" >&2; exit 1; }
  metrics_step_ms "$metrics" "$warmup"
}

echo "run_exchange: $reps repetitions of $warmup warm-up + $steps timed steps, dp=2 on the $backend backend," \
     "1 thread a rank; model: $model; CPU: $(grep -q avx512f /proc/cpuinfo && echo AVX-512 || echo AVX2);" \
     "started $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= reps; r++)); do
  for v in $variants; do
    ms=$(run "$v" "$out/$v.$r.log")
    echo "$v $ms" >>"$out/results"
    printf 'rep %d %-10s median step %8.1f ms\n' "$r" "$v" "$ms"
    ((r == 1)) && grep -E '^  (memory|data-parallel)' "$out/$v.$r.log" | sed 's/^/    /'
  done
done
echo
echo "medians over $reps repetitions, ms a step; load average now $(cut -d' ' -f1-3 /proc/loadavg):"
declare -A med
for v in $variants; do
  med[$v]=$(awk -v v="$v" '$1 == v { print $2 }' "$out/results" | median)
  printf '  median %s_step_ms %.1f\n' "$v" "${med[$v]}"
done
awk -v a="${med[after]}" -v o="${med[overlap]}" -v h="${med[host]}" -v f="${med[file]}" -v l="${med[lamb]}" \
    -v c="${med[clip]}" 'BEGIN {
  printf "  ratio after_vs_overlap %.3f   (>1: overlapping the exchange with the backward gains)\n", a / o
  printf "  ratio host_state_vs_memory %.3f   (goal <= 1.10)\n", h / o
  printf "  ratio file_state_vs_memory %.3f\n", f / o
  printf "  ratio lamb_vs_adam %.3f   (LAMB: one program per bucket, a trust ratio per tensor)\n", l / o
  printf "  ratio clip_vs_adam %.3f   (gradient clipping: the updates wait for the whole backward)\n", c / o
}'
