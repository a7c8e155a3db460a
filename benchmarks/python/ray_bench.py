#!/usr/bin/env python3
"""tutti from Python and inside Ray, measured against what Ray users have today.

    build/venv/bin/python benchmarks/python/ray_bench.py [--actors 2 4] [--out results/python]

Three parts, each on a local Ray cluster (one node) unless said otherwise:

1. allreduce, float32 sum, 8 B to 64 MiB, between N actors, by
   - ray.util.collective with backend="tutti" (tutti.ray: shm between actors on one node),
   - ray.util.collective with backend="gloo" (Ray's own: torch.distributed's Gloo),
   - torch.distributed's gloo called directly in the same kind of actors (no Ray layer).
   Each actor times every iteration on its own clock (time.perf_counter_ns around the call);
   an iteration counts at its slowest actor's time; the table gives the median over the
   timed iterations (warm-up iterations first, not counted).
2. Python's per-call cost over C++'s, at 8 B, world size 1 (no communication: what the bindings
   add): tutti.CollectiveGroup.allreduce, tutti.allreduce by group name, and
   ray.util.collective.allreduce on a TUTTI group, each minus the C++ call measured by
   build/bin/tutti-overhead-bench (Google Benchmark) in the same run.
3. Moving a CPU torch tensor, 1 KiB to 256 MiB, from one actor to another: a task on the
   producer returns it (with @ray.method(tensor_transport="tutti"), plainly through Ray's
   object store, or with Ray's own tensor_transport="gloo" over a torch_gloo group), a task
   on the consumer receives it and touches its last element; the time is the driver's, from
   submitting both tasks to the consumer's answer (median over reps). Each call Ray makes into
   tutti's and gloo's transports is timed inside the actors (Mover.instrument), so that the
   table also says how much of a transfer is the transport's and how much is Ray's.

Writes JSON (raw per-iteration times and medians) and a Markdown table into --out.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

os.environ.setdefault("TUTTI_GLOO_HOSTNAME", "127.0.0.1")

import ray  # noqa: E402
import torch  # noqa: E402

import tutti  # noqa: E402
import tutti.ray  # noqa: E402

tutti.ray.register()


def sizes(lo, hi):
    s = lo
    while s <= hi:
        yield s
        s *= 2


def iters_for(nbytes):
    """Timed iterations per size: enough for a stable median, bounded for large messages."""
    if nbytes <= 64 << 10:
        return 5, 100
    if nbytes <= 4 << 20:
        return 3, 30
    return 2, 10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@ray.remote
class Ranker:
    """One rank: joins a group of one kind, then times allreduce per size."""

    def setup(self, kind, world, rank, name, url=None):
        import torch.distributed as dist
        import ray.util.collective as col

        self.kind, self.name = kind, name
        if kind == "torch-gloo":
            dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world)
            self.call = lambda t: dist.all_reduce(t)
        else:
            col.init_collective_group(world, rank, backend=kind, group_name=name)
            self.call = lambda t: col.allreduce(t, name)
        t = torch.ones(2)
        self.call(t)  # the group formed and every rank in step
        return float(t[0])

    def sweep(self, size_list):
        out = {}
        for nbytes in size_list:
            warm, reps = iters_for(nbytes)
            t = torch.ones(nbytes // 4, dtype=torch.float32)
            for _ in range(warm):
                self.call(t)
            times = []
            for _ in range(reps):
                start = time.perf_counter_ns()
                self.call(t)
                times.append(time.perf_counter_ns() - start)
            t.fill_(1.0)
            self.call(t)
            world = float(t[0])
            out[nbytes] = (times, world)
        return out

    def per_call(self, reps):
        """Python's own cost: world size 1, every path, 8 bytes."""
        import ray.util.collective as col

        res = {}
        x = np.ones(2, dtype=np.float32)
        g = tutti.CollectiveGroup.create(1, 0, "shm", "solo-direct")
        tutti.init_collective_group(1, 0, "shm", "solo-named")
        col.init_collective_group(1, 0, backend="tutti", group_name="solo-ray")
        from ray.util.collective.types import AllReduceOptions

        handle = col.get_group_handle("solo-ray")  # the TuttiGroup, without Ray's wrapper
        options = AllReduceOptions()
        paths = {
            "CollectiveGroup.allreduce": lambda: g.allreduce(x),
            "tutti.allreduce(x, name)": lambda: tutti.allreduce(x, "solo-named"),
            "TuttiGroup.allreduce (tutti.ray's BaseGroup)": lambda: handle.allreduce([x],
                                                                                    options),
            "ray.util.collective.allreduce (TUTTI)": lambda: col.allreduce(x, "solo-ray"),
        }
        for label, fn in paths.items():
            for _ in range(1000):
                fn()
            samples = []
            for _ in range(reps):  # batches of 1000 calls: the timer's own cost amortised
                start = time.perf_counter_ns()
                for _ in range(1000):
                    fn()
                samples.append((time.perf_counter_ns() - start) / 1000)
            res[label] = statistics.median(samples)
        col.destroy_collective_group("solo-ray")
        tutti.destroy_collective_group("solo-named")
        g.destroy()
        return res

    def done(self):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


@ray.remote(enable_tensor_transport=True)
class Mover:
    def make(self, nbytes):
        from tutti import transfer

        self.t = torch.ones(nbytes // 4, dtype=torch.float32)
        # The same values in shareable memory: tutti's allocator, and torch's share_memory_().
        self.shared = transfer.empty(nbytes // 4, torch.float32)
        self.shared.fill_(1.0)
        self.torch_shared = torch.ones(nbytes // 4, dtype=torch.float32).share_memory_()

    def make_many(self, count, nbytes):
        from tutti import transfer

        # Views of one shareable block: the consumer maps it once.
        n = nbytes // 4
        self.block = transfer.empty(count * n, torch.float32).fill_(1.0)
        self.many = [self.block[i * n:(i + 1) * n] for i in range(count)]
        # The same as separate ordinary tensors: the object store pickles a view with its whole
        # storage (1000 views of one 200 MB block would be 200 GB), so it gets these.
        self.many_plain = [torch.ones(n, dtype=torch.float32) for _ in range(count)]

    @ray.method(tensor_transport="tutti")
    def give_tutti(self):
        return self.t

    @ray.method(tensor_transport="tutti")
    def give_tutti_shared(self):
        return self.shared

    @ray.method(tensor_transport="tutti")
    def give_tutti_torch_shared(self):
        return self.torch_shared

    @ray.method(tensor_transport="tutti")
    def give_many(self):
        return self.many

    @ray.method(tensor_transport="tutti")
    def give_many_separate(self):
        return self.many_plain

    def give_many_plain(self):
        return self.many_plain

    def take_many(self, ts):
        return float(sum(t[-1] for t in ts)) / len(ts)

    def give_plain(self):
        return self.t

    @ray.method(tensor_transport="gloo")
    def give_gloo(self):
        return self.t

    def take(self, t):
        return float(t[-1])

    # The transports' own time: each call Ray makes into a tensor transport in this process
    # (the producer's extract and send, the consumer's fetch, wait and recv), timed where Ray
    # calls it; a transport's calls into itself count once. What a transfer spends outside them
    # is Ray's (its tasks, metadata, scheduling). A transfer's first call (extract at the
    # producer, fetch or recv at the consumer) opens its entry; the others add to it.
    TIMED = ("extract_tensor_transport_metadata", "send_multiple_tensors",
             "fetch_multiple_tensors", "wait_fetch_complete", "recv_multiple_tensors")
    OPENS = ("extract_tensor_transport_metadata", "fetch_multiple_tensors",
             "recv_multiple_tensors")

    def instrument(self, transports):
        import threading

        from ray.experimental.rdt.util import get_tensor_transport_manager

        if not hasattr(self, "spent"):
            self.depth = threading.local()
        self.spent = {}  # from now on
        for name in transports:
            manager = get_tensor_transport_manager(name)
            if getattr(manager, "_bench_timed", False):
                continue
            for method in self.TIMED:
                inner = getattr(manager, method)

                def timed(*args, _inner=inner, _name=name, _method=method, **kwargs):
                    depth = getattr(self.depth, "n", 0)
                    self.depth.n = depth + 1
                    start = time.perf_counter_ns()
                    try:
                        return _inner(*args, **kwargs)
                    finally:
                        took = time.perf_counter_ns() - start
                        self.depth.n = depth
                        if depth == 0:
                            entries = self.spent.setdefault(_name, [])
                            if _method in self.OPENS or not entries:
                                entries.append({})
                            entries[-1][_method] = entries[-1].get(_method, 0) + took

                setattr(manager, method, timed)
            manager._bench_timed = True

    def take_spent(self, name):
        """Transport `name`'s calls per transfer in this process since the last take: for each
        transfer, ns per method."""
        return self.spent.pop(name, [])

    def rss_mib(self):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
        return -1


def allreduce_part(world, kinds, size_list):
    rows = {}
    for kind in kinds:
        actors = [Ranker.remote() for _ in range(world)]
        name = f"bench-{kind}-{world}"
        url = f"tcp://127.0.0.1:{free_port()}"
        assert ray.get([a.setup.remote(kind, world, r, name, url)
                        for r, a in enumerate(actors)]) == [float(world)] * world
        results = ray.get([a.sweep.remote(size_list) for a in actors])
        for nbytes in size_list:
            per_rank = [results[r][nbytes][0] for r in range(world)]
            worlds = {results[r][nbytes][1] for r in range(world)}
            assert worlds == {float(world)}, (kind, nbytes, worlds)  # the sum was right
            slowest = [max(it) for it in zip(*per_rank)]
            rows.setdefault(nbytes, {})[kind] = {
                "median_us": statistics.median(slowest) / 1000,
                "iters_ns": slowest,
            }
        ray.get([a.done.remote() for a in actors])
        for a in actors:
            ray.kill(a)
        print(f"allreduce {kind} x{world}: done", file=sys.stderr)
    return rows


def overhead_part():
    actor = Ranker.remote()
    py = ray.get(actor.per_call.remote(21))
    ray.kill(actor)
    bench = os.path.join(ROOT, "build", "bin", "tutti-overhead-bench")
    cpp = None
    if os.access(bench, os.X_OK):
        done = subprocess.run([bench, "--benchmark_filter=Allreduce8B", "--benchmark_format=json",
                               "--benchmark_repetitions=5"],
                              capture_output=True, text=True, timeout=300)
        data = json.loads(done.stdout)
        medians = {b["run_name"]: b["real_time"] for b in data["benchmarks"]
                   if b.get("aggregate_name") == "median"}
        cpp = {"benchmarks": medians}
    return {"python_ns": py, "cpp": cpp}


def transfer_part(size_list, reps):
    from ray.experimental.collective import create_collective_group

    producer, consumer = Mover.remote(), Mover.remote()
    # Ray's own CPU transport needs a torch.distributed Gloo group between the two.
    create_collective_group([producer, consumer], backend="torch_gloo")
    rows = {}
    for nbytes in size_list:
        ray.get(producer.make.remote(nbytes))
        row = {}
        for label, method, transport in (
                ("tutti", producer.give_tutti, "TUTTI"),
                ("tutti, tutti.transfer.empty", producer.give_tutti_shared, "TUTTI"),
                ("tutti, share_memory_()", producer.give_tutti_torch_shared, "TUTTI"),
                ("object store", producer.give_plain, None),
                ("gloo", producer.give_gloo, "GLOO")):
            samples = []
            for i in range(reps + 2):
                if i == 2 and transport:  # two warm-up transfers, then the transport is timed
                    ray.get([a.instrument.remote([transport]) for a in (producer, consumer)])
                start = time.perf_counter_ns()
                got = ray.get(consumer.take.remote(method.remote()))
                elapsed = time.perf_counter_ns() - start
                assert got == 1.0
                if i >= 2:
                    samples.append(elapsed)
            row[label] = {"median_us": statistics.median(samples) / 1000, "ns": samples}
            if transport:
                # Inside the transport, per transfer: the producer's extract (before Ray can
                # hand the metadata on), its send (two-sided: beside the consumer's receive)
                # and the consumer's calls (fetch and wait, or recv).
                made, took = ray.get([a.take_spent.remote(transport)
                                      for a in (producer, consumer)])
                assert len(made) == reps and len(took) == reps, (label, len(made), len(took))
                extract = "extract_tensor_transport_metadata"
                row[label]["extract_us"] = statistics.median(e.get(extract, 0) for e in made) / 1e3
                row[label]["send_us"] = statistics.median(
                    sum(v for k, v in e.items() if k != extract) for e in made) / 1000
                row[label]["consumer_us"] = statistics.median(sum(e.values()) for e in took) / 1000
        rows[nbytes] = row
        rss = ray.get([producer.rss_mib.remote(), consumer.rss_mib.remote()])
        print(f"transfer {nbytes} B: " + ", ".join(f"{k} {v['median_us']:.0f} us"
                                                    for k, v in row.items()) +
              f" (resident: producer {rss[0]} MiB, consumer {rss[1]} MiB)", file=sys.stderr)
    # 1000 tensors of 200 KB in one object (shareable memory), and through the object store.
    ray.get(producer.make_many.remote(1000, 200_000))
    many = {}
    for label, method in (("tutti, views of one tutti.transfer.empty block", producer.give_many),
                          ("tutti, separate tensors", producer.give_many_separate),
                          ("object store, separate tensors", producer.give_many_plain)):
        samples = []
        for i in range(reps + 1):
            start = time.perf_counter_ns()
            assert ray.get(consumer.take_many.remote(method.remote())) == 1.0
            if i >= 1:
                samples.append(time.perf_counter_ns() - start)
        many[label] = statistics.median(samples) / 1000
    rows["1000 x 200 KB"] = many
    print(f"transfer 1000 x 200 KB: " + ", ".join(f"{k} {v:.0f} us" for k, v in many.items()),
          file=sys.stderr)
    ray.kill(producer)
    ray.kill(consumer)
    return rows


def human(nbytes):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def overhead_lines(o):
    lines = []
    lines += ["### Python's per-call cost, 8 B allreduce, world size 1 (median ns per call)", "",
              "| path | ns | over C++ |", "|---|---:|---:|"]
    cpp = None
    if o["cpp"]:
        # The C++ call the Python paths make: an 8-byte allreduce on a shm group of one.
        cpp = o["cpp"]["benchmarks"].get("BM_Allreduce8B/shm")
        for k, v in o["cpp"]["benchmarks"].items():
            lines.append(f"| C++ {k} (tutti-overhead-bench) | {v:.0f} | |")
    for k, v in o["python_ns"].items():
        over = f"{v - cpp:.0f}" if cpp is not None else "n/a"
        lines.append(f"| {k} | {v:.0f} | {over} |")
    lines.append("")
    return lines


def inside_lines(transfer):
    """Where a transfer's time goes: the transport's own calls against Ray's part."""
    kinds = (("tutti", "tutti"), ("tutti, tutti.transfer.empty", "empty"), ("gloo", "gloo"))
    lines = ["", "Where the time goes (median us per transfer): `extract` is the producer's call "
             "into the transport (Ray hands the metadata on after it), `consumer` the consumer's "
             "calls (tutti: fetch and wait; gloo: its receive, beside the producer's send, "
             "`send`); `Ray` is the end-to-end median less both, the part of the transfer spent "
             "outside the transport.", "",
             "| size | " + " | ".join(f"{short}: extract | consumer | Ray" for _, short in kinds) +
             " | gloo: send | object store |",
             "|---:|" + "---:|" * (3 * len(kinds) + 2)]
    for nbytes, r in transfer.items():
        if not str(nbytes).isdigit() or "extract_us" not in r.get("tutti", {}):
            continue
        cells = []
        for key, _ in kinds:
            k = r[key]
            rest = k["median_us"] - k["extract_us"] - k["consumer_us"]
            cells += [f"{k['extract_us']:.0f}", f"{k['consumer_us']:.0f}", f"{rest:.0f}"]
        cells += [f"{r['gloo']['send_us']:.0f}", f"{r['object store']['median_us']:.0f}"]
        lines.append(f"| {human(int(nbytes))} | " + " | ".join(cells) + " |")
    return lines


def markdown(report):
    lines = []
    for world, rows in report["allreduce"].items():
        kinds = list(next(iter(rows.values())).keys())
        lines += [f"### allreduce, {world} actors (median us per call; float32 sum)", "",
                  "| size | " + " | ".join(kinds) + " | gloo / tutti | torch-gloo / tutti |",
                  "|---:|" + "---:|" * (len(kinds) + 2)]
        for nbytes, r in rows.items():
            t = r["tutti"]["median_us"]
            cells = [f"{r[k]['median_us']:.1f}" for k in kinds]
            lines.append(f"| {human(int(nbytes))} | " + " | ".join(cells) +
                         f" | {r['gloo']['median_us'] / t:.0f}x | "
                         f"{r['torch-gloo']['median_us'] / t:.0f}x |")
        lines.append("")
    if report.get("overhead") is not None:
        lines += overhead_lines(report["overhead"])
    if "transfer" not in report:
        return "\n".join(lines) + "\n"
    lines += ["### A CPU torch tensor from one actor to another (median us, end to end)", "",
              "`tutti` is an ordinary tensor (one copy); `empty` one from tutti.transfer.empty "
              "and `shared` one after share_memory_() (both zero-copy).", "",
              "| size | RDT tutti | tutti, empty | tutti, shared | object store | RDT gloo | "
              "store / tutti | gloo / tutti | store / empty | gloo / empty |",
              "|---:|" + "---:|" * 9]
    many = None
    for nbytes, r in report["transfer"].items():
        if not str(nbytes).isdigit():
            many = r
            continue
        a, e, sh, b, c = (r[k]["median_us"] for k in (
            "tutti", "tutti, tutti.transfer.empty", "tutti, share_memory_()", "object store",
            "gloo"))
        lines.append(f"| {human(int(nbytes))} | {a:.0f} | {e:.0f} | {sh:.0f} | {b:.0f} | "
                     f"{c:.0f} | {b / a:.1f}x | {c / a:.1f}x | {b / e:.1f}x | {c / e:.1f}x |")
    lines += inside_lines(report["transfer"])
    if many:
        lines += ["", "1000 tensors of 200 KB in one object, end to end (median us; per tensor):", ""]
        lines += [f"- {label}: {us:.0f} us ({us / 1000:.1f} us per tensor)"
                  for label, us in many.items()]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--actors", type=int, nargs="+", default=[2])
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--transfer-max-bytes", type=int, default=256 << 20)
    ap.add_argument("--transfer-reps", type=int, default=7)
    ap.add_argument("--parts", nargs="+", default=["allreduce", "overhead", "transfer"],
                    choices=["allreduce", "overhead", "transfer"])
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "python"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": "tutti.ray.register",
                          "env_vars": {"TUTTI_GLOO_HOSTNAME": "127.0.0.1"}})
    started = time.monotonic()
    report = {"host": {"cpus": os.cpu_count(), "ray": ray.__version__,
                       "torch": torch.__version__, "tutti": tutti.__version__},
              "allreduce": {}}
    size_list = list(sizes(8, args.max_bytes))
    if "allreduce" in args.parts:
        for world in args.actors:
            report["allreduce"][world] = allreduce_part(world, ["tutti", "gloo", "torch-gloo"],
                                                        size_list)
    if "overhead" in args.parts:
        report["overhead"] = overhead_part()
    if "transfer" in args.parts:
        report["transfer"] = transfer_part(list(sizes(1 << 10, args.transfer_max_bytes)),
                                           args.transfer_reps)
    ray.shutdown()
    report["wall_s"] = time.monotonic() - started

    with open(os.path.join(args.out, "ray_bench.json"), "w") as f:
        json.dump(report, f)
    table = markdown(report)
    with open(os.path.join(args.out, "ray_bench.md"), "w") as f:
        f.write(table)
    print(table)
    print(f"wall {report['wall_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
