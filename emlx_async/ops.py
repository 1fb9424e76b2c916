"""MLX ops as awaitables, built and run natively on the owning queue's thread.

Every function here is generated from emlx_async/_op_table.py (the same
table build_ffi.py turns into the C++ dispatch). Names and options follow
``mlx.core``: arrays are positional, options keyword-only, plus

* ``queue=``: where to run (else the routing rule: owner of a lazy input,
  the bound queue, the default queue); ``device=`` picks a queue of that
  device instead, whatever device the inputs came from (promotion);
* ``lazy=True``: return the unevaluated result, owned by its queue, so
  chains fuse into one graph (``await ea.eval(x)`` materialises it);
* ``nowait=True``: raise ``QueueFull`` instead of waiting for a slot;
* ``check_finite=True``: fail if a floating-point result holds NaN or inf
  (``set_check_finite(True)`` makes that the default for every op).

Calling an op submits it at once and returns a JobFuture, so many ops can
be in flight on one queue, in order. Graph building and evaluation happen in
C++ on the worker, without the GIL.

Example:
    >>> y = await ea.ops.matmul(a, b)
    >>> z = await ea.ops.sum(y, axis=1, keepdims=True)
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from ._dtypes import DTYPE_CODES as _DTYPE_CODES
from ._op_table import OPS, VARIADIC

from ._native import lib
from ._routing import current_queue, route

if lib.emlx_op_count() != len(OPS):  # op codes are table positions: both sides must agree
    raise ImportError("emlx_async's shim was built from a different op table; reinstall the package "
                      "so build_ffi.py regenerates the dispatch")

_CODES = {name: code for code, (name, *_rest) in enumerate(OPS)}
_SPECS = {name: (arrays, params) for name, arrays, params, _ in OPS}


def _as_array(value: Any, like: mx.array | None) -> mx.array:
    """Inputs: mx.arrays as they are; scalars typed like their array operand (MLX's weak typing)."""
    if isinstance(value, mx.array):
        return value
    if isinstance(value, np.ndarray):
        return mx.array(value)
    if isinstance(value, (bool, int, float, complex)) and like is not None and not isinstance(value, bool):
        if mx.issubdtype(like.dtype, mx.inexact) or isinstance(value, int):
            return mx.array(value, dtype=like.dtype)
    return mx.array(value)


# The C++ type each integer kind lands in (cffi_src/ops.cpp: Params): values
# outside it are refused here, as mlx.core does, never truncated.
_INT_RANGES = {"int": ("a 32-bit int", -2**31, 2**31 - 1), "axis": ("a 32-bit int", -2**31, 2**31 - 1),
               "axes": ("a 32-bit int", -2**31, 2**31 - 1), "shape": ("a 32-bit int", -2**31, 2**31 - 1),
               "int64": ("a 64-bit int", -2**63, 2**63 - 1), "strides": ("a 64-bit int", -2**63, 2**63 - 1)}
# Rules a kind may add after a colon ("int:positive"); MLX divides by such options.
_RULES = {"positive": ("positive", lambda v: v > 0), "nonneg": ("non-negative", lambda v: v >= 0),
          "nonzero": ("nonzero", lambda v: v != 0)}


def _int_option(name: str, pname: str, kind: str, rule: str, value: Any) -> int:
    value = operator.index(value)
    words, low, high = _INT_RANGES[kind]
    if not low <= value <= high:
        raise OverflowError(f"[{name}] option {pname!r} = {value} is out of range for {words} "
                            f"[{low}, {high}]")
    if rule and not _RULES[rule][1](value):
        raise ValueError(f"[{name}] option {pname!r} must be {_RULES[rule][0]}, got {value}")
    return value


def _encode(name: str, params, options: dict) -> tuple[list[int], list[float], str]:
    ints: list[int] = []
    floats: list[float] = []
    text = ""
    for pname, full_kind, default in params:
        kind, _, rule = full_kind.partition(":")
        value = options.pop(pname, default)
        try:
            if kind in ("int", "int64"):
                ints.append(_int_option(name, pname, kind, rule, value))
            elif kind == "bool":
                ints.append(1 if value else 0)
            elif kind == "float":
                try:
                    floats.append(float(value))
                except OverflowError:
                    raise OverflowError(f"[{name}] option {pname!r} = {value!r} is too large for a float") from None
            elif kind == "axis":
                ints += [0, 0] if value is None else [1, _int_option(name, pname, kind, rule, value)]
            elif kind in ("axes", "shape", "strides"):
                if value is None and kind == "axes":
                    ints.append(-1)
                else:
                    values = [value] if _is_int(value) else list(value)
                    ints += [len(values), *(_int_option(name, pname, kind, rule, v) for v in values)]
            elif kind == "dtype":
                if value is not None and value not in _DTYPE_CODES:
                    raise TypeError
                ints.append(-1 if value is None else _DTYPE_CODES[value])
            elif kind == "str":
                if not isinstance(value, str):
                    raise TypeError
                text = value
        except (TypeError, ValueError) as exc:
            if str(exc).startswith(f"[{name}]"):
                raise
            raise TypeError(f"[{name}] option {pname!r} must be {_KIND_WORDS[kind]}, got {value!r}") from None
    if options:
        raise TypeError(f"[{name}] got unexpected option(s) {sorted(options)}; "
                        f"it takes {[p[0] for p in params] or 'no options'}")
    return ints, floats, text


def _is_int(value: Any) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


_KIND_WORDS = {"int": "an int", "int64": "an int", "bool": "a bool", "float": "a number",
               "axis": "an int or None", "axes": "an int, a sequence of ints or None",
               "shape": "a sequence of ints", "strides": "a sequence of ints", "dtype": "an mlx dtype or None",
               "str": "a str"}


_check_finite_default = False


def set_check_finite(enabled: bool) -> bool:
    """Debug flag: make every op fail when a floating-point result holds NaN or inf.

    Ops can also ask per call with ``check_finite=True``. Returns the previous setting.
    """
    global _check_finite_default
    previous, _check_finite_default = _check_finite_default, bool(enabled)
    return previous


def _target(inputs: list[mx.array], queue, device):
    return route(inputs, queue) if device is None or queue is not None else current_queue(device)


def submit(name: str, arrays: Sequence[Any], *, queue=None, device=None, lazy: bool = False,
           nowait: bool = False, check_finite: bool | None = None, donate: dict[int, int] | None = None,
           _deps: list | None = None, **options: Any):
    """Submit op `name` of the table; returns its JobFuture.

    ``device=`` promotes: the op runs on a queue of that device (the bound one
    if it matches, else the default) whatever device its inputs came from;
    lazy inputs owned by other queues are evaluated there first.
    """
    expected, params = _SPECS[name]
    if expected != VARIADIC and len(arrays) != expected:
        raise TypeError(f"[{name}] takes {expected} array argument(s), got {len(arrays)}")
    like = next((a for a in arrays if isinstance(a, mx.array)), None)
    inputs = [_as_array(a, like) for a in arrays]
    ints, floats, text = _encode(name, params, dict(options))
    target = _target(inputs, queue, device)
    if check_finite is None:
        check_finite = _check_finite_default
    return target._submit_op(_CODES[name], name, inputs, ints, floats, text, lazy, nowait, check_finite, donate,
                             _deps)


def _make(name: str, arrays: int, params) -> Any:
    option_names = ", ".join(f"{p}={d!r}" for p, _, d in params)

    def op(*inputs: Any, queue=None, device=None, lazy: bool = False, nowait: bool = False,
           check_finite: bool | None = None, **options: Any):
        return submit(name, inputs, queue=queue, device=device, lazy=lazy, nowait=nowait,
                      check_finite=check_finite, **options)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (f"``mx.{name}`` run natively on the owning queue; returns a JobFuture.\n\n"
                  f"Arrays: {arrays if arrays != VARIADIC else 'a list'}. Options: {option_names or 'none'}, "
                  "plus queue=, device=, lazy=, nowait=, check_finite=.")
    return op


_SPECIAL = {"window_scatter_max", "window_scatter_min", "check_bounds", "take", "take_along_axis", "put_along_axis", "kv_cache_attention", "split", "concatenate", "stack", "einsum", "scatter", "scatter_add", "gather", "dequantize",
            "quantized_matmul", "quantize"}

for _name, _arrays, _params, _ in OPS:
    if "_" in _name and _name.split("_", 1)[0] in ("linalg", "fft", "fast"):
        continue  # exposed through ea.linalg, ea.fft and ea.fast
    if _name not in _SPECIAL:
        globals()[_name] = _make(_name, _arrays, _params)


def _window_scatter(name, operand, source, window, strides, padding, kwargs):
    padding = [0, 0] * operand.ndim if padding is None else [int(v) for pair in padding for v in pair]
    return submit(name, [operand, source], window=window, strides=strides or window, padding=padding, **kwargs)


def window_scatter_max(operand, source, /, *, window, strides=None, padding=None, **kwargs: Any):
    """Scatter `source` to the max position of each window of `operand` (max-pooling's gradient).

    `window` and `strides` (default: `window`) per axis; `padding` a (low, high)
    pair per axis. Ties go to the first position in a window.
    """
    return _window_scatter("window_scatter_max", operand, source, window, strides, padding, kwargs)


def window_scatter_min(operand, source, /, *, window, strides=None, padding=None, **kwargs: Any):
    """Like `window_scatter_max`, at each window's min position."""
    return _window_scatter("window_scatter_min", operand, source, window, strides, padding, kwargs)


# ---- indexing, with optional bounds checks -------------------------------------

_bounds_checks = False


def set_bounds_checks(enabled: bool) -> bool:
    """Turn bounds checks of take/take_along_axis/put_along_axis/gather/scatter indices on or off.

    When on, indices are checked on the worker before the op and an
    out-of-range index raises ``MLXIndexError`` (MLX itself would read or
    write out of bounds). When off (the default) they cost nothing.
    Returns the previous setting.
    """
    global _bounds_checks
    previous, _bounds_checks = _bounds_checks, bool(enabled)
    return previous


def _axis_size(a, axis) -> int:
    if axis is None:
        return int(np.prod(a.shape)) if a.ndim else 1
    return a.shape[axis]


def _checked(name: str, arrays: list, checks: list[tuple], kwargs: dict):
    """Submit op `name`, after bounds checks of (indices, axis size[, extent]) when enabled.

    `extent` is how many elements from each index the op reads (a gather's
    slice size along that axis); the index plus it must stay in the axis.

    The checks go to the op's own queue just ahead of it, and the op depends
    on them: it keeps its place in the FIFO and never starts if one fails.
    """
    if not _bounds_checks:
        return submit(name, arrays, **kwargs)
    options = dict(kwargs)
    queue = options.pop("queue", None)
    device = options.pop("device", None)
    target = _target([_as_array(a, None) if not isinstance(a, mx.array) else a for a in arrays], queue, device)
    checks_done = [submit("check_bounds", [check[0]], size=check[1], extent=check[2] if len(check) > 2 else 1,
                          op=name, queue=target) for check in checks]
    return submit(name, arrays, queue=target, _deps=checks_done, **options)


def take(a, indices, /, *, axis=None, **kwargs: Any):
    """``mx.take``."""
    return _checked("take", [a, indices], [(indices, _axis_size(a, axis))], dict(axis=axis, **kwargs))


def take_along_axis(a, indices, /, *, axis=None, **kwargs: Any):
    """``mx.take_along_axis``."""
    return _checked("take_along_axis", [a, indices], [(indices, _axis_size(a, axis))], dict(axis=axis, **kwargs))


def put_along_axis(a, indices, values, /, *, axis: int, **kwargs: Any):
    """``mx.put_along_axis``."""
    return _checked("put_along_axis", [a, indices, values], [(indices, _axis_size(a, axis))],
                    dict(axis=axis, **kwargs))


def concatenate(arrays: Sequence[mx.array], /, *, axis: int = 0, **kwargs: Any):
    """``mx.concatenate`` on the owning queue."""
    return submit("concatenate", list(arrays), axis=axis, **kwargs)


def stack(arrays: Sequence[mx.array], /, *, axis: int = 0, **kwargs: Any):
    """``mx.stack`` on the owning queue."""
    return submit("stack", list(arrays), axis=axis, **kwargs)


def split(a, indices_or_sections, /, *, axis: int = 0, **kwargs: Any):
    """``mx.split``: an int splits into that many equal parts, a sequence at those indices."""
    if isinstance(indices_or_sections, int):
        if indices_or_sections < 1:
            raise ValueError(f"[split] the number of sections must be positive, got {indices_or_sections}")
        return submit("split", [a], sections=indices_or_sections, axis=axis, **kwargs)
    return submit("split", [a], indices=list(indices_or_sections), axis=axis, **kwargs)


def einsum(subscripts: str, /, *operands: mx.array, **kwargs: Any):
    """``mx.einsum`` on the owning queue."""
    return submit("einsum", list(operands), subscripts=subscripts, **kwargs)


def _index_list(indices) -> list:
    return list(indices) if isinstance(indices, (list, tuple)) else [indices]


def _index_checks(a, indices: list, axes, slice_sizes=None) -> list[tuple]:
    if axes is None:
        raise TypeError("the option 'axes' is required (an int or a sequence of ints)")
    axes = [axes] if isinstance(axes, int) else list(axes)
    if slice_sizes is None:
        return [(idx, a.shape[ax]) for idx, ax in zip(indices, axes)]
    # A gather reads slice_sizes[axis] elements from each index along that axis.
    return [(idx, a.shape[ax], builtins.max(int(slice_sizes[ax]), 1)) for idx, ax in zip(indices, axes)]


def scatter(a, indices, updates, /, *, axes, **kwargs: Any):
    """Write `updates` into `a` at `indices` along `axes` (``mlx::core::scatter``)."""
    indices = _index_list(indices)
    return _checked("scatter", [a, *indices, updates], _index_checks(a, indices, axes), dict(axes=axes, **kwargs))


def scatter_add(a, indices, updates, /, *, axes, **kwargs: Any):
    """Add `updates` into `a` at `indices` along `axes` (``mlx::core::scatter_add``)."""
    indices = _index_list(indices)
    return _checked("scatter_add", [a, *indices, updates], _index_checks(a, indices, axes),
                    dict(axes=axes, **kwargs))


def gather(a, indices, /, *, axes, slice_sizes, **kwargs: Any):
    """``mlx::core::gather``: slices of `slice_sizes` from `a` at `indices` along `axes`."""
    indices = _index_list(indices)
    checks = _index_checks(a, indices, axes, slice_sizes) if _bounds_checks else []
    return _checked("gather", [a, *indices], checks, dict(axes=axes, slice_sizes=slice_sizes, **kwargs))


# Each quantization mode's pinned (group_size, bits); affine's are defaults.
QUANTIZATION_MODES = {"affine": None, "mxfp4": (32, 4), "mxfp8": (32, 8), "nvfp4": (16, 4)}


def _check_mode(name: str, mode: str, group_size, bits) -> None:
    if mode not in QUANTIZATION_MODES:
        raise ValueError(f"[{name}] unknown mode {mode!r}; expected one of {sorted(QUANTIZATION_MODES)}")
    pinned = QUANTIZATION_MODES[mode]
    if pinned is None:
        return
    if (group_size is not None and group_size != pinned[0]) or (bits is not None and bits != pinned[1]):
        raise ValueError(f"[{name}] mode {mode!r} needs group_size={pinned[0]} and bits={pinned[1]}, "
                         f"got group_size={group_size} and bits={bits}")


def quantize(w, /, *, group_size=None, bits=None, mode: str = "affine", **kwargs: Any):
    """``mx.quantize``: (w_q, scales[, biases]); each mode's group size and bits are checked."""
    _check_mode("quantize", mode, group_size, bits)
    return submit("quantize", [w], group_size=group_size, bits=bits, mode=mode, **kwargs)


def dequantize(w, scales, biases=None, /, *, group_size=None, bits=None, mode: str = "affine", **kwargs: Any):
    """``mx.dequantize``."""
    _check_mode("dequantize", mode, group_size, bits)
    arrays = [w, scales] + ([biases] if biases is not None else [])
    return submit("dequantize", arrays, group_size=group_size, bits=bits, mode=mode, **kwargs)


def quantized_matmul(x, w, scales, biases=None, /, *, transpose: bool = True, group_size=None, bits=None,
                     mode: str = "affine", **kwargs: Any):
    """``mx.quantized_matmul``."""
    _check_mode("quantized_matmul", mode, group_size, bits)
    arrays = [x, w, scales] + ([biases] if biases is not None else [])
    return submit("quantized_matmul", arrays, transpose=transpose, group_size=group_size, bits=bits,
                  mode=mode, **kwargs)


def names() -> list[str]:
    """Every op this module exposes (the linalg, fft and fast namespaces aside)."""
    return sorted(n for n in globals() if n in _CODES)

