#!/usr/bin/env bash
# Builds the GPU checks here and packs what run.sh needs into .device/ (in .gitignore: it travels
# when the device tool's `carry` names it; under 60 MiB, since a call carries at most 64 MiB,
# the working tree included): the NCCL test binaries, the cuda_ipc test and its worker,
# tutti-bench, tutti-run, the two GPU examples, tutti's libraries, the shared libraries they load
# that the device image lacks (Gloo, fmt, spdlog, hiredis, ibverbs, libnl, the CUDA runtime), and
# DLPack's header (for the Python modules scripts/device/python.sh builds there).
#
# Not bundled: the C library and the loader (the binaries need GLIBC_2.34); libstdc++ and
# libgcc_s (review #6: Debian 12's libstdc++ itself needs GLIBC_2.36; the binaries need
# GLIBCXX_3.4.30, GCC 12's, which Ubuntu 22.04 and later ship; the device image's Python 3.12.3
# suggests Ubuntu 24.04, glibc 2.39, not checked. run.sh's first step checks with ldd that
# everything resolves there, naming any missing version); the CUDA driver; NCCL (the image's
# nvidia-nccl-cu13 wheel).
#
#   flock -o /tmp/tutti-build.lock scripts/device/prepare.sh
# then, on the device machine (the `device` tool, carrying .device; one call, under 5 min):
#   bash scripts/device/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/setup-debian.sh
# NCCL brings its own kernels and tutti has no CUDA code: no CUDA architectures to name.
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DTUTTI_WITH_NCCL=ON >/dev/null
bins=(tests/nccl_test tests/nccl_gpu_test tests/nccl_world_test bin/tutti-bench bin/tutti-run
      examples/gpu_allreduce examples/multigpu_allreduce tests/cuda_ipc_test tests/cuda_ipc_worker)
targets=()
for b in "${bins[@]}"; do targets+=("$(basename "$b")"); done
cmake --build build-device -j"$(nproc)" --target "${targets[@]}" >&2
rm -rf .device && mkdir -p .device/bin .device/lib
for b in "${bins[@]}"; do cp "build-device/$b" .device/bin/; done
cp -P build-device/src/libtutti.so* build-device/backends/*/libtutti_*.so* .device/lib/
# Every library the binaries resolve here, but those the device has (see above).
for f in .device/bin/* .device/lib/*.so.*; do
  ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'
done | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libnccl|libstdc\+\+|libgcc_s)\.so' |
  while read -r lib; do cp -L "$lib" .device/lib/; done
# The headers the Python modules need beyond the tree's (scripts/device/python.sh builds them
# there): DLPack's, from Debian's libdlpack-dev.
mkdir -p .device/include && cp -r /usr/include/dlpack .device/include/
strip --strip-unneeded .device/bin/* .device/lib/*.so* 2>/dev/null || true
size=$(du -sm .device | cut -f1)
echo "prepare.sh: .device is ${size} MiB ($(find .device -type f | wc -l) files)"
if [ "$size" -ge 60 ]; then
  echo "prepare.sh: .device is too large to carry (limit 60 MiB)" >&2
  exit 1
fi
