"""Every op and dtype through the bindings, ranks as threads (the ops release the GIL: a rank
that held it would stall the others into a timeout), against numpy references."""

import gc
import subprocess
import sys
import textwrap
import threading
import weakref

import numpy as np
import pytest
import torch

import tutti
from conftest import (JOIN_TIMEOUT_S, NUMPY_DTYPES, REDUCE_OPS, on_threads, rank_input, reference,
                      run_threads, unique)

WORLDS = [("shm", 2), ("shm", 4), ("gloo", 2), ("gloo", 3)]


@pytest.mark.parametrize("backend,world", WORLDS)
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_allreduce_every_op(backend, world, dtype):
    ops = [op for op in REDUCE_OPS if op != "avg" or dtype.startswith("float")]

    def body(g):
        out = {}
        for op in ops:
            x = rank_input(g.rank, dtype, salt=len(op))
            g.allreduce(x, op)
            out[op] = x
        return out

    results = run_threads(world, body, backend)
    for op in ops:
        expected = reference([rank_input(r, dtype, salt=len(op)) for r in range(world)], op, dtype)
        for r in range(world):
            np.testing.assert_array_equal(results[r][op], expected, err_msg=f"{op} rank {r}")


@pytest.mark.parametrize("backend,world", WORLDS)
def test_avg_of_integers_is_refused_before_any_io(backend, world):
    def body(g):
        with pytest.raises(tutti.InvalidArgumentError, match="avg"):
            g.allreduce(np.ones(4, dtype=np.int32), tutti.ReduceOp.AVG)
        # No rank sent anything: the group is in step and usable.
        x = np.full(4, g.rank + 1, dtype=np.int32)
        g.allreduce(x)
        return x

    for x in run_threads(world, body, backend):
        np.testing.assert_array_equal(x, np.full(4, world * (world + 1) // 2))


@pytest.mark.parametrize("backend,world", WORLDS)
@pytest.mark.parametrize("dtype", ["int8", "uint64", "float16", "float32", "float64", "bool"])
def test_rooted_and_gathering_ops(backend, world, dtype):
    root = world - 1

    def body(g):
        r = g.rank
        out = {}
        x = rank_input(r, dtype)
        g.reduce(x, root, "max")
        out["reduce"] = x
        b = rank_input(r, dtype, salt=5)
        g.broadcast(b, root)
        out["broadcast"] = b
        lst = [np.zeros(6, dtype=dtype) for _ in range(world)]
        g.allgather(lst, rank_input(r, dtype))
        out["allgather_list"] = lst
        buf = np.zeros(6 * world, dtype=dtype)
        g.allgather(buf, rank_input(r, dtype))
        out["allgather_buffer"] = buf
        rs = np.zeros(6, dtype=dtype)
        g.reducescatter(rs, [rank_input(r, dtype, salt=k) for k in range(world)], "max")
        out["reducescatter_list"] = rs
        rs2 = np.zeros(6, dtype=dtype)
        g.reduce_scatter(rs2, np.concatenate([rank_input(r, dtype, salt=k) for k in range(world)]),
                         "min")
        out["reduce_scatter_buffer"] = rs2
        a2a = [np.zeros(6, dtype=dtype) for _ in range(world)]
        g.alltoall(a2a, [rank_input(r, dtype, salt=10 + k) for k in range(world)])
        out["alltoall_list"] = a2a
        a2b = np.zeros(6 * world, dtype=dtype)
        g.alltoall(a2b, np.concatenate([rank_input(r, dtype, salt=20 + k) for k in range(world)]))
        out["alltoall_buffer"] = a2b
        gl = [np.zeros(6, dtype=dtype) for _ in range(world)] if r == root else None
        g.gather(gl, rank_input(r, dtype, salt=30), root)
        out["gather"] = gl
        sc = np.zeros(6, dtype=dtype)
        src = [rank_input(root, dtype, salt=40 + k) for k in range(world)] if r == root else None
        g.scatter(sc, src, root)
        out["scatter"] = sc
        g.barrier()
        return out

    res = run_threads(world, body, backend)
    ins = lambda salt=0: [rank_input(r, dtype, salt=salt) for r in range(world)]  # noqa: E731
    for r in range(world):
        o = res[r]
        want_reduce = reference(ins(), "max", dtype) if r == root else rank_input(r, dtype)
        np.testing.assert_array_equal(o["reduce"], want_reduce)
        np.testing.assert_array_equal(o["broadcast"], rank_input(root, dtype, salt=5))
        for k in range(world):
            np.testing.assert_array_equal(o["allgather_list"][k], rank_input(k, dtype))
            np.testing.assert_array_equal(o["allgather_buffer"][6 * k:6 * k + 6],
                                          rank_input(k, dtype))
            np.testing.assert_array_equal(o["alltoall_list"][k],
                                          rank_input(k, dtype, salt=10 + r))
            np.testing.assert_array_equal(o["alltoall_buffer"][6 * k:6 * k + 6],
                                          rank_input(k, dtype, salt=20 + r))
        np.testing.assert_array_equal(o["reducescatter_list"], reference(
            [rank_input(k, dtype, salt=r) for k in range(world)], "max", dtype))
        np.testing.assert_array_equal(o["reduce_scatter_buffer"], reference(
            [rank_input(k, dtype, salt=r) for k in range(world)], "min", dtype))
        np.testing.assert_array_equal(o["scatter"], rank_input(root, dtype, salt=40 + r))
    for k in range(world):
        np.testing.assert_array_equal(res[root]["gather"][k], rank_input(k, dtype, salt=30))


@pytest.mark.parametrize("backend,world", WORLDS)
def test_v_ops_and_point_to_point(backend, world):
    counts = [r + 1 for r in range(world)]

    def body(g):
        r = g.rank
        out = {}
        mine = np.full(counts[r], r * 10, dtype=np.int64)
        gathered = np.zeros(sum(counts), dtype=np.int64)
        g.allgatherv(gathered, mine, counts)
        out["allgatherv"] = gathered
        # alltoallv: rank r sends (k + 1) elements valued 100r + k to rank k.
        send_counts = [k + 1 for k in range(world)]
        recv_counts = [r + 1] * world
        send = np.concatenate([np.full(k + 1, 100 * r + k) for k in range(world)]).astype(np.int64)
        recv = np.zeros(sum(recv_counts), dtype=np.int64)
        g.alltoallv(recv, send, recv_counts, send_counts)
        out["alltoallv"] = recv
        # A ring in one batch, then plain send/recv between 0 and 1.
        right, left = (r + 1) % world, (r - 1) % world
        got = np.zeros(3, dtype=np.float32)
        g.batch_isend_irecv([tutti.P2POp("send", np.full(3, r, dtype=np.float32), right),
                             tutti.P2POp(tutti.irecv, got, left)])
        out["ring"] = got
        if r == 0:
            g.send(np.arange(5, dtype=np.float64), 1)
        elif r == 1:
            p = np.zeros(5, dtype=np.float64)
            g.recv(p, 0)
            out["p2p"] = p
        return out

    res = run_threads(world, body, backend)
    expect_gathered = np.concatenate([np.full(counts[k], k * 10) for k in range(world)])
    for r in range(world):
        np.testing.assert_array_equal(res[r]["allgatherv"], expect_gathered)
        np.testing.assert_array_equal(res[r]["alltoallv"], np.concatenate(
            [np.full(r + 1, 100 * k + r) for k in range(world)]))
        np.testing.assert_array_equal(res[r]["ring"], np.full(3, (r - 1) % world))
    np.testing.assert_array_equal(res[1]["p2p"], np.arange(5))


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_torch_tensors_in_place_every_dtype(backend):
    dtypes = [torch.bool, torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64]

    def body(g):
        out = []
        for dt in dtypes:
            t = torch.from_numpy(rank_input(g.rank, "float32")).to(dt)
            if dt == torch.bool:
                t = torch.from_numpy(rank_input(g.rank, "bool"))
            g.allreduce(t, tutti.ReduceOp.MAX)
            out.append(t)
        return out

    res = run_threads(2, body, backend)
    for i, dt in enumerate(dtypes):
        name = "bool" if dt == torch.bool else "float32"
        want = reference([rank_input(r, name) for r in range(2)], "max", name)
        for r in range(2):
            np.testing.assert_array_equal(res[r][i].to(torch.float64).numpy(),
                                          want.astype(np.float64), err_msg=str(dt))


def test_anything_with_dlpack_is_used_in_place():
    class Wrapped:  # no buffer protocol, no torch type: only __dlpack__
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, *args, **kwargs):
            return self.t.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    def body(g):
        t = torch.full((2, 3), float(g.rank + 1))
        g.allreduce(Wrapped(t))
        return t

    for t in run_threads(2, body):
        assert torch.equal(t, torch.full((2, 3), 3.0))


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_async_ops_return_works_that_keep_their_tensors(backend):
    def body(g):
        works, keep = [], []
        for k in range(4):
            x = np.full(1000, g.rank + k, dtype=np.float64)
            keep.append(x)
            works.append(g.allreduce(x, async_op=True))
        # The op holds its tensor: dropping the caller's last reference is safe.
        y = np.full(8, 1.0)
        w2 = g.allreduce(y, async_op=True)
        view = y.view()
        del y
        for w in works:
            assert isinstance(w, tutti.Work)
            assert w.wait() is True
            assert w.is_completed() and w.is_success() and w.exception() is None
        w2.wait(timeout=10)
        assert works[0].op == "allreduce"
        return [x.copy() for x in keep], view.copy()

    for xs, y in run_threads(2, body, backend):
        for k, x in enumerate(xs):
            np.testing.assert_array_equal(x, np.full(1000, 1 + 2 * k))
        np.testing.assert_array_equal(y, np.full(8, 2.0))


def test_named_groups_free_functions_and_new_group():
    """Ray's free functions on process-wide named groups (one rank: every backend returns at
    once), and the query functions."""
    name = "solo-free-functions"
    assert not tutti.is_group_initialized(name)
    assert tutti.get_rank(name) == -1
    tutti.init_collective_group(1, 0, "shm", name)
    try:
        assert tutti.is_group_initialized(name)
        assert tutti.get_rank(name) == 0 and tutti.get_collective_group_size(name) == 1
        x = np.arange(4, dtype=np.float32)
        tutti.allreduce(x, name, tutti.ReduceOp.SUM)
        tutti.reduce(x, 0, name)
        tutti.broadcast(x, 0, name)
        tutti.barrier(name)
        out = [np.zeros(4, dtype=np.float32)]
        tutti.allgather(out, x, name)
        np.testing.assert_array_equal(out[0], np.arange(4))
        rs = np.zeros(4, dtype=np.float32)
        tutti.reducescatter(rs, [x], name)
        tutti.reduce_scatter(rs, x, name)
        np.testing.assert_array_equal(rs, np.arange(4))
        w = tutti.barrier(name, async_op=True)
        assert w.wait()
        tutti.synchronize("cpu", name)
        tutti.allreduce_multigpu([x], name)
        np.testing.assert_array_equal(x, np.arange(4))
        sub = tutti.new_group([0], group_name=name + ".sub", parent=name)
        assert sub is not None and sub.world_size == 1
        assert tutti.is_group_initialized(name + ".sub")
        tutti.destroy_collective_group(name + ".sub")
    finally:
        tutti.destroy_collective_group(name)
    assert not tutti.is_group_initialized(name)
    with pytest.raises(tutti.InvalidUsageError, match=name):
        tutti.allreduce(np.zeros(1), name)


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_splits_collective_and_local(backend):
    """A collective split (every rank calls it) and local ones (only the members, under a name):
    ranks 0 and 2 pair up while 1 and 3 do, and each pair sums only its own members."""
    def body(g):
        r = g.rank
        halves = g.split([0, 1]), g.split([2, 3])
        half = halves[0] if r < 2 else halves[1]
        assert halves[1 - r // 2] is None
        x = np.full(3, r + 1, dtype=np.int64)
        half.allreduce(x)
        assert x[0] == (3 if r < 2 else 7)
        name = "evens" if r % 2 == 0 else "odds"
        pair = g.split([r % 2, r % 2 + 2], name=name, local=True)
        assert pair.world_size == 2 and pair.rank == r // 2 and pair.name == name
        y = np.full(2, 10 * r, dtype=np.int64)
        pair.allreduce(y)
        assert y[1] == (0 + 20 if r % 2 == 0 else 10 + 30)
        with pytest.raises(tutti.InvalidArgumentError, match="needs a name"):
            g.split([0, 1, 2, 3], local=True)
        return True

    assert run_threads(4, body, backend=backend) == [True] * 4


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_survivors_shrink_and_go_on(backend):
    """Rank 2 leaves; ranks 0 and 1 shrink without it (named in exclude) and sum among
    themselves in the new group, renumbered, through the same store."""
    def body(g):
        x = np.full(4, g.rank + 1, dtype=np.float32)
        g.allreduce(x)
        assert x[0] == 6
        if g.rank == 2:
            return None  # gone (its group is destroyed)
        with pytest.raises(tutti.InvalidArgumentError, match="excluded rank 5"):
            g.shrink(exclude=[5])
        small = g.shrink(exclude=[2])
        try:
            assert (small.world_size, small.rank) == (2, g.rank)
            assert small.name == g.name + ".shrink0"
            y = np.full(4, 10 * (g.rank + 1), dtype=np.float32)
            small.allreduce(y)
            return float(y[0])
        finally:
            small.destroy()

    assert run_threads(3, body, backend=backend) == [30.0, 30.0, None]


@pytest.mark.parametrize("backend", ["gloo", "shm"])
def test_a_new_process_joins_a_grow(backend):
    """Two members grow by one; a third thread joins under the group's name through the same
    store. Members keep their ranks, the new rank comes after them, and the sum counts all three."""
    store = tutti.HashStore()
    name = unique()

    def rank_main(rank):
        if rank == 2:
            grown = tutti.CollectiveGroup.join(name, store=store, timeout=20)
        else:
            g = tutti.CollectiveGroup.create(2, rank, backend, name, store=store, timeout=20)
            with pytest.raises(tutti.InvalidArgumentError, match="add must be at least 1, got 0"):
                g.grow(add=0)
            grown = g.grow()
            g.destroy()
        try:
            assert grown.world_size == 3 and grown.name == name + ".grow0"
            x = np.full(4, grown.rank + 1, dtype=np.float32)
            grown.allreduce(x)
            return (grown.rank, float(x[0]))
        finally:
            grown.destroy()

    assert on_threads(3, rank_main) == [(0, 6.0), (1, 6.0), (2, 6.0)]


def test_a_join_with_no_grow_times_out_saying_so():
    with pytest.raises(tutti.TimeoutError, match="no grow of it began within 200 ms"):
        tutti.CollectiveGroup.join(unique(), store=tutti.HashStore(), timeout=0.2)


def test_abort_ends_a_waiting_op_promptly():
    done = threading.Event()

    def body(g):
        if g.rank == 0:
            try:
                x = np.zeros(4)
                w = g.recv(x, 1, async_op=True)  # rank 1 never sends
                g.abort("the test gives up")
                with pytest.raises(tutti.AbortedError, match="the test gives up"):
                    w.wait(timeout=5)
                assert g.is_aborted
                with pytest.raises(tutti.AbortedError):
                    g.barrier()
            finally:
                done.set()
            return "aborted"
        assert done.wait(30)  # stays in the group until rank 0 is through
        return "idle"

    assert run_threads(2, body, "shm", timeout=30) == ["aborted", "idle"]


def test_an_async_op_keeps_its_torch_tensor_alive():
    """The Work of an async op holds its torch tensor until the op is done: a tensor the caller
    dropped (or a temporary, g.recv(torch.empty(n), 1, async_op=True)) is not freed under it."""
    torch = pytest.importorskip("torch")
    go = threading.Event()

    def body(g):
        if g.rank == 0:
            x = torch.zeros(4)
            alive = weakref.ref(x)
            w = g.recv(x, 1, async_op=True)
            del x
            gc.collect()
            try:
                assert alive() is not None, "the Work dropped the tensor it writes into"
            finally:
                go.set()
            w.wait(timeout=20)
            return alive().tolist()
        assert go.wait(30)
        g.send(torch.arange(1.0, 5.0), 0)
        return None

    assert run_threads(2, body, "shm", timeout=30)[0] == [1.0, 2.0, 3.0, 4.0]


def test_a_group_collected_with_an_op_in_flight_does_not_deadlock():
    """A group Python collects (no destroy()) while an async op whose handle was dropped is in
    flight: its worker ends the op and drops the op's tensors without waiting for the GIL, which
    the collecting thread holds while it joins that worker (a deadlock before)."""
    script = textwrap.dedent("""
        import threading
        import numpy as np
        import tutti

        store = tutti.HashStore()
        done = threading.Event()

        def rank1():
            g1 = tutti.CollectiveGroup.create(2, 1, "shm", "collected", store=store, timeout=20)
            done.wait(60)
            g1.destroy()

        t = threading.Thread(target=rank1)
        t.start()

        def scope():
            g = tutti.CollectiveGroup.create(2, 0, "shm", "collected", store=store, timeout=20)
            w = g.recv(np.zeros(4), 1, async_op=True)  # rank 1 never sends
            del w  # g goes with this frame, its recv still waiting

        scope()
        done.set()
        t.join(60)
        print("collected")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0 and "collected" in done.stdout, done.stdout + done.stderr


def test_dropping_the_last_reference_to_a_group_lets_other_threads_run():
    """A group Python collects (no destroy()) whose store's host has gone waits in its teardown
    for the store (2 s a request): other Python threads run meanwhile, since the group goes
    without the GIL (before, they all stood still until the teardown ended)."""
    script = textwrap.dedent("""
        import threading, time
        import tutti

        server = tutti.TCPStoreServer()
        store = server.url()
        joined, done = threading.Event(), threading.Event()

        def rank1():  # stays in the group until rank 0's teardown has ended
            g1 = tutti.CollectiveGroup.create(2, 1, "shm", "dropped", store=store, timeout=20)
            joined.set()
            done.wait(60)
            g1.destroy()

        t = threading.Thread(target=rank1)
        t.start()
        g = tutti.CollectiveGroup.create(2, 0, "shm", "dropped", store=store, timeout=20)
        joined.wait(60)
        del server  # the store's host goes: leaving it waits out its requests' timeout
        ticks = []

        def ticker():
            while not done.is_set():
                ticks.append(time.monotonic())
                time.sleep(0.005)

        k = threading.Thread(target=ticker)
        k.start()
        time.sleep(0.05)
        start = time.monotonic()
        del g  # its last reference: the teardown runs here
        end = time.monotonic()
        done.set()
        t.join(60)
        k.join(60)
        marks = [start] + [x for x in ticks if start < x < end] + [end]
        gap = max(b - a for a, b in zip(marks, marks[1:]))
        print(f"teardown {end - start:.3f} s, longest gap {gap:.3f} s, ticks {len(marks) - 2}")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    words = done.stdout.split()
    seconds, gap = float(words[1]), float(words[5])
    # The teardown waited (else this test could not tell), and the ticker ran through it (a tick
    # every 5 ms; with the GIL held through the teardown, one gap as long as the teardown).
    assert seconds >= 0.5, done.stdout
    assert gap < min(1.0, seconds / 2), done.stdout


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_ops_come_from_one_thread_until_another_takes_the_group(backend):
    """A CPU group takes its ops from the thread that created it: another thread's op fails
    with InvalidUsageError before any I/O (the group stays usable) until that thread calls
    issue_from_this_thread(); the creator takes it back the same way."""

    def in_thread(fn):
        out = {}

        def run():
            try:
                out["value"] = fn()
            except BaseException as e:  # noqa: BLE001 (re-raised below)
                out["error"] = e

        t = threading.Thread(target=run)
        t.start()
        t.join(JOIN_TIMEOUT_S)
        assert not t.is_alive()
        if "error" in out:
            raise out["error"]
        return out["value"]

    def body(g):
        refused = np.zeros(2)
        with pytest.raises(tutti.InvalidUsageError, match="issue_from_this_thread"):
            in_thread(lambda: g.allreduce(refused))

        def adopt_and_reduce():
            g.issue_from_this_thread()
            x = np.full(3, g.rank + 1.0)
            g.allreduce(x)
            return x

        first = in_thread(adopt_and_reduce)
        # The helper thread has ended: the next thread to issue an op takes the group over,
        # here the creator again.
        g.issue_from_this_thread()
        second = np.full(3, 10.0 * (g.rank + 1))
        g.allreduce(second)
        return first, second

    for first, second in run_threads(2, body, backend):
        np.testing.assert_array_equal(first, np.full(3, 3.0))
        np.testing.assert_array_equal(second, np.full(3, 30.0))


@pytest.mark.parametrize("backend,world", [("shm", 2), ("shm", 3), ("gloo", 2)])
def test_allreduce_in_symmetric_memory(backend, world):
    n = 100_003  # above shm's 16 KiB small-message path, and not a multiple of the world size

    def body(g):
        x = g.allocate_symmetric(4 * n, "float32")
        t = g.allocate_symmetric(8 * 5000, "int64", framework="torch")  # above 16 KiB
        assert x.shape == (n,) and x.dtype == np.float32 and not x.any()
        assert isinstance(t, torch.Tensor) and t.dtype == torch.int64 and t.numel() == 5000
        # Symmetric where the backend has such memory (shm), for the whole and its slices only.
        assert g.is_symmetric(x) == (backend == "shm") == g.is_symmetric(t[10:20])
        assert not g.is_symmetric(np.zeros(n, np.float32)) and not g.is_symmetric(x.copy())
        assert not g.is_symmetric(x[::2])  # not contiguous: no op could take it
        with pytest.raises(tutti.TensorTypeError):
            g.is_symmetric("x")
        out = []
        for salt in range(2):
            x[:] = rank_input(g.rank, "float32", n=n, salt=salt)
            g.allreduce(x)
            out.append(x.copy())
        t[:] = torch.arange(5000) * (g.rank + 1)
        g.allreduce(t, "max")
        out.append(t.numpy().copy())
        with pytest.raises(tutti.InvalidArgumentError, match="not a multiple of float32's 4"):
            g.allocate_symmetric(6, "float32")
        g.barrier()  # no rank frees its memory while a peer still reads it
        return out

    results = run_threads(world, body, backend)
    for salt in range(2):
        expected = reference([rank_input(r, "float32", n=n, salt=salt) for r in range(world)],
                             "sum", "float32")
        for r in range(world):
            np.testing.assert_array_equal(results[r][salt], expected, err_msg=f"rank {r}")
    for r in range(world):
        np.testing.assert_array_equal(results[r][2], np.arange(5000) * world)
