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


def empty_symmetric(*size, dtype=torch.float32, group=None) -> torch.Tensor:
    """A zeroed CPU tensor in tutti's symmetric memory for `group` (default: the default group),
    whose backend must be "tutti". Collective: every rank calls it with the same size and dtype,
    in the same place in the group's op order. Where every rank's tensor of an op is in such
    memory, tutti's shm backend (and hier's host level) reduces and copies it without staging
    (CollectiveGroup::allocate_symmetric: several times faster above 16 KiB); elsewhere it is
    ordinary memory. The memory goes with the tensor; allocate once and reuse.

        grads = tutti.torch.empty_symmetric(1 << 20)
        dist.all_reduce(grads)
    """
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    backend = _tutti_backend(group, "empty_symmetric")
    return backend.empty_symmetric([int(s) for s in size], dtype)


def is_symmetric(tensor: torch.Tensor, group=None) -> bool:
    """Whether `tensor` lies in the symmetric memory tutti.torch.empty_symmetric gave for `group`
    (default: the default group) on this rank: where that holds on every rank, an op on it copies
    once. False for CUDA and non-contiguous tensors."""
    return _tutti_backend(group, "is_symmetric").is_symmetric(tensor)


def _tutti_backend(group, what: str) -> "TuttiBackend":
    pg = group if group is not None else dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    while not isinstance(backend, TuttiBackend) and hasattr(backend, "wrapped_pg"):
        backend = backend.wrapped_pg  # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps the backend
    if not isinstance(backend, TuttiBackend):
        raise ValueError(f"tutti.torch.{what}: the group's CPU backend is "
                         f"{type(backend).__name__}, not tutti's")
    return backend


register()

__all__ = ["NAME", "TuttiBackend", "empty_symmetric", "is_symmetric", "register"]
