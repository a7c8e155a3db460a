#!/usr/bin/env python3
"""How quiet the machine was around a benchmark run: the CPU time other processes took while it
ran, the hypervisor's steal time, and the load average.

    python3 benchmarks/machine.py run --state STATE.json [--exchange MEMBW] -- COMMAND [ARGS...]
        runs COMMAND (its exit status is this program's) and writes STATE.json:
        {"wall_s", "cpus", "self_cpu_s", "others": fraction of all CPUs that processes other
        than COMMAND's used, "steal": fraction stolen by the hypervisor, "load1_before"}; with
        --exchange (the path of tutti-membw) also "exchange_ns": how long CPUs 0 and 1 took to
        exchange a cache line just before and just after COMMAND (two figures), the floor of a
        2-rank allreduce's smallest sizes, which on these VMs moves between ~50 and ~250 ns
    python3 benchmarks/machine.py probe SECONDS
        the same figures for SECONDS of doing nothing (what the machine does without us)

A run "beside load" is one where others exceed 10% of the CPUs (and 0.05 CPU-seconds: a start-up
flicker in a short run is not load) or steal exceeds 2%; the comparison scripts print which runs
were, and the verdict they would give without them.
"""
import json
import os
import resource
import subprocess
import sys
import time

BUSY_OTHERS = 0.10
BUSY_OTHERS_CPU_S = 0.05
BUSY_STEAL = 0.02


def cpu_times():
    """(busy, steal, total) jiffies summed over all CPUs."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + idle + iowait + steal


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(action):
    """Runs action(); returns (its result, the state dict)."""
    hz = os.sysconf("SC_CLK_TCK")
    cpus = os.cpu_count() or 1
    l1 = load1()
    c0 = children_cpu_s()
    b0, s0, t0 = cpu_times()
    w0 = time.monotonic()
    result = action()
    wall = time.monotonic() - w0
    b1, s1, t1 = cpu_times()
    mine = children_cpu_s() - c0
    total_s = max((t1 - t0) / hz, 1e-9)
    busy_s = (b1 - b0) / hz
    state = {
        "wall_s": round(wall, 3),
        "cpus": cpus,
        "self_cpu_s": round(mine, 3),
        "others": round(max(0.0, busy_s - mine) / total_s, 4),
        "others_cpu_s": round(max(0.0, busy_s - mine), 3),
        "steal": round((s1 - s0) / hz / total_s, 4),
        "load1_before": l1,
    }
    return result, state


def exchange_ns(membw):
    """tutti-membw's cache-line exchange between CPUs 0 and 1, in ns; None where it cannot say."""
    try:
        out = subprocess.run([membw, "--exchange-only", "-n", "3"], capture_output=True,
                             text=True, timeout=60, check=True).stdout
        value = float(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return value if value > 0 else None


def is_busy(state):
    others = state.get("others", 0) > BUSY_OTHERS and \
        state.get("others_cpu_s", BUSY_OTHERS_CPU_S) >= BUSY_OTHERS_CPU_S
    return others or state.get("steal", 0) > BUSY_STEAL


def describe(states):
    """One phrase for a list of states: 'quiet' or what was busy, with the worst figures."""
    if not states:
        return "machine state not recorded"
    others = max(s.get("others", 0) for s in states)
    steal = max(s.get("steal", 0) for s in states)
    busy = sum(1 for s in states if is_busy(s))
    text = (f"other processes used up to {others:.0%} of the CPUs, steal up to {steal:.1%}, "
            f"load average before up to {max(s.get('load1_before', 0) for s in states):.2f}")
    exchanges = [x for s in states for x in s.get("exchange_ns", []) if x]
    if exchanges:
        text += (f"; a cache line between CPUs 0 and 1 in {min(exchanges):.0f}"
                 + (f"-{max(exchanges):.0f}" if round(max(exchanges)) != round(min(exchanges))
                    else "") + " ns")
    if busy == 0:
        return "machine quiet (" + text + ")"
    return f"machine BUSY in {busy} of {len(states)} runs (" + text + ")"


def main(argv):
    if len(argv) >= 2 and argv[1] == "probe":
        seconds = float(argv[2]) if len(argv) > 2 else 1.0
        _, state = measure(lambda: time.sleep(seconds))
        print(json.dumps(state))
        return 0
    if len(argv) >= 4 and argv[1] == "run" and argv[2] == "--state":
        path = argv[3]
        cmd = argv[4:]
        membw = None
        if len(cmd) >= 2 and cmd[0] == "--exchange":
            membw, cmd = cmd[1], cmd[2:]
        if cmd and cmd[0] == "--":
            cmd = cmd[1:]
        if not cmd:
            sys.exit(__doc__)
        before = exchange_ns(membw) if membw else None
        rc, state = measure(lambda: subprocess.call(cmd))
        if membw:
            state["exchange_ns"] = [before, exchange_ns(membw)]
        with open(path, "w") as f:
            json.dump(state, f)
        return rc
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
