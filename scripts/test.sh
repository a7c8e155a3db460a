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
# The Python part's venv (torch's and Ray's wheels, gigabytes to download and unpack) is made in
# the background while the C++ builds; the tests start once both are done, on a quiet machine.
# Should it fail, the Python part makes it again and says why.
venv_job=
if [ "${TUTTI_TEST_PYTHON:-1}" = "1" ]; then
  mkdir -p build
  scripts/python-env.sh --venv > build/python-venv.log 2>&1 &
  venv_job=$!
  # A failed build ends the command: the venv's making goes with it.
  trap 'pkill -P "$venv_job" 2>/dev/null; kill "$venv_job" 2>/dev/null; true' EXIT
fi
start=$SECONDS
scripts/build.sh
echo "test.sh: the build took $((SECONDS - start)) s"
if [ -n "$venv_job" ]; then
  start=$SECONDS
  wait "$venv_job" || echo "test.sh: making the venv in the background failed:" \
    "$(tail -n 3 build/python-venv.log)"
  trap - EXIT
  echo "test.sh: waited $((SECONDS - start)) s more for the venv; $(tail -n 1 build/python-venv.log)"
fi
exclude=(-LE large)
if [ "${TUTTI_TEST_LARGE:-0}" = "1" ]; then
  exclude=()
fi
start=$SECONDS
(cd build && ctest -j"$(nproc)" --output-on-failure --timeout 600 "${exclude[@]}")
echo "test.sh: the tests took $((SECONDS - start)) s"
if [ "${TUTTI_TEST_PYTHON:-1}" = "1" ]; then
  start=$SECONDS
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
