#!/usr/bin/env python3
"""The comparison's one table (Markdown), from the JSON files benchmarks/compare/run.sh writes
under results/compare/<config>/<implementation>.r<rep>.json: per configuration and
implementation, the median over repetitions of each run's median time at a few sizes, and, over
every size measured, at how many each implementation was faster than Open MPI (TCP, and shared
memory where it ran), with the median of the time ratios.

    python3 benchmarks/compare/table.py results/compare [--sizes 8,1K,64K,1M,16M,64M]
"""
import argparse
import glob
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_json import load_run  # noqa: E402
from verdict import how_much  # noqa: E402

CONFIGS = {"lo2": "2 ranks, one host", "lo4": "4 ranks, one host (2 cores)",
           "lo2hog": "2 ranks beside a CPU hog", "lo4hog": "4 ranks beside a CPU hog (2 cores)",
           "lo2hog2": "2 ranks beside two CPU hogs",
           "lo4hog2": "4 ranks beside two CPU hogs (2 cores)",
           "lo2build": "2 ranks beside a 2-job build",
           "lo4build": "4 ranks beside a 2-job build (2 cores)",
           "ns1+1": "2 namespace hosts x 1 rank", "ns2+2": "2 namespace hosts x 2 ranks"}
# File stem -> row label, in table order. "raw gloo" comes from the baseline column of the runs
# that have one (gloo-and-raw; gloo in results from before 2026-12-01).
IMPLS = [("shm", "tutti shm"), ("auto", "tutti auto"), ("gloo", "tutti gloo"),
         ("gloo-functions", "tutti gloo, Gloo's functions"), ("raw", "raw gloo"),
         ("mpi-tcp", "openmpi tcp"), ("mpi-sm", "openmpi sm")]


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * mult[text[-1].upper()] if text[-1].upper() in mult else int(text)


def size_text(b):
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit} {name}"
    return f"{b} B"


def collect(config_dir):
    """{impl: {size: [median per repetition]}}"""
    runs = {}
    for path in sorted(glob.glob(os.path.join(config_dir, "*.r*.json"))):
        stem = re.sub(r"\.r\d+\.json$", "", os.path.basename(path))
        _, _, rows = load_run(path)
        for r in rows:
            runs.setdefault(stem, {}).setdefault(r["size_bytes"], []).append(r["time_us"])
            if "baseline_time_us" in r:
                runs.setdefault("raw", {}).setdefault(r["size_bytes"], []).append(
                    r["baseline_time_us"])
    return {impl: {s: statistics.median(v) for s, v in sizes.items()}
            for impl, sizes in runs.items()}, {
        impl: max(len(v) for v in sizes.values()) for impl, sizes in runs.items()}


def versus(mine, theirs):
    sizes = [s for s in mine if s in theirs and theirs[s] > 0]
    if not sizes or mine is theirs:
        return ""
    ratios = [mine[s] / theirs[s] for s in sizes]
    ahead = sum(1 for q in ratios if q < 1)
    return f"{ahead}/{len(sizes)}, {how_much(statistics.median(ratios))}"


def cell(us):
    if us is None:
        return ""
    return f"{us:.1f}" if us < 100 else f"{us:.0f}"


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dir")
    p.add_argument("--sizes", default="8,1K,64K,1M,16M,64M")
    args = p.parse_args()
    shown = [parse_size(s) for s in args.sizes.split(",")]
    print("Median time per allreduce (us), float32 sum; median over repetitions of each run's "
          "median. `vs MPI`: sizes (of all measured) where the row was faster, and how much faster "
          "or slower than Open MPI it was at the median size.\n")
    print("| configuration | implementation | reps | " +
          " | ".join(size_text(s) for s in shown) + " | vs MPI tcp | vs MPI sm |")
    print("|---|---|---:|" + "---:|" * len(shown) + "---|---|")
    for config, title in CONFIGS.items():
        config_dir = os.path.join(args.dir, config)
        if not os.path.isdir(config_dir):
            continue
        runs, reps = collect(config_dir)
        tcp, sm = runs.get("mpi-tcp", {}), runs.get("mpi-sm", {})
        for stem, label in IMPLS:
            if stem not in runs:
                continue
            times = runs[stem]
            print(f"| {title} | {label} | {reps[stem]} | " +
                  " | ".join(cell(times.get(s)) for s in shown) +
                  f" | {versus(times, tcp) if stem != 'mpi-tcp' else ''}"
                  f" | {versus(times, sm) if stem != 'mpi-sm' else ''} |")


if __name__ == "__main__":
    main()
