#!/usr/bin/env bash
# The out-of-core benchmark of docs/benchmarks.md: bench_ooc_step on both slow tiers (host memory,
# then an O_DIRECT swap file), then the peak resident memory (/usr/bin/time -v) of two runs of
# `tandem train` on the same model: in-core, and out-of-core at the smallest budget any plan fits
# (read from `tandem plan`), with the difference (the issue's goal: at least 1 GB lower).
# Builds nothing: build bench_ooc_step and tandem first.
# Usage: bench/run_ooc.sh [BUILD_DIR] [extra flags for bench_ooc_step, e.g. --reps 3]
# The model is the issue's (GPT 8 layers, d_model 512, 8 heads, seq 256, batch 16); OOC_MODEL
# replaces it for both the benchmark and the training runs (e.g. a small one to try the script).
# `tandem train` caches its out-of-core profile under ~/.cache/tandem/ooc; `tandem plan` below
# measures it first if it is missing, so the training runs only read it. OOC_TIERS (default
# "host file") names the tiers to benchmark; OOC_TIERS= runs the resident-memory part alone.
set -euo pipefail
build=${1:-build/release}
shift || true
model=(${OOC_MODEL:---layers 8 --d-model 512 --heads 8 --seq-len 256 --batch 16})
swap_dir=${TMPDIR:-/tmp}/tandem-ooc-swap
mkdir -p "$swap_dir"

for t in ${OOC_TIERS-host file}; do
  tier=$t
  [[ $t == file ]] && tier="file:$swap_dir"
  echo "== bench_ooc_step ${model[*]} --tier $tier $*"
  "$build/bench/bench_ooc_step" "${model[@]}" --tier "$tier" "$@"
  echo
done

echo "== peak resident memory of tandem train (${model[*]}, 3 steps)"
train=("$build/tandem" train "${model[@]}" --dp 1 --tp 1 --steps 3 --eval-every 0 --quiet)
plan_out=$("$build/tandem" plan "${model[@]}" --dp 1 --tp 1 --memory-budget 1GiB --slow-tier "file:$swap_dir" 2>&1) || {
  # 1 GiB may be below what any plan needs for a bigger model: the error names the smallest too.
  true
}
smallest=$(sed -n 's/.*smallest budget[^(]*(\([0-9]*\) bytes).*/\1/p' <<<"$plan_out" | head -1)
if [[ -z "$smallest" ]]; then
  echo "could not read the smallest budget from tandem plan's output:"
  echo "$plan_out"
  exit 1
fi
echo "smallest budget any plan fits (tandem plan): $smallest bytes"
if [[ ! -x /usr/bin/time ]]; then
  echo "/usr/bin/time is missing (Debian package 'time'): resident memory not measured"
  exit 0
fi
rss() {  # the command's "Maximum resident set size" in kB; its own output goes to stderr
  local log
  log=$(mktemp)
  /usr/bin/time -v "$@" >&2 2>"$log" || { cat "$log" >&2; rm -f "$log"; return 1; }
  grep -E 'Elapsed \(wall clock\)' "$log" | sed 's/^[[:space:]]*/  /' >&2
  sed -n 's/.*Maximum resident set size (kbytes): *//p' "$log"
  rm -f "$log"
}
echo "in-core:      ${train[*]}"
in_core_kb=$(rss "${train[@]}")
echo "  Maximum resident set size (kbytes): $in_core_kb"
echo "out-of-core:  ${train[*]} --memory-budget $smallest --slow-tier file:$swap_dir"
ooc_kb=$(rss "${train[@]}" --memory-budget "$smallest" --slow-tier "file:$swap_dir")
echo "  Maximum resident set size (kbytes): $ooc_kb"
awk -v a="$in_core_kb" -v b="$ooc_kb" 'BEGIN {
  d = (a - b) * 1024
  verdict = d >= 1e9 ? "met" : "MISSED"
  printf "rss in_core_kb %d ooc_kb %d lower_by %.3f GB (%.3f GiB): goal at least 1 GB lower: %s\n",
         a, b, d / 1e9, d / 1073741824, verdict }'
