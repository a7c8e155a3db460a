"""Every c10d op on backend "tutti" against the same op on "gloo", in the same processes.

    torchrun --nproc-per-node 2 python/tests/torch_ops_check.py

The default group is tutti's (init_process_group("tutti") under torchrun: env://, torch's own
TCPStore); a gloo group of the same ranks runs each op on equal inputs, and the outputs must
be equal (exactly: with these sizes and values both reduce in the same order, or exactly
representable sums). Ops gloo lacks (AVG, PREMUL_SUM, bool BAND/BOR) are checked against a
reference computed here. Prints "ok <check>" per check; exits non-zero on the first mismatch.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import tutti.torch  # noqa: F401  (registers "tutti")

dist.init_process_group("tutti", timeout=datetime.timedelta(seconds=60))
RANK, WORLD = dist.get_rank(), dist.get_world_size()
GLOO = dist.new_group(backend="gloo")
TUTTI = dist.group.WORLD
checks = 0


def same(name, a, b):
    global checks
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), (name, len(a), len(b))
        for x, y in zip(a, b):
            same(name, x, y)
        return
    assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype, a.shape, b.shape)
    if not torch.equal(a, b):
        raise AssertionError(f"rank {RANK}: {name}: tutti {a.flatten()[:8]} != gloo "
                             f"{b.flatten()[:8]}")
    checks += 1


def data(shape, dtype, seed, rank=None):
    """Values of rank `rank` (default: this one) for check `seed`."""
    g = torch.Generator().manual_seed(seed * 131 + (RANK if rank is None else rank))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        # Small integers: sums and products are exact in every float type, whatever the order.
        return torch.randint(-3, 4, shape, generator=g).to(dtype)
    if dtype.is_complex:
        return torch.complex(torch.randint(-3, 4, shape, generator=g).float(),
                             torch.randint(-3, 4, shape, generator=g).float()).to(dtype)
    return torch.randint(0, 4, shape, generator=g).to(dtype)


def both(fn):
    """fn(group) -> tensors, on tutti and on gloo."""
    return fn(TUTTI), fn(GLOO)


def check(name, fn):
    t, g = both(fn)
    same(name, t, g)
    print(f"ok {name}", flush=True)


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.uint8, torch.int8]

# ---- all_reduce: every op gloo has, every dtype ----
for dtype in DTYPES:
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        def ar(group, dtype=dtype, op=op):
            t = data((37,), dtype, 1)
            dist.all_reduce(t, op=op, group=group)
            return t
        check(f"all_reduce {op} {dtype}", ar)

# AVG and PREMUL_SUM (gloo has neither): against the sum gloo computes.
for dtype in (torch.float32, torch.float64):
    t = data((16,), dtype, 2)
    s = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    dist.all_reduce(s, op=dist.ReduceOp.SUM, group=GLOO)
    same(f"all_reduce AVG {dtype}", t, s / WORLD)
    t = data((16,), dtype, 3)
    s = t.clone()
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    dist.all_reduce(s, op=dist.ReduceOp.SUM, group=GLOO)
    same(f"all_reduce PREMUL_SUM {dtype}", t, s * 0.5)
print("ok all_reduce AVG, PREMUL_SUM", flush=True)

# bool: SUM/MAX/BOR are or, PRODUCT/MIN/BAND are and.
b = data((29,), torch.bool, 4)
ref_or, ref_and = b.clone(), b.clone()
dist.all_reduce(ref_or, op=dist.ReduceOp.MAX, group=GLOO)
dist.all_reduce(ref_and, op=dist.ReduceOp.MIN, group=GLOO)
for op, ref in ((dist.ReduceOp.BOR, ref_or), (dist.ReduceOp.BAND, ref_and),
                (dist.ReduceOp.SUM, ref_or)):
    t = b.clone()
    dist.all_reduce(t, op=op)
    same(f"all_reduce bool {op}", t, ref)
print("ok all_reduce bool", flush=True)

# complex sums, as (real, imaginary) pairs.
check("all_reduce complex64", lambda g: (lambda t: (dist.all_reduce(t, group=g), t)[1])(
    data((9,), torch.complex64, 5)))

# A non-contiguous tensor: the result lands in its elements, and only there. (gloo's own
# all_reduce of such a view reduces the whole span of storage it covers, the elements between
# too, so the reference reduces a contiguous copy through gloo.)
base = data((8, 6), torch.float32, 6)
expect = base.clone()
columns = expect[:, ::2].contiguous()
dist.all_reduce(columns, group=GLOO)
expect[:, ::2] = columns
dist.all_reduce(base[:, ::2])
same("all_reduce non-contiguous", base, expect)
print("ok all_reduce non-contiguous", flush=True)

# ---- broadcast, reduce ----
for root in range(WORLD):
    def bc(group, root=root):
        t = data((5, 3), torch.float64, 7)
        dist.broadcast(t, src=root, group=group)
        return t
    check(f"broadcast from {root}", bc)
    def rd(group, root=root):
        t = data((11,), torch.int64, 8)
        dist.reduce(t, dst=root, op=dist.ReduceOp.SUM, group=group)
        return t if RANK == root else torch.zeros(0)
    check(f"reduce to {root}", rd)
# A dtype tutti does not reduce (nor gloo move) still moves, as bytes.
t = data((7,), torch.int16, 9)
dist.broadcast(t, src=0)
same("broadcast int16 (as bytes)", t, data((7,), torch.int16, 9, rank=0))
print("ok broadcast int16", flush=True)

# ---- gathers and scatters ----
def allgather(group):
    out = [torch.empty(4, 2, dtype=torch.float32) for _ in range(WORLD)]
    dist.all_gather(out, data((4, 2), torch.float32, 10), group=group)
    return out
check("all_gather", allgather)

def allgather_aliased(group):
    """Every output the input itself, then one output over the input's second half: torch's
    gloo takes these lists (tutti's group refuses them, so its torch backend stages them)."""
    x = data((6,), torch.float32, 14)
    dist.all_gather([x] * WORLD, x, group=group)
    y = torch.zeros(WORLD * 6 + 3)
    inp = y[:6]
    inp.copy_(data((6,), torch.float32, 15))
    outs = [y[3 + 6 * q:9 + 6 * q] for q in range(WORLD)]
    dist.all_gather(outs, inp, group=group)
    return [x, y]
check("all_gather, outputs over the input", allgather_aliased)

def allgather_tensor(group):
    out = torch.empty(WORLD * 3, 5, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, data((3, 5), torch.bfloat16, 11), group=group)
    return out
check("all_gather_into_tensor", allgather_tensor)

def gather(group):
    out = [torch.empty(6, dtype=torch.int32) for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(data((6,), torch.int32, 12), out, dst=0, group=group)
    return out if RANK == 0 else []
check("gather", gather)

def scatter(group):
    out = torch.empty(6, dtype=torch.float64)
    ins = [data((6,), torch.float64, 13 + r) for r in range(WORLD)] if RANK == 0 else None
    dist.scatter(out, ins, src=0, group=group)
    return out
check("scatter", scatter)

def reduce_scatter_ref(inputs):
    """rank r's output is the sum over ranks of their inputs[r], through gloo's all_reduce."""
    total = [t.clone() for t in inputs]
    for t in total:
        dist.all_reduce(t, group=GLOO)
    return total[RANK]

ins = [data((7,), torch.float32, 20 + r) for r in range(WORLD)]
out = torch.empty(7)
dist.reduce_scatter(out, [t.clone() for t in ins])
same("reduce_scatter", out, reduce_scatter_ref(ins))
flat = data((WORLD * 4,), torch.float64, 30)
out = torch.empty(4, dtype=torch.float64)
dist.reduce_scatter_tensor(out, flat.clone())
same("reduce_scatter_tensor", out, reduce_scatter_ref(list(flat.chunk(WORLD))))
print("ok reduce_scatter, reduce_scatter_tensor", flush=True)

# The output another rank's input slot (not this rank's). torch's gloo takes such a list but
# reads the slot while it writes it (2 ranks: rank 1 got its own input plus rank 0's slot 0), so
# the reference is reduce_scatter_ref on copies.
ins = [data((5,), torch.float32, 25 + r) for r in range(WORLD)]
other = (RANK + 1) % WORLD
want = reduce_scatter_ref([t.clone() for t in ins])
dist.reduce_scatter(ins[other], ins)
same("reduce_scatter, output over another rank's input", ins[other], want)
print("ok reduce_scatter, output over another rank's input", flush=True)

def alltoall(group):
    out = [torch.empty(3, dtype=torch.int64) for _ in range(WORLD)]
    dist.all_to_all(out, [data((3,), torch.int64, 40 + r) for r in range(WORLD)], group=group)
    return out
check("all_to_all", alltoall)

# Rank r sends r + d + 1 elements to rank d (gloo takes equal sizes only: against what each
# source rank sent, computed here).
ins = [data((RANK + d + 1,), torch.float32, 50 + d) for d in range(WORLD)]
out = [torch.empty(s + RANK + 1) for s in range(WORLD)]
dist.all_to_all(out, ins)
same("all_to_all of different sizes", out,
     [data((s + RANK + 1,), torch.float32, 50 + RANK, rank=s) for s in range(WORLD)])
print("ok all_to_all of different sizes", flush=True)

def alltoall_single(group):
    out = torch.empty(WORLD * 2, 3)
    dist.all_to_all_single(out, data((WORLD * 2, 3), torch.float32, 60), group=group)
    return out
check("all_to_all_single", alltoall_single)

def alltoall_splits(group):
    in_splits = [RANK + d + 1 for d in range(WORLD)]
    out_splits = [s + RANK + 1 for s in range(WORLD)]
    out = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(out, data((sum(in_splits), 2), torch.float32, 61), out_splits,
                           in_splits, group=group)
    return out
check("all_to_all_single with splits", alltoall_splits)

# ---- point to point ----
def ring(group):
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    out = torch.empty(1 << 16)
    if RANK % 2 == 0:
        dist.send(data((1 << 16,), torch.float32, 70), right, group=group)
        dist.recv(out, left, group=group)
    else:
        dist.recv(out, left, group=group)
        dist.send(data((1 << 16,), torch.float32, 70), right, group=group)
    return out
check("send/recv ring", ring)

def isend_irecv(group):
    # Both ranks post the send first, then the receive: large enough that a send could not
    # finish alone.
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    out = torch.empty(1 << 20)
    s = dist.isend(data((1 << 20,), torch.float32, 71), right, group=group)
    r = dist.irecv(out, left, group=group)
    s.wait()
    r.wait()
    return out
check("isend/irecv, both sending first", isend_irecv)

def batch(group):
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    out = torch.empty(1 << 20)
    ops = [dist.P2POp(dist.isend, data((1 << 20,), torch.float32, 72), right, group=group),
           dist.P2POp(dist.irecv, out, left, group=group)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return out
check("batch_isend_irecv ring", batch)

# ---- barriers ----
dist.barrier()
dist.monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)
print("ok barrier, monitored_barrier", flush=True)

# ---- async: Work's verbs ----
big = [data((1 << 20,), torch.float32, 80 + i) for i in range(4)]
refs = [t.clone() for t in big]
works = [dist.all_reduce(t, async_op=True) for t in big]
futures = [w.get_future() for w in works]
for w in works:
    assert w.wait()
    assert w.is_completed()
for t in refs:
    dist.all_reduce(t, group=GLOO)
same("async all_reduce", big, refs)
for f, r in zip(futures, refs):
    same("async all_reduce future", f.wait()[0], r)
chained = dist.all_reduce(data((1 << 20,), torch.float32, 90), async_op=True).get_future().then(
    lambda f: f.value()[0] * 2)
ref = data((1 << 20,), torch.float32, 90)
dist.all_reduce(ref, group=GLOO)
same("future.then", chained.wait(), ref * 2)
print("ok async", flush=True)

# ---- coalescing (torch groups these calls) ----
tensors = [data((100 + i,), torch.float32, 95 + i) for i in range(3)]
refs = [t.clone() for t in tensors]
with dist._coalescing_manager(async_ops=True) as cm:
    for t in tensors:
        dist.all_reduce(t)
cm.wait()
for t in refs:
    dist.all_reduce(t, group=GLOO)
same("coalesced all_reduce", tensors, refs)
print("ok coalescing", flush=True)

# ---- symmetric memory (tutti.torch.empty_symmetric): the same results as gloo's ----
t = tutti.torch.empty_symmetric(100_003)
assert t.shape == (100_003,) and t.dtype == torch.float32 and not t.any(), t
t.copy_(data((100_003,), torch.float32, 77))
ref = t.clone()
dist.all_reduce(t)
dist.all_reduce(ref, group=GLOO)
same("all_reduce in symmetric memory", t, ref)
m = tutti.torch.empty_symmetric((4, 3000), dtype=torch.int64)
m.copy_(data((4, 3000), torch.int64, 78))
ref = m.clone()
dist.broadcast(m, src=WORLD - 1)
dist.broadcast(ref, src=WORLD - 1, group=GLOO)
same("broadcast in symmetric memory", m, ref)
print("ok empty_symmetric", flush=True)

# ---- subgroups ----
evens = dist.new_group([r for r in range(WORLD) if r % 2 == 0], backend="tutti")
if RANK % 2 == 0:
    t = torch.full((3,), float(RANK))
    dist.all_reduce(t, group=evens)
    assert t.tolist() == [float(sum(range(0, WORLD, 2)))] * 3, t
print("ok new_group", flush=True)
if WORLD >= 2:
    pairs = dist.split_group(split_ranks=[[r, r + 1] for r in range(0, WORLD - 1, 2)])
    if pairs is not None:
        t = torch.full((2,), float(RANK))
        dist.all_reduce(t, group=pairs)
        low = RANK - RANK % 2
        assert t.tolist() == [float(low + low + 1)] * 2, t
    print("ok split_group", flush=True)

# ---- errors: tutti's words, as torch's DistBackendError ----
try:
    dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.BXOR)
    raise AssertionError("BXOR was accepted")
except (RuntimeError, ValueError) as e:
    assert "BXOR" in str(e), e
print("ok errors", flush=True)

dist.barrier()
print(f"rank {RANK}: {checks} checks passed", flush=True)
dist.destroy_process_group()
