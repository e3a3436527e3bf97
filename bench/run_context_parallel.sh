#!/usr/bin/env bash
# Context parallelism's step time (docs/training.md, "Context parallelism"): GPT-2 124M's shape
# (12 layers, d_model 768, 12 heads) at each sequence length of SEQS, batch 1, trained on one rank
# (--cp 1) and with the sequence split over each rank count of CPS (--cp N), in each order of
# ORDERS (TANDEM_CP_ORDER: overlap, the default, gathers the keys and values behind the products;
# sequential gathers them first; ring passes the pieces round, ring attention), on each transport
# of HOWS: thread (in-process ranks), mpi (processes of this host, where mpirun is present) and
# hosts:MBIT (half the processes on each of two namespaced hosts joined by a MBIT Mbit/s link,
# scripts/netns-hosts.sh, as root). Every configuration uses THREADS BLAS threads in all (a rank
# of cp N gets 1/N of them, at least one). Prints the CPU and the load average, each run's median
# step time after the first WARMUP steps (--metrics' step_s), the ratio cp=1 / this run (above 1:
# the split is faster) and, for the overlapped and ring orders, the share of the exchanges' time
# the products hid (from the run's summary: rank 0, every step, the warm-up ones too). The kv
# exchanges run the autotuner's schedules when its cache has them: run `tandem train ... --cp N
# --tune --steps 1` once per sequence length first to make them.
# Builds nothing: build tandem first.
# Usage: bench/run_context_parallel.sh [BUILD_DIR]
# SEQS (default "2048 4096 8192"), CPS ("2"), ORDERS ("overlap sequential ring"), HOWS ("thread
# mpi"), STEPS (6), WARMUP (2), THREADS (nproc), DIR (logs and metrics; default $TMPDIR/tandem-cp)
# may be set.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/steps_common.sh
source "$here/steps_common.sh"
build=${1:-build/release}
seqs=${SEQS:-2048 4096 8192}
cps=${CPS:-2}
orders=${ORDERS:-overlap sequential ring}
hows=${HOWS:-thread mpi}
steps=${STEPS:-6}
warmup=${WARMUP:-2}
threads=${THREADS:-$(nproc)}
dir=${DIR:-${TMPDIR:-/tmp}/tandem-cp}
mkdir -p "$dir"
if [[ ! -x $build/tandem ]]; then
  echo "run_context_parallel.sh: $build/tandem not found: build tandem first (or pass BUILD_DIR)" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
lscpu | sed -n 's/^Model name: *//p'
echo "$(nproc) cores, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# One run; prints its median step time in ms. HOW: thread, mpi or hosts:MBIT; ORDER:
# TANDEM_CP_ORDER.
step_ms() {  # SEQ CP HOW [ORDER]
  local order=${4:-overlap} threads_each=$((threads / $2 > 0 ? threads / $2 : 1))
  local metrics="$dir/metrics-$1-cp$2-$3-$order.jsonl" log="$dir/train-$1-cp$2-$3-$order.log"
  local args=("$build/tandem" train --layers 12 --d-model 768 --heads 12 --seq-len "$1" --batch 1
    --dp 1 --tp 1 --pp 1 --cp "$2" --dropout 0 --steps $((warmup + steps)) --eval-every 0
    --threads "$threads_each" --quiet --metrics "$metrics" --backend "$([[ $3 == thread ]] && echo thread || echo mpi)")
  local cmd
  case $3 in
    thread) cmd=(env TANDEM_CP_ORDER="$order" "${args[@]}") ;;
    mpi) cmd=(mpirun -np "$2" --oversubscribe --bind-to none -x TANDEM_CP_ORDER="$order" "${args[@]}") ;;
    hosts:*) cmd=(env TANDEM_CP_ORDER="$order" "$here/../scripts/netns-hosts.sh" -n $(($2 / 2))
      --rate-mbit "${3#hosts:}" mpirun --oversubscribe --bind-to none "${args[@]}") ;;
    *) echo "run_context_parallel.sh: HOWS: '$3' is not thread, mpi or hosts:MBIT" >&2; exit 1 ;;
  esac
  rm -f "$metrics"
  echo "${cmd[*]}" >"$log"
  "${cmd[@]}" </dev/null >>"$log" 2>&1 || { cat "$log" >&2; echo "run_context_parallel.sh: failed" >&2; exit 1; }
  metrics_step_ms "$metrics" "$warmup"
}

# The share a run's summary gives (e.g. "83%"), or "-".
hidden() {  # SEQ CP HOW ORDER
  local h
  h=$(sed -n 's/.*kv exchanges ran .*(\([0-9]*%\) hidden).*/\1/p' "$dir/train-$1-cp$2-$3-$4.log")
  echo "${h:--}"
}

printf '%-6s %-12s %3s %-11s %10s %6s %7s\n' seq backend cp order ms "1/cp" hidden
for seq in $seqs; do
  one=$(step_ms "$seq" 1 thread)  # one rank: the backend does not matter
  printf '%-6s %-12s %3s %-11s %10.1f %6s %7s\n' "$seq" - 1 - "$one" 1.00 -
  for how in $hows; do
    [[ $how == mpi ]] && ! command -v mpirun >/dev/null && continue
    for cp in $cps; do
      for order in $orders; do
        ms=$(step_ms "$seq" "$cp" "$how" "$order")
        printf '%-6s %-12s %3s %-11s %10.1f %6.2f %7s\n' "$seq" "$how" "$cp" "$order" "$ms" \
          "$(awk -v a="$one" -v b="$ms" 'BEGIN { print a / b }')" "$(hidden "$seq" "$cp" "$how" "$order")"
      done
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
