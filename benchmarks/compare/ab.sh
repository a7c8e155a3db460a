#!/usr/bin/env bash
# The regression guard for fast-path changes: builds another revision of tutti beside the
# working tree and runs the two tutti-bench binaries interleaved (A B, B A, A B, ...) on the same
# sizes and ranks, several times, then prints per size the median time of each and the ratio
# B/A (the working tree against REV) with its spread over the pairs. One pair proves nothing:
# a run can land in another regime than the next (docs/PERFORMANCE.md), so only ratios that hold
# across every pair count.
#
#   benchmarks/compare/ab.sh REV                     # REV (A) against the working tree (B)
#   benchmarks/compare/ab.sh 88312e4 -b 8 -e 1M -f 4 # tutti-bench options are passed to both
#   REPS=9 RANKS=4 benchmarks/compare/ab.sh HEAD~1 --backend gloo
#   B=HEAD~2 benchmarks/compare/ab.sh HEAD~3         # two revisions, neither the working tree
#
# Defaults: 2 ranks, shm, allreduce float32 sum, 8 B-64 MiB by 4, 10 warm-up and 50 timed
# iterations, 5 pairs, checks off. Builds go to build/ab/<commit>/ (kept: a second run against the
# same revision builds nothing); the working tree builds in build/ as scripts/build.sh does.
# Results: results/ab/<A>-vs-<B>/{a,b}.r<rep>.json and table.md. Exit status 0; the verdict line
# names the sizes where B is slower in every pair (by more than NOISE, default 3%). Where some runs
# found a cache line between the CPUs more than twice as slow as the fastest probe ("far": on
# the 2-vCPU VMs the host moves the vCPUs about, minute to minute), the verdict is given again for
# the pairs that ran near and for those that ran far: for the small sizes, many short pairs
# catch both (REPS=20 ... -b 8 -e 1K -f 2 -w 1000 -n 20000).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
rev_a=$1
shift
reps=${REPS:-5}
ranks=${RANKS:-2}
py=/usr/bin/python3
[ -x "$py" ] || py=python3

# Builds commit $1 into build/ab/<sha>/ (only what the benchmark needs) and prints its bin dir.
build_rev() {
  local sha dir
  sha=$(git rev-parse --verify "$1^{commit}")
  dir=build/ab/${sha:0:12}
  if [ ! -x "$dir/build/bin/tutti-bench" ] || [ ! -x "$dir/build/bin/tutti-run" ]; then
    echo "ab: building $1 (${sha:0:12}) in $dir" >&2
    rm -rf "$dir/src"
    mkdir -p "$dir/src"
    git archive "$sha" | tar -x -C "$dir/src"
    # Nothing of the working tree's build leaks in: its own source, its own build directory.
    cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTUTTI_BUILD_TESTS=OFF -DTUTTI_BUILD_EXAMPLES=OFF >/dev/null
    cmake --build "$dir/build" -j"$(nproc)" --target tutti-bench tutti-run >&2
  fi
  echo "$dir/build/bin"
}

scripts/setup-debian.sh >&2
bin_a=$(build_rev "$rev_a")
name_a=$(git rev-parse --short=9 "$rev_a")
if [ -n "${B:-}" ]; then
  bin_b=$(build_rev "$B")
  name_b=$(git rev-parse --short=9 "$B")
else
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)" --target tutti-bench tutti-run >&2
  bin_b=build/bin
  name_b="worktree"
  git diff --quiet HEAD 2>/dev/null && name_b="$(git rev-parse --short=9 HEAD)"
fi

out=${OUT:-results/ab/$name_a-vs-$name_b}
rm -rf "$out"
mkdir -p "$out"
defaults=(--op allreduce --backend shm -b 8 -e 64M -f 4 -w 10 -n 50 -d float32 -o sum -c 0)
# The cache-line exchange between the CPUs before and after each run (benchmarks/machine.py),
# where the working tree's build has the probe.
exchange=()
[ -x build/bin/tutti-membw ] && exchange=(--exchange build/bin/tutti-membw)
run_one() {  # $1 = a|b, $2 = rep
  local bin=$bin_a
  [ "$1" = b ] && bin=$bin_b
  "$py" benchmarks/machine.py run --state "$out/$1.r$2.state.json" "${exchange[@]}" -- \
    "$bin/tutti-bench" --ranks "$ranks" "${defaults[@]}" "${extra[@]}" --json "$out/$1.r$2.json" \
    >"$out/$1.r$2.log" 2>&1 || {
    echo "ab: $1 (pair $2) failed:" >&2
    tail -20 "$out/$1.r$2.log" >&2
    exit 1
  }
}
extra=("$@")
echo "ab: A = $name_a ($bin_a), B = $name_b ($bin_b), $reps pairs, $ranks ranks" >&2
for ((rep = 1; rep <= reps; rep++)); do
  # Alternate which goes first, so that neither always runs on a machine the other warmed.
  if ((rep % 2 == 1)); then order=(a b); else order=(b a); fi
  for side in "${order[@]}"; do
    echo "ab: pair $rep/$reps: $side" >&2
    run_one "$side" "$rep"
  done
done
"$py" benchmarks/compare/ab_table.py "$out" --a "$name_a" --b "$name_b" \
  --noise "${NOISE:-0.03}" | tee "$out/table.md"
