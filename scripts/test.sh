#!/usr/bin/env bash
# The test command (what CI runs): set-up, the layout check (scripts/format.sh --check), build,
# and every test except the "large" (>2 GiB)
# cases; then the Python package's tests (pytest, in the venv scripts/python-env.sh makes, Ray
# included); then the sanitizer runs (scripts/sanitize.sh: the whole suite under AddressSanitizer
# and UndefinedBehaviorSanitizer, the threaded and transfer tests under ThreadSanitizer, every
# fuzzer for FUZZ_SECONDS each). TUTTI_TEST_LARGE=1 runs the large cases too;
# TUTTI_TEST_PYTHON=0 skips the Python part, TUTTI_TEST_SANITIZE=0 the sanitizer runs.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
scripts/setup-debian.sh
scripts/format.sh --check  # the tree follows .clang-format (scripts/format.sh applies it)
echo "test.sh: the set-up took $((SECONDS - start)) s"
# The Python part's wheels (torch's and Ray's, gigabytes) download in the background while the
# C++ builds and its tests run; the Python part installs them without the network. Should the
# download fail, the Python part downloads them itself.
fetch=
if [ "${TUTTI_TEST_PYTHON:-1}" = "1" ]; then
  mkdir -p build
  scripts/python-env.sh --fetch > build/python-fetch.log 2>&1 &
  fetch=$!
  # A failed build or test ends the command: the download goes with it.
  trap 'pkill -P "$fetch" 2>/dev/null; kill "$fetch" 2>/dev/null; true' EXIT
fi
start=$SECONDS
scripts/build.sh
echo "test.sh: the build took $((SECONDS - start)) s"
exclude=(-LE large)
if [ "${TUTTI_TEST_LARGE:-0}" = "1" ]; then
  exclude=()
fi
start=$SECONDS
(cd build && ctest -j"$(nproc)" --output-on-failure --timeout 600 "${exclude[@]}")
echo "test.sh: the tests took $((SECONDS - start)) s"
if [ "${TUTTI_TEST_PYTHON:-1}" = "1" ]; then
  start=$SECONDS
  wait "$fetch" || echo "test.sh: the background download of the wheels failed:" \
    "$(tail -n 3 build/python-fetch.log)"
  trap - EXIT
  echo "test.sh: waited $((SECONDS - start)) s for the wheels; $(tail -n 1 build/python-fetch.log)"
  python=$(scripts/python-env.sh | tail -n 1)
  # From the top level: run inside python/, the source tree's tutti/ (no extension module)
  # would shadow the installed package.
  "$python" -m pytest -q python/tests
  echo "test.sh: the Python part took $((SECONDS - start)) s (venv, package build, tests)"
fi
if [ "${TUTTI_TEST_SANITIZE:-1}" = "1" ]; then
  start=$SECONDS
  FUZZ_SECONDS=${FUZZ_SECONDS:-10} scripts/sanitize.sh
  echo "test.sh: the sanitizer runs took $((SECONDS - start)) s (builds, tests, fuzzers)"
fi
