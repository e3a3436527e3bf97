# shellcheck shell=bash
# Shared by the bench scripts: medians, a run's median step time from its --metrics file, and a
# command run under a time limit. Source it; it defines functions only.

median() {  # of the numbers on stdin, one a line
  sort -g | awk '{ a[NR] = $1 }
    END { if (NR == 0) exit 1; print NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# The median step time in ms of the steps after the first WARMUP, from a --metrics file.
metrics_step_ms() {  # METRICS WARMUP
  awk -v w="$2" 'match($0, /"step":[0-9]+/) {
      s = substr($0, RSTART + 7, RLENGTH - 7) + 0
      if (s > w && match($0, /"step_s":[0-9.eE+-]+/)) print substr($0, RSTART + 9, RLENGTH - 9) * 1e3
    }' "$1" | median
}

# COMMAND under a 15-minute limit, echoed first; a failure is recorded and the script goes on.
run_limited() {  # COMMAND...
  echo "\$ $*"
  local status=0
  timeout -k 10 -s TERM 900 "$@" 2>&1 || status=$?
  [ "$status" = 0 ] || echo "(exit status $status)"
  return 0
}

# The race models of docs/benchmarks.md, as tandem train flags (the first ten words always
# --layers L --d-model D --heads H --seq-len T --batch B): GPT-2 blocks a and b, and s, SmolLM-360M's
# Llama shape at 1024 tokens.
race_model_flags() {  # a|b|s|h
  case $1 in
    a) echo "--layers 4 --d-model 256 --heads 4 --seq-len 128 --batch 16" ;;
    b) echo "--layers 8 --d-model 512 --heads 8 --seq-len 128 --batch 8" ;;
    s) echo "--layers 32 --d-model 960 --heads 15 --seq-len 1024 --batch 2 --arch llama --kv-heads 5 --ffn 2560" ;;
    h) echo "--layers 16 --d-model 960 --heads 15 --seq-len 1024 --batch 2 --arch llama --kv-heads 5 --ffn 2560" ;;
    *) echo "unknown model '$1' (a, b, s or h)" >&2; exit 2 ;;
  esac
}

# The race scripts' arguments: [BUILD_DIR] then --reps --warmup-steps --steps --threads --models,
# into the globals build, reps, warmup, steps, threads, models, tandem (set the defaults first).
# SCRIPT names the caller in messages.
parse_race_args() {  # SCRIPT ARGS...
  local script=$1
  shift
  if [[ $# -gt 0 && $1 != --* ]]; then
    build=$1
    shift
  fi
  while [[ $# -gt 0 ]]; do
    case $1 in
      --reps) reps=$2 ;;
      --warmup-steps) warmup=$2 ;;
      --steps) steps=$2 ;;
      --threads) threads=$2 ;;
      --models) models=$2 ;;
      *) echo "$script: unknown flag $1 (see the usage at the top of the script)" >&2; exit 2 ;;
    esac
    shift 2
  done
  tandem=$build/tandem
  if [[ ! -x $tandem ]]; then
    echo "$script: $tandem not found: build tandem first (or pass BUILD_DIR)" >&2
    exit 1
  fi
}

# The Python interpreter for PyTorch's side: $PYTHON, else python3, else /usr/bin/python3 when
# only that one imports torch (a python3 earlier on PATH may not see Debian's python3-torch).
torch_python() {
  local py=${PYTHON:-python3}
  if [[ -z ${PYTHON:-} ]] && ! "$py" -c "import torch" 2>/dev/null &&
    /usr/bin/python3 -c "import torch" 2>/dev/null; then
    py=/usr/bin/python3
  fi
  echo "$py"
}
