#!/usr/bin/env bash
# Context parallelism's step time (docs/training.md, "Context parallelism"): GPT-2 124M's shape
# (12 layers, d_model 768, 12 heads) at each sequence length of SEQS, batch 1, trained on one rank
# (--cp 1) and with the sequence split over 2 ranks (--cp 2), in-process (--backend thread) and,
# where mpirun is present, as 2 MPI processes. Every configuration uses THREADS BLAS threads in
# all (a cp=2 rank gets half). Prints the CPU and the load average, each run's median step time
# after the first WARMUP steps (--metrics' step_s) and the ratio cp=1 / cp=2 (above 1: the split
# is faster); for cp=2 also the step with the kv exchanges in the sequential order
# (TANDEM_CP_ORDER=sequential) and in the ring order (TANDEM_CP_ORDER=ring: the pieces passed
# round, ring attention) and, from the overlapped run's summary, the share of the exchanges' time
# the products hid (rank 0, every step, the warm-up ones too). The kv exchanges run the autotuner's schedules when its cache has them: run
# `tandem train ... --cp 2 --tune --steps 1` once per sequence length first to make them.
# Builds nothing: build tandem first.
# Usage: bench/run_context_parallel.sh [BUILD_DIR]
# SEQS (default "2048 4096 8192"), STEPS (6), WARMUP (2), THREADS (nproc), DIR (logs and metrics;
# default $TMPDIR/tandem-cp) may be set.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/steps_common.sh
source "$here/steps_common.sh"
build=${1:-build/release}
seqs=${SEQS:-2048 4096 8192}
steps=${STEPS:-6}
warmup=${WARMUP:-2}
threads=${THREADS:-$(nproc)}
dir=${DIR:-${TMPDIR:-/tmp}/tandem-cp}
mkdir -p "$dir"
if [[ ! -x $build/tandem ]]; then
  echo "run_context_parallel.sh: $build/tandem not found: build tandem first (or pass BUILD_DIR)" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
lscpu | sed -n 's/^Model name: *//p'
echo "$(nproc) cores, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# One run; prints its median step time in ms. HOW: thread or mpi; ORDER: TANDEM_CP_ORDER.
step_ms() {  # SEQ CP HOW [ORDER]
  local order=${4:-overlap}
  local metrics="$dir/metrics-$1-cp$2-$3-$order.jsonl" log="$dir/train-$1-cp$2-$3-$order.log"
  local cmd=(env TANDEM_CP_ORDER="$order" "$build/tandem" train --layers 12 --d-model 768 --heads 12 --seq-len "$1" --batch 1
    --dp 1 --tp 1 --pp 1 --cp "$2" --dropout 0 --steps $((warmup + steps)) --eval-every 0
    --threads $((threads / $2)) --quiet --metrics "$metrics" --backend "$3")
  [[ $3 == mpi ]] && cmd=(mpirun -np "$2" --oversubscribe --bind-to none -x TANDEM_CP_ORDER="$order" "${cmd[@]:2}")
  rm -f "$metrics"
  echo "${cmd[*]}" >"$log"
  "${cmd[@]}" >>"$log" 2>&1 || { cat "$log" >&2; echo "run_context_parallel.sh: failed" >&2; exit 1; }
  metrics_step_ms "$metrics" "$warmup"
}

hows=(thread)
command -v mpirun >/dev/null && hows+=(mpi)
# The share the overlapped cp=2 run's summary gives (e.g. "83%").
hidden() {  # SEQ HOW
  sed -n 's/.*kv exchanges ran .*(\([0-9]*%\) hidden).*/\1/p' "$dir/train-$1-cp2-$2-overlap.log"
}

printf '%-6s %-7s %12s %12s %14s %15s %8s %7s\n' seq backend "cp=1 ms" "cp=2 ms" "cp=2 seq. ms" \
  "cp=2 ring ms" "1/2" hidden
for seq in $seqs; do
  one=$(step_ms "$seq" 1 thread)  # one rank: the backend does not matter
  for how in "${hows[@]}"; do
    two=$(step_ms "$seq" 2 "$how")
    seq_two=$(step_ms "$seq" 2 "$how" sequential)
    ring_two=$(step_ms "$seq" 2 "$how" ring)
    printf '%-6s %-7s %12.1f %12.1f %14.1f %15.1f %8.2f %7s\n' "$seq" "$how" "$one" "$two" \
      "$seq_two" "$ring_two" "$(awk -v a="$one" -v b="$two" 'BEGIN { print a / b }')" "$(hidden "$seq" "$how")"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
