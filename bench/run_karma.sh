#!/usr/bin/env bash
# KARMA's claim measured (docs/benchmarks.md): a GPT whose model state does not fit one rank's
# memory, trained on 2 and 4 ranks under the same per-rank limit by every configuration that
# `tandem plan --ranks N --memory-per-rank M` finds fits: data-parallel with --shard weights and
# the activations out-of-core (KARMA's side; --shard moments where it fits) against tensor- and
# pipeline-parallel in-core and their hybrids, all with the same global batch. Each on in-process
# ranks, MPI processes of this host, and two hosts (scripts/netns-hosts.sh, as root) with the link
# limited to each --rates value (Mbit/s each way). For every configuration: the median step over
# --runs runs (each the median of its steps after the first), tokens/s, the bound (rank 0's
# compute phases, forward + backward, from the same run's --metrics), the plan's prediction for
# that transport (the link measured in-process on one host, stated with --link-gbps across
# hosts) and measured / predicted. A configuration that fails prints its error and the script
# goes on. Builds nothing: build tandem first.
#   bench/run_karma.sh build/release | tee docs/results/DATE-karma.txt
# Usage: bench/run_karma.sh [BUILD_DIR] [--runs 3] [--steps 3] [--ranks 2,4] [--rates 1000,10000]
#   [--transports thread,mpi,hosts] [--memory-per-rank 2:SIZE,4:SIZE] [--model "FLAGS"]
#   [--replan EARLIER_OUTPUT]: no training; the plans made now beside that output's measurements
#   (the same flags as that run; rows of rank counts and transports not asked for are skipped).
#   --model takes any model flags with --batch and --seq-len among them, a Llama shape too:
#   --model "--arch llama --kv-heads 2 --layers 4 --d-model 512 --heads 8 --seq-len 128 --batch 8"
set -euo pipefail
build=build/release
if [[ $# -gt 0 && $1 != --* ]]; then
  build=$1
  shift
fi
runs=3
steps=3
ranks_list=2,4
rates=1000,10000
transports=thread,mpi,hosts
replan=
# 4 layers, d_model 512 (12.8M parameters: 196 MiB of weights, gradients and Adam moments; 1024
# tokens a step). One rank would need about 420 MiB with its activations; a rank may hold 175 MiB
# of 2 ranks, 100 MiB of 4.
model="--layers 4 --d-model 512 --heads 8 --seq-len 128 --batch 8"
limits=2:175MiB,4:100MiB
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) runs=$2 ;;
    --steps) steps=$2 ;;
    --ranks) ranks_list=$2 ;;
    --rates) rates=$2 ;;
    --transports) transports=$2 ;;
    --memory-per-rank) limits=$2 ;;
    --model) model=$2 ;;
    --replan) replan=$2 ;;
    *) echo "run_karma.sh: error: unknown flag '$1' (see the usage at the top of the script)" >&2; exit 2 ;;
  esac
  shift 2
done
here=$(cd "$(dirname "$0")/.." && pwd)
tandem=$build/tandem
[[ -x $tandem ]] || { echo "run_karma.sh: error: $tandem is not built" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck source=bench/steps_common.sh
. "$here/bench/steps_common.sh"
read -r -a model_flags <<<"$model"
# Tokens a step, for tokens/s: the model's --batch x --seq-len.
tokens=$(awk '{ for (i = 1; i < NF; ++i) { if ($i == "--batch") b = $(i + 1); if ($i == "--seq-len") s = $(i + 1) } }
  END { print b * s }' <<<"$model")
[[ $tokens -gt 0 ]] || { echo "run_karma.sh: error: --model '$model' must give --batch and --seq-len" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/run_karma.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cores=$(nproc)

echo "# run_karma.sh on $(hostname), $(date -u +%FT%TZ), $cores cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p'), AVX-512: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)"
echo "# model: $model; --runs $runs, --steps $steps (the first a warm-up), per-rank limits $limits"

limit_of() {  # N: the per-rank limit for N ranks
  local kv
  for kv in ${limits//,/ }; do
    [[ ${kv%%:*} == "$1" ]] && { echo "${kv#*:}"; return; }
  done
  echo "run_karma.sh: error: --memory-per-rank names no limit for $1 ranks ($limits)" >&2
  exit 2
}
bytes_of() {  # "130MiB" -> bytes
  awk -v s="$1" 'BEGIN { n = s + 0; u = s; sub(/^[0-9.]+/, "", u)
    f = (u == "GiB") ? 2^30 : (u == "MiB") ? 2^20 : (u == "KiB") ? 2^10 : 1; printf "%.0f", n * f }'
}
# The transports: "thread", "mpi", "hosts:RATE" (two hosts, the link at RATE Mbit/s).
transport_list=()
for t in ${transports//,/ }; do
  if [[ $t == hosts ]]; then
    for r in ${rates//,/ }; do transport_list+=("hosts:$r"); done
  else
    transport_list+=("$t")
  fi
done

# One plan a rank count and transport: its table rows, "step_s tokens/s [flags]", in
# $tmp/plan-N-T.rows; the whole report echoed.
plan_for() {  # N TRANSPORT
  local n=$1 t=$2 threads=$((cores / $1 > 0 ? cores / $1 : 1)) link=()
  [[ $t == hosts:* ]] && link=(--link-gbps "$(awk -v r="${t#hosts:}" 'BEGIN { print r / 1000 }')")
  echo
  echo "## plan: $n ranks, $(limit_of "$n") a rank, transport $t"
  local out=$tmp/plan-$n-${t/:/-}
  run_limited "$tandem" plan "${model_flags[@]}" --threads "$threads" --ranks "$n" \
    --memory-per-rank "$(limit_of "$n")" "${link[@]}" | tee "$out.txt"
  # A row: "* dp=2 tp=1 pp=1 ... 0.1234s  12345  a + b + ... [--dp 2 ...]" (its first two
  # characters mark the recommendation, "*", and its ties, "=").
  sed -n 's/^[*= ] dp=.* \([0-9.]*\)s *\([0-9]*\)  .*\[\(.*\)\]$/\1 \2 \3/p' "$out.txt" >"$out.rows"
}

# One training run: the median step after the first (ms), and rank 0's forward + backward phases
# over those steps (ms), into $tmp/last; the run's summary lines echoed.
train_once() {  # N TRANSPORT FLAGS...
  local n=$1 t=$2
  shift 2
  local threads=$((cores / n > 0 ? cores / n : 1)) limit
  limit=$(bytes_of "$(limit_of "$n")")
  local metrics=$tmp/metrics.jsonl log=$tmp/train.log
  rm -f "$metrics"
  local args=("$tandem" train "${model_flags[@]}" "$@" --steps "$steps" --eval-every 0 --quiet
    --threads "$threads" --metrics "$metrics")
  local cmd
  case $t in
    thread) cmd=(env TANDEM_MEMORY_LIMIT=$((limit * n)) "${args[@]}") ;;
    mpi) cmd=(env TANDEM_MEMORY_LIMIT=$((limit * n)) mpirun -np "$n" --oversubscribe --bind-to none
      "${args[@]}" --backend mpi) ;;
    hosts:*) cmd=(env TANDEM_MEMORY_LIMIT=$((limit * n / 2)) "$here/scripts/netns-hosts.sh"
      -n $((n / 2)) --rate-mbit "${t#hosts:}" mpirun --bind-to none "${args[@]}" --backend mpi) ;;
  esac
  echo "\$ ${cmd[*]}" >"$log"
  local status=0
  timeout -k 10 -s TERM 900 "${cmd[@]}" </dev/null >>"$log" 2>&1 || status=$?
  if [[ $status != 0 || ! -s $metrics ]]; then
    echo "  failed (exit status $status): $(grep -m1 -E 'error|skipped' "$log" || tail -n1 "$log")"
    echo "fail" >"$tmp/last"
    return 0
  fi
  local step fb
  step=$(metrics_step_ms "$metrics" 1)
  fb=$(awk 'match($0, /"step":[0-9]+/) {
      s = substr($0, RSTART + 7, RLENGTH - 7) + 0
      if (s > 1) {
        f = match($0, /"forward":[0-9.eE+-]+/) ? substr($0, RSTART + 10, RLENGTH - 10) : 0
        b = match($0, /"backward":[0-9.eE+-]+/) ? substr($0, RSTART + 11, RLENGTH - 11) : 0
        print (f + b) * 1e3
      }
    }' "$metrics" | median)
  echo "  step $step ms, rank 0 forward+backward $fb ms; $(grep -m1 -E '^tandem train: [0-9]+ steps' "$log")"
  echo "$step $fb" >"$tmp/last"
}

# A summary row: "| N | TRANSPORT | FLAGS | tokens/s | step ms | bound ms | predicted ms | ratio |".
summary_row() {  # N TRANSPORT FLAGS STEP_MS BOUND_MS PREDICTED_S NOTE
  awk -v n="$1" -v t="$2" -v c="$3" -v s="$4" -v fb="$5" -v p="$6" -v tk="$tokens" -v note="$7" 'BEGIN {
    printf "| %s | %s | %s | %.0f | %.1f | %.1f | %.1f | %.2f |%s\n", n, t, c, tk / (s / 1e3), s, fb,
      p * 1e3, s / (p * 1e3), note
  }'
}
summary_head() {
  echo
  echo "## summary: medians over $runs runs; tokens/s = batch x seq / step; bound = rank 0's forward + backward (compute only, same runs); ratio = measured / predicted step"
  echo "| ranks | transport | configuration | tokens/s | step ms | bound ms | predicted ms | ratio |"
  echo "|---|---|---|---|---|---|---|---|"
}

if [[ -n $replan ]]; then
  # The measured rows of an earlier output against the plans made now.
  for n in ${ranks_list//,/ }; do
    for t in "${transport_list[@]}"; do plan_for "$n" "$t"; done
  done
  summary_head
  grep -E '^\| [0-9]+ \| ' "$replan" | while IFS='|' read -r _ n t flags _ step fb _; do
    n=${n// /} t=${t// /} flags=$(sed 's/^ *//; s/ *$//' <<<"$flags")
    rows=$tmp/plan-$n-${t/:/-}.rows
    [[ -f $rows ]] || continue  # a rank count or transport not asked for now
    pred=$(awk -v f="$flags" '{ p = $1; $1 = ""; $2 = ""; sub(/^ +/, ""); if ($0 == f) print p }' "$rows" 2>/dev/null)
    if [[ -z $pred ]]; then
      echo "| $n | $t | $flags | | ${step// /} | ${fb// /} | (not in the plan now) | |"
    else
      summary_row "$n" "$t" "$flags" "${step// /}" "${fb// /}" "$pred" ""
    fi
  done
  exit 0
fi

for n in ${ranks_list//,/ }; do
  for t in "${transport_list[@]}"; do plan_for "$n" "$t"; done
done

# Runs outermost, so that a drift of the machine's speed spreads over every configuration.
for i in $(seq "$runs"); do
  for n in ${ranks_list//,/ }; do
    for t in "${transport_list[@]}"; do
      rows=$tmp/plan-$n-${t/:/-}.rows
      [[ -s $rows ]] || continue
      while read -r _ _ flags <&3; do
        echo
        echo "## run $i of $runs: $n ranks, $t: $flags"
        read -r -a f <<<"$flags"
        train_once "$n" "$t" "${f[@]}"
        key=$(echo "$n|$t|$flags" | md5sum | cut -c1-12)
        cat "$tmp/last" >>"$tmp/res-$key"
      done 3<"$rows"
    done
  done
done

summary_head
for n in ${ranks_list//,/ }; do
  for t in "${transport_list[@]}"; do
    rows=$tmp/plan-$n-${t/:/-}.rows
    [[ -s $rows ]] || { echo "| $n | $t | (no plan: see its output above) | | | | | |"; continue; }
    while read -r pred _ flags; do
      key=$(echo "$n|$t|$flags" | md5sum | cut -c1-12)
      res=$tmp/res-$key
      if ! grep -qv fail "$res" 2>/dev/null; then
        echo "| $n | $t | $flags | failed | | | $(awk -v p="$pred" 'BEGIN { printf "%.1f", p * 1e3 }') | |"
        continue
      fi
      ok=$(grep -vc fail "$res")
      all=$(wc -l <"$res")
      note=""
      [[ $ok -lt $all ]] && note=" $ok of $all runs"
      summary_row "$n" "$t" "$flags" "$(grep -v fail "$res" | cut -d' ' -f1 | median)" \
        "$(grep -v fail "$res" | cut -d' ' -f2 | median)" "$pred" "$note"
    done <"$rows"
  done
done
