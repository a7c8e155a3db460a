#!/usr/bin/env bash
# The test command (what CI runs): set-up, the layout check (scripts/format.sh --check), the
# Release build and the tests only an optimised build can show (release_only below: resident
# memory, every dtype's large case, the installed package, the benchmarks and examples); then the
# Python package's tests (pytest, in the venv scripts/python-env.sh makes, Ray included); then
# the sanitizer runs (scripts/sanitize.sh: the whole C++ suite but the "large" (>2 GiB) cases
# under AddressSanitizer and UndefinedBehaviorSanitizer, the threaded and transfer tests under
# ThreadSanitizer, every fuzzer for FUZZ_SECONDS each, default 5). The sanitizer builds run in
# the background while the plain and Python tests run.
# TUTTI_TEST_LARGE=1 runs the large cases too; TUTTI_TEST_PYTHON=0 skips the Python part;
# TUTTI_TEST_SANITIZE=0 skips the sanitizer runs, and the Release build then builds and runs
# every test.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
scripts/setup-debian.sh
scripts/format.sh --check  # the tree follows .clang-format (scripts/format.sh applies it)
echo "test.sh: the set-up took $((SECONDS - start)) s"
# A fresh clone's run writes about 7 GiB: the venv 5.5 (torch's Linux wheels bring CUDA's
# libraries), the Release, ASan and TSan trees 1.5. Where the disk has less free, pip or the
# linker stops with ENOSPC part-way; say so first, with the figures, so the cause is plain.
read -r free_mib mount < <(df -Pm . | awk 'NR == 2 {print $4, $6}')
need_mib=7500
if [ -x build/venv/bin/python ]; then need_mib=2000; fi
if [ "$free_mib" -lt "$need_mib" ]; then
  echo "test.sh: warning: $free_mib MiB free on $mount, and this" \
    "run may write $need_mib MiB (the venv 5.5 GiB, the three builds 1.5); it may stop with" \
    "'No space left on device'" >&2
fi
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
# With the sanitizer runs (the default), the whole C++ suite runs there, under AddressSanitizer
# and UndefinedBehaviorSanitizer; the plain Release build runs what only an optimised build
# shows (release_only below), so it builds the library, tools, benchmarks, examples and plugins,
# and only the test executables those tests are in. TUTTI_TEST_SANITIZE=0 builds and runs all.
release_only=(
  'Backends/CollectiveMatrix\.'            # every dtype's large case on the -O3 kernels
  'Stores/Cycles\.'                        # resident memory flat over 1000 cycles (ASan's
  'Transfer\.TenThousandCyclesLeakNothing' # quarantine grows it, so the sanitizer run cannot)
  'TCPStoreServerLimits\.OutOfDescriptors' # not under the sanitizers (sanitize.sh says why)
  'Package\.'                              # the installed package (ditto)
  'Bench' 'FaultBench\.' 'Examples\.'      # what users run, built as they build it
  'Types\.Float16MatchesCompiler'          # needs GCC's _Float16 (clang 14 has none)
  'Backends/Faults\.AForkedChildsDumpSignal' # a forked child's new thread (clang 14 ASan: no)
)
release_executables=(collectives_test fault_test transfer_test tcp_store_test bench_test
                     types_test)
# The tests labelled gpu run in the Release build only (not under the sanitizers): where a GPU is
# visible every test executable is built and they run after release_only; elsewhere they would
# only skip, and are not built.
gpu=0
if nvidia-smi -L > /dev/null 2>&1; then gpu=1; fi
start=$SECONDS
if [ "${TUTTI_TEST_SANITIZE:-1}" = "1" ] && [ "${TUTTI_TEST_LARGE:-0}" != "1" ] &&
  [ "$gpu" = 0 ]; then
  scripts/build.sh --no-tests "${release_executables[@]}"
else
  scripts/build.sh
fi
echo "test.sh: the build took $((SECONDS - start)) s"
# The sanitizer builds (scripts/sanitize.sh --build) run in the background at idle priority
# (SCHED_IDLE: on the CPU time the tests below leave, which waiting on processes, timeouts and
# Ray leaves plenty of) while the plain and Python tests run. The scheduler gives those the CPU
# whenever they want it, yet on a 2-vCPU VM the Python tests still ran about 1.5x slower beside
# it (the vCPUs share more than the scheduler sees). The sanitizer builds hidden this way
# outweighed that: about 400 s of build time against about 250 s more for the Python part.
# The ASan build (with the fuzzers) comes first and says when it is done
# (build/sanitize-asan.rc): its tests and the fuzzers start then, while the TSan build goes on
# beside them on the CPU they leave (the ASan tests use about 1.5 of 2 cores, a fuzzer one).
# Should a background build fail, the sanitizer part builds again and shows why.
san_job=
if [ "${TUTTI_TEST_SANITIZE:-1}" = "1" ]; then
  rm -f build/sanitize-asan.rc
  setsid chrt --idle 0 bash -c 'scripts/sanitize.sh --build asan fuzz; echo $? > \
    build/sanitize-asan.rc; scripts/sanitize.sh --build tsan' > build/sanitize-build.log 2>&1 &
  san_job=$!
  background+=("$san_job")
fi
if [ -n "$venv_job" ]; then
  start=$SECONDS
  wait "$venv_job" || echo "test.sh: making the venv in the background failed:" \
    "$(tail -n 3 build/python-venv.log)"
  echo "test.sh: waited $((SECONDS - start)) s more for the venv; $(tail -n 1 build/python-venv.log)"
fi
select=(-LE large)
if [ "${TUTTI_TEST_SANITIZE:-1}" = "1" ]; then
  # Each part of release_only must still name a test (a renamed test would drop out silently).
  for part in "${release_only[@]}"; do
    n=$(cd build && ctest -N -R "^$part" | sed -n 's/^Total Tests: //p')
    if [ "${n:-0}" -eq 0 ]; then
      echo "test.sh: no test matches '^$part' of release_only: renamed? (scripts/test.sh)" >&2
      exit 1
    fi
  done
  pattern=$(IFS='|'; echo "^(${release_only[*]})")
  # The collective matrix at worlds 4 and 8 runs in the sanitizer run only: the optimised
  # reduction kernels and copies are the same code at every world (worlds 1 to 3 take every
  # dtype, op and size here), and what worlds 4 and 8 add, the algorithms' schedules, does not
  # depend on the optimisation level. (A parameterised test's ctest name ends in a comment
  # giving its parameters.)
  select+=(-R "$pattern" -E 'CollectiveMatrix\..*_world[48]( |$)')
elif [ "${TUTTI_TEST_LARGE:-0}" = "1" ]; then
  select=()
fi
start=$SECONDS
(cd build && ctest -j"$(nproc)" --output-on-failure --timeout 600 "${select[@]}")
if [ "${TUTTI_TEST_SANITIZE:-1}" = "1" ]; then
  if [ "${TUTTI_TEST_LARGE:-0}" = "1" ]; then
    (cd build && ctest -j"$(nproc)" --output-on-failure --timeout 600 -L large)
  fi
  if [ "$gpu" = 1 ]; then
    (cd build && ctest --output-on-failure --timeout 600 -L gpu)
  else
    echo "test.sh: the tests labelled gpu are not run here: no GPU is visible (nvidia-smi -L)"
  fi
fi
echo "test.sh: the tests took $((SECONDS - start)) s"
if [ "${TUTTI_TEST_PYTHON:-1}" = "1" ]; then
  start=$SECONDS
  python=$(scripts/python-env.sh | tail -n 1)
  # From the top level: run inside python/, the source tree's tutti/ (no extension module)
  # would shadow the installed package.
  # The slowest ten are named at the end (CI has 30 minutes for all of test.sh).
  "$python" -m pytest -q --durations=10 python/tests
  echo "test.sh: the Python part took $((SECONDS - start)) s (venv, package build, tests)"
fi
if [ "${TUTTI_TEST_SANITIZE:-1}" = "1" ]; then
  san_start=$SECONDS
  start=$SECONDS
  while [ ! -e build/sanitize-asan.rc ] && kill -0 "$san_job" 2>/dev/null; do sleep 1; done
  [ "$(cat build/sanitize-asan.rc 2>/dev/null)" = 0 ] ||
    echo "test.sh: the ASan build in the background failed (build/sanitize-build.log):" \
      "building it here"
  echo "test.sh: waited $((SECONDS - start)) s more for the ASan build"
  start=$SECONDS
  FUZZ_SECONDS=${FUZZ_SECONDS:-5} scripts/sanitize.sh asan fuzz
  echo "test.sh: the ASan+UBSan tests and the fuzzers took $((SECONDS - start)) s"
  start=$SECONDS
  wait "$san_job" || echo "test.sh: the TSan build in the background failed" \
    "(build/sanitize-build.log): building it here"
  echo "test.sh: waited $((SECONDS - start)) s more for the TSan build"
  start=$SECONDS
  scripts/sanitize.sh tsan
  echo "test.sh: the TSan tests took $((SECONDS - start)) s"
  echo "test.sh: the sanitizer part took $((SECONDS - san_start)) s (waits, tests, fuzzers)"
fi
