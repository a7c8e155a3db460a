#!/usr/bin/env python3
"""The main job's verdict: how tutti fared against the baselines that ran beside it, over
several interleaved runs, in words a person can read.

    python3 benchmarks/verdict.py results/bench [--membw results/membw.json]

The directory holds tutti.r<N>.json (tutti-bench runs), optionally sym.r<N>.json (the same sweep
with --symmetric, given a verdict of its own), base.r<N>.json (the baseline tool's runs
of the same sweep, e.g. Open MPI's; optional), the rapid pairs' runs <name>-small.r<N>.json
(8 B-64 KiB) and <name>-mid.r<N>.json (128 KiB-8 MiB), which judge the sizes they ran (at each,
the median over the pairs of tutti's time over the baseline's in the run beside it), and
<name>.r<N>.state.json (benchmarks/machine.py: how busy the machine was during each run). A tutti run with a --baseline column (raw Gloo beside
tutti's gloo backend) counts as a baseline of its own.

Per baseline, over the sizes both measured: the median over runs of each one's time per size,
at how many sizes tutti's is lower, how much faster or slower it is at the median size and at
the closest (or worst) sizes, and how the count varied from run to run (run k of tutti against
run k of the baseline, which ran next to it). Then whether the machine was quiet, and where it
was not, the verdict over the quiet runs alone, and one by the mean time per op over every run
(where both tools wrote mean_us: busy, a median can hide ops that waited out a scheduler's slice,
which a job's throughput pays for). With --membw (tutti-membw's JSON): tutti's time
at 16 and 64 MiB against the memory's floor for an in-place allreduce (2 n S bytes through
memory at the rate every core reaches together; see benchmarks/membw.cc).
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from bench_json import load_run  # noqa: E402
import machine  # noqa: E402


def size_text(b):
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit} {name}"
    return f"{b} B"


def how_much(ratio):
    """tutti's time / the baseline's, as words: "2.5x faster", "1.08x slower", "even"."""
    if ratio <= 0:
        return "?"
    if abs(ratio - 1) < 0.005:
        return "even"
    if ratio < 1:
        faster = 1 / ratio
        return f"{faster:.0f}x faster" if faster >= 100 else f"{faster:.2f}x faster"
    return f"{ratio:.2f}x slower"


def runs_of(directory, stem):
    """{rep: (config, label, rows)} and {rep: state}."""
    runs, states = {}, {}
    for path in glob.glob(os.path.join(directory, f"{stem}.r*.json")):
        m = re.search(rf"{re.escape(stem)}\.r(\d+)\.json$", path)
        if not m:
            continue
        rep = int(m.group(1))
        runs[rep] = load_run(path)
        state = os.path.join(directory, f"{stem}.r{rep}.state.json")
        if os.path.exists(state):
            with open(state) as f:
                states[rep] = json.load(f)
    return runs, states


# bench.sh's rapid pairs: the small sizes (8 B-64 KiB), then the middle ones (128 KiB-8 MiB).
PAIR_SETS = ("-small", "-mid")


def pair_runs(directory, stem):
    """The rapid pairs' runs of stem (STEM-small and STEM-mid), as runs_of() gives them, keyed
    (set, pair): a size is in one set's runs only, so paired() pairs each size within its set."""
    runs, states = {}, {}
    for suffix in PAIR_SETS:
        r, st = runs_of(directory, stem + suffix)
        runs.update({(suffix, k): v for k, v in r.items()})
        states.update({(suffix, k): v for k, v in st.items()})
    return runs, states


def span_text(sizes):
    """"8 B-8 MiB": the smallest and the largest of sizes."""
    sizes = sorted(sizes)
    return size_text(sizes[0]) + (f"-{size_text(sizes[-1])}" if len(sizes) > 1 else "")


def per_size(pairs):
    """How many pairs each size of paired()'s result had: "15", or "14-15"."""
    counts = sorted({v[2] for v in pairs.values()})
    return f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def paired(mine, theirs, reps):
    """mine, theirs: {pair: {size: us}}, a pair's two runs made one beside the other. {size:
    (the median over the pairs in reps of mine / theirs, in how many mine was lower, of how
    many)}."""
    out = {}
    reps = [r for r in reps if r in mine and r in theirs]
    for s in sorted(set().union(*(set(mine[r]) & set(theirs[r]) for r in reps))):
        ratios = [mine[r][s] / theirs[r][s] for r in reps
                  if s in mine[r] and s in theirs[r] and theirs[r][s] > 0]
        if ratios:
            out[s] = (statistics.median(ratios), sum(1 for x in ratios if x < 1), len(ratios))
    return out


def compare(mine, theirs, reps, pairs=None):
    """mine, theirs: {rep: {size: us}}. The verdict text for the runs in reps, or None. pairs
    (from paired()): the sizes it holds are judged by its ratios instead of the ratio of the
    runs' medians."""
    reps = [r for r in reps if r in mine and r in theirs]
    if not reps:
        return None
    sizes = sorted(set.intersection(*(set(mine[r]) & set(theirs[r]) for r in reps)))
    sizes = [s for s in sizes if all(theirs[r][s] > 0 for r in reps)]
    if not sizes:
        return None
    med_m = {s: statistics.median(mine[r][s] for r in reps) for s in sizes}
    med_t = {s: statistics.median(theirs[r][s] for r in reps) for s in sizes}
    ratios = {s: (pairs[s][0] if pairs and s in pairs else med_m[s] / med_t[s]) for s in sizes}
    ahead = [s for s in sizes if ratios[s] < 1]
    behind = sorted((s for s in sizes if ratios[s] >= 1), key=lambda s: -ratios[s])
    per_run = [sum(1 for s in sizes if mine[r][s] < theirs[r][s]) for r in reps]
    text = (f"ahead at {len(ahead)} of {len(sizes)} sizes, "
            f"{how_much(statistics.median(ratios.values()))} at the median size")
    if behind:
        worst = ", ".join(f"{size_text(s)} ({how_much(ratios[s])})" for s in behind[:4])
        more = f" and {len(behind) - 4} more" if len(behind) > 4 else ""
        text += f"; behind at {worst}{more}"
    else:
        close = sorted(sizes, key=lambda s: -ratios[s])[:2]
        text += "; closest at " + ", ".join(f"{size_text(s)} ({how_much(ratios[s])})"
                                             for s in close)
    if len(reps) > 1:
        text += (f"; run by run: ahead at {min(per_run)}-{max(per_run)} of {len(sizes)}"
                 if min(per_run) != max(per_run) else
                 f"; run by run: ahead at {per_run[0]} of {len(sizes)} in every run")
    return text, med_m


def pairs_line(pairs, name, plain):
    """What the rapid pairs (paired()'s) said, and what the sweeps alone would have (plain:
    compare()'s text without them)."""
    sizes = sorted(pairs)
    counts = {pairs[s][2] for s in sizes}
    if len(counts) == 1:
        wins = [pairs[s][1] for s in sizes]
        won = (f"{min(wins)}-{max(wins)}" if min(wins) != max(wins) else f"{wins[0]}") + \
            f" of the {counts.pop()}"
    else:  # a failed run left some sizes fewer pairs: shares
        shares = [pairs[s][1] / pairs[s][2] for s in sizes]
        low, high = round(100 * min(shares)), round(100 * max(shares))
        won = (f"{low}-{high}%" if low != high else f"{low}%") + " of them"
    return (f"{span_text(sizes)} judged by {per_size(pairs)} rapid pairs per size (at each "
            f"size the median of tutti's time over {name}'s in the run beside it; tutti lower in "
            f"{won}); by the sweeps' medians alone: " + plain.split("; run by run")[0])


def column(runs, key):
    """{rep: {size: row[key]}} where every row of every run has key, else None (the mean time
    per op, mean_us, is missing from runs before tutti-bench wrote it)."""
    out = {}
    for r, (_, _, rows) in runs.items():
        if any(key not in row for row in rows):
            return None
        out[r] = {row["size_bytes"]: row[key] for row in rows}
    return out


def memory_line(med_tutti, world, membw_path):
    with open(membw_path) as f:
        rows = json.load(f)["rows"]
    parts = []
    for size in (16 << 20, 64 << 20):
        if size not in med_tutti:
            continue
        candidates = [r for r in rows if r["size_bytes"] == size]
        if not candidates:
            continue
        best = max(candidates, key=lambda r: r["cores"])
        rate = best["update_all_gbps"] * 1e9
        floor_us = 2 * world * size / rate * 1e6
        how = (f"2 x {world} x {size_text(size)} at {best['update_all_gbps']:.1f} GB/s, "
               f"{best['cores']} cores")
        fraction = floor_us / med_tutti[size]
        if fraction > 1.005:
            # Faster than the probe's own rate: the probe bounds nothing at this size here (its
            # kernel ran slower than the op did), and a fraction over 100% would say nonsense.
            parts.append(f"{size_text(size)} in {med_tutti[size]:.0f} us, faster than the memory "
                         f"probe's rate allows ({floor_us:.0f} us: {how}; the probe is no "
                         f"ceiling at this size on this machine)")
            continue
        parts.append(f"{size_text(size)} in {med_tutti[size]:.0f} us, "
                     f"{fraction:.0%} of the memory's bound ({floor_us:.0f} us: {how})")
    if not parts:
        return None
    return "memory: " + "; ".join(parts)


def report(directory, stem, base, base_states, membw):
    """Prints the verdict of the tutti runs named `stem` against the baselines; False if none."""
    tutti, tutti_states = runs_of(directory, stem)
    if not tutti:
        return False
    first = tutti[min(tutti)]
    config, label = first[0], first[1]
    world = config.get("world_size", 2)
    mine = column(tutti, "time_us")
    mine_mean = column(tutti, "mean_us")
    # The small and middle sizes' rapid pairs (bench.sh's second part), where they ran.
    paired_runs, pair_states = pair_runs(directory, stem)
    base_pairs, base_pair_states = pair_runs(directory, "base")
    baselines = []
    # Per baseline: its name, its times per run, their states, its mean times per run, and the
    # pairs (tutti's and its pairs' runs with their states), or None.
    if base:
        name = base[min(base)][1]
        pair = None
        if paired_runs and base_pairs:
            pair = (column(paired_runs, "time_us"), pair_states, column(paired_runs, "mean_us"),
                    column(base_pairs, "time_us"), base_pair_states,
                    column(base_pairs, "mean_us"))
        baselines.append((name, column(base, "time_us"), base_states, column(base, "mean_us"),
                          pair))
    if first[2] and "baseline_time_us" in first[2][0]:
        raw = column(tutti, "baseline_time_us")
        pair = None
        if paired_runs and all(rows and "baseline_time_us" in rows[0]
                               for _, _, rows in paired_runs.values()):
            pair = (column(paired_runs, "time_us"), pair_states, None,
                    column(paired_runs, "baseline_time_us"), {}, None)
        baselines.append((str(config.get("baseline") or "raw"), raw, {}, None, pair))
    reps = sorted(tutti)
    head = f"verdict: {label} ({world} ranks, {len(reps)} interleaved run{'s' * (len(reps) > 1)})"
    sizes = sorted(set.union(*(set(m) for m in mine.values())))
    med_tutti = {s: statistics.median(mine[r][s] for r in reps if s in mine[r]) for s in sizes}
    if not baselines:
        print(head + ": no baseline ran beside it")
    for name, theirs, states, theirs_mean, pair in baselines:
        pairs, pair_reps, pairs_mean = None, [], None
        if pair:
            p_mine, p_mine_states, p_mine_mean, p_theirs, p_states, p_theirs_mean = pair
            pair_reps = sorted(r for r in p_mine if r in p_theirs)
            pairs = paired(p_mine, p_theirs, pair_reps) or None
            if pairs is None:
                pair_reps = []  # no size in common: as if none had run
            elif p_mine_mean and p_theirs_mean:
                pairs_mean = paired(p_mine_mean, p_theirs_mean, pair_reps) or None
        result = compare(mine, theirs, reps, pairs)
        if result is None:
            print(f"{head} vs {name}: no common sizes")
            continue
        text, _ = result
        print(f"{head} vs {name}: {text}")
        if pairs:
            print("  " + pairs_line(pairs, name, compare(mine, theirs, reps)[0]))
        all_states = [tutti_states[r] for r in reps if r in tutti_states] + \
                     [states[r] for r in reps if r in states]
        if pairs:
            all_states += [p_mine_states[r] for r in pair_reps if r in p_mine_states] + \
                          [p_states[r] for r in pair_reps if r in p_states]
        if not all_states:
            continue
        print("  " + machine.describe(all_states))
        quiet = [r for r in reps
                 if not machine.is_busy(tutti_states.get(r, {}))
                 and not machine.is_busy(states.get(r, {}))]
        quiet_pairs = [r for r in pair_reps
                       if not machine.is_busy(p_mine_states.get(r, {}))
                       and not machine.is_busy(p_states.get(r, {}))] if pairs else []
        if len(quiet) < len(reps) or len(quiet_pairs) < len(pair_reps):
            if quiet:
                q_pairs = (paired(p_mine, p_theirs, quiet_pairs) or None) if quiet_pairs else None
                q = compare(mine, theirs, quiet, q_pairs)
                if q:
                    also = (f" (and the quiet pairs of {span_text(q_pairs)}, "
                            f"{per_size(q_pairs)} per size)" if q_pairs else "")
                    print(f"  on the {len(quiet)} quiet run{'s' * (len(quiet) > 1)}{also} alone: "
                          f"{q[0]}")
            else:
                print("  no run was quiet: run it again on a quiet machine for a verdict that holds")
            # Busy, a median can hide ops that stalled for a scheduler's slice: the mean time
            # per op over every run counts them, as a job's throughput does.
            if mine_mean and theirs_mean:
                m = compare(mine_mean, theirs_mean, reps, pairs_mean)
                if m:
                    print(f"  by the mean time per op, every run (stalls included): {m[0]}")
    if membw and med_tutti and os.path.exists(membw):
        line = memory_line(med_tutti, world, membw)
        if line:
            print(line)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("directory")
    ap.add_argument("--membw")
    args = ap.parse_args()
    base, base_states = runs_of(args.directory, "base")
    if not report(args.directory, "tutti", base, base_states, args.membw):
        sys.exit(f"verdict: no tutti runs in {args.directory}")
    # The same sweep with the tensors in symmetric memory (bench.sh's third), where it ran.
    report(args.directory, "sym", base, base_states, args.membw)


if __name__ == "__main__":
    main()
