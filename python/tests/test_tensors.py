"""What the bindings check before any I/O: tensor types, dtypes, contiguity, writability,
devices and option values, each a clear TypeError/ValueError naming the op, the group and rank
and the offending value; the group stays usable (both ranks still meet, in step)."""

import array
import datetime

import numpy as np
import pytest
import torch

import tutti
from conftest import run_threads


def bad_calls(g):
    """(what to call, expected exception, text the message must hold) for rank g.rank."""
    ro = np.arange(4.0)
    ro.flags.writeable = False
    return [
        (lambda: g.allreduce(np.arange(8.0)[::2]), tutti.InvalidArgumentError,
         "tensor is not contiguous (shape [4], strides [2]"),
        (lambda: g.allreduce(torch.ones(3, 4).t()), tutti.InvalidArgumentError,
         "not contiguous (shape [4, 3], strides [1, 4]"),
        (lambda: g.allreduce(ro), tutti.InvalidArgumentError, "read-only"),
        (lambda: g.allreduce(np.zeros(3, dtype=np.int16)), tutti.TensorTypeError,
         "dtype int16, which tutti does not support"),
        (lambda: g.allreduce(np.zeros(3, dtype=np.complex64)), tutti.TensorTypeError,
         "dtype complex64"),
        (lambda: g.allreduce(np.zeros(3, dtype=">f4")), tutti.TensorTypeError, "dtype >f4"),
        (lambda: g.allreduce(np.array(["a"], dtype=object)), tutti.TensorTypeError,
         "dtype object"),
        (lambda: g.allreduce(torch.zeros(3, dtype=torch.int16)), tutti.TensorTypeError,
         "torch.int16"),
        (lambda: g.allreduce(torch.zeros(2, dtype=torch.complex64)), tutti.TensorTypeError,
         "torch.complex64"),
        (lambda: g.allreduce([1.0, 2.0]), tutti.TensorTypeError, "tensor is a list"),
        (lambda: g.allreduce(None), tutti.TensorTypeError, "tensor is None"),
        (lambda: g.allreduce(torch.zeros(2, device="meta")), tutti.InvalidArgumentError,
         "on device meta"),
        (lambda: g.allgather([np.zeros(2), np.zeros(4)[::2]], np.zeros(2)),
         tutti.InvalidArgumentError, "tensor_list[1] is not contiguous"),
        (lambda: g.allgather([np.zeros(2)], np.zeros(2)), tutti.InvalidArgumentError, ""),
        (lambda: g.allreduce(np.zeros(2), "median"), tutti.InvalidArgumentError,
         "unknown reduce op 'median'"),
        (lambda: g.allreduce(np.zeros(2), 3.5), tutti.TensorTypeError, "op must be"),
        (lambda: g.allreduce(np.zeros(2), timeout=-1), tutti.InvalidArgumentError,
         "timeout -1 is negative"),
        (lambda: g.allreduce(np.zeros(2), timeout="soon"), tutti.TensorTypeError,
         "number of seconds"),
        (lambda: g.broadcast(np.zeros(2), 7), tutti.InvalidArgumentError, "7"),
        (lambda: g.send(np.zeros(2), g.rank), tutti.InvalidArgumentError, ""),
        (lambda: g.batch_isend_irecv([("send", np.zeros(2), 1)]), tutti.TensorTypeError,
         "p2p_op_list[0] is not a tutti.P2POp"),
    ]


def test_bad_arguments_fail_before_any_io_and_leave_the_group_usable():
    def body(g):
        for call, exc, text in bad_calls(g):
            with pytest.raises(exc) as info:
                call()
            message = str(info.value)
            assert text in message, message
            if text:  # the bindings' own checks and the group's name where they are
                assert f"group '{g.name}' (rank {g.rank}/2)" in message, message
        # Every rank raised locally, in every case: the group is still in step.
        x = np.full(3, g.rank + 1.0)
        g.allreduce(x)
        return x

    for x in run_threads(2, body, "shm"):
        np.testing.assert_array_equal(x, [3.0, 3.0, 3.0])


def test_error_classes_follow_the_error_codes():
    assert issubclass(tutti.InvalidArgumentError, ValueError)
    assert issubclass(tutti.TensorTypeError, TypeError)
    assert issubclass(tutti.TensorTypeError, tutti.InvalidArgumentError)
    assert issubclass(tutti.TimeoutError, TimeoutError)
    assert issubclass(tutti.IoError, OSError)
    for cls in (tutti.InvalidUsageError, tutti.RemoteError, tutti.AbortedError,
                tutti.UnavailableError, tutti.InternalError):
        assert issubclass(cls, tutti.Error) and issubclass(cls, RuntimeError)
    assert [c.code for c in tutti.errors._BY_CODE] == list(tutti.ErrorCode)
    with pytest.raises(tutti.UnavailableError, match="no-such-backend"):
        tutti.CollectiveGroup.create(1, 0, "no-such-backend", "x")
    with pytest.raises(tutti.InvalidArgumentError) as info:
        tutti.CollectiveGroup.create(2, 5, "shm", "x", store=tutti.HashStore())
    assert info.value.code == tutti.ErrorCode.INVALID_ARGUMENT


def test_read_only_arrays_are_fine_where_the_op_only_reads():
    def body(g):
        src = np.full(4, g.rank + 1.0)
        src.flags.writeable = False
        out = [np.zeros(4), np.zeros(4)]
        g.allgather(out, src)  # input only read
        if g.rank == 0:
            g.send(src, 1)
        else:
            got = np.zeros(4)
            g.recv(got, 0)
            out.append(got)
        b = np.full(2, 5.0) if g.rank == 0 else np.zeros(2)
        if g.rank == 0:
            b.flags.writeable = False  # the root of a broadcast only reads
        g.broadcast(b, 0)
        out.append(b)
        return out

    r0, r1 = run_threads(2, body)
    np.testing.assert_array_equal(r0[0], np.full(4, 1.0))
    np.testing.assert_array_equal(r0[1], np.full(4, 2.0))
    np.testing.assert_array_equal(r1[2], np.full(4, 1.0))
    np.testing.assert_array_equal(r1[3], np.full(2, 5.0))


def test_buffers_scalars_and_timeouts_of_every_form():
    def body(g):
        b = bytearray([g.rank + 1] * 4)  # the buffer protocol: uint8
        g.allreduce(b)
        a = array.array("d", [g.rank + 1.0] * 2)
        g.allreduce(a, "max")
        s = np.array(g.rank + 1.0)  # zero dimensions: one element
        g.allreduce(s, timeout=datetime.timedelta(seconds=5))
        e = np.zeros((0, 3), dtype=np.float32)  # no elements
        g.allreduce(e, timeout=5)
        t = torch.ones(2, requires_grad=True)  # autograd does not stop an in-place collective
        with torch.no_grad():
            g.allreduce(t)
        return bytes(b), list(a), float(s), t.detach().numpy().tolist()

    for b, a, s, t in run_threads(2, body):
        assert b == bytes([3] * 4) and a == [2.0, 2.0] and s == 3.0 and t == [2.0, 2.0]
