"""TuttiTensorTransport: tutti's direct transport as a Ray RDT tensor transport ("TUTTI").

One-sided: the source actor publishes the tensors in place with its process's
tutti.transfer agent when Ray extracts the object's metadata (no copy; the reference travels in
the metadata), and the destination actor reads them itself (shm on one host: a cross-memory
read straight into the tensors it returns; the socket transport elsewhere). Ray frees the
object with garbage_collect, which releases the handle; tutti then keeps the tensors until no
read is in progress. Transfers can be aborted (a fetch in progress is cancelled), so Ray does
not kill actors on a failed transfer; a source that died fails the fetch with tutti.IoError,
which Ray hands to whoever uses the object.

CPU torch tensors only: tutti's direct transport has no CUDA path through Ray yet. A
non-contiguous tensor is made contiguous once at put (one copy); the rest travel in place.
"""

import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import ray
from ray.experimental import CommunicatorMetadata, TensorTransportManager, TensorTransportMetadata
from ray.experimental.rdt.tensor_transport_manager import FetchRequest

import tutti
from tutti import transfer

NAME = "TUTTI"


@dataclass
class TuttiTransportMetadata(TensorTransportMetadata):
    """Ray's metadata plus the tutti.transfer.TensorRef of the published tensors (bytes)."""

    ref: bytes = b""


@dataclass
class TuttiCommunicatorMetadata(CommunicatorMetadata):
    """Nothing: one-sided transfers need no communicator."""


@dataclass
class TuttiFetchRequest(FetchRequest):
    fetch: Any = None


def _fetch_timeout_s() -> float:
    try:
        from ray._private import ray_constants

        return float(ray_constants.RDT_FETCH_FAIL_TIMEOUT_SECONDS)
    except Exception:
        return 60.0


class TuttiTensorTransport(TensorTransportManager):
    def __init__(self):
        self._lock = threading.Lock()
        self._handles: Dict[str, Any] = {}  # obj_id -> ObjectHandle (source side)
        self._fetches: Dict[str, Any] = {}  # obj_id -> Fetch in progress (destination side)

    def tensor_transport_backend(self) -> str:
        return NAME

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return True

    def actor_has_tensor_transport(self, actor: "ray.actor.ActorHandle") -> bool:
        # Every process that can import tutti has it; asking the actor would block here.
        return True

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: List[Any]):
        import torch

        tensors = list(rdt_object)
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"tensor_transport='tutti' (object {obj_id}): item {i} is a "
                                f"{type(t).__name__}, not a torch.Tensor")
            if t.device.type != "cpu":
                raise ValueError(f"tensor_transport='tutti' (object {obj_id}): item {i} is on "
                                 f"{t.device}; tutti's direct transport moves CPU tensors "
                                 f"(use tensor_transport='nccl' or 'cuda_ipc' for CUDA)")
        meta = [(t.shape, t.dtype) for t in tensors]
        if not tensors:
            return TuttiTransportMetadata(tensor_meta=[], tensor_device=None, ref=b"")
        # A non-contiguous tensor (a transpose, a slice with a step) is copied once into a
        # contiguous one, which the object then holds (put keeps what it is given): the consumer
        # gets the same values in a contiguous tensor, as from Ray's object store. Contiguous
        # tensors are published in place.
        tensors = [t if t.is_contiguous() else t.contiguous() for t in tensors]
        handle = transfer.default_agent().put(tensors)
        with self._lock:
            self._handles[obj_id] = handle
        return TuttiTransportMetadata(tensor_meta=meta, tensor_device="cpu",
                                      ref=handle.ref.to_bytes())

    def get_communicator_metadata(self, src_actor, dst_actor, backend: Optional[str] = None):
        return TuttiCommunicatorMetadata()

    def fetch_multiple_tensors(self, obj_id: str, tensor_transport_metadata,
                               communicator_metadata, target_buffers: Optional[List[Any]] = None):
        import torch

        meta = tensor_transport_metadata
        if not meta.tensor_meta:
            return FetchRequest(obj_id=obj_id, tensors=[])
        targets = list(target_buffers) if target_buffers else [
            torch.empty(shape, dtype=dtype) for shape, dtype in meta.tensor_meta
        ]
        fetch = transfer.default_agent().get_async(meta.ref, targets=targets,
                                                   timeout=_fetch_timeout_s())
        with self._lock:
            self._fetches[obj_id] = fetch
        return TuttiFetchRequest(obj_id=obj_id, tensors=targets, fetch=fetch)

    def wait_fetch_complete(self, fetch_request, timeout: float = -1) -> List[Any]:
        fetch = getattr(fetch_request, "fetch", None)
        if fetch is None:
            return fetch_request.tensors
        try:
            if timeout == 0 and not fetch.done():
                raise TimeoutError(f"tutti: fetch of object {fetch_request.obj_id} not done")
            # Bounded by the get's own timeout (Ray's RDT fetch timeout, set at fetch).
            return fetch.wait()
        finally:
            with self._lock:
                if self._fetches.get(fetch_request.obj_id) is fetch:
                    del self._fetches[fetch_request.obj_id]

    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata,
                              communicator_metadata, target_buffers: Optional[List[Any]] = None):
        request = self.fetch_multiple_tensors(obj_id, tensor_transport_metadata,
                                              communicator_metadata, target_buffers)
        return self.wait_fetch_complete(request)

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        raise NotImplementedError("tutti's transport is one-sided: Ray never sends through it")

    def garbage_collect(self, obj_id: str, tensor_transport_meta, tensors: List[Any]):
        with self._lock:
            handle = self._handles.pop(obj_id, None)
        if handle is not None:
            handle.release()

    def abort_transport(self, obj_id: str, communicator_metadata):
        with self._lock:
            fetch = self._fetches.get(obj_id)
        if fetch is not None:
            fetch.cancel()


def wait_tensor_freed(tensor, timeout: Optional[float] = None) -> None:
    """Ray's wait_tensor_freed, then tutti's: returns once no RDT object holds the tensor and no
    tutti read of it is in progress, so the tensor may be written again."""
    import time

    from ray.experimental import wait_tensor_freed as ray_wait

    start = time.monotonic()
    ray_wait(tensor, timeout=timeout)
    remaining = None if timeout is None else max(timeout - (time.monotonic() - start), 0.0)
    transfer.default_agent().wait_tensor_freed(tensor, remaining)
