"""mlx.core's conversion of an op's arguments to arrays, to the last dtype.

A port of mlx's ``to_array`` and ``to_arrays`` (python/src/utils.cpp). A
Python scalar (or a NumPy value) beside an mx.array is a *weak* type: it
takes the array's dtype where that dtype can hold its kind, so
``int8_array + 2`` stays int8, ``float16_array + 2.0`` stays float16, but
``bool_array + 2`` is int32 and ``int_array + 2.5`` float32. Alone, a scalar
keeps its own kind (int32, int64 past int32's range, float32, complex64).

Which of an op's arrays convert as a weak pair is a fact of the op table
(`_op_table.WEAK_PAIRS`); every other input converts on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import mlx.core as mx
import numpy as np

from ._dtypes import INT_RANGES
from ._errors import InvalidInputType, MLXRuntimeError, MLXValueError
from ._errors import OptionTypeError as OptionTypeError  # _adapters reaches it here

# A Python int is checked against the hinted dtype below 64 bits; at 64 the int64_t read decides.
_INT_BITS = {dtype: INT_RANGES[dtype] for dtype in (mx.uint8, mx.uint16, mx.uint32, mx.int8, mx.int16, mx.int32)}
_INT32, _INT64 = INT_RANGES[mx.int32], INT_RANGES[mx.int64]


_ARRAY = mx.array


def is_mlx_array(value: Any) -> bool:
    return isinstance(value, mx.array) or hasattr(value, "__mlx_array__")


def _mlx_array(value: Any) -> mx.array:
    return value if isinstance(value, mx.array) else value.__mlx_array__()


def to_array(value: Any, dtype: mx.Dtype | None = None) -> mx.array:
    """mlx's ``to_array``: `value` as an array, `dtype` the weak-type hint (the other operand's dtype)."""
    if isinstance(value, bool):
        return mx.array(value, dtype=mx.bool_ if dtype is None else dtype)
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise MLXRuntimeError("std::bad_cast")  # mlx reads the int as an int64_t
        out = dtype if dtype is not None else (mx.int32 if _INT32[0] <= value <= _INT32[1] else mx.int64)
        if out in _INT_BITS and not _INT_BITS[out][0] <= value <= _INT_BITS[out][1]:
            raise MLXValueError(f"Converting {value} to {str(out).rsplit('.', 1)[-1]} would result in overflow.")
        return mx.array(value, dtype=mx.int32 if out == mx.bool_ else out)  # a bool hint always promotes
    if isinstance(value, float):
        out = dtype if dtype is not None and mx.issubdtype(dtype, mx.floating) else mx.float32
        if out != mx.float64:
            with np.errstate(over="ignore"):
                value = float(np.float32(value))  # mlx reads the value as a C float first
        return mx.array(value, dtype=out)
    if is_mlx_array(value):
        return _mlx_array(value)
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biufc":
        value = numeric_numpy(value)
        return mx.array(value, dtype=dtype) if dtype is not None else mx.array(value)
    if isinstance(value, complex):
        return mx.array(value, dtype=mx.complex64)
    if value is None:  # nanobind refuses None before mlx converts: the generated functions ask mlx's message
        raise OptionTypeError("Invalid type NoneType received in array initialization.")
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(value, np.ndarray):  # one of a dtype mlx takes no array of (object, str): mlx's name
        name = "ndarray"
    elif isinstance(value, np.generic):  # a str_, bytes_, void or datetime64 scalar (the last crashes mlx)
        name = kind.__name__
    raise InvalidInputType(f"Invalid type {name} received in array initialization.")


def numeric_numpy(value: np.ndarray | np.generic) -> np.ndarray:
    """A NumPy value as an array mlx can take: in the machine's byte order (mlx fails on
    another with std::bad_cast); one of a dtype mlx has no array of is refused by name."""
    value = np.asarray(value)
    if value.dtype.kind not in "biufc":
        raise InvalidInputType("Invalid type ndarray received in array initialization.")
    return value if value.dtype.isnative else value.astype(value.dtype.newbyteorder("="))


def to_arrays(a: Any, b: Any) -> tuple[mx.array, mx.array]:
    """mlx's ``to_arrays``: a non-array beside an array is weakly typed by it; two non-arrays are not."""
    if is_mlx_array(a):
        a = _mlx_array(a)
        return a, (_mlx_array(b) if is_mlx_array(b) else to_array(b, a.dtype))
    if is_mlx_array(b):
        b = _mlx_array(b)
        return to_array(a, b.dtype), b
    return to_array(a), to_array(b)


def inputs(arrays: Iterable[Any], weak_pairs: Iterable[tuple[int, int]] = ()) -> list[mx.array]:
    """An op's inputs as arrays: each weak pair (i, j) as `to_arrays`, the rest as `to_array`.

    Lists and tuples are refused, as mlx refuses them (mlx 0.32: a ValueError
    for a ``scalar | array`` parameter, a TypeError for a plain ``array`` one).
    """
    values = list(arrays)
    for value in values:
        if type(value) is not _ARRAY:
            break
    else:  # the common call: arrays only, which every rule below leaves as they are
        return values
    done = [False] * len(values)
    for i, j in weak_pairs:
        values[i], values[j] = to_arrays(values[i], values[j])
        done[i] = done[j] = True
    for i, value in enumerate(values):
        if not done[i] and not isinstance(value, mx.array):
            values[i] = to_array(value)
    return values
