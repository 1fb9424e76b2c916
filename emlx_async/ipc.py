"""Sharing arrays between processes through POSIX shared memory, and raw pointers.

``name, nbytes = await ea.ipc.to_shm(x)`` copies an array into a new shared
memory object (on a worker thread, not the loop). Another process maps it
with ``await ea.ipc.from_shm(name, shape, dtype)``, without a copy; the name
is unlinked as it is opened, so it cannot leak, and the memory lives as long
as the array. ``shm_unlink(name)`` removes an object nobody opened (it is
harmless when the object is already gone).
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Sequence

import mlx.core as mx

from . import ops
from ._binding import current_queue
from ._errors import EMLXError
from ._host_call import _DTYPE_CODES
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
    """Map the shared-memory object `name` as an array (no copy) and unlink the name."""
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


async def to_device(x: mx.array, device, /) -> mx.array:
    """A copy of `x` made by a queue on `device` ("cpu" or "gpu")."""
    return await ops.copy(x, queue=current_queue(device))
