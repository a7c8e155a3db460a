#!/usr/bin/env bash
# Applies the project's C++ style (.clang-format: Google's, 100 columns) to every tracked C and
# C++ file, with Debian 12's clang-format 14 (other versions lay some lines out differently).
#   scripts/format.sh            rewrite the files in place
#   scripts/format.sh --check    change nothing; list the files that differ and exit 1 if any
#                                (the test command runs this)
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = "--check" ]; then
  check=1
elif [ $# -gt 0 ]; then
  echo "usage: scripts/format.sh [--check]" >&2
  exit 2
fi
tool=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$tool" ]; then
  echo "format: clang-format 14 is not installed (scripts/setup-debian.sh installs it)" >&2
  exit 2
fi
if ! "$tool" --version | grep -q "version 14\."; then
  echo "format: $tool is not version 14 ($("$tool" --version)); the tree is laid out by 14" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.c' '*.cc' '*.cpp' '*.h' '*.hpp')
if [ "$check" = 1 ]; then
  differ=()
  for f in "${files[@]}"; do
    if ! "$tool" --dry-run -Werror "$f" >/dev/null 2>&1; then differ+=("$f"); fi
  done
  if [ ${#differ[@]} -gt 0 ]; then
    echo "format: ${#differ[@]} file(s) differ from .clang-format (run scripts/format.sh):" >&2
    printf '  %s\n' "${differ[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files follow .clang-format"
else
  "$tool" -i "${files[@]}"
fi
