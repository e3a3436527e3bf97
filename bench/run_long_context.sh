#!/usr/bin/env bash
# The long-context benchmark of docs/benchmarks.md ("Long context: 8192 tokens in 4 GiB"): GPT-2
# 124M's shape (12 layers, d_model 768, 12 heads) trained at 8192 tokens, batch 1, out-of-core
# under --memory-budget 3GiB with its activations swapped to an O_DIRECT file, for a few steps.
# Prints the CPU (lscpu), the load average before and after, `tandem plan`'s view of the same run
# (the memory estimate and the plan: what takes memory), the run's start-up lines, each step's
# loss and time (--metrics), and the peak resident memory (/usr/bin/time -v) against the goal of
# 4 GiB. The loss must be finite. Peak memory holds on a loaded machine; step times do not (the
# load average says how loaded it was).
# Builds nothing: build tandem first.
# Usage: bench/run_long_context.sh [BUILD_DIR]
# MODEL (default "--layers 12 --d-model 768 --heads 12": GPT-2 124M's blocks; the vocabulary is
# the synthetic corpus's), SEQ (8192), STEPS (3), BUDGET (--memory-budget, 3GiB), GOAL_GIB (4),
# EXTRA (more tandem train flags, not given to tandem plan: e.g. "--optimizer-state file:DIR", or
# "--model-state file:DIR" for Llama-3.2-1B's shape: MODEL="--model llama-3.2-1b") and DIR (the swap file, the logs and the metrics; default
# $TMPDIR/tandem-long-context) may be set.
set -euo pipefail
build=${1:-build/release}
model=(${MODEL:---layers 12 --d-model 768 --heads 12})
seq=${SEQ:-8192}
steps=${STEPS:-3}
budget=${BUDGET:-3GiB}
goal=${GOAL_GIB:-4}
extra=(${EXTRA:-})
dir=${DIR:-${TMPDIR:-/tmp}/tandem-long-context}
mkdir -p "$dir"
if [[ ! -x $build/tandem ]]; then
  echo "run_long_context.sh: $build/tandem not found: build tandem first (or pass BUILD_DIR)" >&2
  exit 1
fi
if [[ ! -x /usr/bin/time ]]; then
  echo "run_long_context.sh: /usr/bin/time is missing (Debian package 'time')" >&2
  exit 1
fi
lscpu | sed -n 's/^Model name: *//p'
echo "AVX-512: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no), AVX512_BF16: $(grep -qw avx512_bf16 /proc/cpuinfo && echo yes || echo no), $(nproc) cores"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

flags=("${model[@]}" --seq-len "$seq" --batch 1 --dp 1 --tp 1 --pp 1 --memory-budget "$budget"
  --slow-tier "file:$dir")
echo "== tandem plan ${flags[*]}"
"$build/tandem" plan "${flags[@]}" 2>&1 | tee "$dir/plan.log"

flags+=("${extra[@]}")
echo "== tandem train ${flags[*]} --steps $steps"
log="$dir/train.log"
rm -f "$dir/metrics.jsonl"
status=0
/usr/bin/time -v "$build/tandem" train "${flags[@]}" --steps "$steps" --eval-every 0 \
  --metrics "$dir/metrics.jsonl" >"$log" 2>&1 || status=$?
sed '/Command being timed/,$d' "$log"  # tandem's own lines, then time's two below
grep -E "Elapsed \(wall clock\)|Maximum resident set size" "$log" | sed 's/^[[:space:]]*/  /'
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ $status != 0 ]]; then
  echo "tandem train failed (exit status $status); its output:"
  tail -n 30 "$log"
  exit 1
fi

echo "== steps (--metrics)"
sed -n 's/.*"step":\([0-9]*\).*"loss":\([0-9.eE+-]*\).*"step_s":\([0-9.eE+-]*\).*/step \1: loss \2, \3 s/p' \
  "$dir/metrics.jsonl"
peak_kb=$(sed -n 's/.*Maximum resident set size (kbytes): *//p' "$log")
awk -v k="$peak_kb" -v g="$goal" 'BEGIN {
  gib = k / 1048576
  printf "peak resident memory: %.2f GiB (goal: at most %g GiB): %s\n", gib, g, gib <= g ? "met" : "NOT met"
}'
if ! grep -q '"loss":[0-9]' "$dir/metrics.jsonl" || grep -Eq '"loss":(nan|inf|-nan|null)' "$dir/metrics.jsonl"; then
  echo "a step's loss is not finite"
  exit 1
fi
