#!/usr/bin/env bash
# A fine-tune end to end (docs/benchmarks.md, "A Llama fine-tune end to end"): a Hugging Face
# Llama folder written by plain PyTorch (bench/hf_llama_folder.py: bf16 safetensors, untied head,
# SmolLM-135M's shape by default, random weights: nothing can be downloaded here), a SentencePiece
# tokenizer trained by `tandem tokenize` on Debian's changelogs and the text encoded into shards,
# `tandem train --init-from` the folder on the shards, `tandem export --format hf` of the result,
# and the exported folder's loss on the first validation window computed twice: by `tandem eval`
# and by the independent PyTorch forward of the tests (tests/train/hf_llama_forward.py, float64).
# Prints the steps' losses and times, both losses and their difference.
# Builds nothing: build tandem first. Needs python3 with torch (Debian: python3-torch).
# Usage: bench/run_finetune.sh [BUILD_DIR]; STEPS (default 20), SEQ (512), BATCH (4), VOCAB
# (4096), FOLDER_FLAGS (hf_llama_folder.py's shape flags) and DIR (default $TMPDIR) may be set.
set -euo pipefail
build=${1:-build/release}
tandem=$build/tandem
steps=${STEPS:-20}
seq=${SEQ:-512}
batch=${BATCH:-4}
vocab=${VOCAB:-4096}
dir=${DIR:-${TMPDIR:-/tmp}/tandem-finetune}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/steps_common.sh
source "$here/steps_common.sh"
python=${PYTHON:-/usr/bin/python3}
"$python" -c 'import torch' 2>/dev/null || { echo "run_finetune: $python cannot import torch (apt-get install python3-torch)" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$dir/text"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; started $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"

echo "== the text: the first 8 MB of Debian's changelogs; a SentencePiece BPE of $vocab pieces trained on it"
find /usr/share/doc -name 'changelog*.gz' | LC_ALL=C sort | xargs zcat -f 2>/dev/null |
  iconv -c -f UTF-8 -t UTF-8 | head -c 8000000 | sed '$d' >"$dir/text/changelogs.txt" || true
"$tandem" tokenize "$dir/text" --out "$dir/shards" --vocab-size "$vocab" --quiet | tail -1

echo "== the starting folder, written by PyTorch"
"$python" "$here/hf_llama_folder.py" "$dir/published" --vocab "$vocab" ${FOLDER_FLAGS:-}

echo "== tandem train --init-from it, $steps steps of $batch x $seq tokens"
"$tandem" train --init-from "$dir/published" --data "$dir/shards" --seq-len "$seq" --batch "$batch" \
  --steps "$steps" --dp 1 --tp 1 --eval-every 0 --save "$dir/run" --metrics "$dir/metrics.jsonl" \
  >"$dir/train.log" 2>&1 || { cat "$dir/train.log"; exit 1; }
grep -E "^tandem train|learning rate|^step +(1|$steps)/" "$dir/train.log" || true
echo "step time, median of steps 2..$steps: $(metrics_step_ms "$dir/metrics.jsonl" 1) ms"

echo "== tandem export --format hf, then the first validation window's loss twice"
"$tandem" export "$dir/run" --format hf --out "$dir/exported" | tail -1
ours=$("$tandem" eval --checkpoint "$dir/run" --data "$dir/shards" --seq-len "$seq" --batch 1 \
  --max-windows 1 | tee "$dir/eval.log" | sed -n 's/.*loss \([0-9.]*\).*/\1/p' | head -1)
# The window eval scored: the validation split's first seq + 1 tokens (a shard: a 64-byte header,
# then uint16 ids while the vocabulary fits).
ids=$("$python" -c "
import struct, sys
data = open('$dir/shards/val-000000.bin', 'rb').read()[64:]
print(','.join(str(i) for i in struct.unpack('<%dH' % ($seq + 1), data[: 2 * ($seq + 1)])))")
"$python" "$here/../tests/train/hf_llama_forward.py" "$dir/exported" "$ids" "$dir/logits.bin"
theirs=$("$python" -c "
import struct
data = open('$dir/logits.bin', 'rb').read()
print('%.6f' % struct.unpack('<d', data[-8:])[0])")
cat "$dir/eval.log"
echo "loss of the first validation window: tandem eval $ours, PyTorch forward on the export $theirs, |difference| $(awk -v a="$ours" -v b="$theirs" 'BEGIN { d = a - b; print (d < 0) ? -d : d }')"
