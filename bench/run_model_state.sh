#!/usr/bin/env bash
# The model-state benchmark of docs/benchmarks.md: a GPT trained with its blocks' weights,
# gradients and optimizer state in a file tier (--model-state file:DIR), its peak resident memory
# measured by /usr/bin/time -v, its step time beside two bounds measured in the same run: compute
# (the step's matmul FLOPs at bench_gemm's rate, measured before and after the run: the higher,
# since a roof measured while something else ran would flatter the ratio) and I/O (the model state's bytes a step, from the
# run's own summary, at the disk's O_DIRECT bandwidth measured with dd).
# Builds nothing: build tandem and bench_gemm first.
# Usage: bench/run_model_state.sh [BUILD_DIR]
# MODEL (default GPT-2 XL's shape: --model gpt2-xl --batch 4 --micro-batches 4, 4096 tokens a step:
# enough that compute can cover the I/O), STEPS (default
# 4: the first is the warm-up), BUDGET (--memory-budget for the activations, default 2GiB) and
# DIR (where the tier, the activations' swap file and the logs go; default $TMPDIR) may be set;
# STATE=memory trains the same model with its state in memory (the in-core baseline; BUDGET=none
# drops --memory-budget too).
set -euo pipefail
build=${1:-build/release}
model=(${MODEL:---model gpt2-xl --batch 4 --micro-batches 4})
steps=${STEPS:-4}
budget=${BUDGET:-2GiB}
dir=${DIR:-${TMPDIR:-/tmp}/tandem-model-state}
mkdir -p "$dir"
lscpu | sed -n 's/^Model name: *//p'

sgemm() { "$build/bench/bench_gemm" | awk '$1 == 2048 { print $3 }'; }
echo "== the roofs, measured now"
gemm=$(sgemm)
echo "SGEMM n=2048: $gemm GFLOP/s"
gb_per_s() {  # dd's last line ("..., 1.3 GB/s" or "..., 900 MB/s") in GB/s
  awk '/copied/ { u = $NF; v = $(NF - 1); print (u == "GB/s") ? v : (u == "MB/s") ? v / 1000 : v / 1e6 }'
}
write_bw=$(dd if=/dev/zero of="$dir/bw" bs=16M count=128 oflag=direct 2>&1 | gb_per_s)
read_bw=$(dd if="$dir/bw" of=/dev/null bs=16M iflag=direct 2>&1 | gb_per_s)
rm -f "$dir/bw"
echo "O_DIRECT 2 GiB in 16 MiB transfers: write $write_bw GB/s, read $read_bw GB/s"

flags=()
[[ $budget != none ]] && flags+=(--memory-budget "$budget" --slow-tier "file:$dir")
[[ ${STATE:-file} != memory ]] && flags+=(--model-state "file:$dir")
echo "== tandem train ${model[*]} --steps $steps ${flags[*]}"
log="$dir/train.log"
rm -f "$dir/metrics.jsonl"
/usr/bin/time -v "$build/tandem" train "${model[@]}" --dp 1 --tp 1 --steps "$steps" \
  --eval-every 0 "${flags[@]}" --metrics "$dir/metrics.jsonl" >"$log" 2>&1 || {
  cat "$log"
  exit 1
}
grep -E "^tandem train|memory estimate|model state|out-of-core" "$log"
gemm_after=$(sgemm)
echo "SGEMM n=2048 after the run: $gemm_after GFLOP/s (the bound uses the higher)"
gemm=$(awk -v a="$gemm" -v b="$gemm_after" 'BEGIN { print (a > b) ? a : b }')
peak_kb=$(sed -n 's/.*Maximum resident set size (kbytes): *//p' "$log")
echo "peak resident memory: $(awk -v k="$peak_kb" 'BEGIN { printf "%.2f GiB", k / 1048576 }')"

# The steps after the first, from the metrics file.
times=$(sed -n 's/.*"step_s":\([0-9.e+-]*\).*/\1/p' "$dir/metrics.jsonl" | tail -n +2 | sort -g)
median=$(awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }' <<<"$times")
gib() {  # "1.23 GiB" / "456.0 MiB" / "12.0 KiB" / "7 B" in GiB
  awk '{ f = ($2 == "GiB") ? 1 : ($2 == "MiB") ? 1 / 1024 : ($2 == "KiB") ? 1 / 1048576 : 1 / 1073741824; printf "%.4f", $1 * f }' <<<"$1"
}
traffic="0 0"
if line=$(grep "model state (rank 0):" "$log"); then
  read_h=$(sed -n 's/.*(rank 0): \([0-9.]* [KMG]*i*B\) read.*/\1/p' <<<"$line")
  written_h=$(sed -n 's/.* read and \([0-9.]* [KMG]*i*B\) written.*/\1/p' <<<"$line")
  traffic="$(gib "$read_h") $(gib "$written_h")"
fi
# The step's matmul FLOPs, forward and backward, no recomputation: the performance model's
# (perf/flops.h), from the run's "work:" start-up line.
flops=$(sed -n 's/^  work: .* FLOP a token, \([0-9.e+]*\) a step.*/\1/p' "$log")
awk -v flops="$flops" -v g="$gemm" -v tr="$traffic" \
  -v rb="$read_bw" -v wb="$write_bw" -v med="$median" 'BEGIN {
  split(tr, b, " ")
  compute = flops / (g * 1e9)
  io = b[1] * 1.073741824 / rb + b[2] * 1.073741824 / wb
  bound = compute > io ? compute : io
  printf "step (median of the steps after the first): %.1f s\n", med
  printf "compute bound: %.3g FLOP at %.0f GFLOP/s = %.1f s\n", flops, g, compute
  printf "I/O bound: %.2f GiB read at %.2f GB/s + %.2f GiB written at %.2f GB/s = %.1f s\n", b[1], rb, b[2], wb, io
  printf "step / max(bounds) = %.2f (goal: at most 1.25)\n", med / bound
}'
