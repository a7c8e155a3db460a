"""What tutti.ray's tensor transport does with an object's torch tensors, without Ray: checking
them and publishing them at the source, and fetching them at the destination (CPU tensors by shm
or the socket transport; CUDA tensors by cuda_ipc between processes that see the same GPU). Kept
apart from tutti.ray so that it runs, and is tested, where Ray is not installed (the GPU
machine)."""

import os
from typing import Any, Callable, List, Optional, Sequence, Tuple


def describe(ref) -> str:
    """The object a ref (its bytes, as Ray's metadata holds it) names, for messages."""
    from .transfer import TensorRef

    try:
        r = ref if isinstance(ref, TensorRef) else TensorRef.from_bytes(ref)
        return f"{r.object_id} of agent '{r.owner_name}'"
    except Exception:  # noqa: BLE001 (only for a message)
        return "(unreadable)"


def check(what: str, tensors: Sequence[Any]) -> str:
    """The kind of device the object's tensors are on ("cpu" or "cuda"); raises TypeError or
    ValueError, naming `what` and the item, for what tutti cannot move: a non-tensor, a tensor
    on another kind of device, or CPU and CUDA tensors in one object."""
    import torch

    # (is_cpu and is_cuda, not device.type: a thousand tensors' devices took 0.4 ms)
    kinds = set()
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: item {i} is a {type(t).__name__}, not a torch.Tensor")
        if t.is_cpu:
            kinds.add("cpu")
        elif t.is_cuda:
            kinds.add("cuda")
        else:
            raise ValueError(f"{what}: item {i} is on {t.device}; tutti moves CPU and CUDA "
                             f"tensors")
    if len(kinds) > 1:
        raise ValueError(f"{what}: the object holds both CPU and CUDA tensors; tutti moves one "
                         f"kind per object (put them in two objects)")
    return kinds.pop() if kinds else "cpu"


def transport_for(device: str) -> str:
    """The transport of puts: TUTTI_RAY_TRANSFER_TRANSPORT for CPU tensors and
    TUTTI_RAY_TRANSFER_TRANSPORT_CUDA for CUDA ones, each "auto" by default (shm or socket for
    CPU, cuda_ipc for CUDA)."""
    name = "TUTTI_RAY_TRANSFER_TRANSPORT" + ("_CUDA" if device == "cuda" else "")
    return os.environ.get(name, "auto")


def publish(agent, what: str, tensors: Sequence[Any],
            share: Optional[Callable[[Any], Optional[int]]] = None,
            device: Optional[str] = None) -> Tuple[Any, str, List[Any]]:
    """Publishes the object's tensors in place with `agent`; returns (handle, device kind, the
    storages `share` registered). A non-contiguous tensor is copied once into a contiguous one,
    which the object holds (put keeps what it is given); the consumer gets the same values in a
    contiguous tensor. `share(t)` (CPU only) registers a shareable storage, returning a key.
    `device`: what check() said of these tensors, where the caller called it (else it is called
    here)."""
    if device is None:
        device = check(what, tensors)
    tensors = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    shared = []
    if device == "cpu" and share is not None:
        shared = [k for k in (share(t) for t in tensors) if k is not None]
    if device == "cuda":
        # cuda_ipc orders a consumer's read after what the owner queued on each device's
        # default stream: work queued on torch's current stream (a side stream) joins it first.
        import torch

        for index in sorted({t.device.index for t in tensors}):
            torch.cuda.default_stream(index).wait_stream(torch.cuda.current_stream(index))
    handle = agent.put(tensors, transport=transport_for(device))
    return handle, device, shared


def fetch(agent, ref: bytes, device: Optional[str], tensor_meta: Sequence[Tuple[Any, Any]],
          targets: Optional[List[Any]], timeout: float, allow_fallback: bool):
    """Starts the get of an object's tensors; returns (the Fetch, its targets or None). CUDA
    tensors arrive in `targets`, or in new tensors on this process's current CUDA device; a
    cuda_ipc ref read on another host, or where the owner's GPU is not visible, fails naming why
    (there is no fallback for CUDA); so does a process that sees no CUDA device. CPU
    tensors arrive in `targets`, or as the source's shareable memory mapped copy-on-write (no
    copy) and fresh tensors for the rest."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"tensor_transport='tutti': the object of ref {describe(ref)} holds "
                             f"CUDA tensors, and this process sees no CUDA device")
        if not targets:
            where = torch.device("cuda", torch.cuda.current_device())
            targets = [torch.empty(tuple(shape), dtype=dtype, device=where)
                       for shape, dtype in tensor_meta]
        targets = list(targets)
        return agent.get_async(ref, targets=targets, timeout=timeout), targets
    if targets:
        targets = list(targets)
        return agent.get_async(ref, targets=targets, timeout=timeout,
                               allow_fallback=allow_fallback), targets
    return agent.get_async(ref, timeout=timeout, framework="torch", copy_on_write=True,
                           allow_fallback=allow_fallback), None


__all__ = ["check", "fetch", "publish", "transport_for"]
