"""Sharing arrays between processes through POSIX shared memory, and raw pointers.

``name, nbytes = await ea.ipc.to_shm(x)`` copies an array into a new shared
memory object. Another process reads it with ``await ea.ipc.from_shm(name,
shape, dtype)`` into a new array and unlinks the name. Both copy on a worker
thread (the current queue), not on the event loop. ``shm_unlink(name)``
removes an object nobody read (it is harmless when the object is already
gone).

What callers can rely on:

* Names: ``to_shm`` names objects ``/emlx-<pid>-<32 random hex digits>``; a
  caller-chosen ``name=`` must also start with ``/emlx-`` and use only
  ``[A-Za-z0-9._-]``. ``from_shm`` and ``shm_unlink`` refuse any other name
  with ``ValueError``, so they never open or remove another program's
  segments (multiprocessing's, say).
* Permissions: objects are created with ``O_EXCL`` (an existing name is an
  error, never reused) and owner-only, mode 0600, whatever the umask.
  ``permissions`` may add read access for group or others (0640, 0604, 0644),
  never write access or anything else (``ValueError``). ``from_shm`` reads only
  objects owned by this user and not writable by group or others
  (``SharedMemoryError`` otherwise), opening them read-only.
* No leaks: ``to_shm`` leaves nothing behind when it fails or when the
  awaiting task is cancelled; a cancelled export stops writing early and
  removes its object. Once ``to_shm`` has returned, the object is the
  caller's: ``from_shm`` or ``shm_unlink`` removes it. A ``from_shm`` cancelled
  before its job starts leaves the object for another try; once started, it
  consumes the object.
* Sizes: every dimension passed to ``from_shm`` must be a non-negative int
  that fits MLX's int32 shape entries, and the byte size must not overflow
  (``OverflowError``; ``ValueError`` for negative dimensions). The object
  must hold exactly that many bytes (``SharedMemoryError``); a shape or size
  refused this way leaves the object in place for another try.
* Crash safety: data moves with ``pwrite``/``pread``, never through a
  mapping, so a full shared-memory filesystem or a sender that shrinks the
  object while it is read gives ``SharedMemoryError``, not a signal. OS
  errors carry the message of the thread where they happened.
"""

from __future__ import annotations

import operator
import os
import re
import secrets
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from . import ops
from ._convert import numeric_numpy
from ._dtypes import DTYPE_CODES as _DTYPE_CODES
from ._dtypes import INT_RANGES, MAX_DIM, NUMPY_DTYPES
from ._errors import EMLXError, InvalidArgument, InvalidArgumentType, InvalidInputType, MLXOverflowError
from ._errors import SharedMemoryError as SharedMemoryError
from ._native import ffi, last_error, lib
from ._api import current_queue

PREFIX = "/emlx-"
_NAME = re.compile(r"/emlx-[A-Za-z0-9._-]{1,249}")
_OFF_T_MAX = INT_RANGES[mx.int64][1]  # off_t is 64-bit


def _shm_name() -> str:
    return f"{PREFIX}{os.getpid()}-{secrets.token_hex(16)}"


def _check_name(name: str, where: str) -> bytes:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(f"[{where}] {name!r} is not an emlx_async shared-memory name "
                              f"(\"{PREFIX}\" and 1 to 249 of [A-Za-z0-9._-])")
    return name.encode()


def _raise(status: int, message: str) -> None:
    if status == lib.EMLX_SHM_BAD_VALUE:
        raise InvalidArgument(message)
    if status == lib.EMLX_SHM_OVERFLOW:
        raise MLXOverflowError(message)
    raise SharedMemoryError(message or "[shm] unknown error")


async def to_shm(x: mx.array, /, permissions: int = 0o600, *, name: str | None = None) -> tuple[str, int]:
    """Copy `x` into a new shared-memory object; returns (name, nbytes).

    `permissions` is 0600 plus optional read bits for group or others. If the
    awaiting task is cancelled, or anything fails, no object is left behind.
    """
    try:
        permissions = operator.index(permissions)
    except TypeError:
        raise InvalidArgumentType(f"[to_shm] permissions must be an int, got {type(permissions).__name__}") from None
    if permissions & ~0o644 or permissions & 0o600 != 0o600:
        raise InvalidArgument(f"[to_shm] permissions must be 0o600 plus read bits for group or others "
                              f"(0o640, 0o604, 0o644), got {permissions:#o}")
    name = name if name is not None else _shm_name()
    encoded = _check_name(name, "to_shm")
    contiguous = await ops.contiguous(x)
    size = ffi.new("size_t*")
    state = ffi.new("int*", lib.EMLX_SHM_RUNNING)

    def export() -> tuple[int, str]:
        status = lib.emlx_to_shm(ffi.cast("void*", id(contiguous)), encoded, permissions, state, size)
        return status, (last_error() if status < 0 else "")  # the error is this worker thread's

    try:
        status, message = await current_queue().run(export)
    except BaseException:
        # Cancelled (or the job never ran): the export removes its object, or,
        # if it already handed it over, the caller that will never see the name does.
        if lib.emlx_shm_give_up(state) == lib.EMLX_SHM_HANDED_OVER:
            lib.emlx_shm_unlink(encoded)
        raise
    if status != 0:
        if status == lib.EMLX_SHM_ABANDONED:  # pragma: no cover - only after give_up
            raise SharedMemoryError(f"[to_shm] the export of {name!r} was abandoned")
        _raise(status, message)
    return name, size[0]


def _checked_shape(shape: Sequence[int], dtype: mx.Dtype) -> list[int]:
    try:
        dims = [operator.index(d) for d in shape]
    except TypeError:
        raise InvalidArgumentType(f"[from_shm] shape must be a sequence of ints, got {shape!r}") from None
    for i, d in enumerate(dims):
        if d < 0:
            raise InvalidArgument(f"[from_shm] negative dimension in the shape: dimension {i} is {d}")
        if d > MAX_DIM:
            raise MLXOverflowError(f"[from_shm] dimension {i} is {d}, more than an int32 shape entry "
                                   f"holds ({MAX_DIM})")
    count = 1
    for d in dims:
        count *= d
    if count * dtype.size > _OFF_T_MAX:
        raise MLXOverflowError(f"[from_shm] shape {tuple(dims)} has {count} elements of {dtype.size} bytes, "
                               f"more bytes than a shared-memory object can hold")
    return dims


async def from_shm(name: str, shape: Sequence[int], dtype: mx.Dtype) -> mx.array:
    """Read the shared-memory object `name` into a new array and unlink the name.

    The object must be one of ours (see the module docstring) and hold exactly
    the bytes `shape` and `dtype` need; otherwise it is left in place.
    """
    if dtype not in _DTYPE_CODES:
        raise InvalidArgument(f"[from_shm] unsupported dtype {dtype!r}")
    encoded = _check_name(name, "from_shm")
    dims = _checked_shape(shape, dtype)
    out = mx.array(0)
    shape_buffer = ffi.new("int64_t[]", dims)

    def read() -> tuple[int, str]:
        status = lib.emlx_from_shm(encoded, shape_buffer, len(dims), _DTYPE_CODES[dtype], ffi.cast("void*", id(out)))
        return status, (last_error() if status != 0 else "")  # the error is this worker thread's

    # On a worker: reading a large object would otherwise block the loop.
    status, message = await current_queue().run(read)
    if status != 0:
        _raise(status, message)
    return out


def shm_unlink(name: str) -> None:
    """Remove a shared-memory object of ours; nothing happens if it is already gone."""
    status = lib.emlx_shm_unlink(_check_name(name, "shm_unlink"))
    if status != 0:
        _raise(status, last_error())


async def data_ptr(x: mx.array, /) -> int:
    """The address of `x`'s data, evaluating it first (valid while `x` lives)."""
    from ._api import eval as ea_eval

    if not isinstance(x, mx.array):  # the shim reads the object as an mx.array
        raise InvalidInputType(f"[data_ptr] x must be an mx.array, got {type(x).__name__}")
    await ea_eval(x)
    return lib.emlx_data_ptr(ffi.cast("void*", id(x)))




def from_numpy(a: np.ndarray, /, *, copy: bool = True) -> mx.array:
    """An evaluated mx.array with `a`'s contents, usable on any queue.

    With ``copy=False`` a C-contiguous array of a supported dtype is handed to
    MLX's no-copy constructor: where the backend can wrap external memory the
    mx.array reads `a`'s memory (keeping `a` alive), so `a` must not be
    written while MLX may read it; elsewhere (MLX's Linux CPU build) MLX makes
    one copy. Anything else is copied here.
    """
    a = numeric_numpy(a)
    dtype = NUMPY_DTYPES.get(a.dtype)
    if copy or dtype is None or not a.flags.c_contiguous or not a.flags.aligned or a.size == 0:
        return mx.array(a)
    out = mx.array(0)
    status = lib.emlx_wrap_buffer(ffi.cast("void*", a.ctypes.data), ffi.new("int64_t[]", list(a.shape)), a.ndim,
                                  _DTYPE_CODES[dtype], ffi.cast("void*", id(a)), ffi.cast("void*", id(out)))
    if status != 0:
        raise EMLXError(last_error())
    return out


async def to_device(x: mx.array, device, /) -> mx.array:
    """A copy of `x` made by a queue on `device` ("cpu" or "gpu")."""
    return await ops.copy(x, device=device)
