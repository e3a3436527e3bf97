#!/usr/bin/env bash
# Real text end to end (docs/benchmarks.md, "Real text"): the changelogs Debian's packages ship
# (/usr/share/doc/*/changelog*.gz, unpacked: text every Debian machine has) tokenized and trained
# on. Measures
#   1. encoding speed: `tandem tokenize --tokenizer M` on 1 and on 2 threads against SentencePiece's
#      own `spm_encode` (one thread: it has no other mode) with the same model M on the same text,
#      in MB of text a second (M is trained first by `tandem tokenize` on a part of the text);
#   2. GPT-2 124M's shape (`--model gpt2`, the vocabulary the tokenizer's) trained on the shards,
#      fp32 and bf16: tokens/s and model FLOPs utilisation against the GEMM roofs measured in the
#      same run (bench_gemm's 2048^3: OpenBLAS f32 and oneDNN bf16);
#   3. peak resident memory (/usr/bin/time -v) of the same training on the whole corpus's shards
#      and on a small part's: memory-mapped shards, so it must not grow with the corpus;
#   4. `tandem sample` from the trained checkpoint: text, decoded by the tokenizer.
# Builds nothing: build tandem and bench_gemm first. Needs spm_encode (Debian: apt-get install
# sentencepiece). Usage: bench/run_text.sh [BUILD_DIR]; VOCAB (default 16384), STEPS (default 4:
# the first is the warm-up), BATCH (default 4 x 1024 tokens) and DIR (default $TMPDIR) may be set.
set -euo pipefail
build=${1:-build/release}
tandem=$build/tandem
vocab=${VOCAB:-16384}
steps=${STEPS:-4}
batch=${BATCH:-4}
dir=${DIR:-${TMPDIR:-/tmp}/tandem-text}
command -v spm_encode >/dev/null || { echo "run_text: spm_encode missing (apt-get install sentencepiece)" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$dir/corpus" "$dir/part"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; bf16 flags: $(grep -o -w -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "started $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"

# The corpus: every changelog, in a fixed order, its few bytes that are not UTF-8 (old Latin-1
# entries) dropped; the part: its first 16 MB, cut at a line end.
find /usr/share/doc -name 'changelog*.gz' | LC_ALL=C sort | xargs zcat -f 2>/dev/null |
  iconv -c -f UTF-8 -t UTF-8 >"$dir/corpus/changelogs.txt" || true
head -c 16000000 "$dir/corpus/changelogs.txt" | sed '$d' >"$dir/part/changelogs-part.txt"
mb=$(awk -v b="$(stat -c %s "$dir/corpus/changelogs.txt")" 'BEGIN { printf "%.1f", b / 1e6 }')
echo "corpus: $mb MB of Debian changelogs ($(find /usr/share/doc -name 'changelog*.gz' | wc -l) files); part: its first 16 MB"

seconds() { /usr/bin/time -f %e "$@" 2>&1 >/dev/null | tail -1; }

echo "== the tokenizer: BPE, $vocab pieces, trained by tandem tokenize on the part"
"$tandem" tokenize "$dir/part" --out "$dir/part-shards" --vocab-size "$vocab" --quiet | tail -2
model=$dir/part-shards/tokenizer.model
echo "== encoding the whole corpus with that model (MB of text a second)"
for t in 1 2; do
  rm -rf "$dir/shards"
  s=$(seconds "$tandem" tokenize "$dir/corpus" --tokenizer "$model" --out "$dir/shards" --threads "$t" --quiet)
  echo "tandem tokenize, $t thread(s): $s s, $(awk -v m="$mb" -v s="$s" 'BEGIN { printf "%.1f", m / s }') MB/s"
done
s=$(seconds spm_encode --model "$model" --output_format=id --input "$dir/corpus/changelogs.txt" --output /dev/null)
echo "spm_encode (SentencePiece's own, 1 thread): $s s, $(awk -v m="$mb" -v s="$s" 'BEGIN { printf "%.1f", m / s }') MB/s"

echo "== the roofs, measured now"
"$build/bench/bench_gemm" --skip-sweep >"$dir/gemm.txt"
# The library table's square row: each GFLOP/s figure is followed by its ratio ("1.00x 6",
# "2.01x12"); the first is OpenBLAS f32, the third oneDNN bf16.
square() {
  awk -v want="$1" '$1 == "square" {
    for (i = 2; i <= NF; ++i) if ($i ~ /^[0-9.]+x/ && ++k == want) { print $(i - 1); exit }
  }' "$dir/gemm.txt"
}
roof_f32=$(square 1)
roof_bf16=$(square 3)
grep -E "^shape|^square" "$dir/gemm.txt"
echo "GEMM 2048^3: OpenBLAS f32 $roof_f32 GFLOP/s, oneDNN bf16 $roof_bf16 GFLOP/s"

train() {  # PRECISION SHARDS LOG [more flags]: trains; prints the median step of the steps after the first
  local p=$1 shards=$2 log=$3
  shift 3
  rm -f "$dir/metrics.jsonl"
  /usr/bin/time -v "$tandem" train --model gpt2 --data "$shards" --batch "$batch" --seq-len 1024 \
    --dp 1 --tp 1 --steps "$steps" --eval-every 0 --precision "$p" --metrics "$dir/metrics.jsonl" \
    "$@" >"$log" 2>&1 || { cat "$log"; exit 1; }
  sed -n 's/.*"step_s":\([0-9.e+-]*\).*/\1/p' "$dir/metrics.jsonl" | tail -n +2 | sort -g |
    awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
peak_gib() { sed -n 's/.*Maximum resident set size (kbytes): *//p' "$1" | awk '{ printf "%.2f", $1 / 1048576 }'; }

echo "== GPT-2 124M's shape on the shards: --model gpt2 --batch $batch --seq-len 1024, 1 rank, $(nproc) threads"
for p in fp32 bf16; do
  step=$(train "$p" "$dir/shards" "$dir/train-$p.log" --save "$dir/ckpt-$p")
  grep -E "^tandem train: GPT|memory estimate" "$dir/train-$p.log" | head -2
  # The step's matmul FLOPs, forward and backward: the performance model's (perf/flops.h), from
  # the run's "work:" start-up line.
  flops=$(sed -n 's/^  work: .* FLOP a token, \([0-9.e+]*\) a step.*/\1/p' "$dir/train-$p.log")
  roof=$([[ $p == fp32 ]] && echo "$roof_f32" || echo "$roof_bf16")
  awk -v flops="$flops" -v s="$step" -v B="$batch" -v r="$roof" -v p="$p" -v pk="$(peak_gib "$dir/train-$p.log")" 'BEGIN {
    tokens = B * 1024
    printf "%s: %.2f s a step (median after the first), %.0f tokens/s, %.1f TFLOP a step, %.0f GFLOP/s: MFU %.0f%% of the %s GEMM roof (%s GFLOP/s); peak resident %s GiB\n",
      p, s, tokens / s, flops / 1e12, flops / s / 1e9, 100 * flops / s / 1e9 / r, p, r, pk
  }'
done
echo "== memory against the corpus: the same fp32 training on the part's shards ($(du -sh "$dir/part-shards" | cut -f1)) and the whole corpus's ($(du -sh "$dir/shards" | cut -f1))"
train fp32 "$dir/part-shards" "$dir/train-part.log" >/dev/null
echo "peak resident memory: part $(peak_gib "$dir/train-part.log") GiB, whole corpus $(peak_gib "$dir/train-fp32.log") GiB"
echo "== tandem sample from the fp32 checkpoint"
"$tandem" sample --checkpoint "$dir/ckpt-fp32" --prompt "Debian" --tokens 40 --seed 1 2>&1 | tail -3
