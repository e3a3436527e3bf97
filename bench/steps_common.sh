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
