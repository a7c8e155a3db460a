#!/usr/bin/env bash
# The main job: set-up, build, then the allreduce sweep (8 B to 64 MiB, float32, sum, checked)
# on local ranks over the embedded defaults (backend "auto", which is shm on one host; the TCP
# store hosted by the launcher), interleaved with the same sweep through Open MPI's shared memory
# (A B, B A, ... for REPS rounds), between two probes of the memory's own speed; and a third sweep
# with the tensors in the group's symmetric memory (tutti-bench --symmetric: shm's single-copy
# allreduce; SYMMETRIC=0 leaves it out; not with --backend gloo). Writes results/bench/ (every
# run, and how busy the machine was during each), results/allreduce.json,
# results/allreduce-symmetric.json and results/openmpi.json (the medians over the runs, with their
# spread), results/membw.json and the plot results/allreduce.png, and ends with the verdicts, one
# per tutti sweep: at how many sizes tutti is ahead, by how much, how that varied from run to
# run, whether the machine was quiet (and if not, the verdict of the quiet runs alone), and
# tutti's time at 16 and 64 MiB against the memory's floor. The sizes up to 8 MiB run again in
# PAIRS rapid rounds (default 15; 8 B-64 KiB, then 128 KiB-8 MiB), which judge them (see below).
# About two and a half minutes on a 2-core machine, plus a few minutes for the first build.
#
#   scripts/bench.sh                     # 2 ranks
#   RANKS=4 REPS=7 scripts/bench.sh      # more ranks, more rounds
#   scripts/bench.sh --backend gloo      # extra tutti-bench options are passed on; with gloo the
#                                        # baselines are raw Gloo (in the same processes) and
#                                        # Open MPI over TCP
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >&2
ranks=${RANKS:-2}
reps=${REPS:-5}
sweep=(-b 8 -e 64M -f 2 -w 10 -n 100)
out=results/bench
rm -rf "$out"
mkdir -p "$out"
py=/usr/bin/python3
[ -x "$py" ] || py=python3

# The gloo backend is compared with what it is built on (raw Gloo) and with Open MPI's TCP path;
# every other with Open MPI's shared memory.
backend=auto
for ((i = 1; i <= $#; i++)); do
  [ "${!i}" = "--backend" ] && { j=$((i + 1)); backend=${!j:-auto}; }
done
extra=()
btl=self,vader
label="openmpi sm"
symmetric=${SYMMETRIC:-1}
if [ "$backend" = gloo ]; then
  extra=(--baseline)
  btl=self,tcp
  label="openmpi tcp"
  symmetric=0
fi

have_mpi=0
if command -v mpicxx >/dev/null && command -v mpirun >/dev/null; then
  mpicxx -O2 -o build/mpi_allreduce benchmarks/compare/mpi_allreduce.cc
  have_mpi=1
else
  echo "bench: no Open MPI (scripts/setup-debian.sh installs it); no baseline but raw Gloo's" >&2
fi
as_root=(); [ "$(id -u)" -eq 0 ] && as_root=(--allow-run-as-root)

# The memory's speed, before the sweeps and again after them: the bound is the better figure of
# the two (one probe at 64 MiB on 2 cores can read 20-30% low, and the verdict would then put
# the single-copy path over 100% of it).
membw() {
  echo "== the memory's speed (tutti-membw), $1 the sweeps" >&2
  build/bin/tutti-membw -s 16M,64M -n 5 --json "$out/membw.$1.json" >&2
}
membw before
# Each run's state also says how fast the two CPUs exchanged a cache line just before and after
# it: on these VMs that moved between ~50 and ~250 ns over minutes, and the small sizes with it.
exchange=(--exchange build/bin/tutti-membw)

run_tutti() {  # run_tutti STEM REP [tutti-bench options...]
  local stem=$1 rep=$2
  shift 2
  "$py" benchmarks/machine.py run --state "$out/$stem.r$rep.state.json" "${exchange[@]}" -- \
    build/bin/tutti-bench --ranks "$ranks" --op allreduce "${sweep[@]}" -d float32 -o sum -c 1 \
    "${extra[@]}" --json "$out/$stem.r$rep.json" "$@" >"$out/$stem.r$rep.log" 2>&1 || {
    cat "$out/$stem.r$rep.log" >&2
    echo "bench: tutti-bench failed ($stem, run $rep)" >&2
    exit 1
  }
}
run_symmetric() {  # run_symmetric STEM REP [tutti-bench options...]
  [ "$symmetric" = 1 ] || return 0
  local stem=$1 rep=$2
  shift 2
  run_tutti "$stem" "$rep" --symmetric "$@"
}
run_mpi() {  # run_mpi STEM REP
  [ $have_mpi = 1 ] || return 0
  local run="$out/$1.r$2"
  "$py" benchmarks/machine.py run --state "$run.state.json" "${exchange[@]}" -- \
    mpirun "${as_root[@]}" --oversubscribe --mca btl "$btl" -np "$ranks" build/mpi_allreduce \
    "${sweep[@]}" --label "$label" --json "$run.json" >"$run.log" 2>&1 || {
    cat "$run.log" >&2
    echo "bench: Open MPI's run $2 ($1) failed; it is left out" >&2
    rm -f "$run.json"
  }
}
# One round: tutti, Open MPI, tutti on symmetric memory; every other round the other way round.
round() {  # round SUFFIX REP [tutti-bench options...]
  local suffix=$1 rep=$2
  shift 2
  if ((rep % 2 == 1)); then
    run_tutti "tutti$suffix" "$rep" "$@"
    run_mpi "base$suffix" "$rep"
    run_symmetric "sym$suffix" "$rep" "$@"
  else
    run_symmetric "sym$suffix" "$rep" "$@"
    run_mpi "base$suffix" "$rep"
    run_tutti "tutti$suffix" "$rep" "$@"
  fi
}
for ((rep = 1; rep <= reps; rep++)); do
  echo "== run $rep of $reps: tutti and $label" >&2
  round "" "$rep" "$@"
done
# The small and middle sizes again, in rapid pairs. A sweep spends microseconds at a small size,
# and these VMs' state (a cache line between the CPUs in ~75 or ~300 ns) can change within
# seconds: the sweeps' runs of a small size are each a draw of that state, and five of tutti's
# against five of Open MPI's often drew differently. The middle sizes too: 128 KiB-8 MiB of
# both libraries run 2-4x slower in the ~300 ns state, and one sitting's sweeps put tutti behind
# at 1-4 MiB by 1.2-1.4x with tutti's runs in that state three times and Open MPI's once, where
# 105 pairs of short runs had tutti ahead in 96-105 at each size, in either state. A pair's runs
# here are under a second apart, and the verdict judges these sizes by the pairs' ratios
# (benchmarks/verdict.py). PAIRS=0 leaves them out.
pairs=${PAIRS:-15}
[ $have_mpi = 1 ] || [ "$backend" = gloo ] || pairs=0  # no baseline to pair with
pair_rounds() {  # pair_rounds SUFFIX SIZES [tutti-bench options...]: PAIRS rounds of $sweep
  local suffix=$1 sizes=$2
  shift 2
  ((pairs > 0)) && echo "== $pairs rapid pairs of $sizes: tutti and $label" >&2
  for ((rep = 1; rep <= pairs; rep++)); do
    round "$suffix" "$rep" "$@"
  done
}
# (The suffixes are benchmarks/verdict.py's PAIR_SETS.)
sweep=(-b 8 -e 64K -f 2 -w 100 -n 2000)
[ "$backend" = gloo ] && sweep=(-b 8 -e 64K -f 2 -w 20 -n 200)
pair_rounds -small "8 B-64 KiB" "$@"
# 20 warm-up ops: shm times its two ways of staging (ordinary and streaming stores) in a size's
# first 16 ops (backends/shm/shm_publish.h), which a short run would otherwise count.
sweep=(-b 128K -e 8M -f 2 -w 20 -n 20)
pair_rounds -mid "128 KiB-8 MiB" "$@"
membw after || echo "bench: the memory probe after the sweeps failed; the one before stands" >&2
# The last tutti run's table, for the eye; the verdict below is over every run.
grep -v '^tutti-run' "$out/tutti.r$reps.log" >&2 || true

"$py" - "$out" <<'EOF'
import glob, json, os, sys
sys.path.insert(0, "benchmarks")
from bench_json import merge_runs, write_run
from verdict import PAIR_SETS
out = sys.argv[1]
best, probes, config = {}, sorted(glob.glob(os.path.join(out, "membw.*.json"))), {}
if not probes:
    sys.exit("bench: no memory probe's figures in " + out)
exchanges = []
for path in probes:
    with open(path) as f:
        probe = json.load(f)
    config = probe["config"]
    if probe.get("exchange_ns"):
        exchanges.append(probe["exchange_ns"])
    for row in probe["rows"]:
        key = (row["size_bytes"], row["cores"])
        if key not in best or row["update_all_gbps"] > best[key]["update_all_gbps"]:
            best[key] = dict(row, probe=os.path.basename(path))
with open("results/membw.json", "w") as f:
    json.dump({"config": dict(config, probes=len(probes)), "exchange_ns": exchanges,
               "rows": [best[k] for k in sorted(best)]}, f)
for stem, target in (("tutti", "results/allreduce.json"), ("base", "results/openmpi.json"),
                     ("sym", "results/allreduce-symmetric.json")):
    # The sweeps' runs and the pairs': a size up to 8 MiB has its median over both.
    # (The sweeps' first: the merged file's config, iterations included, is the first run's.)
    paths = sorted(glob.glob(os.path.join(out, stem + ".r*.json")))
    for suffix in PAIR_SETS:
        paths += sorted(glob.glob(os.path.join(out, stem + suffix + ".r*.json")))
    paths = [p for p in paths if not p.endswith(".state.json")]
    if paths:
        config, _, rows = merge_runs(paths)
        write_run(target, config, rows)
    elif os.path.exists(target):
        os.remove(target)
EOF
# Each file plotted, and its stem in $out (the times-faster panel takes the sizes up to 8 MiB
# from the pairs, as the verdict does).
plots=(results/allreduce.json)
stems=(tutti)
[ -f results/allreduce-symmetric.json ] && plots+=(results/allreduce-symmetric.json) stems+=(sym)
[ -f results/openmpi.json ] && plots+=(results/openmpi.json) stems+=(base)
"$py" benchmarks/plot.py "${plots[@]}" -o results/allreduce.png --pairs "$out" "${stems[@]}" \
  --title "allreduce, $ranks ranks, float32 sum, median of $reps interleaved runs$(
    ((pairs > 0)) && echo " (to 8 MiB, and $pairs pairs)")" >&2
"$py" benchmarks/verdict.py "$out" --membw results/membw.json
