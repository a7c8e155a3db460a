"""tutti's exceptions: one class per C++ ErrorCode, all deriving from tutti.Error.

Every failure of the C++ library reaches Python as the class of its ErrorCode, carrying the C++
message (which names the group, the rank, the op and the offending value). The classes also
derive from the built-in exception that fits, so generic handlers work:

    InvalidArgumentError   ValueError     bad values, caught before any I/O; the group stays usable
    TensorTypeError        TypeError      (and ValueError) an object that is no tensor, or a dtype
                                          tutti lacks; before any I/O
    InvalidUsageError                     a call in the wrong state (not initialised, destroyed)
    TimeoutError           TimeoutError   a wait ran past its deadline; the group is aborted
    RemoteError                           a peer failed or disagreed; the group is aborted
    IoError                OSError        the transport failed (a peer died); the group is aborted
    AbortedError                          the group was aborted earlier: destroy and re-create it
    UnavailableError                      a backend or resource this build or host lacks
    InternalError                         a bug in tutti or underneath it

See docs/errors.md in the repository for which errors leave a group usable.
"""

import builtins
import enum


class ErrorCode(enum.IntEnum):
    """The C++ tutti::ErrorCode, value for value."""

    INVALID_ARGUMENT = 0
    INVALID_USAGE = 1
    TIMEOUT = 2
    REMOTE_ERROR = 3
    IO_ERROR = 4
    ABORTED = 5
    UNAVAILABLE = 6
    INTERNAL = 7


class Error(RuntimeError):
    """Base class of every tutti error; ``code`` is its ErrorCode."""

    code = ErrorCode.INTERNAL


class InvalidArgumentError(Error, ValueError):
    code = ErrorCode.INVALID_ARGUMENT


class TensorTypeError(InvalidArgumentError, TypeError):
    """An argument that is not a tensor tutti can use (or of a dtype tutti lacks)."""

    code = ErrorCode.INVALID_ARGUMENT


class InvalidUsageError(Error):
    code = ErrorCode.INVALID_USAGE


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 (as asyncio.TimeoutError)
    code = ErrorCode.TIMEOUT


class RemoteError(Error):
    code = ErrorCode.REMOTE_ERROR


class IoError(Error, OSError):
    code = ErrorCode.IO_ERROR


class AbortedError(Error):
    code = ErrorCode.ABORTED


class UnavailableError(Error):
    code = ErrorCode.UNAVAILABLE


class InternalError(Error):
    code = ErrorCode.INTERNAL


# Indexed by ErrorCode: what the extension module raises for each code.
_BY_CODE = (
    InvalidArgumentError,
    InvalidUsageError,
    TimeoutError,
    RemoteError,
    IoError,
    AbortedError,
    UnavailableError,
    InternalError,
)

__all__ = [
    "ErrorCode",
    "Error",
    "InvalidArgumentError",
    "TensorTypeError",
    "InvalidUsageError",
    "TimeoutError",
    "RemoteError",
    "IoError",
    "AbortedError",
    "UnavailableError",
    "InternalError",
]
