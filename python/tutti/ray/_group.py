"""TuttiGroup: tutti as a ray.util.collective backend (a BaseGroup registered as "TUTTI").

Rendezvous (no server to start by hand): rank 0 hosts tutti's embedded TCP store in its own
process, on a free port of every interface, guarded by a random secret, and publishes
"port, secret, node" in Ray's internal KV under ``tutti:group:<Ray namespace>:<name>``; the
other ranks read it there (waiting up to the group's timeout, and again while what they read
does not answer: a killed incarnation's entry), connect (over loopback when they share rank 0's Ray
node, else to rank 0's node address) and meet in the store. Every incarnation of a group name
gets its own secret, which also scopes the store's keys, so a re-created group never meets a
stale one; rank 0 deletes the KV entry once the group has formed, and on destroy.

Backends: "auto" for CPU tensors (shm between actors on one node, Gloo across nodes), and for
CUDA tensors a subgroup with the "nccl" backend, split off on the first CUDA op (every rank's
first CUDA op is the same op, so all ranks split together).

Threads: a tutti CPU group takes its ops from one thread (its creator, or whoever called
issue_from_this_thread last); ops from any other thread fail with tutti.InvalidUsageError. Ray
does not promise one thread: a threaded actor (max_concurrency > 1) runs each task on a thread of
its pool, an async actor on its event loop's thread, concurrency groups on their own threads, and
a group declared with create_collective_group is made inside whichever task first uses it. Ray's
own contract is the one that matters for correctness: every rank issues a group's ops in the same
order, which holds when the actor issues them one at a time. So each op of a TuttiGroup runs
under the group's lock and first hands the tutti group to the calling thread (a cheap check; the
hand-over only when the thread changed). Ops of one actor from two threads at once are thereby
serialised, not refused; their order across ranks is the application's to keep, as with Ray's
gloo and nccl groups.
"""

import os
import secrets
import threading
import time
from typing import Any, List, Optional

import numpy as np
import ray
from ray.util.collective.collective_group.base_collective_group import BaseGroup
from ray.util.collective.types import (
    AllGatherOptions,
    AllReduceOptions,
    BarrierOptions,
    BroadcastOptions,
    RecvOptions,
    ReduceOp as RayReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    SendOptions,
    unset_timeout_ms,
)

import tutti

# Seconds every op and the rendezvous may take (Ray passes no timeout to custom backends);
# tutti.ray.register(timeout=...) or TUTTI_RAY_TIMEOUT_S change it.
DEFAULT_TIMEOUT_S = float(os.environ.get("TUTTI_RAY_TIMEOUT_S", "30"))
_KV_PREFIX = "tutti:group:"


def _kv():
    import ray.experimental.internal_kv as kv

    return kv


def _group_key(group_name: str) -> str:
    """The group's entry in Ray's internal KV, under the job's Ray namespace, as Ray's own groups
    are (a job without one has an anonymous namespace of its own): two jobs that each make a
    group "default" must never read each other's store (their ranks would meet in one group)."""
    try:
        namespace = ray.get_runtime_context().namespace or ""
    except Exception:  # noqa: BLE001 (not connected: the key is never used then)
        namespace = ""
    return f"{_KV_PREFIX}{namespace}:{group_name}"


def _node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def _node_address() -> str:
    """This node's address for tutti's own listeners: a group's store (hosted by its rank 0) and the
    transfer agent's TCP listener. Ray's node IP unless TUTTI_RAY_NODE_ADDRESS names another
    (a node whose Ray address is not the one its peers reach it on for bulk traffic)."""
    override = os.environ.get("TUTTI_RAY_NODE_ADDRESS") or os.environ.get("TUTTI_RAY_STORE_HOST")
    if override:
        return override
    return ray.util.get_node_ip_address()


def _timeout_s(options) -> Optional[float]:
    """An op's timeout from Ray's options (timedelta; negative = unset)."""
    value = getattr(options, "timeout_ms", None) if options is not None else None
    if value is None or value is unset_timeout_ms:
        return None
    seconds = value.total_seconds() if hasattr(value, "total_seconds") else float(value) / 1000
    return seconds if seconds >= 0 else None


# Ray's ReduceOp to tutti's, looked up once per op instead of parsed by name in the bindings.
_REDUCE_OPS = {RayReduceOp.SUM: tutti.ReduceOp.SUM, RayReduceOp.PRODUCT: tutti.ReduceOp.PRODUCT,
               RayReduceOp.MIN: tutti.ReduceOp.MIN, RayReduceOp.MAX: tutti.ReduceOp.MAX}


def _reduce_op(options) -> Any:
    op = getattr(options, "reduceOp", None) if options is not None else None
    if op is None:
        return tutti.ReduceOp.SUM
    # Anything else (tutti's own, a name): the bindings take it or name it in their error.
    return _REDUCE_OPS.get(op, op)


def _is_cuda(tensor) -> bool:
    if type(tensor) is np.ndarray:
        return False
    device = getattr(tensor, "device", None)
    return getattr(device, "type", None) == "cuda" or str(device).startswith("cuda")


class TuttiGroup(BaseGroup):
    """A ray.util.collective group whose every op runs on tutti."""

    def __init__(self, world_size: int, rank: int, group_name: str, timeout_s: Optional[float] = None):
        super().__init__(world_size, rank, group_name)
        self._timeout = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
        self._key = _group_key(group_name)
        self._store = None
        self._cuda = None
        self._token = ""
        self._lock = threading.Lock()
        self._thread = threading.get_ident()  # the thread the tutti group takes ops from
        try:
            self._store = self._rendezvous()
            self._cpu = tutti.CollectiveGroup.create(
                world_size,
                rank,
                os.environ.get("TUTTI_RAY_BACKEND", "auto"),
                group_name,
                store=self._store,
                timeout=self._timeout,
                job_id=self._token,
            )
        finally:
            if rank == 0:
                # Formed (every rank read the entry) or failed: either way it is spent.
                self._delete_key()

    # ---- threads ----

    def __enter__(self):
        """Serialises this group's ops and hands the tutti group to the calling thread."""
        self._lock.acquire()
        thread = threading.get_ident()
        if thread != self._thread:
            try:
                self._cpu.issue_from_this_thread()
            except BaseException:
                self._lock.release()
                raise
            self._thread = thread
        return self

    def __exit__(self, *exc):
        self._lock.release()
        return False

    # ---- rendezvous ----

    def _rendezvous(self) -> "tutti.Store":
        kv = _kv()
        if self.rank == 0:
            self._token = secrets.token_hex(16)
            store = tutti.TCPStore("0.0.0.0", 0, True, timeout=self._timeout, secret=self._token)
            value = f"{store.port}\n{self._token}\n{_node_id()}\n{_node_address()}"
            kv._internal_kv_put(self._key, value, overwrite=True)
            return store
        deadline = time.monotonic() + self._timeout
        delay = 0.001
        last_error = None
        while True:
            value = kv._internal_kv_get(self._key)
            if value is not None:
                port, token, node, address = value.decode().split("\n")
                host = "127.0.0.1" if node == _node_id() else address
                remaining = max(deadline - time.monotonic(), 0.001)
                # A few seconds per try: the entry may be a dead incarnation's (its rank 0 was
                # killed before deleting it), whose port nobody answers, or another store now
                # answers there (refusing this secret). Then the KV is read again, where the new
                # rank 0 writes its entry, until the timeout.
                try:
                    store = tutti.TCPStore(host, int(port), timeout=min(3.0, remaining),
                                           secret=token)
                    store.check(["tutti:ray:reached"])  # the client connects on its first request
                except (tutti.TimeoutError, tutti.IoError, tutti.InvalidArgumentError) as e:
                    last_error = e
                else:
                    store.timeout = self._timeout  # later requests get the group's whole timeout
                    self._token = token
                    return store
            if time.monotonic() >= deadline:
                said = (f"rank 0 did not publish its store in Ray's internal KV ('{self._key}')"
                        if last_error is None else
                        f"the store rank 0 published in Ray's internal KV ('{self._key}') did not "
                        f"answer: {last_error}")
                raise tutti.TimeoutError(
                    f"init_collective_group on group '{self.group_name}' (rank {self.rank}/"
                    f"{self.world_size}), backend TUTTI: {said} within {self._timeout:g} s")
            time.sleep(delay)  # Ray's KV has no blocking get: back off, at most 50 ms
            delay = min(delay * 2, 0.05)

    def _delete_key(self) -> None:
        try:
            _kv()._internal_kv_del(self._key)
        except Exception:  # the cluster may be going down; the key is harmless then
            pass

    # ---- BaseGroup ----

    @classmethod
    def backend(cls):
        return "TUTTI"

    @classmethod
    def check_backend_availability(cls) -> bool:
        return True

    def destroy_group(self):
        if self._cuda is not None:
            self._cuda.destroy()
        self._cpu.destroy()
        if self.rank == 0:
            self._delete_key()

    @property
    def tutti_group(self) -> "tutti.CollectiveGroup":
        """The tutti group behind CPU ops."""
        return self._cpu

    def allocate_symmetric(self, nbytes: int, dtype: str = "uint8",
                           framework: Optional[str] = None):
        """tutti.CollectiveGroup.allocate_symmetric on this group's CPU ranks (see
        tutti.ray.allocate_symmetric)."""
        with self:
            return self._cpu.allocate_symmetric(nbytes, dtype, framework)

    def _group(self, tensors: List[Any]) -> "tutti.CollectiveGroup":
        if tensors and _is_cuda(tensors[0]):
            if self._cuda is None:
                self._cuda = self._cpu.split(list(range(self.world_size)),
                                             name=self.group_name + ".cuda", backend="nccl")
            return self._cuda
        return self._cpu

    def allreduce(self, tensor, allreduce_options: Optional[AllReduceOptions] = None):
        with self:
            g = self._group(tensor)
            op, timeout = _reduce_op(allreduce_options), _timeout_s(allreduce_options)
            if len(tensor) == 1:
                g.allreduce(tensor[0], op, timeout=timeout)
            else:
                g.allreduce_multigpu(tensor, op, timeout=timeout)

    def barrier(self, barrier_options: Optional[BarrierOptions] = None):
        with self:
            self._cpu.barrier(timeout=_timeout_s(barrier_options))

    def reduce(self, tensor, reduce_options: Optional[ReduceOptions] = None):
        with self:
            o = reduce_options or ReduceOptions()
            g = self._group(tensor)
            if len(tensor) == 1:
                g.reduce(tensor[0], o.root_rank, _reduce_op(o), timeout=_timeout_s(o))
            else:
                g.reduce_multigpu(tensor, o.root_rank, o.root_tensor, _reduce_op(o),
                                  timeout=_timeout_s(o))

    def broadcast(self, tensor, broadcast_options: Optional[BroadcastOptions] = None):
        with self:
            o = broadcast_options or BroadcastOptions()
            g = self._group(tensor)
            if len(tensor) == 1:
                g.broadcast(tensor[0], o.root_rank, timeout=_timeout_s(o))
            else:
                g.broadcast_multigpu(tensor, o.root_rank, o.root_tensor, timeout=_timeout_s(o))

    def allgather(self, tensor_lists, tensor, allgather_options: Optional[AllGatherOptions] = None):
        with self:
            g = self._group(tensor)
            timeout = _timeout_s(allgather_options)
            if len(tensor) == 1:
                g.allgather(tensor_lists[0], tensor[0], timeout=timeout)
            else:
                g.allgather_multigpu(tensor_lists, tensor, timeout=timeout)

    def reducescatter(self, tensor, tensor_lists,
                      reducescatter_options: Optional[ReduceScatterOptions] = None):
        with self:
            g = self._group(tensor)
            op, timeout = _reduce_op(reducescatter_options), _timeout_s(reducescatter_options)
            if len(tensor) == 1:
                g.reduce_scatter(tensor[0], tensor_lists[0], op, timeout=timeout)
            else:
                g.reducescatter_multigpu(tensor, tensor_lists, op, timeout=timeout)

    def send(self, tensor, send_options: SendOptions):
        with self:
            o = send_options
            g = self._group(tensor)
            if o.n_elements or _is_cuda(tensor[0]):
                g.send_multigpu(tensor[0], o.dst_rank, o.dst_gpu_index, o.n_elements,
                                timeout=_timeout_s(o))
            else:
                g.send(tensor[0], o.dst_rank, timeout=_timeout_s(o))

    def recv(self, tensor, recv_options: RecvOptions):
        with self:
            o = recv_options
            g = self._group(tensor)
            if o.n_elements or _is_cuda(tensor[0]):
                g.recv_multigpu(tensor[0], o.src_rank, o.src_gpu_index, o.n_elements,
                                timeout=_timeout_s(o))
            else:
                g.recv(tensor[0], o.src_rank, timeout=_timeout_s(o))
