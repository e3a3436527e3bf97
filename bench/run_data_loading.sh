#!/usr/bin/env bash
# Data loading against a step, and memory against the corpus (docs/benchmarks.md, "Data loading"):
# the changelogs Debian's packages ship (/usr/share/doc/*/changelog*.gz, unpacked, as
# bench/run_text.sh does) tokenized into two corpora of token shards, a small one (the first
# SMALL_MB of the text) and a large one (the whole text COPIES times over, hard links to one file),
# and the same small model trained STEPS steps on each, with --trace and under /usr/bin/time -v.
# Prints, for each corpus:
#   1. peak resident memory (/usr/bin/time -v's maximum resident set size), and the largest
#      anonymous (RssAnon) and file-backed (RssFile) resident memory polled from /proc/PID/status:
#      the shards are memory-mapped, and the pages a step reads count in RSS as file pages until
#      the drawn batch releases them (the largest Rss of the shards' mappings, from
#      /proc/PID/smaps, is printed apart), while the process's own memory is RssAnon;
#   2. the time each step spends drawing its batch (the trace's "data" row: windows copied out of
#      the mapped shards, then their pages released) against the step's time (--metrics' step_s),
#      medians after the first step.
# Builds nothing: build tandem first. Usage: bench/run_data_loading.sh [BUILD_DIR]; VOCAB (default
# 4096), STEPS (default 20), SMALL_MB (default 64), COPIES (default 3) and DIR (default $TMPDIR)
# may be set.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/steps_common.sh
source "$here/steps_common.sh"
build=${1:-build/release}
tandem=$build/tandem
vocab=${VOCAB:-4096}
steps=${STEPS:-20}
small_mb=${SMALL_MB:-64}
copies=${COPIES:-3}
dir=${DIR:-${TMPDIR:-/tmp}/tandem-data-loading}
# The model: activations of about 50 MB (the memory estimate says), against corpora of about as
# much and of several times as much token data.
batch=8
model="--layers 2 --d-model 256 --heads 4 --seq-len 128 --batch $batch"
[[ -x $tandem ]] || { echo "run_data_loading: $tandem not found: build tandem first" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$dir/text" "$dir/small" "$dir/large" "$dir/part"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "started $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"

# The text: every changelog in a fixed order, its few bytes that are not UTF-8 dropped.
find /usr/share/doc -name 'changelog*.gz' | LC_ALL=C sort | xargs zcat -f 2>/dev/null |
  iconv -c -f UTF-8 -t UTF-8 >"$dir/text/changelogs.txt" || true
head -c $((small_mb * 1000000)) "$dir/text/changelogs.txt" | sed '$d' >"$dir/small/changelogs-part.txt"
for i in $(seq 1 "$copies"); do ln "$dir/text/changelogs.txt" "$dir/large/changelogs-$i.txt"; done
head -c 8000000 "$dir/text/changelogs.txt" | sed '$d' >"$dir/part/changelogs-8mb.txt"
mb() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1e6 }'; }
echo "text: $(mb "$(stat -c %s "$dir/text/changelogs.txt")") MB of Debian changelogs; small corpus: its first $small_mb MB; large: all of it $copies times"

echo "== the tokenizer: BPE, $vocab pieces, trained by tandem tokenize on the first 8 MB"
"$tandem" tokenize "$dir/part" --out "$dir/tok" --vocab-size "$vocab" --quiet | tail -1
for c in small large; do
  s=$(/usr/bin/time -f %e "$tandem" tokenize "$dir/$c" --tokenizer "$dir/tok/tokenizer.model" \
    --out "$dir/$c-shards" --quiet 2>&1 >/dev/null | tail -1)
  echo "$c corpus: $(du -sm "$dir/$c-shards" | cut -f1) MB of shards, tokenized in $s s"
done

# The largest RssAnon, RssFile, and resident pages of the mapped shards (in kB) of the child of
# PID (tandem under /usr/bin/time) while it lives, polled every 0.2 s.
poll_rss() {  # PID
  local child="" anon=0 file=0 shards=0 a f m
  while [[ -z $child && -e /proc/$1 ]]; do
    child=$(cut -d' ' -f1 "/proc/$1/task/$1/children" 2>/dev/null) || true
    sleep 0.05
  done
  while [[ -n $child && -r /proc/$child/status ]]; do
    read -r a f < <(awk '/^RssAnon:/ { a = $2 } /^RssFile:/ { f = $2 } END { print a + 0, f + 0 }' \
      "/proc/$child/status" 2>/dev/null || echo "0 0")
    m=$(awk '/^[0-9a-f]+-[0-9a-f]+ / { file = $6 } /^Rss:/ && file ~ /-shards\/.*\.bin$/ { s += $2 }
      END { print s + 0 }' "/proc/$child/smaps" 2>/dev/null || echo 0)
    ((a > anon)) && anon=$a
    ((f > file)) && file=$f
    ((m > shards)) && shards=$m
    sleep 0.2
  done
  echo "$anon $file $shards"
}
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
trace_data_ms() {  # TRACE: the "data" spans' durations in ms, but the first step's
  awk 'index($0, "\"cat\":\"data\"") && !index($0, "\"name\":\"batch 1\"") &&
    match($0, /"dur":[0-9.eE+-]+/) { print substr($0, RSTART + 6, RLENGTH - 6) / 1e3 }' "$1"
}

echo "== training: $model, $steps steps, 1 rank"
for c in small large; do
  log=$dir/train-$c.log
  # shellcheck disable=SC2086 # $model is several flags
  /usr/bin/time -v "$tandem" train $model --data "$dir/$c-shards" --steps "$steps" --eval-every 0 \
    --dp 1 --tp 1 --trace "$dir/trace-$c.json" --metrics "$dir/metrics-$c.jsonl" >"$log" 2>&1 &
  tpid=$!
  read -r anon file shards < <(poll_rss "$tpid")
  wait "$tpid" || { cat "$log"; exit 1; }
  [[ $c == small ]] && grep -E "^tandem train: GPT|memory estimate" "$log" | head -2
  peak=$(sed -n 's/.*Maximum resident set size (kbytes): *//p' "$log")
  step=$(metrics_step_ms "$dir/metrics-$c.jsonl" 1)
  data=$(trace_data_ms "$dir/trace-$c.json" | median)
  data_max=$(trace_data_ms "$dir/trace-$c.json" | sort -g | tail -1)
  echo "$c corpus ($(du -sm "$dir/$c-shards" | cut -f1) MB of shards): peak resident $(mib "$peak") MiB (RssAnon $(mib "$anon") MiB, RssFile $(mib "$file") MiB, of which the mapped shards $(mib "$shards") MiB); step $(printf %.1f "$step") ms, data loading $(printf %.3f "$data") ms (max $(printf %.3f "$data_max")): $(awk -v d="$data" -v s="$step" 'BEGIN { printf "%.3f", 100 * d / s }')% of the step (medians of steps 2-$steps)"
  echo "  the shards' mapped pages: at most $shards kB at a poll, over $((steps * batch)) windows read (a window: 129 tokens)"
done
echo "finished $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
