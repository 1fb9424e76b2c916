"""Reading the mlx::core::array inside an mx.array without copying.

The shim reads the C++ handle at ``(char*)obj + offset`` (nanobind's instance
layout, DESIGN §5). That layout is nanobind's, not a public API, so it is
validated here at import against arrays whose shape and item size we know.
When validation fails the runtime uses Python-level paths (slower, same
results) and says so once with a warning.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import mlx.core as mx

from ._native import ensure, ffi, lib

AVAILABLE = lib.EMLX_ARRAY_AVAILABLE
LAZY = lib.EMLX_ARRAY_LAZY
SCHEDULED = lib.EMLX_ARRAY_SCHEDULED

_MAX_DIMS = 8


def _layout_matches(array: mx.array) -> bool:
    shape = ffi.new("int64_t[]", _MAX_DIMS)
    ndim, itemsize, size = ffi.new("int*"), ffi.new("int*"), ffi.new("int64_t*")
    if lib.emlx_probe_array(ffi.cast("void*", id(array)), shape, _MAX_DIMS, ndim, itemsize, size) != 0:
        return False
    return (
        ndim[0] == array.ndim
        and tuple(shape[0 : ndim[0]]) == tuple(array.shape)
        and itemsize[0] == array.itemsize
        and size[0] == array.size
    )


def _validate() -> bool:
    probes = [
        mx.zeros((3, 5, 7), dtype=mx.float16),
        mx.ones((11,), dtype=mx.int64),
        mx.array(2.5),
        mx.zeros((2, 1, 4, 1, 3), dtype=mx.bool_),
        mx.ones((4, 4)) + 1,  # lazy
    ]
    return all(_layout_matches(a) for a in probes)


ZERO_COPY = _validate()
if not ZERO_COPY:  # pragma: no cover - only on an unexpected nanobind layout
    warnings.warn(
        "emlx_async: mx.array's memory layout is not the one the shim expects; "
        "native array jobs fall back to slower Python-level paths",
        RuntimeWarning,
        stacklevel=2,
    )


@dataclass(frozen=True, slots=True)
class ArrayState:
    state: int
    device_type: int = -1
    stream_index: int = -1


# Evaluated arrays are the common case (a replayed step's weights: hundreds
# per call): one shared state instead of a new object each.
_AVAILABLE_STATE = ArrayState(AVAILABLE)
_out_device = ffi.new("int*")
_out_stream = ffi.new("int*")


def array_state(array: mx.array) -> ArrayState:
    """Whether `array` is evaluated, and which stream owns it when lazy.

    Called on the loop thread only (the out-parameters are shared).
    """
    if not ZERO_COPY:  # pragma: no cover
        return ArrayState(AVAILABLE)
    state = lib.emlx_array_state(ffi.cast("void*", id(array)), _out_device, _out_stream)
    if state == LAZY:
        return ArrayState(state, _out_device[0], _out_stream[0])
    return _AVAILABLE_STATE if state == AVAILABLE else ArrayState(state)


def handles(arrays: list[mx.array]):
    """A cffi array of PyObject pointers; the caller keeps `arrays` alive."""
    return ffi.new("void*[]", [ffi.cast("void*", id(a)) for a in arrays])


def check_evaluable(arrays: list[mx.array], what: str) -> None:
    """Refuse (MLXRuntimeError naming `what`) to evaluate `arrays` when a node of their
    graphs could never be allocated: MLX's allocator ends the process on a failed allocation."""
    ensure(lib.emlx_check_evaluable(handles(arrays), len(arrays), what.encode()))


def addresses(arrays: list[mx.array]):
    """The objects' addresses as a cffi ``intptr_t[]`` (the submit calls' form: no cast per array)."""
    return ffi.new("intptr_t[]", [id(a) for a in arrays])


class AddressBuffer:
    """``addresses`` into one reused ``intptr_t[]``: for the submit calls of one loop thread.

    The native submit reads the addresses during the call and keeps none, and
    only its own loop thread submits to a queue, so one buffer per queue is
    never read by two calls at once. Filling it costs 0.3-0.5 us where a new
    cffi array costs 1 us (a submission's most expensive single step).
    """

    __slots__ = ("_buffer",)
    SIZE = 8

    def __init__(self) -> None:
        self._buffer = ffi.new("intptr_t[]", self.SIZE)

    def of(self, arrays: list[mx.array]):
        if len(arrays) > self.SIZE:
            return addresses(arrays)
        buffer, i = self._buffer, 0
        for a in arrays:
            buffer[i] = id(a)
            i += 1
        return buffer
