#!/usr/bin/env bash
# Runs on the device machine (one H200) over the .device/ bundle from prepare.sh: the gpu tests,
# the NCCL unit tests, and tutti-bench at world size 1. Writes logs to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/tutti-device}
mkdir -p "$out"
nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib"))' 2>/dev/null)
if [ -z "$nccl_lib" ]; then
  python3 -m pip install -q nvidia-nccl-cu13 2>/dev/null
  nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib"))')
fi
export LD_LIBRARY_PATH="$PWD/.device/lib:$nccl_lib:${LD_LIBRARY_PATH:-}"
export TUTTI_NCCL_LIBRARY="$nccl_lib/libnccl.so.2"
nvidia-smi -L | tee "$out/gpu.txt"
.device/bin/nccl_test 2>&1 | tee "$out/nccl_test.log" | tail -3
.device/bin/nccl_gpu_test 2>&1 | tee "$out/nccl_gpu_test.log" | tail -15
.device/bin/tutti-bench --backend auto -b 8 -e 64M -n 20 2>&1 | tee "$out/bench-cpu-world1.log" | tail -4
# tutti's NCCL backend against raw NCCL, world size 1, in one run (the overhead ratio).
.device/bin/tutti-bench --backend nccl -b 8 -e 256M -f 4 -w 10 -n 50 --baseline \
  --json "$out/bench-nccl.json" 2>&1 | tee "$out/bench-nccl.log" | tail -16
.device/bin/gpu_allreduce 2>&1 | tee "$out/example-gpu.log" | tail -2
.device/bin/multigpu_allreduce 2>&1 | tee "$out/example-multigpu.log" | tail -2
