#!/usr/bin/env bash
# The Python side's environment: a venv (build/venv, or $TUTTI_VENV) with the pinned packages of
# python/requirements.txt, and tutti's Python package built and installed into it from ./python.
# Idempotent: the venv is made again only when requirements.txt changes; the package rebuilds
# incrementally (its build tree is build/python/), from build/'s libraries where that tree is.
# Prints the venv's python on its last line.
#
#   scripts/python-env.sh --venv   only make (or check) the venv, not the package: scripts/test.sh
#                                  runs this in the background while the C++ builds
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${TUTTI_VENV:-$PWD/build/venv}
req=python/requirements.txt
stamp="$venv/.tutti-requirements"
# Debian's interpreter: python3-venv and python3-dev are installed for it (setup-debian.sh).
base=${TUTTI_PYTHON:-/usr/bin/python3}

if [ ! -x "$venv/bin/python" ] || ! cmp -s "$req" "$stamp"; then
  echo "python-env: creating $venv (pinned packages of $req)" >&2
  rm -rf "$venv"
  "$base" -m venv "$venv"
  # Not byte-compiled here: Python compiles a module when it is first imported and keeps the
  # result. For what tutti and its tests import (torch, Ray, numpy) that took 9 s of CPU once;
  # compiling every file of the packages up front (pip's pass, or compileall on every core) took
  # its CPU from the C++ build this runs beside (scripts/test.sh).
  # --no-cache-dir: pip's cache would keep a second copy of the wheels (3 GB, torch's CUDA
  # libraries) for a venv made again only when requirements.txt changes.
  "$venv/bin/python" -m pip install -q --no-compile --no-cache-dir -r "$req" >&2
  cp "$req" "$stamp"
  echo "python-env: the venv took $SECONDS s" >&2
fi
if [ "${1:-}" = "--venv" ]; then
  exit 0
fi
# --no-build-isolation: build with the venv's pinned scikit-build-core and nanobind (and against
# its torch: tutti._torch).
# Where scripts/build.sh's Release tree build/ is, the package takes its libraries and tutti-run
# (brought up to date first) instead of compiling tutti again; TUTTI_PYTHON_FROM_SOURCE=1 (or no
# such tree) builds them from the sources, as pip install ./python does.
start=$SECONDS
# Always given (empty: from the sources), so a value cached by an earlier build does not stay.
# --config-settings, not -C: Debian's venv brings pip 23.0, which lacks the short form.
config=(--config-settings="cmake.define.TUTTI_PREBUILT=")
if [ "${TUTTI_PYTHON_FROM_SOURCE:-0}" != "1" ] && [ -f build/TuttiConfig.cmake ] &&
  grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' build/CMakeCache.txt; then
  cmake --build build -j"$(nproc)" --target tutti_python_parts >&2
  config=(--config-settings="cmake.define.TUTTI_PREBUILT=$PWD/build")
  echo "python-env: the package takes build/'s libraries and tutti-run" >&2
fi
"$venv/bin/python" -m pip install -q --no-build-isolation --no-deps "${config[@]}" ./python >&2
echo "python-env: the package build took $((SECONDS - start)) s" >&2
echo "$venv/bin/python"
