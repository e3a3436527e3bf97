#!/usr/bin/env bash
# Checks that every C++ and CUDA source in the repository is formatted as .clang-format says;
# `scripts/check-format.sh --fix` rewrites the files that are not.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! clang-format --dry-run --Werror "${files[@]}" 2>"$log"; then
  grep -E '^[^ ].*: (error|warning):' "$log" | cut -d: -f1 | sort -u | sed 's/^/  not formatted: /'
  echo "check-format: run scripts/check-format.sh --fix (clang-format $(clang-format --version | grep -oE '[0-9]+\.[0-9.]+'))" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted as .clang-format says"
