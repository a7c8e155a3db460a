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


def write_run(path, times, backend="shm", tool="tutti-bench", world=2):
    rows = [{"size_bytes": s, "time_us": t, "in_place": True} for s, t in times.items()]
    with open(path, "w") as f:
        json.dump({"config": {"tool": tool, "backend": backend, "world_size": world},
                   "rows": rows}, f)


def write_state(path, others=0.0, steal=0.0):
    with open(path, "w") as f:
        json.dump({"wall_s": 1.0, "cpus": 2, "self_cpu_s": 2.0, "others": others,
                   "steal": steal, "load1_before": 0.1}, f)


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


class Machine(unittest.TestCase):
    def test_a_busy_command_counts_as_itself_not_as_others(self):
        d = tempfile.mkdtemp()
        state_path = os.path.join(d, "s.json")
        spin = "import time\nt=time.time()\nwhile time.time()-t<0.6: pass"
        rc = machine.main(["machine.py", "run", "--state", state_path, "--",
                           sys.executable, "-c", spin])
        self.assertEqual(rc, 0)
        with open(state_path) as f:
            state = json.load(f)
        self.assertGreater(state["self_cpu_s"], 0.4)
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


if __name__ == "__main__":
    unittest.main()
