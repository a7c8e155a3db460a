"""tutti._rdt, the Ray-free part of tutti.ray's tensor transport, on CPU tensors: what it refuses
(naming the object and the item), the transport of puts, and a put and fetch between two agents
(a non-contiguous tensor copied once at put; Ray's target buffers or new tensors). CUDA objects:
test_gpu.py."""

import pytest
import torch

from tutti import _rdt, transfer


def test_check_names_the_object_and_the_item():
    assert _rdt.check("obj", [torch.ones(2), torch.zeros(3, dtype=torch.int64)]) == "cpu"
    assert _rdt.check("obj", []) == "cpu"
    with pytest.raises(TypeError, match=r"object 7: item 1 is a list, not a torch.Tensor"):
        _rdt.check("object 7", [torch.ones(1), [1, 2]])
    with pytest.raises(ValueError, match=r"object 8: item 0 is on meta"):
        _rdt.check("object 8", [torch.ones(1, device="meta")])


def test_transport_of_puts_by_device(monkeypatch):
    monkeypatch.delenv("TUTTI_RAY_TRANSFER_TRANSPORT", raising=False)
    monkeypatch.delenv("TUTTI_RAY_TRANSFER_TRANSPORT_CUDA", raising=False)
    assert _rdt.transport_for("cpu") == "auto" and _rdt.transport_for("cuda") == "auto"
    monkeypatch.setenv("TUTTI_RAY_TRANSFER_TRANSPORT", "socket")
    monkeypatch.setenv("TUTTI_RAY_TRANSFER_TRANSPORT_CUDA", "nccl")
    assert _rdt.transport_for("cpu") == "socket" and _rdt.transport_for("cuda") == "nccl"


def test_publish_then_fetch_between_two_agents():
    owner, consumer = transfer.TransferAgent("rdt-owner"), transfer.TransferAgent("rdt-consumer")
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    shared = []
    handle, device, keys = _rdt.publish(owner, "object 1", [base, base.t()],
                                        lambda t: shared.append(t) or 11)
    assert device == "cpu" and keys == [11, 11] and len(shared) == 2
    assert shared[1].is_contiguous()  # the transpose, copied once before anything else saw it
    meta = [((4, 6), torch.float32), ((6, 4), torch.float32)]
    fetch, targets = _rdt.fetch(consumer, handle.ref.to_bytes(), device, meta, None, 30, True)
    assert targets is None
    got = fetch.wait()
    assert torch.equal(got[0], base) and torch.equal(got[1], base.t().contiguous())
    into = [torch.zeros(4, 6), torch.zeros(6, 4)]
    fetch, targets = _rdt.fetch(consumer, handle.ref.to_bytes(), device, meta, into, 30, True)
    fetch.wait()
    assert [id(t) for t in targets] == [id(t) for t in into]
    assert torch.equal(into[0], base) and torch.equal(into[1], base.t())
    handle.release()
