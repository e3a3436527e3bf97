#!/usr/bin/env bash
# The end-to-end race of docs/benchmarks.md: `tandem train` on 2 MPI processes, `tandem train` on
# 2 in-process ranks and PyTorch DDP on 2 processes (bench/pytorch_ddp_gpt.py), the same GPT, batch,
# optimizer and threads per process, interleaved, repeated; prints the median tokens/s of each and
# the ratios tandem-MPI/DDP (the headline: process against process) and tandem-threads/DDP (what
# switching transport adds). Builds nothing: build tandem first.
# Usage: bench/run_ddp_race.sh [BUILD_DIR] [--reps 3] [--warmup-steps 2] [--steps 8] [--threads 1]
#                              [--models "a b"]
# Models: a = 4 layers, d_model 256, 4 heads, seq 128, batch 16;
#         b = 8 layers, d_model 512, 8 heads, seq 128, batch 8 (chosen so that a repetition should
#         stay near a minute on a quiet 2-core machine; under load from builds one of both models
#         took 3.7 minutes).
# Each run takes --warmup-steps untimed steps, then --steps timed ones; its figure is global tokens
# a step over the median step time (tandem: the lead rank's step_s from --metrics; DDP: rank 0's
# clock), and a system's figure is the median over the repetitions. mpirun runs with --bind-to
# none, as the DDP processes run: neither side is pinned. PYTHON picks the interpreter for the
# DDP side (default python3, else /usr/bin/python3 if only that one has torch); without torch the
# DDP side is skipped with a message and no ratio is printed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build/release
reps=3 warmup=2 steps=8 threads=1 models="a b"
# shellcheck source=bench/steps_common.sh
source "$here/steps_common.sh"
parse_race_args run_ddp_race "$@"

py=$(torch_python)
have_torch=1
"$py" -c "import torch" 2>/dev/null || have_torch=0

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT


# tandem train with the model's flags; prints the median step time in ms of the timed steps.
run_tandem() {  # MODEL BACKEND LOG
  local flags metrics=$out/metrics.jsonl
  read -r -a flags <<<"$(race_model_flags "$1")"
  local cmd=("$tandem" train --backend "$2" --dp 2 --tp 1 --pp 1 "${flags[@]}" --dropout 0
             --lr 0.003 --steps $((warmup + steps)) --eval-every 0 --threads "$threads" --quiet --metrics "$metrics")
  [[ $2 == mpi ]] && cmd=(mpirun -np 2 --oversubscribe --bind-to none "${cmd[@]}")
  rm -f "$metrics"
  echo "${cmd[*]}" >"$3"
  "${cmd[@]}" >>"$3" 2>&1 || { cat "$3" >&2; echo "run_ddp_race: tandem train failed" >&2; exit 1; }
  metrics_step_ms "$metrics" "$warmup"
}

run_ddp() {  # MODEL LOG; prints the median step time in ms
  local flags
  read -r -a flags <<<"$(race_model_flags "$1")"
  local cmd=("$py" "$here/pytorch_ddp_gpt.py" --nproc 2 --threads "$threads" "${flags[@]}"
             --warmup-steps "$warmup" --steps "$steps")
  echo "${cmd[*]}" >"$2"
  "${cmd[@]}" >>"$2" 2>&1 || { cat "$2" >&2; echo "run_ddp_race: pytorch_ddp_gpt.py failed" >&2; exit 1; }
  awk '$1 == "median" && $2 == "ddp_step_ms" { print $3 }' "$2"
}

tokens_per_step() {  # MODEL
  local f
  read -r -a f <<<"$(race_model_flags "$1")"
  local seq batch i
  for ((i = 0; i < ${#f[@]}; i += 2)); do
    [[ ${f[i]} == --seq-len ]] && seq=${f[i + 1]}
    [[ ${f[i]} == --batch ]] && batch=${f[i + 1]}
  done
  echo $((seq * batch))
}

systems="tandem-mpi tandem-threads"
((have_torch)) && systems+=" ddp"
echo "run_ddp_race: $reps repetitions of $warmup warm-up + $steps timed steps," \
     "$threads thread(s) a process or rank; models: $models; started $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
((have_torch)) ||
  echo "run_ddp_race: $py has no torch (Debian: apt-get install python3-torch): DDP side skipped"
for ((r = 1; r <= reps; r++)); do
  for m in $models; do
    tokens=$(tokens_per_step "$m")
    for s in $systems; do
      log=$out/$m.$s.$r.log
      case $s in
        tandem-mpi) ms=$(run_tandem "$m" mpi "$log") ;;
        tandem-threads) ms=$(run_tandem "$m" thread "$log") ;;
        ddp) ms=$(run_ddp "$m" "$log") ;;
      esac
      tps=$(awk -v t="$tokens" -v ms="$ms" 'BEGIN { printf "%.0f", t / (ms / 1e3) }')
      echo "$m $s $tps" >>"$out/results"
      printf 'rep %d model %s %-15s median step %8.1f ms  %7s tokens/s\n' "$r" "$m" "$s" "$ms" "$tps"
      if ((r == 1)); then  # what ran, once
        sed -n '1s/^/    $ /p' "$log"
        grep -E '^(tandem train: GPT|PyTorch)' "$log" | sed 's/^/    /' || true
      fi
    done
  done
done

echo
echo "medians over $reps repetitions (min-max), tokens/s; load average now $(cut -d' ' -f1-3 /proc/loadavg):"
declare -A med
for m in $models; do
  echo "model $m: $(race_model_flags "$m")"
  for s in $systems; do
    v=$(awk -v m="$m" -v s="$s" '$1 == m && $2 == s { print $3 }' "$out/results")
    med[$s]=$(median <<<"$v")
    printf '  tokens_per_s %s_%s %.0f (%s-%s)\n' "$m" "${s//-/_}" "${med[$s]}" \
      "$(sort -g <<<"$v" | head -1)" "$(sort -g <<<"$v" | tail -1)"
  done
  if ((have_torch)); then
    awk -v m="$m" -v a="${med[tandem-mpi]}" -v b="${med[tandem-threads]}" -v d="${med[ddp]}" 'BEGIN {
      printf "  ratio %s_tandem_mpi_vs_ddp %.2f   (headline: 2 processes against 2 processes)\n", m, a / d
      printf "  ratio %s_tandem_threads_vs_ddp %.2f   (in-process ranks: what switching transport gives)\n", m, b / d
    }'
  fi
done
