"""tutti._rdt, the Ray-free part of tutti.ray's tensor transport, on CPU tensors: what it refuses
(naming the object and the item), the transport of puts, and a put and fetch between two agents
(a non-contiguous tensor copied once at put; Ray's target buffers or new tensors). CUDA objects:
test_gpu.py."""

import subprocess
import sys
import textwrap

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


class _Recorder:
    """Stands in for an agent: records what a fetch asks of it."""

    def get_async(self, ref, **options):
        self.ref, self.options = ref, options
        return "fetch"


def test_fetch_asks_the_agent_for_what_the_transport_promises():
    r = _Recorder()
    assert _rdt.fetch(r, b"ref", "cpu", [((2,), torch.float32)], None, 5.0, False) == ("fetch",
                                                                                        None)
    assert r.options == {"timeout": 5.0, "framework": "torch", "copy_on_write": True,
                         "allow_fallback": False}
    into = [torch.zeros(2)]
    _rdt.fetch(r, b"ref", "cpu", [((2,), torch.float32)], into, 5.0, True)
    assert r.options["targets"][0] is into[0] and r.options["allow_fallback"] is True


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a process without a CUDA device")
def test_a_cuda_object_without_a_cuda_device_is_refused_naming_it():
    owner = transfer.TransferAgent("rdt-cuda-owner")
    handle = owner.put([torch.ones(2)])
    with pytest.raises(ValueError, match=r"rdt-cuda-owner.*sees no CUDA device"):
        _rdt.fetch(_Recorder(), handle.ref.to_bytes(), "cuda", [((2,), torch.float32)], None, 5.0,
                   True)
    handle.release()


def test_the_transports_shared_storage_counts_hold_under_failure_and_threads():
    """tutti.ray's transport (Ray-free here: no cluster, a process of its own for its default
    agent): a put that fails gives back the shared storages it counted (before, they stayed
    registered for the process's life); two threads publishing and collecting objects of one
    shared storage leave no error and no registration behind (before, a release could unregister
    a storage another thread had just counted again, and two first uses both registered it)."""
    pytest.importorskip("ray")
    script = textwrap.dedent("""
        import os, threading
        import torch
        import tutti
        from tutti.ray._transport import TuttiTensorTransport
        tr = TuttiTensorTransport()
        weights = torch.ones(1 << 16).share_memory_()
        os.environ["TUTTI_RAY_TRANSFER_TRANSPORT"] = "no-such-transport"
        try:
            tr.extract_tensor_transport_metadata("failed", [weights])
            raise SystemExit("a put over a transport the agent lacks succeeded")
        except tutti.Error:
            pass
        assert tr._regions == {}, tr._regions
        del os.environ["TUTTI_RAY_TRANSFER_TRANSPORT"]
        errors = []
        def loop(k):
            try:
                for i in range(200):
                    name = f"obj-{k}-{i}"
                    tr.extract_tensor_transport_metadata(name, [weights])
                    tr.garbage_collect(name, None, [weights])
            except Exception as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=loop, args=(k,)) for k in range(2)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors
        assert tr._regions == {}, tr._regions
        print("counts hold")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "counts hold" in done.stdout, done.stdout + done.stderr
