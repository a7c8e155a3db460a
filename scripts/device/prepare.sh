#!/usr/bin/env bash
# Builds tutti here (CUDA code for sm_90, NCCL backend on) and packs what the GPU checks need
# into .device/ (git-ignored; carry it to the device machine, under 64 MiB): the test and bench
# binaries, tutti's libraries, and the shared libraries they load that a bare machine lacks
# (Gloo, fmt, spdlog, hiredis, ibverbs, libnl, the CUDA runtime, libstdc++). The CUDA driver
# and NCCL come from the device machine (NCCL from the nvidia-nccl-cu13 Python package).
#
#   scripts/device/prepare.sh && du -sh .device
# then, on the device machine (the `device` tool, carrying .device):
#   bash scripts/device/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/setup-debian.sh
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DTUTTI_WITH_NCCL=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build build-device -j"$(nproc)" >&2
rm -rf .device && mkdir -p .device/bin .device/lib
bins=(build-device/tests/nccl_test build-device/tests/nccl_gpu_test build-device/tests/collectives_test
      build-device/tests/tutti_test_worker build-device/bin/tutti-bench build-device/bin/tutti-run
      build-device/examples/gpu_allreduce build-device/examples/multigpu_allreduce)
cp "${bins[@]}" .device/bin/
cp -P build-device/src/libtutti.so* build-device/backends/*/libtutti_*.so* .device/lib/
# Every library the binaries resolve here, but the C library, the loader, the driver and NCCL.
for f in .device/bin/* .device/lib/*.so.*; do
  ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" .device/lib/ 2>/dev/null || true; done
strip --strip-unneeded .device/bin/* .device/lib/*.so* 2>/dev/null || true
echo "/.device/" >> .git/info/exclude
sort -u -o .git/info/exclude .git/info/exclude
du -sh .device
