"""tutti inside Ray: a collective backend and an RDT tensor transport, both named "TUTTI".

    import ray, tutti.ray
    tutti.ray.register()                        # in the driver, before creating actors
    ray.init(runtime_env={"worker_process_setup_hook": "tutti.ray.register"})  # and in actors

Then, inside actors, ``ray.util.collective.init_collective_group(world, rank, backend="tutti",
group_name=...)`` (or ``create_collective_group(actors, world, ranks, backend="tutti")`` from the
driver) makes every ``ray.util.collective`` call on that group run on tutti, and
``@ray.method(tensor_transport="tutti")`` (actors declared with
``@ray.remote(enable_tensor_transport=True)``, the consuming actors too: Ray runs the fetch on
the system thread that option creates) moves torch tensors through tutti's one-sided
transport: CUDA tensors by cuda_ipc between actors that see the same GPU; CPU tensors by shm
between actors on one node, and across nodes the socket transport over TCP (each worker's agent
listens on its node's IP, its refs signed and its connections proven with a
secret the cluster's workers share through Ray's internal KV; ``TUTTI_RAY_TRANSFER_TRANSPORT``
names another transport for puts, e.g. "ucx" with ``TUTTI_PLUGINS=ucx``). Ray needs the
collective backend registered in every process that uses it (the setup
hook above does that); the tensor transport Ray registers on actors itself.
"""

import warnings
from typing import Optional

from . import _group, _transport
from ._group import TuttiGroup
from ._transport import TuttiTensorTransport, transport_agent, wait_tensor_freed

NAME = "TUTTI"
_warned_no_torch = False


def register(timeout: Optional[float] = None, collective: bool = True,
             tensor_transport: bool = True) -> None:
    """Registers TuttiGroup as Ray's collective backend "TUTTI" and TuttiTensorTransport as the
    RDT tensor transport "TUTTI" in this process. Idempotent. timeout: seconds each op and the
    rendezvous may take in groups this process makes (default 30, or TUTTI_RAY_TIMEOUT_S). The
    actors make their own groups: for them, set TUTTI_RAY_TIMEOUT_S in the job's runtime_env
    (``env_vars``), which the worker setup hook's register() reads. Without torch, only the
    collective backend is registered (numpy is all it needs), with a warning saying so."""
    if timeout is not None:
        _group.DEFAULT_TIMEOUT_S = float(timeout)
    if tensor_transport:
        _transport.serve_other_nodes()
    if collective:
        from ray.util.collective.backend_registry import _global_registry, register_collective_backend

        if not _global_registry.is_registered(NAME):
            register_collective_backend(NAME, TuttiGroup)
    if tensor_transport:
        try:
            import torch
        except ImportError:
            # The collective backend needs numpy only; the tensor transport moves torch tensors.
            global _warned_no_torch
            if not _warned_no_torch:
                _warned_no_torch = True
                warnings.warn("tutti.ray: torch is not importable, so the tensor transport "
                              "'TUTTI' is not registered (the collective backend is); install "
                              "torch for tensor_transport='tutti', or pass "
                              "tensor_transport=False", RuntimeWarning, stacklevel=2)
            return
        from ray.experimental import register_tensor_transport
        from ray.experimental.rdt import util as rdt_util

        rdt_util._ensure_default_transports_registered()
        if NAME not in rdt_util.transport_manager_info:
            register_tensor_transport(NAME, ["cpu", "cuda"], TuttiTensorTransport, torch.Tensor)


def allocate_symmetric(nbytes: int, dtype: str = "uint8", group_name: str = "default",
                       framework: Optional[str] = None):
    """Collective, inside the actors of a ray.util.collective group on tutti: every rank calls it
    with the same nbytes, in the same place among the group's ops. Returns a zeroed 1-D numpy
    array (or torch tensor, framework="torch") in symmetric memory: where every rank's tensor
    lies in such memory, ``ray.util.collective.allreduce`` (and reduce, allgather, reducescatter,
    broadcast) on one node copies once instead of three times, several times faster above
    16 KiB. Where the group's backend has no such memory (across nodes) it is ordinary memory.
    Allocate once and reuse; ``tutti.ray.is_symmetric`` says where an array lies."""
    return _tutti_group(group_name, "allocate_symmetric").allocate_symmetric(nbytes, dtype,
                                                                              framework)


def is_symmetric(tensor, group_name: str = "default") -> bool:
    """Whether `tensor` lies in memory tutti.ray.allocate_symmetric gave for `group_name` (on
    this rank)."""
    return _tutti_group(group_name, "is_symmetric").tutti_group.is_symmetric(tensor)


def _tutti_group(group_name: str, what: str) -> TuttiGroup:
    from ray.util import collective

    g = collective.get_group_handle(group_name)
    if not isinstance(g, TuttiGroup):
        raise TypeError(f"tutti.ray.{what}: the collective group '{group_name}' runs on "
                        f"{type(g).__name__}, not on tutti (backend=\"tutti\")")
    return g


__all__ = ["NAME", "TuttiGroup", "TuttiTensorTransport", "allocate_symmetric", "is_symmetric",
           "register", "transport_agent", "wait_tensor_freed"]
