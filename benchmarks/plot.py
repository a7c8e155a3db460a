#!/usr/bin/env python3
"""Plots tutti-bench JSON files (and the comparison tools' JSON, which has the same shape):
time per size with the spread over runs (where the rows carry min_us/max_us, as the main job's
merged runs do), bus bandwidth, and how many times faster the first file (tutti) is than each of
the others at each size.

    python3 benchmarks/plot.py results/allreduce.json results/openmpi.json -o results/allreduce.png

With --baseline rows (raw Gloo beside tutti's gloo backend), raw Gloo is a line of its own.
With --pairs DIR STEM... (the main job's run directory and each file's stem there, e.g.
results/bench tutti sym base), the times-faster panel takes the sizes the rapid pairs ran from
the pairs, as the verdict does (benchmarks/verdict.py): the median over the pairs of the first
file's time over the other's in the run beside it.
Needs matplotlib (Debian: python3-matplotlib, which scripts/setup-debian.sh installs).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_json import load_run  # noqa: E402


def series(path):
    """[(name, sizes, times, lows, highs, busbw)] for one file."""
    config, label, rows = load_run(path)
    name = f"{label} (n={config.get('world_size')})"
    sizes = [r["size_bytes"] for r in rows]
    out = [(name, sizes, [r["time_us"] for r in rows],
            [r.get("min_us", r["time_us"]) for r in rows],
            [r.get("max_us", r["time_us"]) for r in rows],
            [r["busbw_gbps"] for r in rows])]
    if rows and "baseline_time_us" in rows[0]:
        factor = config.get("bus_factor", 1.0)
        base = [r["baseline_time_us"] for r in rows]
        raw = config.get("baseline") or "raw"
        out.append((f"{raw} (beside tutti {config.get('backend')}, n={config.get('world_size')})",
                    sizes, base, base, base,
                    [s / t / 1e3 * factor if t > 0 else 0 for s, t in zip(sizes, base)]))
    return config.get("op", "?"), out


def pair_ratios(directory, stems):
    """{i: {size: ratio}} for stems[1:]: the median over the rapid pairs (STEM-small and
    STEM-mid runs in directory) of stems[0]'s time over stems[i]'s in the run beside it
    (verdict.paired's)."""
    import verdict
    out = {}
    if not stems:
        return out
    first = verdict.column(verdict.pair_runs(directory, stems[0])[0], "time_us")
    for i, stem in enumerate(stems[1:], 1):
        other = verdict.column(verdict.pair_runs(directory, stem)[0], "time_us")
        if first and other:
            reps = sorted(r for r in first if r in other)
            out[i] = {s: v[0] for s, v in verdict.paired(first, other, reps).items()}
    return out


def size_label(b):
    for unit, name in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if b >= unit:
            return f"{b // unit}{name}"
    return str(b)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("json", nargs="+")
    p.add_argument("-o", "--output", default="bench.png")
    p.add_argument("--title")
    p.add_argument("--pairs", nargs="+", metavar="DIR STEM")
    args = p.parse_args()
    paired_ratio = pair_ratios(args.pairs[0], args.pairs[1:len(args.json) + 1]) \
        if args.pairs else {}
    ops, lines, owners = set(), [], []  # owners: the file each line came from
    for i, path in enumerate(args.json):
        op, more = series(path)
        ops.add(op)
        lines += more
        owners += [i] * len(more)  # (a file with --baseline rows gives two lines)
    title = args.title or f"{', '.join(sorted(ops))}: time, busbw and speed-up by message size"
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, bw, up) = plt.subplots(1, 3, figsize=(18, 5.2))
    for name, sizes, times, lows, highs, busbw in lines:
        (line,) = lat.plot(sizes, times, marker="o", markersize=3, label=name)
        if any(lo != hi for lo, hi in zip(lows, highs)):
            lat.fill_between(sizes, lows, highs, color=line.get_color(), alpha=0.2)
        bw.plot(sizes, busbw, marker="o", markersize=3, label=name)
    mine = lines[0]
    for (name, sizes, times, _, _, _), owner in zip(lines[1:], owners[1:]):
        theirs = dict(zip(sizes, times))
        pairs = paired_ratio.get(owner, {}) if owner != 0 else {}
        common = [(s, 1 / pairs[s] if s in pairs and pairs[s] > 0 else theirs[s] / t)
                  for s, t in zip(mine[1], mine[2]) if s in theirs and t > 0]
        if common:
            up.plot([s for s, _ in common], [x for _, x in common], marker="o", markersize=3,
                    label=f"vs {name}")
    up.axhline(1.0, color="black", linewidth=1)
    for ax in (lat, bw, up):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ticks = [s for s in mine[1] if s & (s - 1) == 0][::2]
        ax.set_xticks(ticks, [size_label(s) for s in ticks])
    lat.set_ylabel("time, median over runs, band: their spread (us)")
    lat.set_yscale("log")
    bw.set_ylabel("bus bandwidth (GB/s)")
    up.set_ylabel(f"{mine[0]}: times faster (above 1) or slower" +
                  (f"\n(to {size_label(max(s for d in paired_ratio.values() for s in d))}"
                   " by the rapid pairs)" if any(paired_ratio.values()) else ""))
    up.set_ylim(bottom=0)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
