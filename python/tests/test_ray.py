"""tutti inside a local Ray cluster: the "TUTTI" collective backend with 2 and 4 actors (every
op and dtype against numpy references, groups side by side, destroy and re-create, a group
declared from the driver, an actor killed mid-allreduce) and the "TUTTI" RDT tensor transport
(nested containers, a ref back to its owner, ray.put/ray.get, wait_tensor_freed, a dead
source)."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

import ray.util.collective as col  # noqa: E402
from ray.util.collective.types import ReduceOp  # noqa: E402

import tutti  # noqa: E402
import tutti.ray  # noqa: E402
from conftest import mapped_from, rank_input, reference, unique  # noqa: E402

# Imported here, before any actor dies: Ray's RDT failure monitor thread imports
# ray.experimental.collective (and with it ray.dag) when a source actor dies, and ray.shutdown()
# imports ray.dag on the main thread; when the two first imports overlap, one of them sees the
# package half initialised ("cannot import name 'CollectiveOutputNode' from partially initialized
# module", seen once at the fixture's teardown after test_rdt_a_dead_source_fails_the_consumer).
import ray.dag  # noqa: E402,F401
import ray.experimental.collective  # noqa: E402,F401

DTYPES = ["bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64"]
OPS = {"sum": ReduceOp.SUM, "product": ReduceOp.PRODUCT, "min": ReduceOp.MIN,
       "max": ReduceOp.MAX}
OP_TIMEOUT_S = 20

# Before any class uses tensor_transport="tutti": Ray checks the name when it decorates.
tutti.ray.register(timeout=OP_TIMEOUT_S)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": "tutti.ray.register",
                          # The actors import this module (and conftest) by name.
                          "env_vars": {"PYTHONPATH": os.path.dirname(os.path.abspath(__file__)),
                                       "TUTTI_RAY_TIMEOUT_S": str(OP_TIMEOUT_S),
                                       "TUTTI_GLOO_HOSTNAME": "127.0.0.1"}})
    yield
    ray.shutdown()


@ray.remote(enable_tensor_transport=True)
class Worker:
    def setup(self, name, world, rank):
        col.init_collective_group(world, rank, backend="tutti", group_name=name)
        return col.get_rank(name), col.get_collective_group_size(name)

    def destroy(self, name):
        col.destroy_collective_group(name)
        return col.is_group_initialized(name)

    def pid(self):
        import os

        return os.getpid()

    def matrix(self, name, dtypes):
        """Every op of ray.util.collective on inputs derived from the rank alone."""
        r, w = col.get_rank(name), col.get_collective_group_size(name)
        out = {}
        for dtype in dtypes:
            for op_name, op in OPS.items():
                x = rank_input(r, dtype, salt=len(op_name))
                col.allreduce(x, name, op)
                out[("allreduce", dtype, op_name)] = x
            x = rank_input(r, dtype)
            col.reduce(x, w - 1, name, ReduceOp.MAX)
            out[("reduce", dtype)] = x
            b = rank_input(r, dtype, salt=3)
            col.broadcast(b, 1, name)
            out[("broadcast", dtype)] = b
            lst = [np.zeros(6, dtype=dtype) for _ in range(w)]
            col.allgather(lst, rank_input(r, dtype, salt=4), name)
            out[("allgather", dtype)] = lst
            rs = np.zeros(6, dtype=dtype)
            col.reducescatter(rs, [rank_input(r, dtype, salt=10 + k) for k in range(w)], name,
                              ReduceOp.MIN)
            out[("reducescatter", dtype)] = rs
            if r == 0:
                col.send(rank_input(0, dtype, salt=7), 1, name)
            elif r == 1:
                got = np.zeros(6, dtype=dtype)
                col.recv(got, 0, name)
                out[("p2p", dtype)] = got
            col.barrier(name)
        t = torch.full((5,), float(r + 1), dtype=torch.bfloat16)
        col.allreduce(t, name)
        out["torch"] = t.float().numpy()
        return out

    def allreduce_value(self, name, value, n=4):
        x = np.full(n, value, dtype=np.float64)
        col.allreduce(x, name)
        return x

    def allreduce_from_new_thread(self, name, value):
        """The op from a thread other than the one that made the group (which lives on)."""
        out = {}

        def run():
            try:
                out["x"] = self.allreduce_value(name, value)
            except Exception as e:  # noqa: BLE001 (reported to the driver)
                out["x"] = f"{type(e).__name__}: {e}"

        t = threading.Thread(target=run)
        t.start()
        t.join(OP_TIMEOUT_S + 10)
        return out.get("x", "the thread did not finish")

    def symmetric_allreduce(self, name, n):
        """An allreduce of memory tutti.ray.allocate_symmetric gave (a single copy on shm)."""
        r = col.get_rank(name)
        x = tutti.ray.allocate_symmetric(4 * n, "float32", group_name=name)
        t = tutti.ray.allocate_symmetric(8 * n, "int64", group_name=name, framework="torch")
        x[:] = np.arange(n, dtype=np.float32) * (r + 1)
        t[:] = torch.arange(n) * (r + 1)
        col.allreduce(x, name)
        col.allreduce(t, name, ReduceOp.MAX)
        backend = col.get_group_handle(name).tutti_group.backend
        where = [tutti.ray.is_symmetric(x, name), tutti.ray.is_symmetric(t, name),
                 tutti.ray.is_symmetric(np.ones(n, np.float32), name)]
        col.barrier(name)  # no rank frees its memory while another still reads it
        return x.copy(), t.numpy().copy(), backend, where

    def allreduce_timed(self, name):
        x = np.ones(1 << 16, dtype=np.float32)
        start = time.monotonic()
        try:
            col.allreduce(x, name)
            return "no error", "", time.monotonic() - start
        except Exception as e:  # noqa: BLE001 (reported to the driver)
            return type(e).__name__, str(e), time.monotonic() - start

    def stall(self, name):
        col.barrier(name)
        time.sleep(600)  # killed here by the test

    # ---- RDT ----
    @ray.method(tensor_transport="tutti")
    def produce(self, n):
        self.kept = torch.arange(n, dtype=torch.float32)
        return {"weights": [self.kept, torch.ones(3, dtype=torch.int64)],
                "bias": (torch.full((2, 2), 2.5),)}

    @ray.method(tensor_transport="tutti")
    def produce_shareable(self, n):
        from tutti import transfer

        arena = transfer.empty((n,), torch.float32)
        arena.fill_(1.0)
        shared = torch.arange(n, dtype=torch.float64).share_memory_()
        self.shareable = (arena, shared)
        return [arena, shared]

    def consume_in_place(self, obj):
        arena, shared = obj
        where = (mapped_from(arena), mapped_from(shared))
        arena[0] = -5.0  # a page of the consumer's own from now on
        return where, float(arena.sum()), float(shared.sum())

    def shareable_firsts(self):
        return float(self.shareable[0][0]), float(self.shareable[1][0])

    def consume(self, obj):
        w, ones = obj["weights"]
        (bias,) = obj["bias"]
        return float(w.sum()), int(ones.sum()), float(bias.sum())

    def set_env(self, name, value):
        os.environ[name] = value

    def env(self, name):
        return os.environ.get(name)

    def transfer_reach(self):
        """Whether this worker's agent signs its refs and puts its TCP address in them."""
        from tutti import transfer

        h = transfer.default_agent().put([torch.zeros(1)])
        try:
            address = os.environ.get("TUTTI_TRANSFER_LISTEN_TCP", "")
            return h.ref.is_signed, bool(address) and address.encode() in h.ref.to_bytes()
        finally:
            h.release()

    def is_kept(self, obj):
        return obj["weights"][0] is self.kept

    def wait_freed(self, timeout):
        try:
            tutti.ray.wait_tensor_freed(self.kept, timeout=timeout)
            return "freed"
        except TimeoutError as e:
            return f"timeout: {e}"

    def get_put(self, refs):
        (t,) = refs
        return float(ray.get(t).sum())

    def get_put_list(self, refs):
        (t,) = refs
        got = ray.get(t)
        return got.tolist(), got.is_contiguous()


@ray.remote(max_concurrency=3)
class ThreadedWorker:
    """A threaded actor: each task runs on some thread of its pool."""

    def setup(self, name, world, rank):
        col.init_collective_group(world, rank, backend="tutti", group_name=name)
        return threading.get_ident()

    def allreduce_value(self, name, value):
        x = np.full(4, value, dtype=np.float32)
        col.allreduce(x, name)
        return x, threading.get_ident()

    def destroy(self, name):
        col.destroy_collective_group(name)


@ray.remote
class AsyncWorker:
    """An async actor: its tasks run on the event loop's thread, not the actor's main one."""

    async def setup(self, name, world, rank):
        col.init_collective_group(world, rank, backend="tutti", group_name=name)
        return threading.get_ident()

    async def allreduce_value(self, name, value):
        x = np.full(4, value, dtype=np.int64)
        col.allreduce(x, name)
        return x, threading.get_ident()

    async def destroy(self, name):
        col.destroy_collective_group(name)


@pytest.fixture(scope="module")
def workers(cluster):
    ws = [Worker.remote() for _ in range(4)]
    ray.get([w.pid.remote() for w in ws])
    return ws


def setup_group(actors, name):
    world = len(actors)
    assert ray.get([a.setup.remote(name, world, r) for r, a in enumerate(actors)]) == [
        (r, world) for r in range(world)]


def check_matrix(results, world, dtypes):
    for r, out in enumerate(results):
        for dtype in dtypes:
            for op_name in OPS:
                want = reference([rank_input(k, dtype, salt=len(op_name)) for k in range(world)],
                                 op_name, dtype)
                np.testing.assert_array_equal(out[("allreduce", dtype, op_name)], want,
                                              err_msg=f"rank {r} {dtype} {op_name}")
            want_reduce = (reference([rank_input(k, dtype) for k in range(world)], "max", dtype)
                           if r == world - 1 else rank_input(r, dtype))
            np.testing.assert_array_equal(out[("reduce", dtype)], want_reduce)
            np.testing.assert_array_equal(out[("broadcast", dtype)], rank_input(1, dtype, salt=3))
            for k in range(world):
                np.testing.assert_array_equal(out[("allgather", dtype)][k],
                                              rank_input(k, dtype, salt=4))
            np.testing.assert_array_equal(out[("reducescatter", dtype)], reference(
                [rank_input(k, dtype, salt=10 + r) for k in range(world)], "min", dtype))
            if r == 1:
                np.testing.assert_array_equal(out[("p2p", dtype)], rank_input(0, dtype, salt=7))
        np.testing.assert_array_equal(out["torch"], np.full(5, world * (world + 1) / 2))


@pytest.mark.parametrize("world", [2, 4])
def test_every_op_and_dtype(workers, world):
    name = unique(f"matrix{world}")
    actors = workers[:world]
    setup_group(actors, name)
    try:
        results = ray.get([a.matrix.remote(name, DTYPES) for a in actors])
        check_matrix(results, world, DTYPES)
    finally:
        ray.get([a.destroy.remote(name) for a in actors])


def test_groups_side_by_side_destroy_and_recreate(workers):
    a, b = unique("side-a"), unique("side-b")
    setup_group(workers[:2], a)
    setup_group([workers[3], workers[2], workers[1]], b)  # other actors, other rank order
    # Interleaved: each group's allreduce sees only its own members.
    ra = [workers[0].allreduce_value.remote(a, 1.0), workers[1].allreduce_value.remote(a, 2.0)]
    rb = [w.allreduce_value.remote(b, 10.0 * (i + 1)) for i, w in
          enumerate([workers[3], workers[2], workers[1]])]
    for x in ray.get(ra):
        np.testing.assert_array_equal(x, np.full(4, 3.0))
    for x in ray.get(rb):
        np.testing.assert_array_equal(x, np.full(4, 60.0))
    # Destroy a, re-create the same name with a different world, use it again.
    assert ray.get([w.destroy.remote(a) for w in workers[:2]]) == [False, False]
    setup_group(workers, a)
    for x in ray.get([w.allreduce_value.remote(a, 1.0) for w in workers]):
        np.testing.assert_array_equal(x, np.full(4, 4.0))
    # Rank 0 hosts the store and drops it with the group: the others' teardown still finds it
    # (it waited out the 20 s op timeout on a rank whose destroy came after rank 0's).
    start = time.monotonic()
    ray.get([w.destroy.remote(a) for w in workers])
    ray.get([w.destroy.remote(b) for w in [workers[3], workers[2], workers[1]]])
    assert time.monotonic() - start < OP_TIMEOUT_S / 4


def test_a_dead_incarnations_kv_entry_does_not_hold_up_a_new_group(workers):
    """A rank 0 killed during init leaves its entry in Ray's KV (found by helper-39): rank 1 of
    the next group of that name read it, and its store client waited its whole timeout on a port
    nobody answers. Now it tries for a few seconds, reads the KV again, and finds the new rank 0's
    entry (here written a second after rank 1 started)."""
    import socket

    from ray.experimental import internal_kv
    from tutti.ray._group import _group_key

    name = unique("stale")
    with socket.socket() as s:  # a port that was free a moment ago, and nobody's now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    node = ray.get_runtime_context().get_node_id()
    internal_kv._internal_kv_put(_group_key(name), f"{port}\n{'ab' * 16}\n{node}\n127.0.0.1",
                                 overwrite=True)
    start = time.monotonic()
    late = workers[1].setup.remote(name, 2, 1)
    time.sleep(1.0)  # rank 1 reads the dead entry first
    early = workers[0].setup.remote(name, 2, 0)
    assert ray.get([early, late]) == [(0, 2), (1, 2)]
    assert time.monotonic() - start < OP_TIMEOUT_S / 2
    out = ray.get([workers[0].allreduce_value.remote(name, 1.0),
                   workers[1].allreduce_value.remote(name, 2.0)])
    for x in out:
        np.testing.assert_array_equal(x, np.full(4, 3.0))
    ray.get([w.destroy.remote(name) for w in workers[:2]])


def test_group_declared_from_the_driver(workers):
    name = unique("declared")
    col.create_collective_group(workers[:2], 2, [1, 0], backend="tutti", group_name=name)
    # The actors join on first use, with the ranks the driver gave them.
    out = ray.get([workers[0].allreduce_value.remote(name, 5.0),
                   workers[1].allreduce_value.remote(name, 7.0)])
    for x in out:
        np.testing.assert_array_equal(x, np.full(4, 12.0))
    ray.get([w.destroy.remote(name) for w in workers[:2]])


def test_symmetric_memory_through_ray(workers):
    """tutti.ray.allocate_symmetric in the actors: ray.util.collective's allreduce of it gives
    the reduction; on one node (shm) the memory is symmetric."""
    name = unique("symmetric")
    setup_group(workers[:3], name)
    try:
        n = 50_001  # above shm's 16 KiB small-message path, not a multiple of 3
        out = ray.get([w.symmetric_allreduce.remote(name, n) for w in workers[:3]])
        for x, t, backend, where in out:
            np.testing.assert_array_equal(x, np.arange(n, dtype=np.float32) * 6)
            np.testing.assert_array_equal(t, np.arange(n) * 3)
            symmetric = backend in ("shm", "hier")
            assert where == [symmetric, symmetric, False], (backend, where)
        assert out[0][2] == "shm"  # three actors on one node: "auto" is shm
    finally:
        ray.get([w.destroy.remote(name) for w in workers[:3]])


def test_ops_from_other_threads_than_the_groups_creator(workers):
    """tutti's CPU groups take ops from one thread; the TUTTI backend hands the group to
    whichever thread Ray runs the op on: a thread the task starts, the threads of a threaded
    actor's pool, an async actor's event loop."""
    name = unique("threads")
    setup_group(workers[:2], name)
    try:
        out = ray.get([w.allreduce_from_new_thread.remote(name, float(i + 1))
                       for i, w in enumerate(workers[:2])])
        for x in out:
            np.testing.assert_array_equal(x, np.full(4, 3.0))
        # And back on the actor's own thread.
        for x in ray.get([w.allreduce_value.remote(name, 2.0) for w in workers[:2]]):
            np.testing.assert_array_equal(x, np.full(4, 4.0))
    finally:
        ray.get([w.destroy.remote(name) for w in workers[:2]])

    for label, cls in (("threaded", ThreadedWorker), ("async", AsyncWorker)):
        name = unique(label)
        actors = [cls.remote() for _ in range(2)]
        ray.get([a.setup.remote(name, 2, r) for r, a in enumerate(actors)])
        threads = set()
        for step in range(6):  # one op at a time per actor, as Ray's collectives require
            out = ray.get([a.allreduce_value.remote(name, r + step) for r, a in
                           enumerate(actors)])
            for x, thread in out:
                np.testing.assert_array_equal(x, np.full(4, 1 + 2 * step))
                threads.add(thread)
        print(label, "actors ran the ops on", len(threads), "threads")
        ray.get([a.destroy.remote(name) for a in actors])
        for a in actors:
            ray.kill(a)


def test_an_actor_killed_mid_allreduce_fails_the_others_naming_the_op(cluster):
    name = unique("killed")
    survivor, victim = Worker.remote(), Worker.remote()
    setup_group([survivor, victim], name)
    stalled = victim.stall.remote(name)  # joins the barrier, then never the allreduce
    pending = survivor.allreduce_timed.remote(name)
    ray.kill(victim)
    kind, message, elapsed = ray.get(pending, timeout=OP_TIMEOUT_S + 30)
    assert kind in ("RemoteError", "IoError", "AbortedError"), (kind, message)
    assert "allreduce" in message and "rank 1" in message, message
    assert elapsed < OP_TIMEOUT_S, f"{elapsed:.1f} s: the op's timeout is {OP_TIMEOUT_S} s"
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(stalled, timeout=30)
    ray.kill(survivor)


def test_rdt_moves_nested_tensors_and_returns_the_owners_own(workers):
    producer, consumer = workers[0], workers[1]
    ref = producer.produce.remote(1000)
    assert ray.get(consumer.consume.remote(ref)) == (499500.0, 3, 10.0)
    assert ray.get(producer.is_kept.remote(ref)) is True  # back to its owner: the same tensor
    local = ray.get(ref)  # the driver fetches through tutti too
    assert float(local["weights"][0].sum()) == 499500.0
    # Freed once no ref is left; until then wait_tensor_freed times out.
    assert ray.get(producer.wait_freed.remote(0.2)).startswith("timeout")
    del ref, local
    assert ray.get(producer.wait_freed.remote(30)) == "freed"


def test_rdt_shareable_tensors_arrive_without_a_copy(workers):
    """Tensors the producer made in shareable memory (tutti.transfer.empty, share_memory_())
    arrive as copy-on-write mappings of its pages: the consumer reads them in place, writes its
    own copy of a page, and the producer's tensors stay as they were."""
    producer, consumer = workers[0], workers[1]
    n = 1 << 18
    ref = producer.produce_shareable.remote(n)
    (arena_at, shared_at), arena_sum, shared_sum = ray.get(consumer.consume_in_place.remote(ref))
    assert "memfd:tutti-rdt" in arena_at, arena_at
    assert "/dev/shm/torch_" in shared_at, shared_at
    assert arena_sum == n - 6.0  # its write of element 0 (was 1) counted
    assert shared_sum == n * (n - 1) / 2
    assert ray.get(producer.shareable_firsts.remote()) == (1.0, 0.0)
    del ref


def test_rdt_put_from_the_driver(workers):
    t = torch.arange(100, dtype=torch.float64)
    ref = ray.put(t, _tensor_transport="tutti")
    assert ray.get(workers[2].get_put.remote([ref])) == 4950.0


EARLY_DRIVER = """
import sys

import numpy as np
import ray
import torch

import tutti.ray
from tutti import transfer

kept = transfer.put([np.ones(4)])  # tutti.transfer first: the default agent, with no secret
tutti.ray.register(timeout=20)
ray.init(address=sys.argv[1], log_to_driver=False,
         runtime_env={"worker_process_setup_hook": "tutti.ray.register",
                      "env_vars": {"TUTTI_GLOO_HOSTNAME": "127.0.0.1"}})


@ray.remote(enable_tensor_transport=True)
class Producer:
    @ray.method(tensor_transport="tutti")
    def make(self, n):
        return torch.arange(n, dtype=torch.float32)

    def total(self, tensor):
        return float(tensor.sum())


p = Producer.remote()
print("from the actor", float(ray.get(p.make.remote(1000)).sum()))
ref = ray.put(torch.arange(100, dtype=torch.float64), _tensor_transport="tutti")
print("to the actor", ray.get(p.total.remote(ref)))
print("agent", tutti.ray.transport_agent().name, transfer.default_agent().name)
kept.release()
"""


def test_rdt_from_a_driver_that_used_tutti_transfer_before_ray(cluster, tmp_path):
    """A driver whose default agent was made before ray.init (it used tutti.transfer first, with
    no secret) moves RDT objects both ways through an agent of the transport's own, with the
    cluster's secret; before, its gets failed ("this agent has no secret"). A fresh interpreter,
    connected to this cluster, without the secret this process's environment holds."""
    if "TUTTI_STORE_SECRET" in os.environ:
        pytest.skip("TUTTI_STORE_SECRET is set for the whole job: every agent has the secret")
    script = tmp_path / "early_driver.py"
    script.write_text(EARLY_DRIVER)
    env = {k: v for k, v in os.environ.items()
           if k not in ("TUTTI_TRANSFER_SECRET", "TUTTI_STORE_SECRET",
                        "TUTTI_TRANSFER_LISTEN_TCP")}
    out = subprocess.run([sys.executable, str(script), ray.get_runtime_context().gcs_address],
                         capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "from the actor 499500.0" in lines, out.stdout
    assert "to the actor 4950.0" in lines, out.stdout
    agents = next(line for line in lines if line.startswith("agent ")).split()
    assert agents[1].startswith("ray-rdt:") and agents[1] != agents[2], agents


def test_rdt_non_contiguous_tensors_arrive_with_their_values(workers):
    """A transpose and a strided slice (put refused them before): made contiguous once at put,
    they arrive with every value in place."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    for t in (base.t(), base[:, ::2]):
        assert not t.is_contiguous()
        ref = ray.put(t, _tensor_transport="tutti")
        values, contiguous = ray.get(workers[2].get_put_list.remote([ref]))
        assert values == t.tolist() and contiguous


UCX_PLUGIN_DIR = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                              "..", "build", "plugins"))
HAVE_UCX = os.path.exists(os.path.join(UCX_PLUGIN_DIR, "libtutti-plugin-ucx.so"))


@pytest.fixture(scope="module")
def two_nodes(cluster):
    """A producer and a consumer told they are on different nodes (TUTTI_HOST_ID; one machine
    here), with the ucx plugin loaded where it is built."""
    def on(node):
        env = {"TUTTI_HOST_ID": node}
        if HAVE_UCX:
            env.update({"TUTTI_PLUGINS": "ucx", "TUTTI_PLUGIN_PATH": UCX_PLUGIN_DIR})
        return Worker.options(runtime_env={"env_vars": env}).remote()

    actors = on("node-a"), on("node-b")
    yield actors
    for a in actors:
        ray.kill(a)


def test_rdt_across_nodes_over_tcp_with_the_clusters_secret(two_nodes):
    """shm cannot reach across nodes, so the consumer reads the producer's tensors over TCP from
    the producer's agent, which listens on the node's IP and signs its refs with the secret the
    cluster's workers share (before, the get failed: the owner did not listen on TCP)."""
    producer, consumer = two_nodes
    ref = producer.produce.remote(1000)
    assert ray.get(consumer.consume.remote(ref), timeout=120) == (499500.0, 3, 10.0)
    assert ray.get(producer.transfer_reach.remote()) == (True, True)


def test_rdt_across_nodes_from_a_node_that_names_its_own_address(two_nodes):
    """TUTTI_RAY_NODE_ADDRESS: the node's address for tutti's listeners, the transfer agent's as
    well as a group's store (the agent took Ray's node IP whatever it said): here 127.0.0.2, a
    loopback address Ray does not use, on which the consumer on the other "node" reaches it."""
    _, consumer = two_nodes
    producer = Worker.options(runtime_env={"env_vars": {
        "TUTTI_HOST_ID": "node-c", "TUTTI_RAY_NODE_ADDRESS": "127.0.0.2"}}).remote()
    try:
        ref = producer.produce.remote(300)
        assert ray.get(consumer.consume.remote(ref), timeout=120) == (44850.0, 3, 10.0)
        assert ray.get(producer.env.remote("TUTTI_TRANSFER_LISTEN_TCP")) == "127.0.0.2"
        assert ray.get(producer.transfer_reach.remote()) == (True, True)
    finally:
        ray.kill(producer)


@pytest.mark.skipif(not HAVE_UCX, reason="the ucx plugin is not built (build/plugins: Debian's "
                                         "libucx-dev)")
def test_rdt_across_nodes_over_ucx(two_nodes):
    """TUTTI_RAY_TRANSFER_TRANSPORT=ucx: the producer publishes on ucx (a put on a transport not
    loaded fails) and the consumer, its socket fallback off (TUTTI_RAY_TRANSFER_FALLBACK=0), can
    only pull with one-sided UCX gets."""
    producer, consumer = two_nodes
    ray.get(producer.set_env.remote("TUTTI_RAY_TRANSFER_TRANSPORT", "ucx"))
    ray.get(consumer.set_env.remote("TUTTI_RAY_TRANSFER_FALLBACK", "0"))
    try:
        ref = producer.produce.remote(2000)
        assert ray.get(consumer.consume.remote(ref), timeout=120) == (1999000.0, 3, 10.0)
        # The fallback off is what makes this a test of ucx: an shm ref now fails, by name.
        ray.get(producer.set_env.remote("TUTTI_RAY_TRANSFER_TRANSPORT", "auto"))
        ref = producer.produce.remote(10)
        with pytest.raises(Exception) as info:
            ray.get(consumer.consume.remote(ref), timeout=120)
        assert "another host" in str(info.value), str(info.value)
    finally:
        ray.get(producer.set_env.remote("TUTTI_RAY_TRANSFER_TRANSPORT", "auto"))
        ray.get(consumer.set_env.remote("TUTTI_RAY_TRANSFER_FALLBACK", "1"))


def test_the_tensor_transport_is_registered_for_cpu_and_cuda_tensors():
    """CUDA objects go by cuda_ipc on one node (test_gpu.py runs that path on a GPU)."""
    from ray.experimental.rdt import util as rdt_util

    tutti.ray.register()
    info = rdt_util.transport_manager_info["TUTTI"]
    assert info.devices == ["cpu", "cuda"]
    assert info.transport_manager_class is tutti.ray.TuttiTensorTransport


def test_register_without_torch_registers_the_collective_backend():
    """A numpy-only Ray user: tutti.ray.register() registers the collective backend and says
    why the tensor transport is not (torch made unimportable in a fresh interpreter)."""
    code = (
        "import sys, warnings\n"
        "sys.modules['torch'] = None\n"
        "import tutti.ray\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    tutti.ray.register()\n"
        "from ray.util.collective.backend_registry import _global_registry\n"
        "print(_global_registry.is_registered('TUTTI'), [str(x.message) for x in w])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("True ")
    assert "torch is not importable" in out.stdout


def test_rdt_a_dead_source_fails_the_consumer(cluster):
    producer, consumer = Worker.remote(), Worker.remote()
    ref = producer.produce.remote(10)
    ray.get(producer.is_kept.remote(ref))  # produced and published
    pid = ray.get(producer.pid.remote())
    ray.kill(producer)
    # ray.kill returns before the process is gone (a fresh-clone run once fetched from it in
    # between): wait until it is, on this one-node cluster.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.01)
    else:
        pytest.fail(f"the killed producer (pid {pid}) still runs after 60 s")
    with pytest.raises(Exception) as info:
        ray.get(consumer.consume.remote(ref), timeout=120)
    print("dead source:", type(info.value).__name__, str(info.value)[:600])
    assert "gone" in str(info.value) or "died" in str(info.value), str(info.value)
    ray.kill(consumer)
