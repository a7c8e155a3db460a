#!/usr/bin/env bash
# The GPU checks, on the device machine (one H200), over the .device/ bundle from prepare.sh:
# the NCCL unit and GPU tests, every op at world size 1 on the GPU, tutti-bench's NCCL backend
# against raw NCCL in one run, the two GPU examples, and the direct transport's cuda_ipc (its
# tests between two processes, and tutti-bench --op transfer --transport cuda_ipc: copy against
# the staged path and an in-process device-to-device copy, then warm borrows); then the Python
# package's GPU tests (scripts/device/python.sh).
#
#   bash scripts/device/run.sh            (the `device` tool, carrying .device; one call)
#
# Bounded: every step runs under `timeout`, and the limits add up to 505 s (see STEPS below),
# inside a 10-minute command (the whole ran in 34 s on an H200 without the Python step). NCCL is
# the nvidia-nccl-cu13 wheel that the device image ships (no pip: the machine has no network);
# without it the script stops at once with exit status 3. NCCL_DEBUG=WARN. A GPU test that skips counts as a failure (on the device every
# selected test must run). Writes to $OUT (default /tmp/tutti-device): run.log (everything, step
# by step), result.json (each step's status, seconds and limit, the GPU, driver, compute mode and
# NCCL found), bench-nccl.json and bench-cuda-ipc.json, and the Python step's torch/
# (torch_bench.json, .md, .svg and ranks1/rank0.json). Prints one line per step, and a failed
# step's last lines. Exit status: 0 when every step passed, 1 when one failed, 3
# without NCCL.
#
# For the CPU check of this script (tests/device_run_test.sh, against the stand-in):
# TUTTI_DEVICE_BUNDLE (default .device), TUTTI_DEVICE_BENCH_MAX (tutti-bench's largest size,
# default 256M), TUTTI_DEVICE_IPC_MIN / TUTTI_DEVICE_IPC_MAX (the cuda_ipc sweep, default 1M to
# 1G), TUTTI_DEVICE_PYTHON (default python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
bundle=${TUTTI_DEVICE_BUNDLE:-.device}
bench_max=${TUTTI_DEVICE_BENCH_MAX:-256M}
ipc_min=${TUTTI_DEVICE_IPC_MIN:-1M}
ipc_max=${TUTTI_DEVICE_IPC_MAX:-1G}
python=${TUTTI_DEVICE_PYTHON:-python3}
out=${OUT:-/tmp/tutti-device}
mkdir -p "$out"
log="$out/run.log"
result="$out/result.json"
: >"$log"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

say() { echo "$*" | tee -a "$log"; }
json_escape() { sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr '\n' ' '; }

# The device: GPU, driver, compute mode (EXCLUSIVE_PROCESS changes how the two-process test
# fails), the C library. Logged before anything can fail.
gpu_info=$(timeout -k 2 10 nvidia-smi --query-gpu=name,driver_version,compute_mode,memory.total \
  --format=csv,noheader 2>&1 | head -4)
glibc=$(ldd --version 2>&1 | head -1)
say "device: ${gpu_info:-nvidia-smi gave nothing}"
say "glibc: $glibc"

# NCCL from the wheel. `m.__path__` also works for namespace packages (m.__file__ is None there).
nccl_dir=$(timeout -k 2 20 "$python" -c \
  'import nvidia.nccl as m; print(list(m.__path__)[0] + "/lib")' 2>>"$log") || nccl_dir=""
steps_json=""
status=passed

write_result() {
  {
    echo "{"
    echo "  \"status\": \"$status\","
    echo "  \"device\": \"$(printf '%s' "$gpu_info" | json_escape)\","
    echo "  \"glibc\": \"$(printf '%s' "$glibc" | json_escape)\","
    echo "  \"nccl_library\": \"$(printf '%s' "${nccl_lib:-}" | json_escape)\","
    echo "  \"steps\": [${steps_json}"
    echo "  ]"
    echo "}"
  } >"$result"
}

if [ -z "$nccl_dir" ] || [ ! -e "$nccl_dir/libnccl.so.2" ]; then
  say "run.sh: FAILED: no libnccl.so.2 from the nvidia-nccl-cu13 wheel (looked in '${nccl_dir}'" \
      "via $python's nvidia.nccl); the device image should ship it, and this script installs nothing"
  status=no_nccl
  write_result
  exit 3
fi
nccl_lib="$nccl_dir/libnccl.so.2"
if ! bundle=$(cd "$bundle" 2>/dev/null && pwd) || [ ! -d "$bundle/bin" ]; then
  say "run.sh: FAILED: no bundle at ${TUTTI_DEVICE_BUNDLE:-.device} (run scripts/device/prepare.sh" \
      "here and carry .device)"
  status=no_bundle
  write_result
  exit 1
fi
export LD_LIBRARY_PATH="$bundle/lib:$nccl_dir:${LD_LIBRARY_PATH:-}"
export TUTTI_NCCL_LIBRARY="$nccl_lib"
export NCCL_DEBUG=WARN
say "nccl: $nccl_lib"
bin="$bundle/bin"

# True when FILE reports at least one "sum A (expected B)" and every one has A = B.
sums_agree() {
  local found
  found=$(grep -oE 'sum [^ ]+ \(expected [^)]+\)' "$1") || return 1
  ! printf '%s\n' "$found" | while read -r _ got _ want; do
    [ "$got" = "${want%)}" ] || echo "$got != ${want%)}"
  done | grep -q .
}

# step NAME LIMIT_S CHECK COMMAND...: runs COMMAND under timeout, its output into run.log.
# CHECK is "gtest" (no test may skip), "sums" (see sums_agree), a grep -E pattern the output
# must match, or "-".
step() {
  local name=$1 limit=$2 check=$3
  shift 3
  local output="$work/$name.out"
  {
    echo
    echo "=== $name (limit ${limit} s): $*"
  } >>"$log"
  local start end rc why=""
  start=$(date +%s.%N)
  timeout -k 5 "$limit" "$@" >"$output" 2>&1
  rc=$?
  end=$(date +%s.%N)
  cat "$output" >>"$log"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    why="timed out after ${limit} s"
  elif [ "$rc" -ne 0 ]; then
    why="exit status $rc"
  elif [ "$check" = gtest ] && grep -q '^\[  SKIPPED \]' "$output"; then
    why="a test skipped: $(grep '^\[  SKIPPED \]' "$output" | head -3 | tr '\n' ' ')"
  elif [ "$check" = sums ] && ! sums_agree "$output"; then
    why="a sum is missing or wrong"
  elif [ "$check" != gtest ] && [ "$check" != sums ] && [ "$check" != - ] &&
       ! grep -qE "$check" "$output"; then
    why="the output lacks /$check/"
  fi
  local seconds
  seconds=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  [ -n "$steps_json" ] && steps_json+=","
  steps_json+=$'\n'"    {\"name\": \"$name\", \"passed\": $([ -z "$why" ] && echo true || echo false), "
  steps_json+="\"exit_status\": $rc, \"seconds\": $seconds, \"limit_seconds\": $limit, "
  steps_json+="\"why\": \"$(printf '%s' "$why" | json_escape)\"}"
  if [ -z "$why" ]; then
    say "ok     $name (${seconds} s)"
  else
    status=failed
    say "FAILED $name (${seconds} s): $why"
    tail -25 "$output" | sed 's/^/    /'
  fi
}

# STEPS: 10 + 20 + 75 + 45 + 105 + 20 + 20 + 15 + 35 + 10 = 355 s at most, and python_gpu's 150:
# 505 s.
# Every library the bundle's binaries need resolves on this image (a missing one, or a C++
# runtime older than the GLIBCXX version they were built against, shows here first).
step libraries 10 - bash -c "! ldd $bin/* $bundle/lib/*.so* 2>&1 | grep -B3 'not found'"
step nccl_test 20 gtest "$bin/nccl_test" --gtest_filter=-NcclBackend.WithoutAGpuAGroupFailsClearly
# Each stuck-stream test holds its stream at most 10 s; two processes on one GPU at most 60 s.
step nccl_gpu_test 75 gtest "$bin/nccl_gpu_test" --gtest_filter=-NcclChild.*
# Every op and dtype at world size 1 on one GPU (nccl_world_test's other sizes need more GPUs).
step nccl_world_test 45 gtest "$bin/nccl_world_test" \
  --gtest_filter=Sizes/NcclWorld.EveryOpAndDtype/world1_devices1
# tutti's NCCL backend against raw NCCL, world size 1, in one run (the overhead ratio), values
# checked.
step bench_nccl 105 'Out of bounds values : 0 OK' "$bin/tutti-bench" --backend nccl -b 8 \
  -e "$bench_max" -f 4 -w 10 -n 50 --baseline --json "$out/bench-nccl.json"
step gpu_allreduce 20 sums "$bin/tutti-run" -n 1 --backend nccl --timeout 15 \
  "$bin/gpu_allreduce"
step multigpu_allreduce 20 sums "$bin/multigpu_allreduce"
# The direct transport's cuda_ipc between two processes on the GPU (handles opened once, events,
# borrows), then its benchmark: two processes, copy into a ready device buffer against staged
# (D2H, Unix socket, H2D) and an in-process D2D copy (cold and warm rows), then warm borrows.
step cuda_ipc_test 15 gtest "$bin/cuda_ipc_test"
step bench_cuda_ipc 35 'Out of bounds values : 0 OK' "$bin/tutti-bench" --ranks 2 --op transfer \
  --transport cuda_ipc -b "$ipc_min" -e "$ipc_max" -f 4 -w 2 -n 10 --baseline \
  --json "$out/bench-cuda-ipc.json"
step bench_cuda_ipc_borrow 10 'Out of bounds values : 0 OK' "$bin/tutti-bench" --ranks 2 \
  --op transfer --transport cuda_ipc --mode borrow -b "$ipc_min" -e "$ipc_max" -f 4 -w 5 -n 50
# The Python package on the GPU: its modules built for the device's Python (3.12, with torch for
# CUDA), then python/tests/test_gpu.py (torch CUDA tensors through the NCCL backend,
# torch.distributed's "tutti" backend on CUDA, cuda_ipc between two processes). Off with
# TUTTI_DEVICE_PYTHON_TESTS=0 (tests/device_run_test.sh: the stand-in has no torch for CUDA).
if [ "${TUTTI_DEVICE_PYTHON_TESTS:-1}" = 1 ]; then
  # Then torch.distributed on tutti against torch's own NCCL backend (torch_bench.py --device
  # cuda, ~15 s; TUTTI_DEVICE_TORCH_BENCH=0 leaves it out), into $OUT/torch.
  step python_gpu 150 ' passed' env TUTTI_DEVICE_TORCH_BENCH="${TUTTI_DEVICE_TORCH_BENCH:-1}" \
    bash scripts/device/python.sh "$work/python"
fi

write_result
say "run.sh: $status (log: $log, summary: $result)"
[ "$status" = passed ]
