"""Sharing arrays between processes through POSIX shared memory, and raw pointers.

``name, nbytes = await ea.ipc.to_shm(x)`` copies an array into a new shared
memory object (on a worker thread, not the loop). Another process maps it
with ``await ea.ipc.from_shm(name, shape, dtype)`` and hands the mapping to
MLX's no-copy constructor (backends that cannot wrap external memory, such
as the Linux CPU build, copy it once); the name is unlinked as it is opened,
so it cannot leak. ``shm_unlink(name)`` removes an object nobody opened (it is
harmless when the object is already gone).
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from . import ops
from ._routing import current_queue
from ._errors import EMLXError
from ._dtypes import DTYPE_CODES as _DTYPE_CODES
from ._native import ffi, lib, last_error

_names = itertools.count()


class SharedMemoryError(EMLXError, OSError):
    """A shared-memory object could not be created, opened or removed."""


def _shm_name() -> str:
    return f"/emlx-{os.getpid()}-{next(_names)}-{secrets.token_hex(4)}"


async def to_shm(x: mx.array, /, permissions: int = 0o600, *, name: str | None = None) -> tuple[str, int]:
    """Copy `x` into a new shared-memory object; returns (name, nbytes)."""
    name = name or _shm_name()
    contiguous = await ops.contiguous(x)
    size = ffi.new("size_t*")

    def export() -> int:
        return lib.emlx_to_shm(ffi.cast("void*", id(contiguous)), name.encode(), permissions, size)

    if await current_queue().run(export) != 0:
        raise SharedMemoryError(last_error())
    return name, size[0]


async def from_shm(name: str, shape: Sequence[int], dtype: mx.Dtype) -> mx.array:
    """Map the shared-memory object `name` as an array and unlink the name."""
    if dtype not in _DTYPE_CODES:
        raise ValueError(f"[from_shm] unsupported dtype {dtype!r}")
    dims = [int(d) for d in shape]
    out = mx.array(0)
    status = lib.emlx_from_shm(name.encode(), ffi.new("int64_t[]", dims), len(dims), _DTYPE_CODES[dtype],
                               ffi.cast("void*", id(out)))
    if status != 0:
        raise SharedMemoryError(last_error())
    return out


def shm_unlink(name: str) -> None:
    """Remove a shared-memory object; nothing happens if it is already gone."""
    if lib.emlx_shm_unlink(name.encode()) != 0:
        raise SharedMemoryError(last_error())


async def data_ptr(x: mx.array, /) -> int:
    """The address of `x`'s data, evaluating it first (valid while `x` lives)."""
    from ._api import eval as ea_eval

    await ea_eval(x)
    return lib.emlx_data_ptr(ffi.cast("void*", id(x)))


_NUMPY_DTYPES = {np.dtype(np.bool_): mx.bool_, np.dtype(np.uint8): mx.uint8, np.dtype(np.uint16): mx.uint16,
                 np.dtype(np.uint32): mx.uint32, np.dtype(np.uint64): mx.uint64, np.dtype(np.int8): mx.int8,
                 np.dtype(np.int16): mx.int16, np.dtype(np.int32): mx.int32, np.dtype(np.int64): mx.int64,
                 np.dtype(np.float16): mx.float16, np.dtype(np.float32): mx.float32,
                 np.dtype(np.complex64): mx.complex64}


def from_numpy(a: np.ndarray, /, *, copy: bool = True) -> mx.array:
    """An evaluated mx.array with `a`'s contents, usable on any queue.

    With ``copy=False`` a C-contiguous array of a supported dtype is handed to
    MLX's no-copy constructor: where the backend can wrap external memory the
    mx.array reads `a`'s memory (keeping `a` alive), so `a` must not be
    written while MLX may read it; elsewhere (MLX's Linux CPU build) MLX makes
    one copy. Anything else is copied here.
    """
    a = np.asarray(a)
    dtype = _NUMPY_DTYPES.get(a.dtype)
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
    return await ops.copy(x, queue=current_queue(device))
