#!/usr/bin/env bash
# The main job: set-up, build, then the allreduce sweep (8 B to 64 MiB, float32, sum, checked)
# on local ranks over the embedded defaults (backend "auto", which is shm on one host; the TCP
# store hosted by the launcher), with raw Gloo's time beside tutti's in the same run, then the
# same sweep through Open MPI (its shared-memory transport) right after it. Writes
# results/allreduce.json, results/openmpi.json and a plot, results/allreduce.png, and ends with
# a one-line verdict against both baselines. About a minute on a 2-core machine.
#
#   scripts/bench.sh                     # 2 ranks
#   RANKS=4 scripts/bench.sh             # more ranks
#   scripts/bench.sh --backend gloo      # extra tutti-bench options are passed on
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >&2
mkdir -p results
ranks=${RANKS:-2}
sweep=(-b 8 -e 64M -f 2 -w 10 -n 50)
build/bin/tutti-bench --ranks "$ranks" --op allreduce "${sweep[@]}" -d float32 -o sum -c 1 \
  --baseline --json results/allreduce.json "$@"

# Python's standard library is enough for the verdict and the plot (matplotlib is used where
# installed); Debian's interpreter, as a python3 earlier on PATH may lack zlib.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
runs=(results/allreduce.json)
if command -v mpicxx >/dev/null && command -v mpirun >/dev/null; then
  echo "== Open MPI (shared memory), the same sweep" >&2
  mpicxx -O2 -o build/mpi_allreduce benchmarks/compare/mpi_allreduce.cc
  as_root=(); [ "$(id -u)" -eq 0 ] && as_root=(--allow-run-as-root)
  if mpirun "${as_root[@]}" --oversubscribe --mca btl self,vader -np "$ranks" build/mpi_allreduce \
      "${sweep[@]}" --label "openmpi sm" --json results/openmpi.json >&2; then
    runs+=(results/openmpi.json)
  else
    echo "bench: Open MPI's run failed; the verdict is against raw Gloo only" >&2
  fi
else
  echo "bench: no Open MPI (scripts/setup-debian.sh installs it); the verdict is against raw Gloo only" >&2
fi
"$py" benchmarks/plot.py "${runs[@]}" -o results/allreduce.png \
  --title "allreduce, $ranks ranks, float32 sum, one run" >&2
"$py" benchmarks/verdict.py "${runs[@]}"
