#!/usr/bin/env python3
"""Merges tutti-bench and comparison JSON files into one Markdown table: median time per size
for each run, and the first run's time divided by each other's (above 1: the first is slower).

    python3 benchmarks/compare/table.py tutti.json mpi.json torch.json
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_json import load_run  # noqa: E402


def load(path):
    config, label, rows = load_run(path)
    runs = [(label, {r["size_bytes"]: r["time_us"] for r in rows})]
    if rows and "baseline_time_us" in rows[0]:
        runs.append((str(config.get("baseline") or "raw"),
                     {r["size_bytes"]: r["baseline_time_us"] for r in rows}))
    return runs


def main():
    runs = [run for path in sys.argv[1:] for run in load(path)]
    sizes = sorted(set().union(*(set(times) for _, times in runs)))
    names = [name for name, _ in runs]
    print("| size (B) | " + " | ".join(f"{n} (us)" for n in names) + " | " +
          " | ".join(f"{names[0]} / {n}" for n in names[1:]) + " |")
    print("|---:|" + "---:|" * (2 * len(names) - 1))
    for s in sizes:
        cells = [f"{times[s]:.1f}" if s in times else "" for _, times in runs]
        base = runs[0][1].get(s)
        ratios = [f"{base / times[s]:.2f}" if base and times.get(s) else "" for _, times in runs[1:]]
        print(f"| {s} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
