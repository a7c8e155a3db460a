"""tutti's Python package with torch CUDA tensors, on a GPU: the NCCL backend through the bindings
(out-of-place results checked while a busy kernel still delays their inputs on torch's stream),
torch.distributed's "tutti" backend on CUDA tensors (stream-ordered as torch's NCCL backend),
cuda_ipc between two processes, and what tutti.ray's tensor transport does with a CUDA object
(tutti._rdt). One GPU is enough (world size 1 for NCCL: it refuses two ranks on one device).
Skipped where torch sees no CUDA device, saying so; scripts/device/run.sh runs them on the device
machine, where a skip fails."""

import contextlib
import multiprocessing as mp
import time

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch (scripts/device/run.sh runs these on a GPU)",
                allow_module_level=True)

import tutti  # noqa: E402
from tutti import transfer  # noqa: E402
from conftest import unique  # noqa: E402

N = 1 << 20


STALE = -12345  # what a queued tensor holds until its values land (no expected value is it)


def queued(values):
    """A CUDA tensor that holds STALE until a copy queued on torch's current stream behind a
    ~20 ms busy kernel writes `values`: an op not ordered after the caller's stream reads STALE."""
    src = values.cuda()
    t = torch.full_like(src, STALE)
    torch.cuda.synchronize()
    torch.cuda._sleep(40_000_000)  # GPU cycles: about 20 ms at the H200's 1.98 GHz
    t.copy_(src)
    return t


@pytest.fixture
def group():
    g = tutti.CollectiveGroup.create(1, 0, "nccl", unique(), store=tutti.HashStore(), timeout=30)
    # The NCCL communicator is made by the first op, taking longer than queued()'s kernel: made
    # here, so that the tests' ops meet inputs that have not landed yet.
    g.allreduce(torch.zeros(1, device="cuda"))
    torch.cuda.synchronize()
    yield g
    g.destroy()


def test_collectives_run_after_the_kernels_before_them(group):
    assert group.backend == "nccl"
    expected = torch.arange(N, dtype=torch.float32) * 3 - 7
    out = [torch.full((N,), -1.0, device="cuda")]
    group.allgather(out, queued(expected))
    assert torch.equal(out[0].cpu(), expected)

    x = queued(expected)
    group.allreduce(x, "max")
    group.broadcast(x, 0)
    assert torch.equal(x.cpu(), expected)

    out = torch.full((N,), -1.0, device="cuda")
    group.reduce_scatter(out, [queued(expected)], "sum")
    assert torch.equal(out.cpu(), expected)

    ints = torch.arange(4096, dtype=torch.int64) * 5
    out = torch.zeros(4096, dtype=torch.int64, device="cuda")
    group.alltoall(out, queued(ints))
    assert torch.equal(out.cpu(), ints)


def test_a_cpu_tensor_on_an_nccl_group_is_refused_by_name(group):
    with pytest.raises(tutti.InvalidArgumentError, match="allreduce"):
        group.allreduce(torch.ones(4))


@pytest.fixture
def tutti_dist():
    """torch.distributed on backend "tutti", world size 1, with its NCCL communicator made by a
    first op (its set-up outlasts queued()'s kernel, which would hide how later ops are ordered)."""
    import torch.distributed as dist
    import tutti.torch  # noqa: F401  (registers "tutti")

    dist.init_process_group("tutti", store=dist.HashStore(), rank=0, world_size=1)
    try:
        dist.all_reduce(torch.zeros(1, device="cuda"))
        torch.cuda.synchronize()
        yield dist
    finally:
        dist.destroy_process_group()


def test_torch_distributed_tutti_backend_on_cuda(tutti_dist):
    dist = tutti_dist
    assert "cuda" in dist.Backend.backend_capability["tutti"]
    expected = torch.arange(N, dtype=torch.float32) - 5
    x = queued(expected)
    dist.all_reduce(x)
    assert torch.equal(x.cpu(), expected)
    out = torch.full((N,), -1.0, device="cuda")
    dist.all_gather_into_tensor(out, queued(expected))
    assert torch.equal(out.cpu(), expected)
    work = dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True)
    work.wait()
    assert torch.equal(x.cpu(), expected)
    dist.barrier()


def test_torch_distributed_cuda_ops_are_stream_ordered_as_nccls(tutti_dist):
    """As with torch's NCCL backend: the Work's future is complete at once and orders the
    waiting stream after the op; copies into a non-contiguous output follow the op on the
    caller's stream; wait() does not block the host until the GPU is done."""
    dist = tutti_dist
    expected = torch.arange(N, dtype=torch.float32) * 2 + 1
    x = queued(expected)  # its values land ~20 ms from now
    work = dist.all_reduce(x, async_op=True)
    assert not work.is_completed()  # the kernel still holds it up on the GPU
    future = work.get_future()
    assert future.done()  # complete at once: stream-ordered, not host-ordered
    doubled = future.then(lambda f: f.value()[0] * 2)
    start = time.perf_counter()
    work.wait()
    assert time.perf_counter() - start < 0.010, "wait() blocked the host on the GPU"
    assert torch.equal(doubled.wait().cpu(), expected * 2)
    assert torch.equal(x.cpu(), expected)

    # A non-contiguous output: staged, and copied back on the caller's stream after the op.
    base = torch.arange(4096 * 2, dtype=torch.float32).reshape(4096, 2)
    out = torch.full((2, 4096), -1.0, device="cuda").t()
    assert not out.is_contiguous()
    dist.all_gather([out], queued(base))
    assert torch.equal(out.cpu(), base)


@contextlib.contextmanager
def owner_process(target, *args):
    """Runs target(conn, *args) in a spawned process; yields the first thing it sends (its
    object's ref and what goes with it); then tells it the consumer is done, and waits for it to
    release its object."""
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=target, args=(there, *args), daemon=True)
    p.start()
    try:
        assert here.poll(120), "the owner process sent no ref"
        yield here.recv()
        here.send("done")
        assert here.poll(60) and here.recv() == "released"
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()


def _owner(conn, n):
    t = torch.arange(n, dtype=torch.float32, device="cuda") * 2 + 1
    h = transfer.put([t])
    conn.send((h.ref.to_bytes(), h.ref.transport))
    conn.recv()  # the consumer is done
    h.release()
    conn.send("released")


def test_cuda_ipc_between_two_processes():
    with owner_process(_owner, N) as (ref, transport):
        assert transport == "cuda_ipc"
        target = torch.full((N,), -1.0, device="cuda")
        transfer.get(ref, targets=[target], timeout=60)
        assert torch.equal(target.cpu(), torch.arange(N, dtype=torch.float32) * 2 + 1)
        target.fill_(-1)
        transfer.get(ref, targets=[target], timeout=60)  # again: the opened handle, reused
        assert torch.equal(target.cpu(), torch.arange(N, dtype=torch.float32) * 2 + 1)


def _rdt_owner(conn, n):
    from tutti import _rdt

    base = torch.arange(2 * n, dtype=torch.float32).reshape(2, n)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # written on a side stream, behind a busy kernel there
        first = queued(base[1] * 3)
    tensors = [first, queued(base).t()]  # the second is not contiguous: copied once at put
    try:
        _rdt.check("mixed", [tensors[0], torch.ones(2)])
    except ValueError as e:
        mixed = str(e)
    else:
        mixed = ""
    handle, device, _ = _rdt.publish(transfer.default_agent(), "object 1", tensors)
    meta = [(t.shape, t.dtype) for t in tensors]  # torch.Size, as Ray's metadata holds
    conn.send((handle.ref.to_bytes(), device, meta, mixed))
    conn.recv()
    handle.release()
    conn.send("released")


def test_tutti_ray_moves_cuda_tensors_between_two_processes():
    """What tutti.ray's tensor transport does for a CUDA object (tutti._rdt: Ray is not needed to
    run it): published at the source (one tensor written on a side stream, one not contiguous),
    fetched into new tensors on the destination's device and into given ones."""
    from tutti import _rdt

    with owner_process(_rdt_owner, 4096) as (ref, device, meta, mixed):
        assert device == "cuda"
        assert "both CPU and CUDA" in mixed and "mixed" in mixed
        base = torch.arange(2 * 4096, dtype=torch.float32).reshape(2, 4096)
        fetch, targets = _rdt.fetch(transfer.default_agent(), ref, device, meta, None, 60, True)
        got = fetch.wait()
        assert [t.device.type for t in got] == ["cuda", "cuda"]
        assert torch.equal(got[0].cpu(), base[1] * 3)  # not STALE: the side stream was joined
        assert got[1].shape == (4096, 2) and torch.equal(got[1].cpu(), base.t())
        into = [torch.zeros(4096, device="cuda"), torch.zeros(4096, 2, device="cuda")]
        fetch, targets = _rdt.fetch(transfer.default_agent(), ref, device, meta, into, 60, True)
        fetch.wait()
        assert torch.equal(into[0].cpu(), base[1] * 3) and torch.equal(into[1].cpu(), base.t())
