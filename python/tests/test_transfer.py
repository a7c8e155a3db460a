"""tutti.transfer: put in place, get (copies, into targets, as numpy or torch), borrow
(zero-copy, read-only), get_async, references as bytes/text/pickle, own refs, lifetime
(wait_tensor_freed), reserve/fulfil/fail, and a dead owner, between agents in one process and
across processes."""

import gc
import multiprocessing as mp
import os
import pickle
import signal
import time

import numpy as np
import pytest
import torch

import tutti
from tutti import transfer
from conftest import mapped_from, on_threads, run_processes


@pytest.fixture(scope="module")
def agents():
    return transfer.TransferAgent("owner"), transfer.TransferAgent("consumer")


def test_put_get_round_trips_every_form(agents):
    owner, consumer = agents
    a = np.arange(1000, dtype=np.float32)
    b = torch.arange(10, dtype=torch.int64)
    c = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    h = owner.put([a, b, c])
    ref = h.ref
    assert ref.tensors == [("float32", (1000,), "cpu"), ("int64", (10,), "cpu"),
                           ("bfloat16", (2,), "cpu")]
    assert ref.owner_name == "owner" and ref.transport == "shm"
    for form in (ref, ref.to_bytes(), ref.to_text(), pickle.loads(pickle.dumps(ref))):
        got = consumer.get(form, framework="torch")
        assert torch.equal(got[0], torch.from_numpy(a))
        assert torch.equal(got[1], b)
        assert torch.equal(got[2], c)
    got = consumer.get(ref.to_text(), framework="torch")
    got[0][0] = 99  # a copy: the owner's tensor is untouched
    assert a[0] == 0
    with pytest.raises(tutti.TensorTypeError, match="bfloat16"):
        consumer.get(ref)  # numpy has no bfloat16
    h.release()


def test_torch_gets_keep_every_dtype_and_shape(agents):
    """framework='torch' tensors (made through torch's C DLPack entry): each dtype as torch names
    it (bool stays bool), 0-d and empty shapes, the bytes as put; copied, and mapped copy-on-write
    from the owner's memory; the last tensor alive holds what it came in (the owner's lease) and
    lets it go when deleted."""
    owner, consumer = agents
    put = [torch.tensor([True, False, True]), torch.tensor(7.5, dtype=torch.float16),
           torch.zeros((0, 3), dtype=torch.int32), torch.arange(6, dtype=torch.uint8).reshape(2, 3),
           torch.tensor([2 ** 40, -3], dtype=torch.int64),
           torch.tensor([1.0, -0.5], dtype=torch.bfloat16)]
    block = transfer.empty((2, 1, 6), torch.float64, agent=owner)
    block.copy_(torch.arange(12, dtype=torch.float64).reshape(2, 1, 6))
    put.append(block)
    h = owner.put(put)
    for cow in (False, True):
        got = consumer.get(h.ref, framework="torch", copy_on_write=cow)
        assert [t.dtype for t in got] == [t.dtype for t in put]
        assert [tuple(t.shape) for t in got] == [tuple(t.shape) for t in put]
        assert all(torch.equal(g, t) for g, t in zip(got, put))
        assert ("memfd:tutti-rdt" in mapped_from(got[-1])) == cow
        last = got[-1]
        del got
        gc.collect()
        assert last.sum().item() == 66.0
        if cow:
            h.release()
            with pytest.raises(tutti.TimeoutError, match="leased by agent 'consumer'"):
                owner.wait_tensor_freed(block, timeout=0.2)
        del last
    owner.wait_tensor_freed(block, timeout=10)


def test_get_into_targets_is_checked_before_any_io(agents):
    owner, consumer = agents
    a = np.arange(16, dtype=np.float64)
    with owner.put([a]) as h:
        target = np.zeros(16)
        (same,) = consumer.get(h.ref, targets=[target])
        assert same is target
        np.testing.assert_array_equal(target, a)
        with pytest.raises(tutti.InvalidArgumentError, match="consumer"):
            consumer.get(h.ref, targets=[np.zeros(15)])
        with pytest.raises(tutti.InvalidArgumentError, match="not contiguous"):
            consumer.get(h.ref, targets=[np.zeros(32)[::2]])
        f = consumer.get_async(h.ref, targets=[np.zeros(16)])
        (t,) = f.wait()
        assert f.done()
        np.testing.assert_array_equal(t, a)


def test_own_refs_return_the_very_objects_put(agents):
    owner, _ = agents
    t = torch.ones(3)
    with owner.put([t]) as h:
        (same,) = owner.get(h.ref)
        assert same is t


def test_borrow_of_allocated_memory_is_zero_copy_and_read_only(agents):
    owner, consumer = agents
    shared = owner.allocate(64 * 4, "float32")
    shared[:] = np.arange(64)
    h = owner.put([shared])
    with consumer.borrow(h.ref) as (view,):
        assert not view.flags.writeable
        shared[5] = -1  # the owner writes: the borrower sees the same pages
        assert view[5] == -1
        h.release()
        with pytest.raises(tutti.TimeoutError, match="leased by agent 'consumer'"):
            owner.wait_tensor_freed(shared, timeout=0.2)
        del view
    owner.wait_tensor_freed(shared, timeout=10)


def test_copy_on_write_gets_map_shareable_memory_without_a_copy(agents):
    """transfer.empty and share_memory_() tensors reach a copy_on_write get as private mappings
    of the owner's memory: writable, the writes the consumer's own, the owner's object held while
    they live; a heap tensor is copied as before."""
    owner, consumer = agents
    arena = transfer.empty((256, 4), torch.float32, agent=owner)
    arena.copy_(torch.arange(1024, dtype=torch.float32).reshape(256, 4))
    shared = torch.arange(4096, dtype=torch.float64).share_memory_()
    fd, _ = shared.untyped_storage()._share_fd_cpu_()
    region = torch.empty(0, dtype=torch.uint8).set_(shared.untyped_storage())
    owner.register_memory(region, fd)
    heap = torch.full((8,), 3.0)
    h = owner.put([arena, shared, heap])
    got = consumer.get(h.ref, framework="torch", copy_on_write=True)
    assert [tuple(t.shape) for t in got] == [(256, 4), (4096,), (8,)]
    assert torch.equal(got[0], arena) and torch.equal(got[1], shared) and torch.equal(got[2], heap)
    # Mapped from the owner's files (a memfd, torch's /dev/shm file), not copied.
    assert "memfd:tutti-rdt" in mapped_from(got[0])
    assert "/dev/shm/torch_" in mapped_from(got[1])
    copy_at = mapped_from(got[2])  # the consumer's own memory: a copy
    assert copy_at in ("", "[heap]"), copy_at
    got[0][0, 0] = -1.0  # the consumer's own page from now on
    got[1][7] = -1.0
    assert arena[0, 0] == 0.0 and shared[7] == 7.0
    h.release()
    with pytest.raises(tutti.TimeoutError, match="leased by agent 'consumer'"):
        owner.wait_tensor_freed(shared, timeout=0.2)
    with pytest.raises(tutti.InvalidUsageError):
        owner.unregister_memory(region)
    del got
    owner.wait_tensor_freed(shared, timeout=10)
    owner.wait_tensor_freed(arena, timeout=10)
    owner.unregister_memory(region)


def test_wait_tensor_freed_names_what_holds_the_tensor(agents):
    owner, _ = agents
    x = np.zeros(8)
    h = owner.put([x], expected_gets=0)
    with pytest.raises(tutti.TimeoutError, match="wait_tensor_freed"):
        owner.wait_tensor_freed(x, timeout=0.1)
    h.release()
    owner.wait_tensor_freed(x, timeout=10)
    assert owner.collect() == 0  # the agent let go of the array


def test_reserve_fulfil_and_fail(agents):
    owner, consumer = agents
    h = owner.reserve([("float32", (4,)), (torch.int64, (2,))])
    assert h.ref.is_pending
    f = consumer.get_async(h.ref, timeout=10)
    assert not f.is_completed() and not f.done()
    # Work's verbs: a shorter wait raises and leaves the get running; no error while it runs.
    with pytest.raises(tutti.TimeoutError, match="still runs after 50 ms"):
        f.wait(timeout=0.05)
    assert f.exception() is None
    owner.fulfil(h, [np.full(4, 2.0, dtype=np.float32), np.array([7, 8])])
    x, y = f.wait(timeout=10)
    assert f.is_completed() and f.exception() is None
    np.testing.assert_array_equal(x, np.full(4, 2.0))
    np.testing.assert_array_equal(y, [7, 8])
    h.release()
    bad = owner.reserve([("float32", (1,))])
    owner.fail(bad, "the producer crashed")
    with pytest.raises(tutti.RemoteError, match="the producer crashed"):
        consumer.get(bad.ref, timeout=10)
    g = consumer.get_async(bad.ref, timeout=10)
    with pytest.raises(tutti.RemoteError):
        g.wait()
    assert isinstance(g.exception(), tutti.RemoteError)
    assert "the producer crashed" in str(g.exception())


def test_a_dropped_fetch_ends_its_get_before_its_targets_go(agents):
    """A Fetch dropped while its get waits (here for a reservation) cancels the get and waits for
    its end: the targets it held may be freed at once, and nothing writes into them later."""
    owner, consumer = agents
    h = owner.reserve([("float32", (4,))])
    target = np.zeros(4, dtype=np.float32)
    f = consumer.get_async(h.ref, targets=[target], timeout=30)
    with pytest.raises(tutti.TimeoutError):
        f.wait(timeout=0.05)
    start = time.monotonic()
    del f
    assert time.monotonic() - start < 10, "dropping the fetch waited for the get's timeout"
    owner.fulfil(h, [np.full(4, 3.0, dtype=np.float32)])
    got = consumer.get(h.ref, timeout=10)[0]  # the agent serves the next get
    np.testing.assert_array_equal(got, np.full(4, 3.0))
    np.testing.assert_array_equal(target, np.zeros(4))  # the dropped get never wrote it
    h.release()


def test_a_get_timeout_of_zero_is_refused_not_the_default(agents):
    """In C++ a zero timeout means the agent's default (60 s); from Python 0 is refused by name,
    and a fraction of a millisecond is a millisecond, not zero."""
    owner, consumer = agents
    h = owner.reserve([("float32", (1,))])
    with pytest.raises(tutti.InvalidArgumentError, match="timeout must be positive"):
        consumer.get(h.ref, timeout=0)
    with pytest.raises(tutti.InvalidArgumentError, match="fetch_timeout must be positive"):
        transfer.TransferAgent("zero", fetch_timeout=0)
    start = time.monotonic()
    with pytest.raises(tutti.TimeoutError):
        consumer.get(h.ref, timeout=0.0004)
    assert time.monotonic() - start < 5
    h.release()


def test_two_sided_gloo_between_agents_in_a_ring():
    """Three agents (threads of this process) join the transport group over one HashStore; each
    gets its neighbour's array over 'gloo' at once (every pair has its own group and thread), a
    process outside the group is refused naming it, and the group can be reset."""
    store = tutti.HashStore()
    agents = [transfer.TransferAgent(f"ring-{r}") for r in range(3)]
    on_threads(3, lambda r: agents[r].join_group("gloo", 3, r, store=store, timeout=20))
    assert agents[0].transport_group("gloo").world_size == 3
    arrays = [np.arange(5000, dtype=np.int64) * (r + 1) for r in range(3)]
    handles = [agents[r].put(arrays[r], transport="gloo") for r in range(3)]
    assert handles[0].ref.transport == "gloo"
    got = [None] * 3

    def fetch(r):
        for _ in range(5):
            got[r] = agents[r].get(handles[(r + 1) % 3].ref, timeout=20)

    on_threads(3, fetch)
    for r in range(3):
        np.testing.assert_array_equal(got[r][0], arrays[(r + 1) % 3])
    outsider = transfer.TransferAgent("outsider")
    with pytest.raises(tutti.InvalidUsageError, match="rdt.gloo"):
        outsider.get(handles[0].ref)
    on_threads(3, lambda r: agents[r].reset_transport("gloo"))
    np.testing.assert_array_equal(agents[1].get(handles[0].ref)[0], arrays[0])
    for h in handles:
        h.release()


def test_bad_refs_and_tensors_are_refused():
    with pytest.raises(tutti.InvalidArgumentError):
        transfer.TensorRef.from_text("tutti-ref:1:bm90IGEgcmVm")
    with pytest.raises(tutti.TensorTypeError, match="ref must be"):
        transfer.get(12)
    with pytest.raises(tutti.InvalidArgumentError, match="not contiguous"):
        transfer.put([np.zeros(8)[::2]])
    with pytest.raises(tutti.TensorTypeError, match="int16"):
        transfer.put([np.zeros(8, dtype=np.int16)])


def owner_process(conn):
    data = np.arange(1 << 20, dtype=np.float32)  # 4 MiB
    h = transfer.put([data, torch.full((3,), 7, dtype=torch.int32)])
    kept = transfer.put([np.ones(4)])  # alive until the process dies
    conn.send((h.ref.to_bytes(), kept.ref.to_text()))
    conn.recv()  # the consumer is done
    h.release()
    transfer.wait_tensor_freed(data, timeout=20)
    conn.send("freed")
    conn.recv()


def test_across_processes_and_a_dead_owner():
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=owner_process, args=(there,), daemon=True)
    p.start()
    try:
        assert here.poll(60)
        ref, kept = here.recv()
        data, small = transfer.get(ref)
        np.testing.assert_array_equal(data, np.arange(1 << 20, dtype=np.float32))
        np.testing.assert_array_equal(small, [7, 7, 7])
        here.send("done")
        assert here.poll(30) and here.recv() == "freed"
        with pytest.raises(tutti.InvalidUsageError, match="freed"):
            transfer.get(ref, timeout=10)  # the owner lives: the object was freed
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        # Once the owner died every get says so, the one of an object freed before it went too,
        # whether the consumer still held the owner's page or its housekeeping had forgotten it.
        with pytest.raises(tutti.IoError, match="is gone"):
            transfer.get(ref, timeout=10)
        with pytest.raises(tutti.IoError) as info:
            transfer.get(kept, timeout=10)
        print("dead owner:", info.value)
    finally:
        if p.is_alive():
            p.kill()
        p.join(5)
