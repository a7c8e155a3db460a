"""tutti's Python package with torch CUDA tensors, on a GPU: the NCCL backend through the bindings
(ops ordered after the kernels torch queued on its stream), torch.distributed's "tutti" backend on
CUDA tensors, and the direct transport's cuda_ipc between two processes. One GPU is enough
(world size 1 for NCCL: it refuses two ranks on one device). Skipped where torch sees no CUDA
device, saying so; scripts/device/run.sh runs them on the device machine, where a skip fails."""

import multiprocessing as mp

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch (scripts/device/run.sh runs these on a GPU)",
                allow_module_level=True)

import tutti  # noqa: E402
from tutti import transfer  # noqa: E402
from conftest import unique  # noqa: E402

N = 1 << 20


def queued(values):
    """A CUDA tensor whose values are still being written by kernels queued on torch's current
    stream when this returns: an op not ordered after them would read the old values."""
    t = torch.zeros(values.numel(), dtype=values.dtype, device="cuda")
    for _ in range(20):
        t.add_(1)
    t.copy_(values.cuda(), non_blocking=True)
    return t


@pytest.fixture
def group():
    g = tutti.CollectiveGroup.create(1, 0, "nccl", unique(), store=tutti.HashStore(), timeout=30)
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


def test_torch_distributed_tutti_backend_on_cuda():
    import torch.distributed as dist
    import tutti.torch  # noqa: F401  (registers "tutti")

    assert "cuda" in dist.Backend.backend_capability["tutti"]
    store = dist.HashStore()
    dist.init_process_group("tutti", store=store, rank=0, world_size=1)
    try:
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
    finally:
        dist.destroy_process_group()


def _owner(conn, n):
    t = torch.arange(n, dtype=torch.float32, device="cuda") * 2 + 1
    h = transfer.put([t])
    conn.send((h.ref.to_bytes(), h.ref.transport))
    conn.recv()  # the consumer is done
    h.release()
    conn.send("released")


def test_cuda_ipc_between_two_processes():
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=_owner, args=(there, N), daemon=True)
    p.start()
    try:
        assert here.poll(120), "the owner process sent no ref"
        ref, transport = here.recv()
        assert transport == "cuda_ipc"
        target = torch.full((N,), -1.0, device="cuda")
        transfer.get(ref, targets=[target], timeout=60)
        assert torch.equal(target.cpu(), torch.arange(N, dtype=torch.float32) * 2 + 1)
        target.fill_(-1)
        transfer.get(ref, targets=[target], timeout=60)  # the owner's handle, opened once
        assert torch.equal(target.cpu(), torch.arange(N, dtype=torch.float32) * 2 + 1)
        here.send("done")
        assert here.poll(60) and here.recv() == "released"
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()
