"""Shared helpers: ranks as threads of this process (ops release the GIL, so they run side by
side), ranks as processes (multiprocessing, spawn), numpy references, unique group names."""

import multiprocessing as mp
import os
import queue
import random
import socket
import threading
import traceback
import uuid

import numpy as np
import pytest

# Gloo binds and connects on loopback only, whatever this host's name resolves to.
os.environ.setdefault("TUTTI_GLOO_HOSTNAME", "127.0.0.1")

import tutti  # noqa: E402

# Bounds every wait of these helpers: a hang fails the test instead of the run.
JOIN_TIMEOUT_S = 60

# Every dtype tutti takes, as numpy names (bfloat16 goes through torch, see test_collectives).
NUMPY_DTYPES = ["bool", "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16",
                "float32", "float64"]
REDUCE_OPS = ["sum", "product", "min", "max", "avg"]


def unique(prefix: str = "g") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def free_port() -> int:
    """A loopback port below the kernel's ephemeral range: a port from binding port 0 may be
    handed to another test's listener or client socket before the test binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    if low > 11000:
        for _ in range(200):
            port = random.SystemRandom().randrange(10000, low)
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_threads(n: int, fn):
    """Runs fn(i) for i in range(n), each on a thread of its own; returns their results in order
    and re-raises the first one's exception."""
    results = [None] * n
    errors = [None] * n

    def main(i):
        try:
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 (handed to the test thread)
            errors[i] = e

    threads = [threading.Thread(target=main, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
        assert not t.is_alive(), "a thread did not finish"
    for e in errors:
        if e is not None:
            raise e
    return results


def run_threads(world_size: int, fn, backend: str = "shm", timeout: float = 20.0):
    """Runs fn(group) on world_size ranks that are threads sharing a HashStore; returns their
    results in rank order and re-raises the first rank's exception."""
    store = tutti.HashStore()
    name = unique()

    def rank_main(rank):
        group = tutti.CollectiveGroup.create(world_size, rank, backend, name, store=store,
                                             timeout=timeout)
        try:
            return fn(group)
        finally:
            group.destroy()

    return on_threads(world_size, rank_main)


def _process_main(target, rank, world_size, args, results):
    try:
        results.put((rank, "ok", target(rank, world_size, *args)))
    except BaseException as e:  # noqa: BLE001
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_processes(world_size: int, target, *args, timeout: float = JOIN_TIMEOUT_S):
    """Runs target(rank, world_size, *args) in world_size spawned processes; returns their
    results in rank order. target must be a module-level function of a test module."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_process_main, args=(target, r, world_size, args, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(world_size):
            rank, status, value = results.get(timeout=timeout)
            if status != "ok":
                raise AssertionError(f"rank {rank} failed: {value}")
            out[rank] = value
    except queue.Empty:
        raise AssertionError(f"ranks {sorted(set(range(world_size)) - set(out))} did not "
                             f"answer within {timeout} s")
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
    return [out[r] for r in range(world_size)]


def rank_input(rank: int, dtype: str, n: int = 6, salt: int = 0) -> np.ndarray:
    """A deterministic input per rank: small values (products and sums of 4 ranks stay exact
    in every dtype), never the same on two ranks."""
    if dtype == "bool":
        return ((np.arange(n) + rank + salt) % 3 == 0)
    values = (np.arange(n) * 7 + rank * 3 + salt) % 3 + 1  # 1..3
    return values.astype(dtype)


def reference(inputs, op: str, dtype: str) -> np.ndarray:
    """The reduction of the ranks' inputs, computed with numpy alone."""
    stack = np.stack(inputs)
    if dtype == "bool":
        if op in ("sum", "max"):
            return np.logical_or.reduce(stack, axis=0)
        return np.logical_and.reduce(stack, axis=0)
    wide = stack.astype(np.float64)
    if op == "sum":
        out = wide.sum(axis=0)
    elif op == "product":
        out = wide.prod(axis=0)
    elif op == "min":
        out = wide.min(axis=0)
    elif op == "max":
        out = wide.max(axis=0)
    else:
        out = wide.mean(axis=0)
    return out.astype(dtype)


@pytest.fixture
def group_name():
    return unique()


def mapped_from(tensor):
    """The /proc/self/maps name of the mapping that holds the tensor's first byte."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, *rest = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return rest[4].strip() if len(rest) > 4 else ""
    return None
