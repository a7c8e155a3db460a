#!/usr/bin/env python3
"""The allreduce sweep through PyTorch's torch.distributed (gloo), printing tutti-bench's
columns and writing the same JSON (benchmarks/compare/run.sh compares them side by side).

    python3 torch_allreduce.py --ranks 2 -b 8 -e 64M -f 2 -w 10 -n 50 --json torch.json

float32 sum, in place; every rank times every iteration and the slowest rank's time per
iteration is combined after the loop, as tutti-bench does.
"""
import argparse
import json
import math
import os
import time


def parse_size(text):
    mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    if text[-1].upper() in mult:
        return int(float(text[:-1]) * mult[text[-1].upper()])
    return int(text)


def quantile(values, q):
    """The q-quantile by nearest rank, as tutti-bench computes it."""
    values = sorted(values)
    k = max(1, math.ceil(q * len(values)))
    return values[min(len(values), k) - 1]


def worker(rank, args, port):
    import torch
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    world = args.ranks
    buf = torch.zeros(args.e // 4 + 1, dtype=torch.float32)
    rows = []
    size = args.b
    while True:
        nbytes = min(int(round(size)), args.e)
        count = max(1, nbytes // 4)
        view = buf[:count]
        for _ in range(args.w):
            dist.all_reduce(view)
        times = torch.zeros(args.n, dtype=torch.float64)
        for i in range(args.n):
            t0 = time.perf_counter()
            dist.all_reduce(view)
            times[i] = (time.perf_counter() - t0) * 1e6
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        view.fill_(rank + 1)
        dist.all_reduce(view)
        wrong = torch.tensor([int((view != world * (world + 1) / 2).sum())])
        dist.all_reduce(wrong)
        t = quantile(times.tolist(), 0.5)
        p99 = quantile(times.tolist(), 0.99)
        algbw = count * 4 / t / 1e3
        busbw = algbw * 2 * (world - 1) / world
        rows.append({"op": "allreduce", "size_bytes": count * 4, "count": count,
                     "dtype": "float32", "redop": "sum", "root": -1, "in_place": True,
                     "time_us": t, "p99_us": p99, "algbw_gbps": algbw, "busbw_gbps": busbw,
                     "wrong": int(wrong[0])})
        if rank == 0:
            print(f"  {count * 4:10d} {count:12d} {t:9.1f} {p99:9.1f} {algbw:7.3f} {busbw:7.3f} "
                  f"{int(wrong[0]):6d}", flush=True)
        if nbytes >= args.e:
            break
        size *= args.f
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {"tool": "torch_allreduce", "op": "allreduce",
                                  "backend": "torch-gloo", "world_size": world,
                                  "torch": torch.__version__, "dtype": "float32", "redop": "sum",
                                  "warmup": args.w, "iters": args.n,
                                  "bus_factor": 2 * (world - 1) / world},
                       "rows": rows}, f, indent=1)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("-b", type=parse_size, default=8)
    p.add_argument("-e", type=parse_size, default=64 << 20)
    p.add_argument("-f", type=float, default=2)
    p.add_argument("-w", type=int, default=10)
    p.add_argument("-n", type=int, default=50)
    p.add_argument("--json")
    args = p.parse_args()
    import socket
    import torch
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"# PyTorch {torch.__version__} torch.distributed gloo, world size {args.ranks}, "
          "float32 sum, in place", flush=True)
    print(f"# {'size':>10} {'count':>12} {'time':>9} {'p99':>9} {'algbw':>7} {'busbw':>7} "
          f"{'#wrong':>6}", flush=True)
    mp.spawn(worker, args=(args, port), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
