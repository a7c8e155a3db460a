#!/usr/bin/env python3
"""Tests of the benchmark scripts' arithmetic: the A/B table (benchmarks/compare/ab_table.py),
the machine-state probe (benchmarks/machine.py) and the main job's verdict
(benchmarks/verdict.py), on made-up runs whose answers are worked out here by hand."""
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BENCH = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, BENCH)
sys.path.insert(0, os.path.join(BENCH, "compare"))

import ab_table  # noqa: E402
import machine  # noqa: E402
import plot  # noqa: E402
import verdict  # noqa: E402


def write_run(path, times, backend="shm", tool="tutti-bench", world=2, symmetric=False,
              means=None):
    rows = [{"size_bytes": s, "time_us": t, "in_place": True} for s, t in times.items()]
    for row in rows:
        if means is not None:
            row["mean_us"] = means[row["size_bytes"]]
    with open(path, "w") as f:
        json.dump({"config": {"tool": tool, "backend": backend, "world_size": world,
                              "symmetric": symmetric}, "rows": rows}, f)


def write_state(path, others=0.0, steal=0.0, exchange=None):
    state = {"wall_s": 1.0, "cpus": 2, "self_cpu_s": 2.0, "others": others, "steal": steal,
             "load1_before": 0.1}
    if exchange is not None:
        state["exchange_ns"] = exchange
    with open(path, "w") as f:
        json.dump(state, f)


class AbTable(unittest.TestCase):
    def make(self, a_runs, b_runs, busy=()):
        d = tempfile.mkdtemp()
        for rep, times in enumerate(a_runs, 1):
            write_run(os.path.join(d, f"a.r{rep}.json"), times)
            write_state(os.path.join(d, f"a.r{rep}.state.json"), others=0.5 if rep in busy else 0)
        for rep, times in enumerate(b_runs, 1):
            write_run(os.path.join(d, f"b.r{rep}.json"), times)
            write_state(os.path.join(d, f"b.r{rep}.state.json"))
        return d

    def test_a_size_is_slower_only_when_every_pair_says_so(self):
        # 8 B: B is 1.5x in all three pairs. 1 KiB: 1.5x, 1.5x, then 0.8x (pairs disagree).
        # 1 MiB: B is 0.5x in every pair. 64 KiB: 1.01x (within the 3% noise).
        a = [{8: 1.0, 1024: 2.0, 65536: 10.0, 1 << 20: 100.0}] * 3
        b = [{8: 1.5, 1024: 3.0, 65536: 10.1, 1 << 20: 50.0},
             {8: 1.5, 1024: 3.0, 65536: 10.1, 1 << 20: 50.0},
             {8: 1.5, 1024: 1.6, 65536: 10.1, 1 << 20: 50.0}]
        d = self.make(a, b)
        ra, _ = ab_table.runs(d, "a")
        rb, _ = ab_table.runs(d, "b")
        lines, verdict = ab_table.table(ra, rb, 0.03, "A", "B")
        self.assertIn("slower in every pair (by > 3%) at 8 B (1.50x);", verdict)
        self.assertIn("faster in every pair at 1 MiB (0.50x)", verdict)
        row_1k = next(line for line in lines if line.startswith("| 1 KiB"))
        # Ratios 1.5, 1.5, 0.8: median 1.5, range 0.8-1.5, no verdict.
        self.assertIn("| 1.500 | 0.800-1.500 |  |", row_1k)
        self.assertEqual(len(lines), 2 + 4)

    def test_busy_pairs_are_named_and_left_out_of_the_quiet_verdict(self):
        a = [{8: 1.0}, {8: 1.0}, {8: 1.0}]
        b = [{8: 1.2}, {8: 0.5}, {8: 1.2}]  # pair 2 ran while A was beside a busy process
        d = self.make(a, b, busy={2})
        out = subprocess.run([sys.executable, os.path.join(BENCH, "compare", "ab_table.py"), d],
                             capture_output=True, text=True, check=True).stdout
        self.assertIn("machine BUSY in 1 of 6 runs", out)
        self.assertIn("other processes used up to 50% of the CPUs", out)
        # All pairs: 1.2, 0.5, 1.2 disagree; the quiet ones (1 and 3) say slower.
        self.assertIn("ab: B/A over 3 pairs: median ratio 1.200; slower in every pair (by > 3%) "
                      "at none", out)
        self.assertIn("ab: quiet pairs only: B/A over 2 pairs: median ratio 1.200; slower in every "
                      "pair (by > 3%) at 8 B (1.20x)", out)

    def test_pairs_are_judged_again_by_the_cache_line_state_both_runs_saw(self):
        # Probes (ns, before and after each run): pairs 1-2 near (70-80), 3-4 far (260-300),
        # pair 5 mixed (A far, B near): left out of both. 8 B: B 0.5x in the far pairs, 1.1x in
        # the near ones (so "even" over all five pairs, whose ratios disagree).
        d = tempfile.mkdtemp()
        probes = {1: ([70, 75], [72, 80]), 2: ([71, 74], [76, 73]), 3: ([280, 290], [260, 300]),
                  4: ([270, 265], [290, 285]), 5: ([280, 281], [75, 74])}
        a_times = {1: 0.25, 2: 0.25, 3: 0.5, 4: 0.5, 5: 0.5}
        b_times = {1: 0.275, 2: 0.275, 3: 0.25, 4: 0.25, 5: 0.275}
        for rep in probes:
            write_run(os.path.join(d, f"a.r{rep}.json"), {8: a_times[rep]})
            write_run(os.path.join(d, f"b.r{rep}.json"), {8: b_times[rep]})
            write_state(os.path.join(d, f"a.r{rep}.state.json"), exchange=probes[rep][0])
            write_state(os.path.join(d, f"b.r{rep}.state.json"), exchange=probes[rep][1])
        out = subprocess.run([sys.executable, os.path.join(BENCH, "compare", "ab_table.py"), d],
                             capture_output=True, text=True, check=True).stdout
        self.assertIn("ab: B/A over 5 pairs: median ratio 0.550; slower in every pair (by > 3%) "
                      "at none; faster in every pair at none", out)
        self.assertIn("ab: pairs with both runs near: B/A over 2 pairs: median ratio 1.100; "
                      "slower in every pair (by > 3%) at 8 B (1.10x)", out)
        self.assertIn("ab: pairs with both runs far: B/A over 2 pairs: median ratio 0.500; "
                      "slower in every pair (by > 3%) at none; faster in every pair at 8 B "
                      "(0.50x)", out)

    def test_the_mean_time_per_op_gets_a_table_and_verdict_of_its_own(self):
        # Medians equal (0.26 in every run: the steps they move in), means 0.270 -> 0.262 in each
        # of 3 pairs: B/A by the mean 0.970, faster in every pair by more than the 1% margin.
        d = tempfile.mkdtemp()
        for rep in (1, 2, 3):
            write_run(os.path.join(d, f"a.r{rep}.json"), {8: 0.26}, means={8: 0.270})
            write_run(os.path.join(d, f"b.r{rep}.json"), {8: 0.26}, means={8: 0.2619})
        out = subprocess.run([sys.executable, os.path.join(BENCH, "compare", "ab_table.py"), d,
                              "--noise", "0.01"], capture_output=True, text=True,
                             check=True).stdout
        self.assertIn("ab: B/A over 3 pairs: median ratio 1.000; slower in every pair (by > 1%) "
                      "at none; faster in every pair at none", out)
        self.assertIn("ab: by the mean time per op: B/A over 3 pairs: median ratio 0.970; slower "
                      "in every pair (by > 1%) at none; faster in every pair at 8 B (0.97x)", out)
        # Without means on one side (an older tutti-bench), no such lines.
        write_run(os.path.join(d, "a.r1.json"), {8: 0.26})
        out = subprocess.run([sys.executable, os.path.join(BENCH, "compare", "ab_table.py"), d],
                             capture_output=True, text=True, check=True).stdout
        self.assertNotIn("by the mean", out)

    def test_no_state_verdict_where_no_run_was_far(self):
        d = tempfile.mkdtemp()
        for rep in (1, 2):
            for side, t in (("a", 1.0), ("b", 1.2)):
                write_run(os.path.join(d, f"{side}.r{rep}.json"), {8: t})
                write_state(os.path.join(d, f"{side}.r{rep}.state.json"), exchange=[70, 140])
        out = subprocess.run([sys.executable, os.path.join(BENCH, "compare", "ab_table.py"), d],
                             capture_output=True, text=True, check=True).stdout
        self.assertNotIn("both runs", out)


class Machine(unittest.TestCase):
    def test_a_busy_command_counts_as_itself_not_as_others(self):
        d = tempfile.mkdtemp()
        state_path = os.path.join(d, "s.json")
        # 0.6 s of the spinner's own CPU time, however busy the machine (a wall-clock spin got
        # 0.3 s of CPU in a loaded test run).
        spin = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.6: pass"
        rc = machine.main(["machine.py", "run", "--state", state_path, "--",
                           sys.executable, "-c", spin])
        self.assertEqual(rc, 0)
        with open(state_path) as f:
            state = json.load(f)
        self.assertGreater(state["self_cpu_s"], 0.5)
        self.assertGreaterEqual(state["wall_s"], 0.6)

    def test_a_process_beside_the_command_counts_as_others(self):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.2)
            _, state = machine.measure(lambda: time.sleep(1.0))
        finally:
            hog.kill()
            hog.wait()
        # One CPU of `cpus` was the hog's: at least most of 1/cpus of all CPU time.
        self.assertGreater(state["others"], 0.7 / state["cpus"])
        self.assertTrue(machine.is_busy(state))

    def test_exit_status_is_the_commands(self):
        d = tempfile.mkdtemp()
        rc = machine.main(["machine.py", "run", "--state", os.path.join(d, "s.json"), "--",
                           sys.executable, "-c", "raise SystemExit(3)"])
        self.assertEqual(rc, 3)

    def test_the_cache_line_exchange_is_taken_before_and_after_the_command(self):
        d = tempfile.mkdtemp()
        # A stand-in for tutti-membw that says 61.5 ns before the command and 248 ns after it
        # (the command writes the file it reads).
        probe = os.path.join(d, "probe")
        later = os.path.join(d, "later")
        with open(probe, "w") as f:
            f.write(f"#!/bin/sh\n[ \"$1 $2 $3\" = \"--exchange-only -n 3\" ] || exit 2\n"
                    f"if [ -e {later} ]; then echo 248.0; else echo 61.5; fi\n")
        os.chmod(probe, 0o755)
        state_path = os.path.join(d, "s.json")
        rc = machine.main(["machine.py", "run", "--state", state_path, "--exchange", probe, "--",
                           "touch", later])
        self.assertEqual(rc, 0)
        with open(state_path) as f:
            state = json.load(f)
        self.assertEqual(state["exchange_ns"], [61.5, 248.0])
        self.assertIn("a cache line between CPUs 0 and 1 in 62-248 ns", machine.describe([state]))
        # A probe that cannot say (it fails): no figure, and the description says none.
        os.remove(later)
        rc = machine.main(["machine.py", "run", "--state", state_path, "--exchange",
                           os.path.join(d, "absent"), "--", "true"])
        self.assertEqual(rc, 0)
        with open(state_path) as f:
            state = json.load(f)
        self.assertEqual(state["exchange_ns"], [None, None])
        self.assertNotIn("cache line", machine.describe([state]))

    def test_the_real_probe_gives_a_time(self):
        membw = os.environ.get("TUTTI_MEMBW", os.path.join(ROOT, "build", "bin", "tutti-membw"))
        if not os.access(membw, os.X_OK):
            self.skipTest(f"{membw} is not built (ctest names it in TUTTI_MEMBW)")
        value = machine.exchange_ns(membw)
        if (os.cpu_count() or 1) < 2:
            self.assertIsNone(value)
        else:
            # A cache line moves between two cores in tens to hundreds of ns; not 0, not ms.
            self.assertTrue(value is not None and 5 < value < 100000, value)


class Verdict(unittest.TestCase):
    def run_verdict(self, d, *extra):
        return subprocess.run([sys.executable, os.path.join(BENCH, "verdict.py"), d, *extra],
                              capture_output=True, text=True, check=True).stdout

    def test_medians_over_runs_and_readable_ratios(self):
        d = tempfile.mkdtemp()
        # tutti per run at 8 B / 1 MiB / 64 MiB; the baseline beside it.
        tutti = [{8: 0.4, 1 << 20: 100.0, 64 << 20: 10000.0},
                 {8: 0.5, 1 << 20: 110.0, 64 << 20: 11000.0},
                 {8: 0.3, 1 << 20: 90.0, 64 << 20: 30000.0}]
        base = [{8: 0.45, 1 << 20: 200.0, 64 << 20: 20000.0}] * 3
        for rep in range(3):
            write_run(os.path.join(d, f"tutti.r{rep + 1}.json"), tutti[rep])
            write_run(os.path.join(d, f"base.r{rep + 1}.json"), base[rep], backend="openmpi sm",
                      tool="mpi_allreduce")
            write_state(os.path.join(d, f"tutti.r{rep + 1}.state.json"))
            write_state(os.path.join(d, f"base.r{rep + 1}.state.json"),
                        others=0.4 if rep == 2 else 0.0)
        out = self.run_verdict(d)
        # Medians: 8 B 0.4 vs 0.45 (1.12x faster), 1 MiB 100 vs 200 (2x), 64 MiB 11000 vs 20000.
        # Run 3 was beside a busy machine; runs 1 and 2 alone: 8 B median 0.45 (even, not ahead).
        self.assertIn("vs openmpi sm: ahead at 3 of 3 sizes, 1.82x faster at the median size; "
                      "closest at 8 B (1.12x faster), 64 MiB (1.82x faster); run by run: ahead "
                      "at 2-3 of 3", out)
        self.assertIn("machine BUSY in 1 of 6 runs", out)
        self.assertIn("on the 2 quiet runs alone: ahead at 2 of 3 sizes", out)
        self.assertIn("behind at 8 B (even)", out)

    def test_a_busy_sitting_also_gets_a_verdict_by_the_mean_time_per_op(self):
        d = tempfile.mkdtemp()
        # Medians say tutti is ahead at both sizes; the means (stalls included) say 8 B stalled:
        # 8 B 50 us against 0.5 (100x slower), 1 MiB 120 against 400 (0.3).
        for rep in (1, 2):
            write_run(os.path.join(d, f"tutti.r{rep}.json"), {8: 0.4, 1 << 20: 100.0},
                      means={8: 50.0, 1 << 20: 120.0})
            write_run(os.path.join(d, f"base.r{rep}.json"), {8: 0.45, 1 << 20: 200.0},
                      backend="openmpi sm", tool="mpi_allreduce",
                      means={8: 0.5, 1 << 20: 400.0})
            write_state(os.path.join(d, f"tutti.r{rep}.state.json"),
                        others=0.5 if rep == 2 else 0.0)
            write_state(os.path.join(d, f"base.r{rep}.state.json"))
        out = self.run_verdict(d)
        self.assertIn("vs openmpi sm: ahead at 2 of 2 sizes", out)
        # The median of the two ratios, 100 and 0.3, is 50.15.
        self.assertIn("by the mean time per op, every run (stalls included): ahead at 1 of 2 "
                      "sizes, 50.15x slower at the median size; behind at 8 B (100.00x slower)",
                      out)
        # Quiet, or without means from both tools, there is no such line.
        for rep in (1, 2):
            write_state(os.path.join(d, f"tutti.r{rep}.state.json"))
        self.assertNotIn("by the mean time per op", self.run_verdict(d))
        write_state(os.path.join(d, "tutti.r2.state.json"), others=0.5)
        write_run(os.path.join(d, "base.r1.json"), {8: 0.45, 1 << 20: 200.0},
                  backend="openmpi sm", tool="mpi_allreduce")
        out = self.run_verdict(d)
        self.assertIn("on the 1 quiet run alone", out)
        self.assertNotIn("by the mean time per op", out)

    def test_the_symmetric_sweep_has_a_verdict_of_its_own(self):
        d = tempfile.mkdtemp()
        for rep in (1, 2):
            write_run(os.path.join(d, f"tutti.r{rep}.json"), {8: 0.4, 1 << 20: 100.0})
            write_run(os.path.join(d, f"sym.r{rep}.json"), {8: 0.4, 1 << 20: 25.0},
                      symmetric=True)
            write_run(os.path.join(d, f"base.r{rep}.json"), {8: 0.5, 1 << 20: 150.0},
                      backend="openmpi sm", tool="mpi_allreduce")
        out = self.run_verdict(d).splitlines()
        # 8 B: 0.4 vs 0.5 (1.25x faster) either way; 1 MiB: 100 vs 150 (1.50x), 25 vs 150 (6x);
        # the symmetric sweep's median ratio (0.8 + 1/6) / 2 = 0.483: 2.07x faster.
        self.assertTrue(out[0].startswith("verdict: tutti shm (2 ranks, 2 interleaved runs) vs "
                                          "openmpi sm: ahead at 2 of 2 sizes"), out)
        sym = [line for line in out if line.startswith("verdict: tutti shm, symmetric memory")]
        self.assertEqual(len(sym), 1, out)
        self.assertIn("vs openmpi sm: ahead at 2 of 2 sizes, 2.07x faster at the median size; "
                      "closest at 8 B (1.25x faster), 1 MiB (6.00x faster)", sym[0])

    def test_small_and_middle_sizes_are_judged_by_the_rapid_pairs(self):
        d = tempfile.mkdtemp()
        # The sweeps: 8 B drew differently (tutti 0.5 "far" in 2 of 3 runs, the baseline 0.3
        # "near" in all): by the medians, 0.5 / 0.3, 1.67x slower. 1 MiB the same way: tutti
        # 150 far in 2 of 3, the baseline 100 near in all: 1.50x slower.
        for rep, (t8, t1m) in enumerate(((0.5, 150.0), (0.25, 60.0), (0.5, 150.0)), 1):
            write_run(os.path.join(d, f"tutti.r{rep}.json"), {8: t8, 1 << 20: t1m})
            write_run(os.path.join(d, f"base.r{rep}.json"), {8: 0.3, 1 << 20: 100.0},
                      backend="openmpi sm", tool="mpi_allreduce")
        # Four pairs of 8 B (the small set), each pair's two runs in one state: ratios 0.9, 0.8,
        # 1.1, 0.5; median 0.85 (1.18x faster), tutti lower in 3 of 4.
        for rep, (t8, b8) in enumerate(((0.27, 0.3), (0.4, 0.5), (0.33, 0.3), (0.25, 0.5)), 1):
            write_run(os.path.join(d, f"tutti-small.r{rep}.json"), {8: t8})
            write_run(os.path.join(d, f"base-small.r{rep}.json"), {8: b8},
                      backend="openmpi sm", tool="mpi_allreduce")
        # Four pairs of 1 MiB (the middle set; the first far for both): ratios 0.3, 0.6, 0.55,
        # 0.5; median 0.525 (1.90x faster), tutti lower in 4 of 4.
        for rep, (t, b) in enumerate(((150.0, 500.0), (60.0, 100.0), (55.0, 100.0),
                                      (50.0, 100.0)), 1):
            write_run(os.path.join(d, f"tutti-mid.r{rep}.json"), {1 << 20: t})
            write_run(os.path.join(d, f"base-mid.r{rep}.json"), {1 << 20: b},
                      backend="openmpi sm", tool="mpi_allreduce")
        out = self.run_verdict(d)
        # 8 B by the pairs (0.85), 1 MiB by the pairs (0.525): median ratio 0.6875, 1.45x faster.
        self.assertIn("verdict: tutti shm (2 ranks, 3 interleaved runs) vs "
                      "openmpi sm: ahead at 2 of 2 sizes, 1.45x faster at the median size; "
                      "closest at 8 B (1.18x faster), 1 MiB (1.90x faster)", out)
        self.assertIn("8 B-1 MiB judged by 4 rapid pairs per size (at each size the median of "
                      "tutti's time over openmpi sm's in the run beside it; tutti lower in 3-4 of "
                      "the 4); by the sweeps' medians alone: ahead at 0 of 2 sizes, 1.58x slower "
                      "at the median size; behind at 8 B (1.67x slower), 1 MiB (1.50x slower)",
                      out)
        # A busy pair is left out of the quiet verdict: without small pair 4, 8 B's ratios 0.9,
        # 0.8, 1.1: median 0.9 (1.11x faster); 1 MiB's four stay (0.525): median ratio 0.7125,
        # 1.40x faster.
        write_state(os.path.join(d, "base-small.r4.state.json"), others=0.5)
        out = self.run_verdict(d)
        self.assertIn("machine BUSY in 1 of 1 runs", out)
        self.assertIn("on the 3 quiet runs (and the quiet pairs of 8 B-1 MiB, 3-4 per size) "
                      "alone: ahead at 2 of 2 sizes, 1.40x faster at the median size; closest at "
                      "8 B (1.11x faster), 1 MiB (1.90x faster)", out)
        # Every middle pair busy too: the quiet verdict takes 1 MiB from the quiet sweeps (150
        # over 100, 1.50x slower) and says which sizes its pairs covered.
        for rep in range(1, 5):
            write_state(os.path.join(d, f"base-mid.r{rep}.state.json"), others=0.5)
        out = self.run_verdict(d)
        self.assertIn("on the 3 quiet runs (and the quiet pairs of 8 B, 3 per size) alone: ahead "
                      "at 1 of 2 sizes", out)
        self.assertIn("behind at 1 MiB (1.50x slower)", out)
        for rep in range(1, 5):
            os.remove(os.path.join(d, f"base-mid.r{rep}.state.json"))
        # A pair whose baseline run failed (its JSON removed) is no pair: 8 B has 3 left, as
        # quiet, tutti lower in 2 of them (67%); 1 MiB 4 of 4 (100%).
        os.remove(os.path.join(d, "base-small.r4.json"))
        os.remove(os.path.join(d, "base-small.r4.state.json"))
        out = self.run_verdict(d)
        self.assertIn("8 B-1 MiB judged by 3-4 rapid pairs per size", out)
        self.assertIn("tutti lower in 67-100% of them", out)
        self.assertNotIn("quiet", out.replace("machine quiet", ""))

    def test_the_plot_takes_the_paired_sizes_ratios_from_the_pairs(self):
        d = tempfile.mkdtemp()
        # tutti over base per pair at 8 B: 0.9, 1.2, 1.1 (median 1.1); at 16 B 0.5 in each; at
        # 1 MiB (the middle set, two pairs) 0.25 and 0.75: median 0.5.
        for rep, (t8, b8) in enumerate(((0.9, 1.0), (1.2, 1.0), (1.1, 1.0)), 1):
            write_run(os.path.join(d, f"tutti-small.r{rep}.json"), {8: t8, 16: 1.0})
            write_run(os.path.join(d, f"base-small.r{rep}.json"), {8: b8, 16: 2.0})
        for rep, t in enumerate((25.0, 75.0), 1):
            write_run(os.path.join(d, f"tutti-mid.r{rep}.json"), {1 << 20: t})
            write_run(os.path.join(d, f"base-mid.r{rep}.json"), {1 << 20: 100.0})
        ratios = plot.pair_ratios(d, ["tutti", "sym", "base"])
        self.assertNotIn(1, ratios)  # no sym-small runs
        self.assertAlmostEqual(ratios[2][8], 1.1)
        self.assertAlmostEqual(ratios[2][16], 0.5)
        self.assertAlmostEqual(ratios[2][1 << 20], 0.5)
        self.assertEqual(plot.pair_ratios(d, []), {})

    def test_the_memory_floor(self):
        d = tempfile.mkdtemp()
        write_run(os.path.join(d, "tutti.r1.json"), {16 << 20: 2000.0, 64 << 20: 10000.0})
        membw = os.path.join(d, "membw.json")
        with open(membw, "w") as f:
            json.dump({"rows": [
                {"size_bytes": 16 << 20, "cores": 1, "update_all_gbps": 30.0},
                {"size_bytes": 16 << 20, "cores": 2, "update_all_gbps": 50.0},
                {"size_bytes": 64 << 20, "cores": 2, "update_all_gbps": 26.8435456}]}, f)
        out = self.run_verdict(d, "--membw", membw)
        # 2 x 2 ranks x 16 MiB = 67.108864 MB at 50 GB/s: 1342 us, 67% of 2000 us. At 64 MiB:
        # 268.435456 MB at 26.8435456 GB/s: 10000 us, 100%.
        self.assertIn("16 MiB in 2000 us, 67% of the memory's bound (1342 us", out)
        self.assertIn("64 MiB in 10000 us, 100% of the memory's bound (10000 us", out)

    def test_a_probe_slower_than_the_op_is_no_bound(self):
        d = tempfile.mkdtemp()
        write_run(os.path.join(d, "tutti.r1.json"), {64 << 20: 5000.0})
        membw = os.path.join(d, "membw.json")
        with open(membw, "w") as f:
            json.dump({"rows": [
                {"size_bytes": 64 << 20, "cores": 2, "update_all_gbps": 26.8435456}]}, f)
        out = self.run_verdict(d, "--membw", membw)
        # The bound, 10000 us, is twice the op's 5000 us: no "200% of the memory's bound".
        self.assertIn("64 MiB in 5000 us, faster than the memory probe's rate allows (10000 us: "
                      "2 x 2 x 64 MiB at 26.8 GB/s, 2 cores; the probe is no ceiling", out)
        self.assertNotIn("200%", out)

    def test_how_much(self):
        self.assertEqual(verdict.how_much(0.5), "2.00x faster")
        self.assertEqual(verdict.how_much(1.25), "1.25x slower")
        self.assertEqual(verdict.how_much(1.002), "even")
        self.assertEqual(verdict.how_much(0.002), "500x faster")


if __name__ == "__main__":
    unittest.main()
