#!/usr/bin/env python3
"""One line: how a tutti-bench run fared against the baselines that ran beside it.

    python3 benchmarks/verdict.py results/allreduce.json [results/openmpi.json ...]

The first file is tutti's; its own --baseline column (raw Gloo) counts as a baseline, and so does
each further file (a comparison tool's JSON, e.g. Open MPI's). Per baseline: at how many sizes
tutti's median time was lower, the median of tutti's time / the baseline's over all sizes, and
the sizes where tutti was slower, with the factor (the worst three).
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_json import load_run  # noqa: E402


def size_text(b):
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit} {name}"
    return f"{b} B"


def against(name, mine, theirs):
    sizes = sorted(s for s in mine if s in theirs and theirs[s] > 0)
    if not sizes:
        return f"vs {name}: no common sizes"
    ratios = {s: mine[s] / theirs[s] for s in sizes}
    ahead = sum(1 for s in sizes if ratios[s] < 1)
    text = (f"vs {name}: ahead at {ahead} of {len(sizes)} sizes, "
            f"median ratio {statistics.median(ratios.values()):.2f}")
    behind = sorted((s for s in sizes if ratios[s] >= 1), key=lambda s: -ratios[s])
    if behind:
        worst = ", ".join(f"{size_text(s)} ({ratios[s]:.2f}x)" for s in sorted(behind[:3]))
        more = f" and {len(behind) - 3} more" if len(behind) > 3 else ""
        text += f"; behind at {worst}{more}"
    return text


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    config, label, rows = load_run(sys.argv[1])
    mine = {r["size_bytes"]: r["time_us"] for r in rows}
    parts = []
    for path in sys.argv[2:]:
        _, other, other_rows = load_run(path)
        parts.append(against(other, mine, {r["size_bytes"]: r["time_us"] for r in other_rows}))
    if rows and "baseline_time_us" in rows[0]:
        parts.append(against(str(config.get("baseline") or "raw"), mine,
                             {r["size_bytes"]: r["baseline_time_us"] for r in rows}))
    world = config.get("world_size")
    print(f"verdict: {label} ({world} ranks, median time per size) " + "; ".join(parts))


if __name__ == "__main__":
    main()
