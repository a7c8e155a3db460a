#!/usr/bin/env bash
# Installs the Debian 12 packages tutti builds, tests and benchmarks with. Idempotent: installs
# only what is missing. Run as root or with sudo available.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config python3 python3-venv python3-dev python3-matplotlib
  libgloo-dev libfmt-dev libspdlog-dev libgtest-dev libbenchmark-dev libdlpack-dev
  libasio-dev libhiredis-dev redis-server libopenmpi-dev openmpi-bin iproute2 libssl-dev
  clang-14 libclang-rt-14-dev clang-format-14 libucx-dev ucx-utils
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
echo "setup-debian: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
