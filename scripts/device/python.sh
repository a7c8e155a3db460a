#!/usr/bin/env bash
# On the device machine (run.sh's python_gpu step): builds tutti's Python modules for the
# device's own Python (tutti._tutti, and tutti._torch against its torch) over the bundle's
# libraries, then runs python/tests/test_gpu.py there. The bundle (.device, from prepare.sh) is
# built on Debian for Debian's Python; the device's Python (3.12, with torch for CUDA, nanobind,
# CMake and ninja; no network) needs modules of its own, and building them there takes seconds
# on its cores. Nothing is installed: the package is assembled in a scratch directory.
#
#   bash scripts/device/python.sh [SCRATCH]     (run.sh passes one; the default is mktemp -d)
#
# TUTTI_DEVICE_BUNDLE (default .device) and TUTTI_DEVICE_PYTHON (default python3) as run.sh;
# TUTTI_DEVICE_TORCH_BENCH=1 also runs the torch.distributed benchmark on the GPU (see below).
# Exit status: pytest's (1 where a test failed); 2 where a test skipped (on the device every
# test must run); 3 where tutti._tutti cannot be built there (no Python, no nanobind, a compile
# error).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bundle=$(cd "${TUTTI_DEVICE_BUNDLE:-.device}" && pwd)
if ! python=$(command -v "${TUTTI_DEVICE_PYTHON:-python3}"); then
  echo "python.sh: no ${TUTTI_DEVICE_PYTHON:-python3} here" >&2
  exit 3
fi
work=${1:-$(mktemp -d)}
mkdir -p "$work/src" "$work/pkg"

if ! nanobind_dir=$("$python" -m nanobind --cmake_dir 2>/dev/null); then
  echo "python.sh: $python has no nanobind (the device image ships it)" >&2
  exit 3
fi
rm -rf "$work/pkg/tutti"
cp -r python/tutti "$work/pkg/"

# The package's own CMakeLists.txt builds or imports tutti's CMake targets; here the libraries
# are the bundle's files, so a small project names them.
cat > "$work/src/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.21)
project(tutti_device_python LANGUAGES CXX)
find_package(Python 3.9 COMPONENTS Interpreter Development.Module REQUIRED)
find_package(nanobind CONFIG REQUIRED)
set(S ${TUTTI_ROOT}/python/src)
set(LIBS ${TUTTI_LIB}/libtutti.so)
foreach(b shm gloo nccl cuda_ipc)
  if(EXISTS ${TUTTI_LIB}/libtutti_${b}.so)
    list(APPEND LIBS ${TUTTI_LIB}/libtutti_${b}.so)
  endif()
endforeach()
nanobind_add_module(_tutti NB_STATIC ${S}/module.cc ${S}/errors.cc ${S}/tensors.cc ${S}/groups.cc
                    ${S}/stores.cc ${S}/transfer.cc ${S}/transfer_agent.cc)
target_compile_features(_tutti PRIVATE cxx_std_17)
target_include_directories(_tutti PRIVATE ${S} ${TUTTI_ROOT}/include ${TUTTI_BUNDLE_INCLUDE})
# Linking a backend registers it: kept although the module names none of its symbols.
target_link_options(_tutti PRIVATE "LINKER:--no-as-needed")
target_link_libraries(_tutti PRIVATE ${LIBS})
set_target_properties(_tutti PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${OUT})
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import os, torch; from torch.utils.cpp_extension import include_paths; print(';'.join(include_paths())); print(os.path.join(os.path.dirname(torch.__file__), 'lib')); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
  OUTPUT_VARIABLE info RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(WARNING "torch is not importable by ${Python_EXECUTABLE}: no tutti._torch")
  return()
endif()
string(REPLACE "\n" ";" lines "${info}")
list(POP_BACK lines abi)
list(POP_BACK lines torch_lib)
file(GLOB torch_sources ${S}/torch/*.cc)
Python_add_library(_torch MODULE WITH_SOABI ${torch_sources})
target_include_directories(_torch SYSTEM PRIVATE ${lines})
target_include_directories(_torch PRIVATE ${S}/torch ${TUTTI_ROOT}/include ${TUTTI_BUNDLE_INCLUDE})
target_compile_definitions(_torch PRIVATE _GLIBCXX_USE_CXX11_ABI=${abi})
target_compile_features(_torch PRIVATE cxx_std_20)
target_link_options(_torch PRIVATE "LINKER:--no-as-needed")
foreach(l c10 torch torch_cpu torch_python)
  target_link_libraries(_torch PRIVATE ${torch_lib}/lib${l}.so)
endforeach()
target_link_libraries(_torch PRIVATE ${LIBS})
set_target_properties(_torch PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${OUT})
EOF

start=$SECONDS
cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$python" -Dnanobind_DIR="$nanobind_dir" -DTUTTI_ROOT="$root" \
  -DTUTTI_LIB="$bundle/lib" -DTUTTI_BUNDLE_INCLUDE="$bundle/include" -DOUT="$work/pkg/tutti" \
  > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 3; }
cmake --build "$work/build" -j"$(nproc)" --target _tutti || exit 3
# tutti._torch is built against the device's torch, which may not be the version the package
# pins (python/requirements.txt): a failure here is reported, and the tests still run (the
# torch.distributed test then fails on its import).
torch_built=1
if ! cmake --build "$work/build" -j"$(nproc)" > "$work/torch-build.log" 2>&1; then
  torch_built=0
  echo "python.sh: tutti._torch did not build against torch $("$python" -c \
    'import torch; print(torch.__version__)' 2>/dev/null):" >&2
  grep -m 12 'error' "$work/torch-build.log" >&2 || tail -20 "$work/torch-build.log" >&2
fi
echo "python.sh: the modules took $((SECONDS - start)) s to build"

export LD_LIBRARY_PATH="$bundle/lib:${LD_LIBRARY_PATH:-}"
export PYTHONPATH="$work/pkg"
set +e
"$python" -m pytest -q -rs -p no:cacheprovider python/tests/test_gpu.py 2>&1 | tee "$work/pytest.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -eq 5 ] || { [ "$rc" -eq 0 ] && grep -qiE '[0-9]+ skipped' "$work/pytest.log"; }; then
  echo "python.sh: FAILED: a test skipped on the device" >&2
  exit 2
fi
if [ "$torch_built" = 0 ] && [ "$rc" -eq 0 ]; then rc=1; fi
# TUTTI_DEVICE_TORCH_BENCH=1: then torch.distributed on tutti against torch's own NCCL backend,
# one rank on the GPU (benchmarks/python/torch_bench.py --device cuda), into $OUT/torch.
if [ "${TUTTI_DEVICE_TORCH_BENCH:-0}" = 1 ] && [ "$rc" -eq 0 ]; then
  timeout -k 5 240 "$python" benchmarks/python/torch_bench.py --device cuda --ranks 1 \
    --max-bytes $((8 << 20)) --out "${OUT:-/tmp/tutti-device}/torch" || rc=1
fi
exit "$rc"
