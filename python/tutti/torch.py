"""tutti as a torch.distributed backend: ``import tutti.torch`` registers backend "tutti".

    import torch
    import torch.distributed as dist
    import tutti.torch                        # registers "tutti"

    dist.init_process_group("tutti")          # under torchrun: env:// (torch's TCPStore)
    t = torch.ones(4)
    dist.all_reduce(t)                        # every c10d op; DDP and FSDP2 run on it

    torchrun --nproc-per-node 2 train.py      # as with "gloo"

The process group's own store (torchrun's TCPStore, or ``store=`` given to
init_process_group) carries tutti's rendezvous: no second server. TUTTI_BACKEND chooses
tutti's backend for CPU tensors (default "auto": shm between the processes of one host, hier or
gloo across hosts); CUDA tensors go to tutti's NCCL backend where it is available. Timeouts are
init_process_group(timeout=)'s. Errors are torch.distributed.DistBackendError carrying tutti's
message (group, rank, op, offending value).

Built against the torch installed when tutti was built (torch's C++ ABI is per version):
``pip install --no-build-isolation ./python`` in the environment that has torch.
"""

import os

import torch
import torch.distributed as dist

try:
    from . import _torch
except ImportError as e:  # built where torch was not importable, or against another torch
    raise ImportError(
        f"tutti.torch: this tutti has no torch.distributed backend for torch "
        f"{torch.__version__} ({e}); reinstall tutti in this environment with "
        f"`pip install --no-build-isolation ./python` (torch must be importable while it builds)"
    ) from e

from . import is_backend_available

NAME = "tutti"
TuttiBackend = _torch.TuttiBackend


def _create(opts, backend_options):
    """torch's creator (extended API): one TuttiBackend per process group."""
    timeout = opts.timeout
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    return _torch.create(opts.store, opts.group_rank, opts.group_size, seconds,
                         os.environ.get("TUTTI_BACKEND", "auto"), opts.group_id or "")


def register() -> None:
    """Registers backend "tutti" with torch.distributed (for CPU tensors, and CUDA tensors where
    tutti's NCCL backend is available). Idempotent; importing tutti.torch calls it."""
    if NAME in dist.Backend.backend_list:
        return
    devices = ["cpu"]
    if torch.cuda.is_available() and is_backend_available("nccl"):
        devices.append("cuda")
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=devices)


register()

__all__ = ["NAME", "TuttiBackend", "register"]
