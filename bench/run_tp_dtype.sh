#!/usr/bin/env bash
# The tensor-parallel exchanges in bf16 against f32 (docs/benchmarks.md, "Tensor-parallel
# exchanges in bf16"): `tandem train --tp 2 --precision bf16 --tp-dtype f32` and `--tp-dtype
# bf16`, interleaved, repeated, on the thread backend (2 ranks in one process) and on 2 MPI
# processes (`mpirun -np 2 --bind-to none`, as bench/run_bf16_race.sh launches them); prints each
# run's median step (the lead rank's step_s after the warm-up steps), the medians over the
# repetitions and the ratio f32/bf16 of the step times (above 1: bf16 faster). Builds nothing.
# Usage: bench/run_tp_dtype.sh [BUILD_DIR] [--reps 3] [--warmup-steps 2] [--steps 8]
#                              [--threads 1] [--models b]
# Models (bench/run_ddp_race.sh's): a = 4 layers, d_model 256, 4 heads, seq 128, batch 16;
#                                   b = 8 layers, d_model 512, 8 heads, seq 128, batch 8.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build/release
reps=3 warmup=2 steps=8 threads=1 models="b"
# shellcheck source=bench/steps_common.sh
source "$here/steps_common.sh"
parse_race_args run_tp_dtype "$@"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {  # MODEL BACKEND WIRE LOG; prints the median step time in ms of the timed steps
  local flags metrics=$out/metrics.jsonl
  read -r -a flags <<<"$(race_model_flags "$1")"
  local cmd=("$tandem" train --tp 2 --dp 1 --pp 1 "${flags[@]}" --precision bf16 --dropout 0
             --tp-dtype "$3" --steps $((warmup + steps)) --eval-every 0 --threads "$threads"
             --quiet --metrics "$metrics")
  if [[ $2 == mpi ]]; then
    cmd=(mpirun -np 2 --oversubscribe --bind-to none "${cmd[@]}" --backend mpi)
  else
    cmd+=(--backend thread)
  fi
  rm -f "$metrics"
  echo "${cmd[*]}" >"$4"
  "${cmd[@]}" >>"$4" 2>&1 || { cat "$4" >&2; echo "run_tp_dtype: tandem train failed" >&2; exit 1; }
  metrics_step_ms "$metrics" "$warmup"
}

echo "run_tp_dtype: $reps repetitions of $warmup warm-up + $steps timed steps, $threads threads" \
     "a rank; models: $models; CPU: $(lscpu | sed -n 's/^Model name: *//p');" \
     "bf16 flags: $(grep -o -w -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "started $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= reps; r++)); do
  for m in $models; do
    for b in thread mpi; do
      for w in f32 bf16; do
        log=$out/$m.$b.$w.$r.log
        ms=$(run "$m" "$b" "$w" "$log")
        echo "$m $b $w $ms" >>"$out/results"
        printf 'rep %d model %s %-6s --tp-dtype %-4s median step %8.1f ms\n' "$r" "$m" "$b" "$w" "$ms"
        if ((r == 1)); then sed -n '1s/^/    $ /p' "$log"; fi
      done
    done
  done
done

echo
echo "medians over $reps repetitions (min-max), ms a step; load average now" \
     "$(cut -d' ' -f1-3 /proc/loadavg):"
for m in $models; do
  echo "model $m: $(race_model_flags "$m")"
  for b in thread mpi; do
    declare -A med=()
    for w in f32 bf16; do
      v=$(awk -v m="$m" -v b="$b" -v w="$w" '$1 == m && $2 == b && $3 == w { print $4 }' \
        "$out/results")
      med[$w]=$(median <<<"$v")
      printf '  step_ms %s_%s_%s %.1f (%s-%s)\n' "$m" "$b" "$w" "${med[$w]}" \
        "$(sort -g <<<"$v" | head -1)" "$(sort -g <<<"$v" | tail -1)"
    done
    awk -v m="$m" -v b="$b" -v a="${med[f32]}" -v c="${med[bf16]}" \
      'BEGIN { printf "  speed-up %s_%s bf16 over f32 %.3f\n", m, b, a / c }'
  done
done
