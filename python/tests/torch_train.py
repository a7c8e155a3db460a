"""A small model trained for a few steps with DDP or FSDP2 on a torch.distributed backend, as a
user's script would be, written for gloo and run unchanged but for the backend's name.

    torchrun --nproc-per-node 2 python/tests/torch_train.py --backend gloo,tutti --wrap ddp \
        --out p.pt

With several backends the same training runs once on each, one after the other in the same
processes (init_process_group, train, destroy_process_group), from the same seeds. Every rank
trains on batches of its own (seeded by rank); rank 0 saves each backend's final parameters to
<backend>-<--out>, and with --overlap-out a count of the gradient buckets whose all_reduce was
still running when DDP's hook returned on rank 0 (async overlap; --lag makes rank 1 late to
each bucket, so an op that returned at once is still running) to <backend>-<--overlap-out>. The test
compares tutti's parameters with gloo's.

Put gloo first. torch's ProcessGroupGloo keeps its worker threads past destroy_process_group,
and a worker may still hold its last op (whose tensors are Python objects) when the main thread
returns from the barrier. Where that op is released only once the interpreter is finalizing,
the worker's wait for the GIL ends the thread through a noexcept destructor, and the process
aborts with "terminate called without an active exception" (torch issue 190489, open; seen here
beside a CPU hog in about one run in six with gloo last). With gloo first, the worker releases it
during the next backend's run.
"""

import argparse
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="gloo", help="one backend, or several: gloo,tutti")
parser.add_argument("--wrap", choices=["ddp", "fsdp2"], default="ddp")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--out", required=True)
parser.add_argument("--overlap-out", default="")
parser.add_argument("--lag", action="store_true",
                    help="rank 1 issues each bucket's all_reduce only once rank 0's hook has "
                         "returned (a mark in the process group's store)")
args = parser.parse_args()


def for_backend(path, backend):
    head, tail = os.path.split(path)
    return os.path.join(head, f"{backend}-{tail}")


def train(backend):
    if backend == "tutti":
        import tutti.torch  # noqa: F401  (registers "tutti")

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()

    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 8))
    still_running = []
    hooks_run = []  # every rank's hooks, counted alike (DDP's buckets go in one order)
    store = dist.distributed_c10d._get_default_store()
    if args.wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, bucket_cap_mb=0.1)  # several buckets, so communication can overlap

        def allreduce_hook(state, bucket):
            # What DDP's default does (sum, then divide), recording whether the op was still
            # running when the hook handed it back to DDP (and backward went on). With --lag
            # rank 1 comes to each bucket only once rank 0's hook has looked, so rank 0's op
            # cannot be done when its hook returns, unless all_reduce(async_op=True) waited for
            # it (then rank 0 never marks, and rank 1's wait for the mark times out).
            mark = f"lag/{backend}/{len(hooks_run)}"
            hooks_run.append(None)
            if rank == 1 and args.lag:
                store.wait([mark], datetime.timedelta(seconds=30))
            work = dist.all_reduce(bucket.buffer(), async_op=True)
            still_running.append(not work.is_completed())
            if rank == 0 and args.lag:
                store.set(mark, "1")
            return work.get_future().then(lambda f: f.value()[0].div_(world))

        model.register_comm_hook(None, allreduce_hook)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)

    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.steps):
        x = torch.randn(32, 64, generator=gen)
        y = torch.randn(32, 8, generator=gen)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    params = []
    for p in model.parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
        params.append(full.detach().clone())
    if rank == 0:
        torch.save(params, for_backend(args.out, backend))
        if args.overlap_out:
            with open(for_backend(args.overlap_out, backend), "w") as f:
                f.write(f"{sum(still_running)} {len(still_running)}\n")
    dist.barrier()
    dist.destroy_process_group()


names = args.backend.split(",")
# Each run's default group has the same name and store prefix (destroy_process_group resets
# them): a backend run twice would meet its first run's keys.
if len(set(names)) != len(names):
    parser.error(f"--backend names a backend twice: {args.backend}")
for name in names:
    train(name)
