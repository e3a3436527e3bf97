#!/usr/bin/env bash
# tandem bf16 against tandem fp32 (docs/benchmarks.md, "bf16 matmuls"): `tandem train
# --precision fp32` and `--precision bf16` on one rank with the same threads, interleaved,
# repeated, on the two race models; prints each run's median step, the medians over the
# repetitions in tokens/s and the ratio bf16/fp32. Builds nothing: build tandem first.
# Usage: bench/run_precision.sh [BUILD_DIR] [--reps 3] [--warmup-steps 2] [--steps 8]
#                               [--threads 2] [--models "a b"]
# Models (bench/run_ddp_race.sh's): a = 4 layers, d_model 256, 4 heads, seq 128, batch 16;
#                                   b = 8 layers, d_model 512, 8 heads, seq 128, batch 8.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build/release
reps=3 warmup=2 steps=8 threads=2 models="a b"
# shellcheck source=bench/steps_common.sh
source "$here/steps_common.sh"
parse_race_args run_precision "$@"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {  # MODEL PRECISION LOG; prints the median step time in ms of the timed steps
  local flags metrics=$out/metrics.jsonl
  read -r -a flags <<<"$(race_model_flags "$1")"
  local cmd=("$tandem" train --dp 1 --tp 1 --pp 1 "${flags[@]}" --dropout 0 --precision "$2"
             --steps $((warmup + steps)) --eval-every 0 --threads "$threads" --quiet
             --metrics "$metrics")
  rm -f "$metrics"
  echo "${cmd[*]}" >"$3"
  "${cmd[@]}" >>"$3" 2>&1 || { cat "$3" >&2; echo "run_precision: tandem train failed" >&2; exit 1; }
  metrics_step_ms "$metrics" "$warmup"
}

echo "run_precision: $reps repetitions of $warmup warm-up + $steps timed steps, $threads threads;" \
     "models: $models; CPU: $(lscpu | sed -n 's/^Model name: *//p');" \
     "bf16 flags: $(grep -o -w -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "started $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= reps; r++)); do
  for m in $models; do
    read -r -a f <<<"$(race_model_flags "$m")"
    tokens=$((f[7] * f[9]))  # seq_len x batch
    for p in fp32 bf16; do
      log=$out/$m.$p.$r.log
      ms=$(run "$m" "$p" "$log")
      tps=$(awk -v t="$tokens" -v ms="$ms" 'BEGIN { printf "%.0f", t / (ms / 1e3) }')
      echo "$m $p $tps" >>"$out/results"
      printf 'rep %d model %s %-5s median step %8.1f ms  %7s tokens/s\n' "$r" "$m" "$p" "$ms" "$tps"
      if ((r == 1)); then  # what ran, once
        sed -n '1s/^/    $ /p' "$log"
        grep -E '^ *precision ' "$log" | sed 's/^ */    /' || true
      fi
    done
  done
done

echo
echo "medians over $reps repetitions (min-max), tokens/s; load average now $(cut -d' ' -f1-3 /proc/loadavg):"
for m in $models; do
  echo "model $m: $(race_model_flags "$m")"
  declare -A med=()
  for p in fp32 bf16; do
    v=$(awk -v m="$m" -v p="$p" '$1 == m && $2 == p { print $3 }' "$out/results")
    med[$p]=$(median <<<"$v")
    printf '  tokens_per_s %s_%s %.0f (%s-%s)\n' "$m" "$p" "${med[$p]}" \
      "$(sort -g <<<"$v" | head -1)" "$(sort -g <<<"$v" | tail -1)"
  done
  awk -v m="$m" -v a="${med[bf16]}" -v b="${med[fp32]}" \
    'BEGIN { printf "  ratio %s_bf16_vs_fp32 %.2f\n", m, a / b }'
done
