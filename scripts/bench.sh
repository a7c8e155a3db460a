#!/usr/bin/env bash
# The main job: set-up, build, then the allreduce sweep (8 B to 64 MiB, float32, sum, checked)
# on local ranks over the embedded defaults (backend "auto", which is shm on one host; the TCP
# store hosted by the launcher), with raw Gloo's time beside tutti's in the same run. Well under
# a minute on a 2-core machine.
#
#   scripts/bench.sh                     # 2 ranks
#   RANKS=4 scripts/bench.sh             # more ranks
#   scripts/bench.sh --backend gloo      # extra tutti-bench options are passed on
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >&2
mkdir -p results
exec build/bin/tutti-bench --ranks "${RANKS:-2}" --op allreduce -b 8 -e 64M -f 2 -d float32 \
  -o sum -c 1 -w 10 -n 50 --baseline --json results/allreduce.json "$@"
