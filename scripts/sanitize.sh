#!/usr/bin/env bash
# The sanitizer runs of the test command (scripts/test.sh calls this; CI runs it):
#   asan   the whole C++ suite built with AddressSanitizer (and LeakSanitizer) and
#          UndefinedBehaviorSanitizer, clang, in build-asan/; the fuzzers are built there too
#          (the NCCL backend and cuda_ipc against the declared CUDA headers, as on a machine
#          without the toolkit)
#   tsan   the threaded, transfer and NCCL-stand-in tests built with ThreadSanitizer, GCC, in
#          build-tsan/ (only those targets)
#   fuzz   every libFuzzer target (tests/fuzz/) for FUZZ_SECONDS each (default 20), from its seeds
#          in tests/fuzz/seeds/<target>/ with seed FUZZ_SEED (default 1); a crash leaves its
#          input in build-asan/fuzz/<target>/ (copy it to the seeds as regression-<what> once
#          fixed). To hunt: FUZZ_SEED=0 FUZZ_SECONDS=600 FUZZ_CORPUS=keep scripts/sanitize.sh fuzz
#
#   scripts/sanitize.sh            # all three
#   scripts/sanitize.sh asan fuzz  # some
#   scripts/sanitize.sh --build    # only build them (scripts/test.sh does so in the background,
#                                  # at idle priority, while the plain tests run)
#
# Suppressions (tests/sanitizers/*.supp) are for third-party code only, each with its reason.
# Findings fail the run: UBSan's are errors (-fno-sanitize-recover), not warnings.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build_only=0
if [ "${1:-}" = "--build" ]; then
  build_only=1
  shift
fi
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(asan tsan fuzz)
jobs=$(nproc)
supp=$root/tests/sanitizers
# intercept_tls_get_addr=0: clang-14's LeakSanitizer takes a thread's dynamic TLS block that
# begins 16 bytes past a page for one of glibc 2.19-2.24's, reads its range from the header those
# had in front of it (glibc 2.25 and later allocate it with malloc: no such header), and its
# tracer crashes scanning that range at exit ("Tracer caught signal 11", the process exits 1;
# google/sanitizers#1409, fixed in LLVM 17). Where a block lands depends on the heap's layout,
# so any test could fail by chance (a TwoHostsUcx test did in CI on 2026-12-03; a change of the
# heap's use made another fail every run). Without the interception LeakSanitizer does not scan
# dynamic TLS blocks: memory only they point to would be reported (none is, in the whole suite).
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=0:strict_string_checks=1:intercept_tls_get_addr=0
export LSAN_OPTIONS=suppressions=$supp/lsan.supp
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp
# Fewer repetitions in the tests that repeat one path many times (tests/sanitizers.h says which).
export TUTTI_TEST_LIGHT=1
# Not under the sanitizers: the installed package's consumer project (built without them, it
# cannot link their runtimes), and a test that runs the process out of file descriptors, which
# UBSan's vptr check itself needs to read /proc/self/maps and its suppressions (the plain build
# runs both).
asan_skip='Package\.|TCPStoreServerLimits\.OutOfDescriptorsPausesAcceptingAndWarnsOnce'

# -O0 but for the data path (TUTTI_HOT_FLAGS in CMakeLists.txt says which code that is), at -O1.
opt="-O0 -g1"

configure_asan() {
  CC=clang-14 CXX=clang++-14 cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=None \
    -DCMAKE_C_FLAGS="$opt" -DCMAKE_CXX_FLAGS="$opt" -DTUTTI_HOT_FLAGS=-O1 \
    -DTUTTI_SANITIZE="address;undefined" -DTUTTI_FUZZ=ON -DTUTTI_CUDA_HEADERS=DECLARED >/dev/null
}

for part in "${parts[@]}"; do
  start=$SECONDS
  case $part in
    asan)
      configure_asan
      cmake --build build-asan -j"$jobs"
      echo "sanitize: the asan build took $((SECONDS - start)) s" >&2
      [ "$build_only" = 1 ] && continue
      (cd build-asan && ctest -j"$jobs" --output-on-failure --timeout 900 -LE "large|gpu" \
        -E "$asan_skip")
      ;;
    tsan)
      cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_C_FLAGS="$opt" \
        -DCMAKE_CXX_FLAGS="$opt" -DTUTTI_HOT_FLAGS=-O1 -DTUTTI_SANITIZE=thread >/dev/null
      # The threaded parts: async ops and abort, splits, grow, batched p2p, the direct transport
      # and its two-sided transports, the TCP store in TLS, and the NCCL backend's host logic on
      # the stand-in; the ops' clock (a thread-local anchor each, one rate per process); the
      # single-copy collectives on symmetric memory (ranks as threads of one process).
      targets=(work_test abort_test split_test grow_test tls_test batch_p2p_test transfer_test
               op_clock_test symmetric_test
               transfer_group_test
               transfer_process_test transfer_worker tutti_test_worker tutti_fault_worker tutti-run
               tutti-flight)
      tests='^(Backends/(WorkTest|Abort|AbortProcesses|Split|BatchP2P|BatchP2PRules)|NewGroup|Grow|StoreTls|TensorRefFormat|Transfer|TransferSecret|TransferCustom|TransferGroup|OwnerHere|OwnerThere|OwnerExits|TwoSided|OpClock|Symmetric)[./]'
      if ninja -C build-tsan -t targets all 2>/dev/null | grep -q '^transfer_nccl_test:'; then
        targets+=(nccl_test nccl_fault_test transfer_nccl_test nccl_world_test
                  tutti_standin_cudart tutti_standin_nccl)
        tests="$tests|^standin\\.(nccl_test|nccl_fault_test|transfer_nccl_test|nccl_world_test)"
      fi
      cmake --build build-tsan -j"$jobs" --target "${targets[@]}"
      echo "sanitize: the tsan build took $((SECONDS - start)) s" >&2
      [ "$build_only" = 1 ] && continue
      # Not under TSan: the 1 GiB cancel, whose copies and checks of 1 GiB took 100 s of the
      # run's 130 under TSan's instrumentation; the same cancel and abort paths run under TSan
      # in CancelAndAbortEndGetsAndTheAgentStaysUsable, and the 1 GiB one runs in the plain and
      # ASan builds.
      (cd build-tsan && ctest -j"$jobs" --output-on-failure --timeout 900 -LE "large|gpu" \
        -R "$tests" -E 'Transfer\.CancelAndAbortEndA1GiBCopyMidway')
      ;;
    fuzz)
      configure_asan
      cmake --build build-asan -j"$jobs" --target tutti_fuzzers
      [ "$build_only" = 1 ] && continue
      secs=${FUZZ_SECONDS:-20}
      # A fixed seed and a fresh corpus (the seeds only): a run explores the same inputs in the
      # same order wherever it runs, so the test command's run is a prefix of what passed here
      # (a faster machine goes further). FUZZ_SEED=0 lets libFuzzer pick one; FUZZ_CORPUS=keep
      # grows a corpus in build-asan/fuzz/<target>/corpus across runs instead.
      seed=${FUZZ_SEED:-1}
      for bin in build-asan/tests/fuzz/fuzz_*; do
        [ -x "$bin" ] || continue
        name=$(basename "$bin")
        seeds=$root/tests/fuzz/seeds/${name#fuzz_}
        work=build-asan/fuzz/$name
        [ "${FUZZ_CORPUS:-fresh}" = keep ] || rm -rf "$work/corpus"
        mkdir -p "$work/corpus"
        echo "sanitize: $name for $secs s, seed $seed (seeds: $seeds)" >&2
        "$bin" -max_total_time="$secs" -seed="$seed" -print_final_stats=1 \
          -artifact_prefix="$work/" -timeout=10 -rss_limit_mb=2048 "$work/corpus" "$seeds" \
          2>"$work/log" || {
          tail -40 "$work/log" >&2
          echo "sanitize: $name found a crash; its input is in $work/ (replay: $bin FILE)" >&2
          exit 1
        }
        grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$work/log" | tr '\n' ' ' >&2
        echo >&2
      done
      ;;
    *) echo "sanitize: unknown part '$part' (asan, tsan, fuzz)" >&2; exit 2 ;;
  esac
  echo "sanitize: $part took $((SECONDS - start)) s" >&2
done
