"""Ranks as processes: multiprocessing over a TCP store that rank 0 hosts, tutti-run (the
console script the package installs) with init_collective_group_from_env, and a rank killed in
the middle of an allreduce."""

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tutti
from conftest import NUMPY_DTYPES, free_port, rank_input, reference, run_processes


def matrix_rank(rank, world, url):
    tutti.init_collective_group(world, rank, "auto", "matrix", store=url, timeout=30)
    out = {"backend": tutti.get_group("matrix").backend}
    for dtype in NUMPY_DTYPES:
        for op in ("sum", "product", "min", "max"):
            x = rank_input(rank, dtype, n=1000, salt=len(op))
            tutti.allreduce(x, "matrix", op)
            out[(dtype, op)] = x
    big = np.full(3 << 20, rank + 1, dtype=np.float32)  # 12 MiB: the chunked path
    tutti.allreduce(big, "matrix")
    out["big"] = (float(big.min()), float(big.max()))
    gathered = [np.zeros(5, dtype=np.int64) for _ in range(world)]
    tutti.allgather(gathered, np.arange(5, dtype=np.int64) + rank, "matrix")
    out["allgather"] = gathered
    tutti.barrier("matrix")
    tutti.destroy_collective_group("matrix")
    return out


def test_four_processes_every_dtype_and_op():
    world = 4
    url = f"tcp://127.0.0.1:{free_port()}"
    res = run_processes(world, matrix_rank, url)
    assert {r["backend"] for r in res} == {"shm"}  # "auto" on one host
    for dtype in NUMPY_DTYPES:
        for op in ("sum", "product", "min", "max"):
            want = reference([rank_input(r, dtype, n=1000, salt=len(op)) for r in range(world)],
                             op, dtype)
            for r in range(world):
                np.testing.assert_array_equal(res[r][(dtype, op)], want, err_msg=f"{dtype} {op}")
    for r in range(world):
        assert res[r]["big"] == (10.0, 10.0)
        for k in range(world):
            np.testing.assert_array_equal(res[r]["allgather"][k], np.arange(5) + k)


def test_tutti_run_launches_python_ranks(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, tutti
        tutti.init_collective_group_from_env()
        rank, world = tutti.get_rank(), tutti.get_collective_group_size()
        x = np.full(4, rank + 1, dtype=np.int64)
        tutti.allreduce(x)
        assert (x == world * (world + 1) // 2).all(), x
        print("rank", rank, "of", world, "sum", int(x[0]), "backend", tutti.get_group().backend)
        tutti.destroy_collective_group()
    """))
    launcher = os.path.join(os.path.dirname(sys.executable), "tutti-run")
    assert os.access(launcher, os.X_OK), "the package installs the tutti-run console script"
    env = dict(os.environ, TUTTI_BACKEND="auto")
    done = subprocess.run([launcher, "-n", "3", "--timeout", "60", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=90, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    for r in range(3):
        assert f"[{r}]: rank {r} of 3 sum 6 backend shm" in done.stdout, done.stdout


def victim_rank(url, ready):
    tutti.init_collective_group(2, 1, "shm", "victim", store=url, timeout=30)
    tutti.barrier("victim")
    ready.set()
    time.sleep(120)  # never reaches the allreduce: the test kills it here


def test_a_rank_killed_mid_allreduce_fails_the_other_naming_the_op():
    ctx = mp.get_context("spawn")
    url = f"tcp://127.0.0.1:{free_port()}"
    ready = ctx.Event()
    victim = ctx.Process(target=victim_rank, args=(url, ready), daemon=True)
    victim.start()
    try:
        tutti.init_collective_group(2, 0, "shm", "victim", store=url, timeout=20)
        tutti.barrier("victim")
        assert ready.wait(30)
        x = np.ones(1 << 16, dtype=np.float32)
        work = tutti.allreduce(x, "victim", async_op=True)  # waits for rank 1, in vain
        os.kill(victim.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(tutti.Error) as info:
            work.wait()
        elapsed = time.monotonic() - start
        message = str(info.value)
        assert "allreduce" in message and "rank 1" in message, message
        assert elapsed < 20, f"the error took {elapsed:.1f} s, the op's timeout is 20 s"
        assert not isinstance(info.value, tutti.TimeoutError), message  # noticed, not timed out
        with pytest.raises(tutti.AbortedError):
            tutti.barrier("victim")
    finally:
        tutti.destroy_collective_group("victim")
        victim.join(10)
