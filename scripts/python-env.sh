#!/usr/bin/env bash
# The Python side's environment: a venv (build/venv, or $TUTTI_VENV) with the pinned packages of
# python/requirements.txt, and tutti's Python package built and installed into it from ./python.
# Idempotent: the venv is made again only when requirements.txt changes; the package rebuilds
# incrementally (its build tree is build/python/), from build/'s libraries where that tree is.
# Prints the venv's python on its last line.
#
#   scripts/python-env.sh --fetch   only download the pinned wheels (into <venv>.wheels), for
#                                   the next run to install without the network; scripts/test.sh
#                                   runs it in the background while the C++ builds and is tested
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${TUTTI_VENV:-$PWD/build/venv}
req=python/requirements.txt
stamp="$venv/.tutti-requirements"
wheels="$venv.wheels"
# Debian's interpreter: python3-venv and python3-dev are installed for it (setup-debian.sh).
base=${TUTTI_PYTHON:-/usr/bin/python3}

if [ "${1:-}" = "--fetch" ]; then
  if [ -x "$venv/bin/python" ] && cmp -s "$req" "$stamp"; then
    exit 0  # nothing to fetch: the venv is up to date
  fi
  rm -rf "$venv" "$wheels" "$wheels.part"
  mkdir -p "$wheels.part"
  trap 'rm -rf "$wheels.part"' EXIT  # a failed or stopped download leaves nothing
  # What is downloaded is what the stamp says, even if requirements.txt changes meanwhile.
  cp "$req" "$wheels.part/requirements.txt"
  "$base" -m venv "$venv"
  "$venv/bin/python" -m pip download -q --no-cache-dir -d "$wheels.part" \
    -r "$wheels.part/requirements.txt" >&2
  mv "$wheels.part" "$wheels"
  echo "python-env: fetched the pinned wheels in $SECONDS s" >&2
  exit 0
fi

if [ ! -x "$venv/bin/python" ] || ! cmp -s "$req" "$stamp"; then
  if [ -x "$venv/bin/python" ] && cmp -s "$req" "$wheels/requirements.txt"; then
    echo "python-env: installing the pinned packages of $req from $wheels" >&2
    if ! "$venv/bin/python" -m pip install -q --no-index --find-links "$wheels" -r "$req" >&2; then
      echo "python-env: that failed; downloading them again" >&2
      rm -rf "$venv" "$wheels"
      "$base" -m venv "$venv"
      "$venv/bin/python" -m pip install -q -r "$req" >&2
    fi
  else
    echo "python-env: creating $venv (pinned packages of $req)" >&2
    rm -rf "$venv"
    "$base" -m venv "$venv"
    "$venv/bin/python" -m pip install -q -r "$req" >&2
  fi
  rm -rf "$wheels"
  cp "$req" "$stamp"
  echo "python-env: the venv took $SECONDS s" >&2
fi
# --no-build-isolation: build with the venv's pinned scikit-build-core and nanobind (and against
# its torch: tutti._torch).
# Where scripts/build.sh's Release tree build/ is, the package takes its libraries and tutti-run
# (brought up to date first) instead of compiling tutti again; TUTTI_PYTHON_FROM_SOURCE=1 (or no
# such tree) builds them from the sources, as pip install ./python does.
start=$SECONDS
# Always given (empty: from the sources), so a value cached by an earlier build does not stay.
config=(-C "cmake.define.TUTTI_PREBUILT=")
if [ "${TUTTI_PYTHON_FROM_SOURCE:-0}" != "1" ] && [ -f build/TuttiConfig.cmake ] &&
  grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' build/CMakeCache.txt; then
  targets=(tutti tutti-run)
  for backend in tutti_shm tutti_gloo tutti_nccl; do
    [ -f "build/Tutti$(echo "${backend#tutti_}" | sed 's/./\U&/')Targets.cmake" ] && targets+=("$backend")
  done
  cmake --build build -j"$(nproc)" --target "${targets[@]}" >&2
  config=(-C "cmake.define.TUTTI_PREBUILT=$PWD/build")
  echo "python-env: the package takes build/'s libraries (${targets[*]})" >&2
fi
"$venv/bin/python" -m pip install -q --no-build-isolation --no-deps "${config[@]}" ./python >&2
echo "python-env: the package build took $((SECONDS - start)) s" >&2
echo "$venv/bin/python"
