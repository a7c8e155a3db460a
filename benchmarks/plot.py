#!/usr/bin/env python3
"""Plots tutti-bench JSON files (and the comparison tools' JSON, which has the same shape):
bus bandwidth and latency against message size, one line per run.

    python3 benchmarks/plot.py results/allreduce.json other.json -o results/allreduce.png

With --baseline rows, raw Gloo's time is plotted as a line of its own. Uses matplotlib where it
is installed (Debian: python3-matplotlib), else draws the same two panels with png_plot.py, which
needs nothing beyond Python's standard library.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_json import load_run  # noqa: E402


def series(path):
    config, label, rows = load_run(path)
    name = f"{label} (n={config.get('world_size')})"
    out = [(name, [r["size_bytes"] for r in rows], [r["time_us"] for r in rows],
            [r["busbw_gbps"] for r in rows])]
    if rows and "baseline_time_us" in rows[0]:
        factor = config.get("bus_factor", 1.0)
        base = [r["baseline_time_us"] for r in rows]
        raw = config.get("baseline") or "raw"
        out.append((f"{raw} (beside tutti {config.get('backend')}, n={config.get('world_size')})",
                    [r["size_bytes"] for r in rows], base,
                    [r["size_bytes"] / t / 1e3 * factor if t > 0 else 0
                     for r, t in zip(rows, base)]))
    return config.get("op", "?"), out


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("json", nargs="+")
    p.add_argument("-o", "--output", default="bench.png")
    p.add_argument("--title")
    args = p.parse_args()
    ops, lines = set(), []
    for path in args.json:
        op, more = series(path)
        ops.add(op)
        lines += more
    title = args.title or f"{', '.join(sorted(ops))}: busbw and latency by message size"
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    try:
        import matplotlib
    except ImportError:
        from png_plot import write_plot
        write_plot(args.output, title, lines)
        print(f"wrote {args.output}")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bw, lat) = plt.subplots(1, 2, figsize=(13, 5))
    for name, sizes, times, busbw in lines:
        bw.plot(sizes, busbw, marker="o", markersize=3, label=name)
        lat.plot(sizes, times, marker="o", markersize=3, label=name)
    for ax in (bw, lat):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    bw.set_ylabel("bus bandwidth (GB/s)")
    lat.set_ylabel("time, median (us)")
    lat.set_yscale("log")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
