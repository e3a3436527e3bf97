#!/bin/bash
# Builds every emitted program under DIR/src (default .device) for sm_90 (H100, H200) into
# DIR/bin/<name>/, with its check/ reference results beside it. Each program's own Makefile is
# used, warnings as errors; its output goes to DIR/src/<name>/build.log. ARCH overrides the target.
set -uo pipefail
B="${1:-.device}"
ARCH="${ARCH:--gencode arch=compute_90,code=sm_90}"
failed=0
for d in "$B"/src/*/; do
  n=$(basename "$d")
  # The program's name: the Makefile's first rule that builds from a .cu file.
  prog=$(sed -n 's/^\([A-Za-z0-9_]*\): .*\.cu$/\1/p' "$d/Makefile" | head -1)
  echo "== $n ($prog)"
  if ! make -C "$d" ARCH="$ARCH" >"$d/build.log" 2>&1; then
    echo "BUILD FAILED $n"
    tail -20 "$d/build.log"
    failed=1
    continue
  fi
  mkdir -p "$B/bin/$n"
  cp "$d/$prog" "$B/bin/$n/$prog"
  rm -rf "$B/bin/$n/check"
  cp -r "$d/check" "$B/bin/$n/check"
done
exit $failed
