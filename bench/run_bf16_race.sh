#!/usr/bin/env bash
# The bf16 race of docs/benchmarks.md: tandem against PyTorch with both sides in bf16 (PyTorch:
# torch.autocast('cpu', bfloat16); tandem: --precision bf16), f32 master weights on both, on the
# two race models, interleaved, repeated. Three races:
#   1. processes:  tandem on 2 MPI processes against PyTorch DDP (gloo) on 2 processes, bf16;
#   2. the same pair in fp32;
#   3. one machine: tandem on 1 rank x 2T threads, on 2 in-process ranks x T, and on 2 MPI
#      processes x T (race 1's runs), each against one PyTorch process x 2T threads (no DDP), bf16.
# Prints each run's median step, the medians over the repetitions in tokens/s, and the ratios
# tandem/PyTorch (race 3 also for tandem's fastest configuration), tandem bf16/fp32 and PyTorch
# bf16/fp32; the CPU (lscpu's model name, the bf16 flags in /proc/cpuinfo) and OMP_WAIT_POLICY;
# and each run's model FLOP utilisation against tandem's GEMM roof measured in the same run.
# Builds nothing: build tandem first.
# Usage: bench/run_bf16_race.sh [BUILD_DIR] [--reps 3] [--warmup-steps 2] [--steps 8] [--threads 1]
#                               [--models "a b"]
# --threads T is per process in races 1 and 2; race 3's single process or rank has 2T, so every
# configuration uses 2T threads in all. Models (bench/steps_common.sh's): a = 4 layers, d_model
# 256, 4 heads, seq 128, batch 16; b = 8 layers, d_model 512, 8 heads, seq 128, batch 8; s =
# SmolLM-360M's Llama shape (32 layers, d_model 960, 15 heads, 5 key/value heads, MLP 2560) at seq
# 1024, batch 2; h = s at half its depth (16 layers): PyTorch 1.13, which saves each layer's T x T
# scores, runs out of 24 GiB at s's 32 layers even in one process.
# Like for like: the same model, global batch, sequence, optimizer (AdamW), threads in all, dropout
# 0; neither side pinned (mpirun --bind-to none). A run's figure is global tokens a step over its
# median step time after --warmup-steps (tandem: the lead rank's step_s from --metrics; PyTorch:
# rank 0's clock). PYTHON picks the interpreter (as run_ddp_race.sh); without torch the script
# stops with a message: every race here needs both sides.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build/release
reps=3 warmup=2 steps=8 threads=1 models="a b"
# shellcheck source=bench/steps_common.sh
source "$here/steps_common.sh"
parse_race_args run_bf16_race "$@"

py=$(torch_python)
if ! "$py" -c "import torch" 2>/dev/null; then
  echo "run_bf16_race: $py has no torch (Debian: apt-get install python3-torch)" >&2
  exit 1
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# tandem train with the model's flags; prints the median step time in ms of the timed steps.
run_tandem() {  # MODEL PRECISION HOW LOG [FLAGS...]; HOW: mpi (2 processes), thread (2 ranks) or one (1 rank)
  local flags metrics=$out/metrics.jsonl grid=(--dp 2 --tp 1 --pp 1) width=$threads
  read -r -a flags <<<"$(race_model_flags "$1")"
  [[ $3 == one ]] && grid=(--dp 1 --tp 1 --pp 1) width=$((2 * threads))
  local cmd=("$tandem" train "${grid[@]}" "${flags[@]}" --dropout 0 --precision "$2"
             --lr 0.003 --steps $((warmup + steps)) --eval-every 0 --threads "$width" --quiet
             --metrics "$metrics" "${@:5}")
  case $3 in
    mpi) cmd=(mpirun -np 2 --oversubscribe --bind-to none "${cmd[@]}" --backend mpi) ;;
    thread) cmd+=(--backend thread) ;;
  esac
  rm -f "$metrics"
  echo "${cmd[*]}" >"$4"
  "${cmd[@]}" >>"$4" 2>&1 || { cat "$4" >&2; echo "run_bf16_race: tandem train failed" >&2; exit 1; }
  metrics_step_ms "$metrics" "$warmup"
}

# pytorch_ddp_gpt.py; prints the median step time in ms of the timed steps.
run_torch() {  # MODEL PRECISION NPROC LOG; NPROC 2: DDP, 1 thread each; 1: one process x 2T
  local flags width=$threads
  read -r -a flags <<<"$(race_model_flags "$1")"
  (($3 == 1)) && width=$((2 * threads))
  local cmd=("$py" "$here/pytorch_ddp_gpt.py" --nproc "$3" --threads "$width" --precision "$2"
             "${flags[@]}" --warmup-steps "$warmup" --steps "$steps")
  echo "${cmd[*]}" >"$4"
  "${cmd[@]}" >>"$4" 2>&1 || { cat "$4" >&2; echo "run_bf16_race: pytorch_ddp_gpt.py failed" >&2; exit 1; }
  awk '$1 == "median" && $2 == "ddp_step_ms" { print $3 }' "$4"
}

# The systems, in the order each repetition runs them: each tandem run beside its PyTorch one.
# tandem-mpigb-bf16 is race 1's tandem run with its gradients exchanged in bf16 (--grad-dtype bf16):
# not like for like (DDP reduces f32 gradients), so no ratio against DDP, only against race 1's.
# SYSTEMS="..." runs a subset (a large model's runs take minutes each); a ratio or MFU line whose
# runs were left out is not printed.
systems=${SYSTEMS:-"tandem-mpi-bf16 ddp-bf16 tandem-mpi-fp32 ddp-fp32 tandem-1rank-bf16
         torch-1proc-bf16 tandem-threads-bf16 tandem-mpigb-bf16"}
run_system() {  # SYSTEM MODEL LOG; prints the median step time in ms
  case $1 in
    tandem-mpi-*) run_tandem "$2" "${1##*-}" mpi "$3" ;;
    tandem-mpigb-*) run_tandem "$2" "${1##*-}" mpi "$3" --grad-dtype bf16 ;;
    tandem-threads-*) run_tandem "$2" "${1##*-}" thread "$3" ;;
    tandem-1rank-*) run_tandem "$2" "${1##*-}" one "$3" ;;
    ddp-*) run_torch "$2" "${1##*-}" 2 "$3" ;;
    torch-1proc-*) run_torch "$2" "${1##*-}" 1 "$3" ;;
  esac
}

echo "run_bf16_race: $reps repetitions of $warmup warm-up + $steps timed steps; $threads thread(s)" \
     "a process in the 2-process runs, $((2 * threads)) in the 1-process runs; models: $models"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; bf16 flags:" \
     "$(grep -o -w -E 'avx512_bf16|amx_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "OMP_WAIT_POLICY: ${OMP_WAIT_POLICY:-unset here (tandem and pytorch_ddp_gpt.py each set PASSIVE; their lines below say what ran)}"
echo "started $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"

# The roofs for the model FLOP utilisation: tandem's GEMM entry point at 2048^3 on 2T threads in
# one process (all the cores the races use), f32 (OpenBLAS) and bf16 (oneDNN), measured now and
# again after the races; the higher of the two measurements is the roof.
roofs() {
  "$build/bench/bench_gemm" --threads $((2 * threads)) --skip-sweep |
    awk '$1 == "square" {  # each GFLOP/s figure is followed by its ratio, "1.97x"
      n = 0
      for (i = 2; i <= NF; ++i) if ($i ~ /^[0-9.]+x/) v[++n] = $(i - 1)
      print v[1], v[3]  # OpenBLAS f32, oneDNN bf16
    }' 
}
[[ -x $build/bench/bench_gemm ]] || { echo "run_bf16_race: no $build/bench/bench_gemm" >&2; exit 1; }
read -r roof_f32 roof_bf16 <<<"$(roofs)"
echo "roofs before the races: GEMM 2048^3 on $((2 * threads)) threads: f32 $roof_f32 GFLOP/s, bf16 $roof_bf16 GFLOP/s"
for ((r = 1; r <= reps; r++)); do
  for m in $models; do
    read -r -a f <<<"$(race_model_flags "$m")"
    tokens=$((f[7] * f[9]))  # seq_len x batch
    for s in $systems; do
      log=$out/$m.$s.$r.log
      ms=$(run_system "$s" "$m" "$log")
      tps=$(awk -v t="$tokens" -v ms="$ms" 'BEGIN { printf "%.0f", t / (ms / 1e3) }')
      echo "$m $s $tps" >>"$out/results"
      printf 'rep %d model %s %-19s median step %8.1f ms  %7s tokens/s\n' "$r" "$m" "$s" "$ms" "$tps"
      if ((r == 1)); then  # what ran, once
        sed -n '1s/^/    $ /p' "$log"
        grep -E '^ *precision |^autocast bf16 check|^PyTorch' "$log" | sed 's/^ */    /' || true
      fi
    done
  done
done

ratio() {  # NAME A B NOTE; nothing when a run was left out (SYSTEMS)
  [[ -n $2 && -n $3 ]] || return 0
  awk -v n="$1" -v a="$2" -v b="$3" -v note="$4" \
    'BEGIN { printf "  ratio %s %.2f   (%s)\n", n, a / b, note }'
}

read -r after_f32 after_bf16 <<<"$(roofs)"
echo "roofs after the races: f32 $after_f32 GFLOP/s, bf16 $after_bf16 GFLOP/s"
roof_f32=$(awk -v a="$roof_f32" -v b="$after_f32" 'BEGIN { print (a > b ? a : b) }')
roof_bf16=$(awk -v a="$roof_bf16" -v b="$after_bf16" 'BEGIN { print (a > b ? a : b) }')

# Model FLOPs a token (forward and backward, the backward twice the forward): the matmuls of
# every block and the head, and attention's over the whole window, as tandem's performance model
# counts them (perf/flops.h), read from the "work:" start-up line of the model's first tandem run
# (empty when SYSTEMS ran none).
model_flops() {  # MODEL
  local log
  log=$(ls "$out/$1".tandem-*.1.log 2>/dev/null | head -1)
  [[ -n $log ]] || return 0
  sed -n 's/^  work: \([0-9.e+]*\) FLOP a token.*/\1/p' "$log" | awk '{ printf "%.0f", $1 }'
}
mfu() {  # NAME TOKENS_PER_S FLOPS_PER_TOKEN ROOF_GFLOPS
  awk -v n="$1" -v t="$2" -v f="$3" -v r="$4" \
    'BEGIN { printf "  mfu %s %.1f%%   (%.0f GFLOP/s of %.0f)\n", n, 100 * t * f / 1e9 / r, t * f / 1e9, r }'
}

echo
echo "medians over $reps repetitions (min-max), tokens/s; load average now $(cut -d' ' -f1-3 /proc/loadavg):"
for m in $models; do
  echo "model $m: $(race_model_flags "$m")"
  declare -A med=()
  for s in $systems; do
    v=$(awk -v m="$m" -v s="$s" '$1 == m && $2 == s { print $3 }' "$out/results")
    med[$s]=$(median <<<"$v")
    printf '  tokens_per_s %s_%s %.0f (%s-%s)\n' "$m" "${s//-/_}" "${med[$s]:-}" \
      "$(sort -g <<<"$v" | head -1)" "$(sort -g <<<"$v" | tail -1)"
  done
  # tandem's fastest single-machine configuration, by median.
  best="tandem-1rank-bf16"
  for s in tandem-threads-bf16 tandem-mpi-bf16; do
    [[ -n ${med[$s]:-} ]] || continue
    [[ -n ${med[$best]:-} ]] || { best=$s; continue; }
    awk -v a="${med[$s]:-}" -v b="${med[$best]:-}" 'BEGIN { exit !(a > b) }' && best=$s
  done
  ratio "${m}_tandem_mpi_vs_ddp_bf16" "${med[tandem-mpi-bf16]:-}" "${med[ddp-bf16]:-}" \
    "race 1: 2 processes against 2, both bf16"
  ratio "${m}_tandem_mpi_vs_ddp_fp32" "${med[tandem-mpi-fp32]:-}" "${med[ddp-fp32]:-}" \
    "race 2: the same in fp32"
  for s in tandem-1rank-bf16 tandem-threads-bf16 tandem-mpi-bf16; do
    ratio "${m}_${s//-/_}_vs_torch_1proc_bf16" "${med[$s]:-}" "${med[torch-1proc-bf16]:-}" \
      "race 3: against one PyTorch process x $((2 * threads)) threads"
  done
  ratio "${m}_tandem_best_vs_torch_1proc_bf16" "${med[$best]:-}" "${med[torch-1proc-bf16]:-}" \
    "race 3's headline: tandem's fastest here, $best"
  ratio "${m}_tandem_mpi_bf16_vs_fp32" "${med[tandem-mpi-bf16]:-}" "${med[tandem-mpi-fp32]:-}" \
    "tandem bf16 over fp32, 2 MPI processes"
  ratio "${m}_ddp_bf16_vs_fp32" "${med[ddp-bf16]:-}" "${med[ddp-fp32]:-}" \
    "PyTorch autocast bf16 over fp32, DDP"
  ratio "${m}_tandem_mpi_bf16_grads_vs_f32_grads" "${med[tandem-mpigb-bf16]:-}" "${med[tandem-mpi-bf16]:-}" \
    "tandem bf16, 2 MPI processes: gradients exchanged in bf16 over f32"
  flops=$(model_flops "$m")
  [[ -n $flops ]] || { echo "  model FLOPs a token: no tandem run to read them from"; continue; }
  echo "  model FLOPs a token: $flops; MFU against the roof of its precision:"
  for s in $systems; do
    roof=$roof_bf16
    [[ $s == *fp32 ]] && roof=$roof_f32
    mfu "${m}_${s//-/_}" "${med[$s]:-}" "$flops" "$roof"
  done
done
