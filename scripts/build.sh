#!/usr/bin/env bash
# Installs what is missing, then configures and builds tutti in ./build (Release).
#
#   scripts/build.sh [-DOPTION=VALUE ...]            everything
#   scripts/build.sh --no-tests [TARGET ...] [-D...] everything but the tests' directory (tests/:
#                                                    its executables, workers and stand-ins), and
#                                                    the targets named (scripts/test.sh builds the
#                                                    few test executables its plain run needs)
set -euo pipefail
cd "$(dirname "$0")/.."
configure=()
no_tests=0
named=()
for arg in "$@"; do
  case $arg in
    --no-tests) no_tests=1 ;;
    -*) configure+=("$arg") ;;
    *) named+=("$arg") ;;
  esac
done
if [ "$no_tests" = 0 ] && [ ${#named[@]} -gt 0 ]; then
  echo "build.sh: targets are named only after --no-tests (without it, everything is built)" >&2
  exit 2
fi
scripts/setup-debian.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${configure[@]}" >/dev/null
if [ "$no_tests" = 0 ]; then
  cmake --build build -j"$(nproc)"
  exit 0
fi
# Ninja has an "all" target per source directory (src/all, backends/gloo/all, ...): every one
# but tests/ and the directories under it.
mapfile -t dirs < <(ninja -C build -t targets all | sed -n 's|^\(.*/all\): phony$|\1|p' |
  grep -v '^tests\(/\|$\)')
if [ ${#dirs[@]} -eq 0 ]; then
  echo "build.sh: ninja -C build -t targets all named no directory targets" >&2
  exit 1
fi
cmake --build build -j"$(nproc)" --target "${dirs[@]}" "${named[@]}"
