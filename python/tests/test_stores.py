"""The stores through Python: bytes in and out, every call of the Store interface, timeouts
that name the missing keys, and stores shared across processes."""

import time

import pytest

import tutti
from conftest import free_port, run_processes


def exercise(store):
    store.set("a", b"\x00\x01binary")
    store.set(b"b", "text")
    assert store.get("a") == b"\x00\x01binary"
    assert store.get("b") == b"text"
    assert store.add("n", 5) == 5 and store.add("n", -2) == 3
    assert store.compare_set("c", "", "first") == b"first"
    assert store.compare_set("c", "wrong", "second") == b"first"
    assert store.compare_set("c", "first", "second") == b"second"
    assert store.check(["a", "b"]) and not store.check(["a", "missing"])
    store.wait(["a", "b"], timeout=1)
    start = time.monotonic()
    with pytest.raises(tutti.TimeoutError, match="missing"):
        store.wait(["missing"], timeout=0.2)
    assert time.monotonic() - start < 5
    assert store.delete_key("a") and not store.delete_key("a")
    assert store.num_keys() >= 3


@pytest.mark.parametrize("kind", ["hash", "file", "tcp", "prefix"])
def test_every_store_call(kind, tmp_path):
    if kind == "hash":
        store = tutti.HashStore(timeout=5)
    elif kind == "file":
        store = tutti.FileStore(str(tmp_path / "store"), timeout=5)
        assert store.path.endswith("store")
    elif kind == "tcp":
        server = tutti.TCPStoreServer("127.0.0.1", 0)
        store = tutti.TCPStore("127.0.0.1", server.port, timeout=5)
        assert server.url().startswith("tcp://127.0.0.1:")
    else:
        store = tutti.PrefixStore("job7", tutti.HashStore(timeout=5))
        assert store.prefix == "job7"
    exercise(store)
    store.timeout = 0.1
    assert store.timeout == pytest.approx(0.1)
    with pytest.raises(tutti.TimeoutError, match="never"):
        store.get("never")


def test_open_store_urls(tmp_path):
    exercise(tutti.open_store("hash://"))
    exercise(tutti.open_store(f"file://{tmp_path}/s", timeout=5))
    port = free_port()
    exercise(tutti.open_store(f"tcp://127.0.0.1:{port}", timeout=5, host=True))
    with pytest.raises(tutti.InvalidArgumentError, match="gopher"):
        tutti.open_store("gopher://x")
    with pytest.raises(tutti.TensorTypeError, match="bytes or str"):
        tutti.HashStore().set("k", 12)


def store_rank(rank, world, url):
    store = tutti.open_store(url, timeout=20)
    store.set(f"rank{rank}", str(rank * rank))
    total = store.add("count", 1)
    store.wait([f"rank{r}" for r in range(world)])
    return [store.get(f"rank{r}").decode() for r in range(world)], total


def test_a_tcp_store_shared_by_processes_with_a_secret():
    server = tutti.TCPStoreServer("127.0.0.1", 0, secret="s3cret")
    url = f"tcp://127.0.0.1:{server.port}?secret=s3cret"
    res = run_processes(3, store_rank, url)
    assert all(values == ["0", "1", "4"] for values, _ in res)
    assert sorted(total for _, total in res) == [1, 2, 3]
    with pytest.raises(tutti.InvalidArgumentError):
        tutti.TCPStore("127.0.0.1", server.port, timeout=2, secret="wrong").set("k", "v")
