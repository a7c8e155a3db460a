"""tutti's direct tensor transport (Ray's RDT without an actor runtime).

An owner publishes tensors in place and hands the reference to any process, by any means (its
bytes, its text, or pickled); that process's agent resolves it::

    import numpy as np
    from tutti import transfer

    weights = np.arange(1 << 20, dtype=np.float32)
    handle = transfer.put([weights])            # in place: leave weights unchanged until freed
    text = handle.ref.to_text()                 # "tutti-ref:1:..." (or .to_bytes(), or pickle)

    # in another process on this host:
    (copy,) = transfer.get(text)                 # a copy (numpy; framework="torch" for torch)
    with transfer.default_agent().borrow(text) as (view,):   # zero-copy, read-only
        total = view.sum()
    (mine,) = transfer.get(text, copy_on_write=True)  # zero-copy for shareable memory, writable

    handle.release()                             # the object may go once no get reads it
    transfer.wait_tensor_freed(weights, timeout=10)   # then weights may change again

Transports: "shm" (one host: the consumer reads the owner's memory; zero-copy from shareable
memory: transfer.empty() or TransferAgent.allocate, or memory registered with its file, e.g. a
torch tensor after share_memory_()), "socket" (any host: TransferAgent(listen_tcp=True) on the
owner).
Errors are tutti.Error subclasses naming the agent, the object, the transport and the peer.
"""

from ._tutti import transfer as _native

Borrowed = _native.Borrowed
Fetch = _native.Fetch
ObjectHandle = _native.ObjectHandle
TensorRef = _native.TensorRef
TransferAgent = _native.TransferAgent
default_agent = _native.default_agent
default_agent_made = _native.default_agent_made


def put(tensors, **options):
    """default_agent().put(tensors, ...): publishes in place; returns an ObjectHandle."""
    return default_agent().put(tensors, **options)


def get(ref, **options):
    """default_agent().get(ref, ...): the tensors of a ref (TensorRef, bytes or text)."""
    return default_agent().get(ref, **options)


def borrow(ref, **options):
    """default_agent().borrow(ref, ...): read-only zero-copy views (a Borrowed)."""
    return default_agent().borrow(ref, **options)


def get_async(ref, **options):
    """default_agent().get_async(ref, ...): a Fetch; .wait() returns the tensors."""
    return default_agent().get_async(ref, **options)


def empty(shape, dtype="float32", framework="torch", agent=None):
    """A new, uninitialised tensor (torch, or framework="numpy") in the agent's shareable memory
    (TransferAgent.allocate): put, it reaches consumers on this host without a copy (borrow,
    get(copy_on_write=True), Ray's tensor_transport="tutti"). dtype: a name ("float32"), a torch
    dtype or a numpy dtype. The memory goes back when the tensor and every view of it are gone."""
    import math

    if isinstance(shape, int):
        shape = (shape,)
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    elif not isinstance(dtype, str):
        import numpy

        name = numpy.dtype(dtype).name
    agent = agent or default_agent()
    count = math.prod(shape)
    flat = agent.allocate(count * _itemsize(name), dtype=name, framework=framework)
    return flat[:count].reshape(tuple(shape))


def _itemsize(name):
    sizes = {"bool": 1, "int8": 1, "uint8": 1, "float16": 2, "bfloat16": 2, "int32": 4,
             "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8}
    if name not in sizes:
        raise TypeError(f"tutti.transfer.empty: dtype {name!r} is not one tutti carries "
                        f"({', '.join(sizes)})")
    return sizes[name]


def wait_tensor_freed(tensor, timeout=None):
    """default_agent().wait_tensor_freed(tensor, timeout): until no object overlaps it."""
    return default_agent().wait_tensor_freed(tensor, timeout)


__all__ = [
    "Borrowed",
    "Fetch",
    "ObjectHandle",
    "TensorRef",
    "TransferAgent",
    "borrow",
    "default_agent",
    "empty",
    "get",
    "get_async",
    "put",
    "wait_tensor_freed",
]
