#!/usr/bin/env bash
# A/B of the NCCL backend on the device machine: tutti-bench --backend nccl --baseline with two
# builds of libtutti_nccl, alternated A B, B A, ... in one run, so that both meet the same GPU
# and the same moment. Prints, per size, the median time of A, of B and of raw NCCL (the
# baseline both runs measure), and B/A; writes ab-nccl.json to $OUT.
#
# Here: copy the A build's backend (for instance the revision before the change) aside first,
#   mkdir -p .device/ab/a && cp build-device/backends/nccl/libtutti_nccl.so.0.1.0 \
#     .device/ab/a/libtutti_nccl.so.0
# then build the change, run scripts/device/prepare.sh, and copy its backend to .device/ab/b the
# same way. There (the `device` tool, carrying .device):
#   bash scripts/device/ab-nccl.sh .device/ab/a .device/ab/b
# Each directory holds libtutti_nccl.so.0; it comes first on the library path, the rest of the
# bundle after it. PAIRS (default 5) and BENCH_ARGS (default -b 8 -e 8M -f 64 -w 50 -n 500).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 2 ] || { echo "usage: $0 A_LIBDIR B_LIBDIR" >&2; exit 2; }
a=$1
b=$2
for d in "$a" "$b"; do
  [ -f "$d/libtutti_nccl.so.0" ] || { echo "$d has no libtutti_nccl.so.0" >&2; exit 2; }
done
bundle=${TUTTI_DEVICE_BUNDLE:-.device}
pairs=${PAIRS:-5}
read -r -a args <<<"${BENCH_ARGS:--b 8 -e 8M -f 64 -w 50 -n 500}"
out=${OUT:-/tmp/tutti-device}
mkdir -p "$out"
nccl_dir=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0] + "/lib")') || {
  echo "no NCCL (the nvidia-nccl-cu13 wheel)" >&2
  exit 3
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
one() {  # one() SIDE LIBDIR INDEX
  LD_LIBRARY_PATH="$2:$bundle/lib:$nccl_dir" timeout -k 5 120 "$bundle/bin/tutti-bench" \
    --backend nccl --baseline "${args[@]}" --json "$work/$1-$3.json" >"$work/$1-$3.log" 2>&1 || {
    echo "$1 run $3 failed:" >&2
    tail -5 "$work/$1-$3.log" >&2
    exit 1
  }
}
for ((i = 0; i < pairs; ++i)); do
  if ((i % 2 == 0)); then
    one a "$a" "$i"; one b "$b" "$i"
  else
    one b "$b" "$i"; one a "$a" "$i"
  fi
done
python3 - "$work" "$pairs" "$out/ab-nccl.json" <<'EOF'
import json, statistics, sys
work, pairs, dest = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = {s: [json.load(open(f"{work}/{s}-{i}.json"))["rows"] for i in range(pairs)] for s in "ab"}
table = []
print(f"{'size':>10} {'A us':>8} {'B us':>8} {'raw us':>8} {'B/A':>6} {'A/raw':>6} {'B/raw':>6}")
for k, row in enumerate(runs["a"][0]):
    med = lambda s, key: statistics.median(r[k][key] for r in runs[s])
    a, b = med("a", "time_us"), med("b", "time_us")
    raw = statistics.median([r[k]["baseline_time_us"] for s in "ab" for r in runs[s]])
    table.append({"size_bytes": row["size_bytes"], "a_us": a, "b_us": b, "raw_us": raw,
                  "a_p99_us": med("a", "p99_us"), "b_p99_us": med("b", "p99_us")})
    print(f"{row['size_bytes']:>10} {a:8.2f} {b:8.2f} {raw:8.2f} {b / a:6.2f} {a / raw:6.2f} "
          f"{b / raw:6.2f}")
json.dump({"pairs": pairs, "rows": table}, open(dest, "w"), indent=1)
EOF
