#!/bin/bash
# Runs the bundle's CUDA programs on one GPU, -np 1 as Open MPI singletons: each program's check
# against the reference interpreter, then its timing at two larger sizes.
# From the repository root: bash .device/run.sh   (writes $OUT/gpu.log and $OUT/summary.txt;
# OUT defaults to .device/out). Needs only the NVIDIA driver and, somewhere on the machine,
# cuBLAS 13 (libcublas.so.13, libcublasLt.so.13) and NCCL >= 2.18 (libnccl.so.2): Open MPI is
# bundled. ITERS (20) timed runs a size; BUDGET and DEADLINE bound the whole run in seconds.
# CHUNKS1 (default: lamb_fused lamb_fused_old): programs timed once more at the two larger sizes
# with TANDEM_CUDA_CHUNKS=1 (the other runs leave it unset: 4 chunks), after all the others.
B="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$B/out}"
mkdir -p "$OUT"
LOG="$OUT/gpu.log"
SUM="$OUT/summary.txt"
: >"$LOG"
T0=$(date +%s)
BUDGET="${BUDGET:-240}"     # past this, the larger sizes are skipped (the checks still run)
DEADLINE="${DEADLINE:-330}" # the hard end; each run's timeout is min(60, what is left)
ITERS="${ITERS:-20}"
log() { echo "$@" | tee -a "$LOG"; }
elapsed() { echo $(($(date +%s) - T0)); }
run_limit() {
  local left=$((DEADLINE - $(elapsed)))
  [ $left -gt 60 ] && left=60
  echo $left
}

chmod +x "$B"/bin/*/* "$B/bin/mpitest" 2>/dev/null # in case the copy lost the mode bits
log "== tandem GPU run $(date -u +%FT%TZ) on $(hostname)"
log "== nvidia-smi"
{
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  timeout 20 nvidia-smi | head -20
} >>"$LOG" 2>&1
# NVIDIA_REQUIRE_* is a long constraint list of the image, of no use here.
log "== env: $(env | grep -E "^(NCCL|CUDA|NVIDIA|LD_LIBRARY_PATH)" | grep -v '^NVIDIA_REQUIRE' | tr "\n" " ")"
log "== OS: $(. /etc/os-release 2>/dev/null; echo "$PRETTY_NAME"), glibc $(ldd --version 2>&1 | head -1 | awk '{print $NF}'), $(nproc) cores"

# ---- libraries: cuBLAS 13 and NCCL from the machine (too big to bundle), Open MPI from the bundle.
# The usual install places first; the whole disk only if they hold no copy.
HITS=$(timeout 30 find /usr/local /opt /usr/lib /usr/lib64 /root /home /workspace \
  \( -name libcublas.so.13 -o -name libcublasLt.so.13 -o -name libnccl.so.2 \) \
  \( -type f -o -type l \) 2>/dev/null)
if ! echo "$HITS" | grep -q libcublasLt.so.13 || ! echo "$HITS" | grep -q libnccl.so.2; then
  HITS="$HITS
$(timeout 40 find / -xdev \( -path /proc -o -path /sys \) -prune -o \( -name libcublas.so.13 \
    -o -name libcublasLt.so.13 -o -name libnccl.so.2 \) \( -type f -o -type l \) -print 2>/dev/null)"
fi
pick() { # NAME: the folder of the first hit, preferring CUDA 13 / pip cu13 copies
  {
    echo "$HITS" | grep "/$1\$" | grep -E 'cu13|cuda-13|cuda/'
    echo "$HITS" | grep "/$1\$"
  } | head -1 | xargs -r dirname
}
CUBLAS_DIR=$(pick libcublas.so.13)
CUBLASLT_DIR=$(pick libcublasLt.so.13)
NCCL_DIR=$(pick libnccl.so.2)
log "== found: libcublas.so.13 in '${CUBLAS_DIR}', libcublasLt.so.13 in '${CUBLASLT_DIR}', libnccl.so.2 in '${NCCL_DIR}'"
log "   all candidates: $(echo "$HITS" | sort -u | tr '\n' ' ')"

# Open MPI: drop whatever the image sets, then the bundle's isolated singleton.
for v in $(env | sed -n 's/^\(OMPI_[A-Za-z0-9_]*\|OPAL_[A-Za-z0-9_]*\|PMIX_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
# shellcheck source-path=SCRIPTDIR source=env.sh
. "$B/env.sh"
BASE_LD="$B/lib:${CUBLAS_DIR}:${CUBLASLT_DIR}:${NCCL_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH="$BASE_LD"
export NCCL_DEBUG="${NCCL_DEBUG:-VERSION}"

log "== MPI pre-flight (bundled Open MPI 4.1.4, isolated singleton)"
if [ -z "${FORCE_STUB:-}" ] && timeout 30 "$B/bin/mpitest" >>"$LOG" 2>&1 && grep -q "MPI OK" "$LOG"; then
  MPI_KIND="openmpi-bundle"
else
  log "   bundled Open MPI failed; falling back to the one-process MPI stand-in (lib/stubmpi)"
  export LD_LIBRARY_PATH="$B/lib/stubmpi:$BASE_LD"
  timeout 30 "$B/bin/mpitest" >>"$LOG" 2>&1
  MPI_KIND="stub"
fi
log "   MPI: $MPI_KIND"
log "== ldd of one program (anything 'not found' is fatal):"
one=$(find "$B/bin" -mindepth 2 -maxdepth 2 -type f | head -1)
ldd "$one" 2>&1 | grep -E "nccl|cublas|mpi|not found|libcuda" | tee -a "$LOG"

# ---- the programs of programs.txt, each timed at its check's size, then at S1 and S2
ADAM_S1="N=16777216"
ADAM_S2="N=67108864"
MEG_S1="B=4096 H=4096 K=4096"
MEG_S2="B=8192 H=8192 K=8192"
ROWS=()
CROWS=()
CHUNKS1="${CHUNKS1-lamb_fused lamb_fused_old}"

median_of() { sed -n 's/.* median \([0-9.]*\) ms.*/\1/p' "$1" | tail -1; }

# The two timing sizes of a workload into s1 and s2; false for one without sizes.
sizes_of() {
  case "$1" in
    adam | lamb | folds) s1=$ADAM_S1 s2=$ADAM_S2 ;;
    megatron_layer) s1=$MEG_S1 s2=$MEG_S2 ;;
    *) return 1 ;;
  esac
}

mapfile -t PROGS < <(grep -v '^#' "$B/programs.txt" | grep -v '^[[:space:]]*$')
for entry in "${PROGS[@]}"; do
  read -r name workload _ <<<"$entry"
  sizes_of "$workload" || { log "== $name: no sizes for workload $workload"; continue; }
  dir="$B/bin/$name"
  exe=$(find "$dir" -maxdepth 1 -type f 2>/dev/null | head -1)
  if [ -z "$exe" ]; then
    log "== $name: no binary"
    ROWS+=("$name|missing|-|-|-|-")
    continue
  fi
  log ""
  log "== $name: $(basename "$exe") (t=$(elapsed)s), check at $(sed -n 's/^sym \([^ ]*\) \(.*\)/\1=\2/p' "$dir/check/np1/meta.txt" | tr '\n' ' ')"
  tmp="$OUT/.run.txt"
  lim=$(run_limit)
  if [ "$lim" -lt 8 ]; then
    log "   skipped: past the ${DEADLINE}s deadline"
    ROWS+=("$name|skipped|-|-|-|-")
    continue
  fi
  # 1. the check against check/np1 (the reference interpreter), timed at the check's size
  (cd "$dir" && timeout -k 5 "$lim" "./$(basename "$exe")" --iters "$ITERS") >"$tmp" 2>&1
  rc=$?
  cat "$tmp" >>"$LOG"
  log "   [check run exit $rc]"
  if grep -q "PASSED" "$tmp"; then
    chk=PASSED
  elif grep -q "FAILED" "$tmp"; then
    chk=FAILED
  elif [ $rc -ge 124 ]; then
    chk=TIMEOUT
  else
    chk="ERROR($rc)"
  fi
  maxerr=$(sed -n 's/.*max relative error \([^:]*\).*/\1/p' "$tmp" | sort -g | tail -1)
  t0=$(median_of "$tmp")
  grep -E "PASSED|FAILED|DIFFERS|median|rank 0:" "$tmp" | head -8 | sed 's/^/   | /'
  # 2. the larger sizes, without the check
  ts=()
  for sz in "$s1" "$s2"; do
    if [ "$(elapsed)" -gt "$BUDGET" ]; then
      log "   skip $sz: past ${BUDGET}s"
      ts+=("skipped")
      continue
    fi
    if [ "$chk" = TIMEOUT ]; then
      log "   skip $sz: the check run hung"
      ts+=("skipped")
      continue
    fi
    lim=$(run_limit)
    if [ "$lim" -lt 8 ]; then
      log "   skip $sz: past the ${DEADLINE}s deadline"
      ts+=("skipped")
      continue
    fi
    # shellcheck disable=SC2086 # $sz is several NAME=EXTENT arguments
    (cd "$dir" && timeout -k 5 "$lim" "./$(basename "$exe")" $sz --no-check --iters "$ITERS") >"$tmp" 2>&1
    rc=$?
    cat "$tmp" >>"$LOG"
    log "   [$sz exit $rc]"
    m=$(median_of "$tmp")
    [ -z "$m" ] && m="err($rc)"
    ts+=("$m")
    grep -E "median|rank 0:" "$tmp" | head -3 | sed 's/^/   | /'
  done
  ROWS+=("$name|$chk|${maxerr:--}|${t0:--}|${ts[0]}|${ts[1]}")
done

# ---- the chunk count: CHUNKS1's programs at S1 and S2 with one chunk per fused collective
for name in $CHUNKS1; do
  workload=$(awk -v n="$name" '$1 == n {print $2}' "$B/programs.txt")
  sizes_of "$workload" || continue # not in the bundle
  dir="$B/bin/$name"
  exe=$(find "$dir" -maxdepth 1 -type f 2>/dev/null | head -1)
  [ -z "$exe" ] && continue
  log ""
  tmp="$OUT/.run.txt"
  log "== $name with TANDEM_CUDA_CHUNKS=1 (t=$(elapsed)s)"
  ts=()
  for sz in "$s1" "$s2"; do
    lim=$(run_limit)
    if [ "$(elapsed)" -gt "$BUDGET" ] || [ "$lim" -lt 8 ]; then
      log "   skip $sz: past the budget"
      ts+=("skipped")
      continue
    fi
    # shellcheck disable=SC2086 # $sz is several NAME=EXTENT arguments
    (cd "$dir" && TANDEM_CUDA_CHUNKS=1 timeout -k 5 "$lim" "./$(basename "$exe")" $sz --no-check \
      --iters "$ITERS") >"$tmp" 2>&1
    rc=$?
    cat "$tmp" >>"$LOG"
    log "   [$sz chunks=1 exit $rc]"
    m=$(median_of "$tmp")
    [ -z "$m" ] && m="err($rc)"
    ts+=("$m")
  done
  CROWS+=("$name|${ts[0]}|${ts[1]}")
done
rm -f "$OUT/.run.txt"

{
  echo ""
  echo "== summary (median ms of $ITERS runs, -np 1, MPI: $MPI_KIND; ms@check at the sizes logged per program;"
  echo "   adam/lamb S1=$ADAM_S1 S2=$ADAM_S2; megatron S1=$MEG_S1 S2=$MEG_S2); total $(elapsed)s"
  printf "%-16s %-10s %-10s %12s %12s %12s\n" program check max_rel_err "ms@check" "ms@S1" "ms@S2"
  for r in "${ROWS[@]}"; do
    IFS='|' read -r a b c d e f <<<"$r"
    printf "%-16s %-10s %-10s %12s %12s %12s\n" "$a" "$b" "$c" "$d" "$e" "$f"
  done
  if [ ${#CROWS[@]} -gt 0 ]; then
    echo "with TANDEM_CUDA_CHUNKS=1 (the rows above: 4):"
    printf "%-16s %-10s %-10s %12s %12s %12s\n" program "" "" "" "ms@S1" "ms@S2"
    for r in "${CROWS[@]}"; do
      IFS='|' read -r a e f <<<"$r"
      printf "%-16s %-10s %-10s %12s %12s %12s\n" "$a" "" "" "" "$e" "$f"
    done
  fi
} | tee "$SUM" | tee -a "$LOG"
exit 0
