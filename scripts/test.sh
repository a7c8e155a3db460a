#!/usr/bin/env bash
# The test command (what CI runs): set-up, the layout check (scripts/format.sh --check), build,
# and every test except the "large" (>2 GiB) cases; then the Python package's tests (pytest, in
# the venv scripts/python-env.sh makes, Ray included); then the sanitizer runs
# (scripts/sanitize.sh: the whole suite under AddressSanitizer and UndefinedBehaviorSanitizer,
# the threaded and transfer tests under ThreadSanitizer, every fuzzer for FUZZ_SECONDS each,
# default 5). The sanitizer builds run in the background while the plain and Python tests run,
# and the collective matrix's worlds 4 and 8 run in the sanitizer run only (see below).
# TUTTI_TEST_LARGE=1 runs the large cases too; TUTTI_TEST_PYTHON=0 skips the Python part,
# TUTTI_TEST_SANITIZE=0 the sanitizer runs (the plain run then takes every world).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
scripts/setup-debian.sh
scripts/format.sh --check  # the tree follows .clang-format (scripts/format.sh applies it)
echo "test.sh: the set-up took $((SECONDS - start)) s"
# The Python part's venv (torch's and Ray's wheels, gigabytes to download and unpack) is made in
# the background while the C++ builds; the tests start once both are done. Should it fail, the
# Python part makes it again and says why.
# Background jobs run in process groups of their own (setsid): a failure here ends them all.
background=()
stop_background() {
  for job in "${background[@]}"; do kill -- -"$job" 2>/dev/null || true; done
}
trap stop_background EXIT
mkdir -p build
venv_job=
if [ "${TUTTI_TEST_PYTHON:-1}" = "1" ]; then
  setsid scripts/python-env.sh --venv > build/python-venv.log 2>&1 &
  venv_job=$!
  background+=("$venv_job")
fi
start=$SECONDS
scripts/build.sh
echo "test.sh: the build took $((SECONDS - start)) s"
# The sanitizer builds (scripts/sanitize.sh --build) run in the background at idle priority
# (SCHED_IDLE: on the CPU time the tests below leave, which waiting on processes, timeouts and
# Ray leaves plenty of) while the plain and Python tests run. The scheduler gives those the CPU
# whenever they want it, yet on a 2-vCPU VM the Python tests still ran about 1.5x slower beside
# it (the vCPUs share more than the scheduler sees). The sanitizer builds hidden this way
# outweighed that: about 400 s of build time against about 250 s more for the Python part.
# Should the background build fail, the sanitizer part builds again and shows why.
san_job=
if [ "${TUTTI_TEST_SANITIZE:-1}" = "1" ]; then
  setsid chrt --idle 0 scripts/sanitize.sh --build > build/sanitize-build.log 2>&1 &
  san_job=$!
  background+=("$san_job")
fi
if [ -n "$venv_job" ]; then
  start=$SECONDS
  wait "$venv_job" || echo "test.sh: making the venv in the background failed:" \
    "$(tail -n 3 build/python-venv.log)"
  echo "test.sh: waited $((SECONDS - start)) s more for the venv; $(tail -n 1 build/python-venv.log)"
fi
exclude=(-LE large)
if [ "${TUTTI_TEST_LARGE:-0}" = "1" ]; then
  exclude=()
fi
if [ "${TUTTI_TEST_SANITIZE:-1}" = "1" ]; then
  # The collective matrix at worlds 4 and 8 runs in the sanitizer run only: the optimised
  # reduction kernels and copies are the same code at every world (worlds 1 to 3 take every
  # dtype, op and size here), and what worlds 4 and 8 add, the algorithms' schedules, does not
  # depend on the optimisation level. Those two worlds were a fifth of this run's test time.
  # (A parameterised test's ctest name ends in a comment giving its parameters.)
  exclude+=(-E 'CollectiveMatrix\..*_world[48]( |$)')
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
  wait "$san_job" || echo "test.sh: the sanitizer builds in the background failed" \
    "(build/sanitize-build.log): building them here"
  echo "test.sh: waited $((SECONDS - start)) s more for the sanitizer builds"
  start=$SECONDS
  FUZZ_SECONDS=${FUZZ_SECONDS:-5} scripts/sanitize.sh
  echo "test.sh: the sanitizer runs took $((SECONDS - start)) s (builds, tests, fuzzers)"
fi
