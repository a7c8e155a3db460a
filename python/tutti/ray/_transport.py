"""TuttiTensorTransport: tutti's direct transport as a Ray RDT tensor transport ("TUTTI").

One-sided: the source actor publishes the tensors in place with its process's tutti.transfer agent
(transport_agent()) when Ray extracts the object's metadata (no copy; the reference travels in the
metadata), and the destination actor reads them itself (shm on one node; on another node the socket
transport, over TCP to the source's agent, which serve_other_nodes() set listening on its node's IP
with the cluster's transfer secret). TUTTI_RAY_TRANSFER_TRANSPORT names the transport of puts
(default "auto"; e.g. "ucx" with TUTTI_PLUGINS=ucx for one-sided gets across nodes). Ray frees the
object with garbage_collect, which releases the handle; tutti then keeps the tensors until no read
is in progress and no consumer maps them. Transfers can be aborted (a fetch in progress is
cancelled), so Ray does not kill actors on a failed transfer; a source that died fails the fetch
with tutti.IoError, which Ray hands to whoever uses the object.

Zero-copy where the memory allows it: tensors the source made in shareable memory
(tutti.transfer.empty, or any tensor after share_memory_(), whose storage is registered with the
agent at put) reach the destination as private copy-on-write mappings of the source's pages: no
byte moves until the destination writes a page (then that page is its own; the source never sees
it), and the object stays at the source until the destination's tensors go. Other tensors: one
cross-memory read into fresh tensors (or into Ray's target buffers).

CUDA tensors (registered for "cpu" and "cuda"): by cuda_ipc between actors that see the same GPU
(on one node; Ray gives each num_gpus=1 actor its own GPU, so give them a shared one), the
destination copying from the source's device memory into its own (Ray's target buffers, or new
tensors on its current CUDA device); across nodes a CUDA object fails its fetch, naming why (no
two-sided path yet: use tensor_transport="nccl" there). An object holds CPU or CUDA tensors, not
both. A non-contiguous tensor is made contiguous once at put (one copy); the rest travel in
place. The Ray-free part of this is tutti._rdt.
"""

import atexit
import os
import secrets
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import ray
from ray.experimental import CommunicatorMetadata, TensorTransportManager, TensorTransportMetadata
from ray.experimental.rdt.tensor_transport_manager import FetchRequest

import tutti
from tutti import _rdt, transfer

from . import _group

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


_SECRET_KEY = b"tutti:rdt:secret"

_agent_lock = threading.Lock()
# The transport's own agent, made only where this process's default agent predates the
# cluster's secret (see serve_other_nodes).
_own_agent = None


def transport_agent():
    """The agent that RDT objects of this process go through: tutti.transfer's default agent,
    unless that was made before Ray gave the process the cluster's secret (see
    serve_other_nodes)."""
    own = _own_agent
    return own if own is not None else transfer.default_agent()


def serve_other_nodes() -> None:
    """Before this process's transfer agent exists: lets it serve consumers on other nodes (TCP on
    the node's IP) and sign refs with a secret all of the cluster's workers share (made once,
    kept in Ray's internal KV: one per cluster, readable by whoever can reach its GCS).
    Needs a connected Ray process; elsewhere (a driver before ray.init) it does nothing, and the
    transport calls it again when Ray first makes it. What the environment already says is kept:
    TUTTI_TRANSFER_SECRET or TUTTI_STORE_SECRET set by the user (for processes outside Ray that
    exchange refs with the workers) is used as is. A process whose default agent already exists
    without a secret or a listener (it used tutti.transfer before Ray made the transport) keeps
    it for its own refs, and gets a second agent, with the secret and the TCP listener, for Ray's
    objects (transport_agent()); tensors it allocated with transfer.empty() from the default
    agent then reach Ray's consumers by a copy, not in place (allocate them with
    agent=transport_agent() instead)."""
    global _own_agent
    if not ray.is_initialized():
        return
    with _agent_lock:
        if _own_agent is not None:
            return
        has_secret = "TUTTI_TRANSFER_SECRET" in os.environ or "TUTTI_STORE_SECRET" in os.environ
        says_listen = "TUTTI_TRANSFER_LISTEN_TCP" in os.environ
        predates = transfer.default_agent_made()
        if predates and has_secret and says_listen:
            return  # made as the environment has every process of the job make it
        if not has_secret:
            kv = _group._kv()
            # The first writer wins (the GCS puts atomically); everyone reads what won.
            kv._internal_kv_put(_SECRET_KEY, secrets.token_hex(32).encode(), overwrite=False)
            os.environ["TUTTI_TRANSFER_SECRET"] = kv._internal_kv_get(_SECRET_KEY).decode()
        if not says_listen:
            # The node's address as the collective groups give it to their store (one
            # override, TUTTI_RAY_NODE_ADDRESS, for both).
            os.environ["TUTTI_TRANSFER_LISTEN_TCP"] = _group._node_address()
        if not predates:
            return
        # As tutti.transfer's default agent reads the environment: "0" or nothing, no listener;
        # "1", the default address; else the address to listen on. The secret from it too.
        listen = os.environ["TUTTI_TRANSFER_LISTEN_TCP"]
        _own_agent = transfer.TransferAgent(f"ray-rdt:{os.getpid()}",
                                            listen_tcp=listen not in ("", "0"),
                                            tcp_host="" if listen in ("", "0", "1") else listen)
        # Stopped at exit, before the interpreter tears the bindings down (nanobind would
        # report the agent as leaked).
        atexit.register(_drop_own_agent)


def _drop_own_agent() -> None:
    global _own_agent
    with _agent_lock:
        _own_agent = None


def _allow_fallback() -> bool:
    """A one-host ref (shm) read from another node goes over the socket transport instead, unless
    TUTTI_RAY_TRANSFER_FALLBACK=0 (then such a get fails, naming why)."""
    return os.environ.get("TUTTI_RAY_TRANSFER_FALLBACK", "1") != "0"


def _fetch_timeout_s() -> Optional[float]:
    """Ray's RDT fetch timeout (seconds), or None (the agent's own) where Ray sets none."""
    try:
        from ray._private import ray_constants

        seconds = float(ray_constants.RDT_FETCH_FAIL_TIMEOUT_SECONDS)
    except Exception:
        return 60.0
    return seconds if seconds > 0 else None


class TuttiTensorTransport(TensorTransportManager):
    def __init__(self):
        # Ray makes this in each process that first moves an object through it (a driver that
        # registered before ray.init gets its secret here), before the agent exists.
        serve_other_nodes()
        self._lock = threading.Lock()
        # Held across a storage's registration and its release, agent calls included: two
        # threads must not both register a storage, nor one unregister what another just took.
        self._regions_lock = threading.Lock()
        self._handles: Dict[str, Any] = {}  # obj_id -> ObjectHandle (source side)
        self._fetches: Dict[str, Any] = {}  # obj_id -> Fetch in progress (destination side)
        # Shared storages registered with the agent (source side), by data pointer: the region
        # (which keeps the storage alive while registered) and how many live objects use it.
        self._regions: Dict[int, List[Any]] = {}
        self._storages_of: Dict[str, List[int]] = {}  # obj_id -> the registered storages it uses

    def _register_shared(self, agent, t) -> Optional[int]:
        """Registers the storage of a share_memory_() tensor with the agent (once per storage),
        so destinations map it instead of copying; its data pointer, or None."""
        # (The storage's own is_shared: Tensor.is_shared() makes a TypedStorage first, 1 us a
        # tensor, 10x this.)
        storage = t.untyped_storage()
        if not storage.is_shared():
            return None
        ptr = storage.data_ptr()
        if storage.nbytes() == 0:
            return None
        with self._regions_lock:
            entry = self._regions.get(ptr)
            if entry is not None:
                entry[1] += 1
                return ptr
            try:
                fd, _ = storage._share_fd_cpu_()
            except Exception:  # noqa: BLE001 (shared by file name: copied like any other tensor)
                return None
            import torch

            region = torch.empty(0, dtype=torch.uint8).set_(storage)
            agent.register_memory(region, fd, 0)
            self._regions[ptr] = [region, 1]
            return ptr

    def _release_storages(self, agent, ptrs: List[int]) -> None:
        """One object fewer uses these storages; unregisters those no object uses any more (a
        storage a destination still maps stays registered until a later call finds it free)."""
        with self._regions_lock:
            for ptr in ptrs:
                if ptr in self._regions:
                    self._regions[ptr][1] -= 1
            for ptr, entry in [(p, e) for p, e in self._regions.items() if e[1] <= 0]:
                try:
                    agent.unregister_memory(entry[0])
                except tutti.InvalidUsageError:
                    continue  # still mapped by a destination: try again later
                except tutti.Error:  # noqa: BLE001 (no longer registered: nothing to keep)
                    pass
                del self._regions[ptr]

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
        tensors = list(rdt_object)
        what = f"tensor_transport='tutti' (object {obj_id})"
        device = _rdt.check(what, tensors)
        meta = [(t.shape, t.dtype) for t in tensors]
        if not tensors:
            return TuttiTransportMetadata(tensor_meta=[], tensor_device=None, ref=b"")
        # Contiguous tensors are published in place; a non-contiguous one (a transpose, a slice
        # with a step) is copied once, as from Ray's object store (see _rdt.publish).
        agent = transport_agent()
        registered: List[int] = []

        def share(t):
            ptr = self._register_shared(agent, t)
            if ptr is not None:
                registered.append(ptr)
            return ptr

        try:
            handle, device, storages = _rdt.publish(agent, what, tensors, share, device)
        except BaseException:
            # The put failed (a transport the agent does not have, say): the storages it counted
            # are not this object's, or they would stay registered for the process's life.
            if registered:
                self._release_storages(agent, registered)
            raise
        with self._lock:
            self._handles[obj_id] = handle
            if storages:
                self._storages_of[obj_id] = storages
        return TuttiTransportMetadata(tensor_meta=meta, tensor_device=device,
                                      ref=handle.ref.to_bytes())

    def get_communicator_metadata(self, src_actor, dst_actor, backend: Optional[str] = None):
        return TuttiCommunicatorMetadata()

    def fetch_multiple_tensors(self, obj_id: str, tensor_transport_metadata,
                               communicator_metadata, target_buffers: Optional[List[Any]] = None):
        meta = tensor_transport_metadata
        if not meta.tensor_meta:
            return FetchRequest(obj_id=obj_id, tensors=[])
        fetch, targets = _rdt.fetch(transport_agent(), meta.ref, meta.tensor_device,
                                    meta.tensor_meta, target_buffers, _fetch_timeout_s(),
                                    _allow_fallback())
        with self._lock:
            # Fetches that ended are dropped here too: one whose wait timed out stays until it
            # ends (Ray's ray.get gives such a request up without abort_transport).
            for done in [k for k, f in self._fetches.items() if f.done()]:
                del self._fetches[done]
            replaced = self._fetches.pop(obj_id, None)
            self._fetches[obj_id] = fetch
        # Outside the lock: a replaced fetch still running is cancelled and waited for as it goes.
        del replaced
        request = TuttiFetchRequest(obj_id=obj_id, tensors=targets or [], fetch=fetch)
        # Ray drops the request when it gives up on the get (ray.get's timeout) without calling
        # abort_transport: the fetch then ends with it, before Ray's caller may reuse the targets.
        weakref.finalize(request, _end_fetch, fetch, os.getpid())
        return request

    def wait_fetch_complete(self, fetch_request, timeout: float = -1) -> List[Any]:
        fetch = getattr(fetch_request, "fetch", None)
        if fetch is None:
            return fetch_request.tensors
        # Ray's timeout (seconds; negative or None: none) bounds this wait; the get's own timeout
        # (Ray's RDT fetch timeout, set at fetch) bounds it in any case. A wait that times out
        # raises TimeoutError (tutti.TimeoutError is one) and leaves the fetch running, where
        # abort_transport still finds it.
        if timeout == 0 and not fetch.done():
            raise TimeoutError(f"tutti: fetch of object {fetch_request.obj_id} not done")
        try:
            if timeout is None or timeout <= 0:
                return fetch.wait()
            return fetch.wait(timeout=timeout)
        finally:
            if fetch.done():
                self._forget_fetch(fetch_request.obj_id, fetch)

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
            storages = self._storages_of.pop(obj_id, [])
        if handle is not None:
            handle.release()
        if storages or self._regions:
            self._release_storages(transport_agent(), storages)

    def abort_transport(self, obj_id: str, communicator_metadata):
        with self._lock:
            fetch = self._fetches.get(obj_id)
        if fetch is not None:
            # Ended before Ray may reuse the targets: the cancel, then the get's end (its
            # kAborted, or what it reached first).
            fetch.cancel()
            try:
                fetch.wait()
            except Exception:  # noqa: BLE001 (the get's error is nobody's now)
                pass
            self._forget_fetch(obj_id, fetch)

    def _forget_fetch(self, obj_id: str, fetch) -> None:
        """Drops obj_id's entry if it is still this fetch (a newer fetch of it stays)."""
        with self._lock:
            if self._fetches.get(obj_id) is fetch:
                del self._fetches[obj_id]


def _end_fetch(fetch, pid: int) -> None:
    """A fetch whose request Ray dropped: cancelled, and waited for, unless it ended (or this is
    a forked child at its exit: the get's thread is the parent's)."""
    if os.getpid() != pid or fetch.done():
        return
    fetch.cancel()
    try:
        fetch.wait()
    except Exception:  # noqa: BLE001 (the get's end is nobody's now)
        pass


def wait_tensor_freed(tensor, timeout: Optional[float] = None) -> None:
    """Ray's wait_tensor_freed, then tutti's: returns once no RDT object holds the tensor and no
    tutti read of it is in progress, so the tensor may be written again."""
    import time

    from ray.experimental import wait_tensor_freed as ray_wait

    start = time.monotonic()
    ray_wait(tensor, timeout=timeout)
    remaining = None if timeout is None else max(timeout - (time.monotonic() - start), 0.0)
    transport_agent().wait_tensor_freed(tensor, remaining)
