#!/usr/bin/env python3
"""The A/B table of benchmarks/compare/ab.sh: per size, the median over pairs of each side's
median time, and the ratio B/A of each pair (B's run against the A run beside it) as its median
and its range over the pairs. A size counts as slower (or faster) only when every pair says so by
more than the noise margin; anything else is "even" (within noise, or the pairs disagree).

Where the runs' cache-line probes (machine.py, "exchange_ns") fall in two states, some runs with a
line between the CPUs more than twice as slow as the sitting's fastest ("far") and some not
("near"), the verdict is given again for the pairs whose two runs were both near and for those
both far: the small sizes' times follow that state more than either revision (docs/PERFORMANCE.md).

    python3 benchmarks/compare/ab_table.py results/ab/X-vs-Y [--a NAME] [--b NAME] [--noise 0.03]
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
from bench_json import load_run  # noqa: E402
import machine  # noqa: E402


def size_text(b):
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit} {name}"
    return f"{b} B"


def run_files(directory, side):
    """(rep, path) of one side's runs (not their .state.json)."""
    for path in glob.glob(os.path.join(directory, f"{side}.r*.json")):
        m = re.search(rf"{side}\.r(\d+)\.json$", path)
        if m:
            yield int(m.group(1)), path


def runs(directory, side):
    """{rep: {size: median us}} and {rep: state} for one side."""
    times, states = {}, {}
    for rep, path in run_files(directory, side):
        _, _, rows = load_run(path)
        times[rep] = {r.get("size_bytes", r.get("bytes")): r["time_us"] for r in rows}
        state_path = os.path.join(directory, f"{side}.r{rep}.state.json")
        if os.path.exists(state_path):
            with open(state_path) as f:
                states[rep] = json.load(f)
    return times, states


def means(directory, side):
    """{rep: {size: mean us per op}} for one side, or None where a run has no mean_us (an older
    tutti-bench)."""
    out = {}
    for rep, path in run_files(directory, side):
        _, _, rows = load_run(path)
        if any("mean_us" not in r for r in rows):
            return None
        out[rep] = {r.get("size_bytes", r.get("bytes")): r["mean_us"] for r in rows}
    return out or None


def classify(ratios, noise):
    if all(r > 1 + noise for r in ratios):
        return "slower"
    if all(r < 1 - noise for r in ratios):
        return "faster"
    return "even"


def table(a, b, noise, name_a, name_b, reps=None):
    """Markdown lines and the verdict for the pairs in `reps` (all when None)."""
    pairs = sorted(set(a) & set(b))
    if reps is not None:
        pairs = [p for p in pairs if p in reps]
    if not pairs:
        return [], "no complete pair"
    sizes = sorted(set.intersection(*(set(a[p]) & set(b[p]) for p in pairs)))
    lines = [f"| size | A {name_a} (us) | B {name_b} (us) | B/A median | B/A range | |",
             "|---|---|---|---|---|---|"]
    verdicts = {"slower": [], "faster": [], "even": []}
    for s in sizes:
        ratios = [b[p][s] / a[p][s] for p in pairs if a[p][s] > 0]
        if not ratios:
            continue
        kind = classify(ratios, noise)
        verdicts[kind].append((s, statistics.median(ratios)))
        lines.append(f"| {size_text(s)} | {statistics.median(a[p][s] for p in pairs):.4g} | "
                     f"{statistics.median(b[p][s] for p in pairs):.4g} | "
                     f"{statistics.median(ratios):.3f} | {min(ratios):.3f}-{max(ratios):.3f} | "
                     f"{'' if kind == 'even' else kind} |")
    def named(kind):
        items = verdicts[kind]
        return ", ".join(f"{size_text(s)} ({r:.2f}x)" for s, r in items) if items else "none"
    all_ratios = [b[p][s] / a[p][s] for p in pairs for s in sizes if a[p][s] > 0]
    verdict = (f"B/A over {len(pairs)} pairs: median ratio {statistics.median(all_ratios):.3f}; "
               f"slower in every pair (by > {noise:.0%}) at {named('slower')}; "
               f"faster in every pair at {named('faster')}")
    return lines, verdict


def exchange_states(states_a, states_b):
    """{pair: "near" | "far"} for the pairs whose two runs saw the same state, or {} when no run
    was far. A run is far when every probe of it took more than twice the sitting's fastest."""
    probes = {}
    for side, states in (("a", states_a), ("b", states_b)):
        for rep, state in states.items():
            xs = [x for x in state.get("exchange_ns", []) if x]
            if xs:
                probes[(side, rep)] = xs
    if not probes:
        return {}
    fastest = min(min(xs) for xs in probes.values())
    kind = {k: "far" if min(xs) > 2 * fastest else "near" if max(xs) <= 2 * fastest else None
            for k, xs in probes.items()}
    if "far" not in kind.values():
        return {}
    out = {}
    for rep in set(states_a) & set(states_b):
        ka, kb = kind.get(("a", rep)), kind.get(("b", rep))
        if ka is not None and ka == kb:
            out[rep] = ka
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("directory")
    ap.add_argument("--a", default="A")
    ap.add_argument("--b", default="B")
    ap.add_argument("--noise", type=float, default=0.03)
    args = ap.parse_args()
    a, states_a = runs(args.directory, "a")
    b, states_b = runs(args.directory, "b")
    lines, verdict = table(a, b, args.noise, args.a, args.b)
    print("\n".join(lines))
    print()
    states = list(states_a.values()) + list(states_b.values())
    print(machine.describe(states))
    print("ab: " + verdict)
    quiet = {p for p in set(a) & set(b)
             if p in states_a and p in states_b
             and not machine.is_busy(states_a[p]) and not machine.is_busy(states_b[p])}
    if states and len(quiet) < len(set(a) & set(b)):
        if quiet:
            print("ab: quiet pairs only: " + table(a, b, args.noise, args.a, args.b, quiet)[1])
        else:
            print("ab: no pair ran on a quiet machine")
    by_state = exchange_states(states_a, states_b)
    for kind in ("near", "far"):
        reps = {p for p, k in by_state.items() if k == kind}
        if reps:
            print(f"ab: pairs with both runs {kind}: " + table(a, b, args.noise, args.a, args.b,
                                                                reps)[1])
    # The same by the mean time per op: at the small sizes the per-iteration medians land on a
    # few values ~10 ns apart (0.250, 0.260 us), so a change of a few percent can leave them
    # equal where the mean shows it.
    mean_a, mean_b = means(args.directory, "a"), means(args.directory, "b")
    if mean_a and mean_b:
        lines, verdict = table(mean_a, mean_b, args.noise, args.a, args.b)
        print()
        print("By the mean time per op:")
        print("\n".join(lines))
        print("ab: by the mean time per op: " + verdict)
        for kind in ("near", "far"):
            reps = {p for p, k in by_state.items() if k == kind}
            if reps:
                print(f"ab: by the mean, pairs with both runs {kind}: " +
                      table(mean_a, mean_b, args.noise, args.a, args.b, reps)[1])


if __name__ == "__main__":
    main()
