#!/usr/bin/env bash
# The test command (what CI runs): set-up, build, and every test except the "large" (>2 GiB)
# cases. TUTTI_TEST_LARGE=1 runs those too.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exclude=(-LE large)
if [ "${TUTTI_TEST_LARGE:-0}" = "1" ]; then
  exclude=()
fi
cd build
ctest -j"$(nproc)" --output-on-failure --timeout 600 "${exclude[@]}"
