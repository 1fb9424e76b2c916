"""Submitting an op of the table: arguments converted and encoded as mlx would take them, then routed.

`submit` is the one way into the native dispatch (cffi_src/ops.cpp, generated
from emlx_async/_op_table.py): the generated mlx-signature functions, their
adapters and the hand-written ops all submit through it. It also keeps the
debug flags every op obeys (``set_check_finite``, ``set_bounds_checks``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._convert import inputs as _inputs
from ._dtypes import DTYPE_CODES as _DTYPE_CODES
from ._errors import InvalidArgument, InvalidArgumentType, MLXOverflowError, OptionTypeError
from ._native import ffi, lib
from ._op_table import KINDS, OPS, RULE_TESTS, RULES, VARIADIC, WEAK_PAIRS, dispatch_digest, int_range
from ._routing import route
from ._runtime import get_runtime

if ffi.string(lib.emlx_op_table_digest()).decode() != dispatch_digest():  # op codes are spec positions
    raise ImportError("emlx_async's shim was built from a different op spec (emlx_async/_op_table.py); "
                      "reinstall the package so build_ffi.py regenerates the dispatch")

# What a submission reads of its op, in one look-up: code, array count, parameters, weak pairs.
_OPS = {op.name: (code, op.arrays, op.params, WEAK_PAIRS.get(op.name, ())) for code, op in enumerate(OPS)}

# The parameter kinds (emlx_async/_op_table.py: KINDS, RULES): values outside
# the C++ type an integer lands in are refused here, as mlx.core does, never truncated.
_INT_RANGES = {kind: int_range(kind) for kind, spec in KINDS.items() if spec.bits}
_RULES = {rule: (words, RULE_TESTS[rule]) for rule, (words, _) in RULES.items()}
_INT64 = int_range("int64")


def _int_option(name: str, pname: str, kind: str, rule: str, value: Any, bare: bool = False) -> int:
    value = operator.index(value)
    words, low, high = _INT_RANGES[kind]
    if kind == "shape" and _INT64[1] <= value <= _INT64[2] and not low <= value <= high:
        # mlx's own messages for a dimension past int32: a list's (python/src/small_vector.h: its
        # Shape caster), a bare int's (zeros of one dimension: its int | Shape overloads)
        if bare:
            raise MLXOverflowError(f"Shape dimension {value} is outside the supported range [{low}, {high}]. "
                                   "MLX currently uses 32-bit integers for shape dimensions.")
        raise MLXOverflowError(f"Integer value {value} is outside the supported range [{low}, {high}].")
    if not low <= value <= high:
        raise MLXOverflowError(f"[{name}] option {pname!r} = {value} is out of range for {words} "
                               f"[{low}, {high}]")
    if rule and not _RULES[rule][1](value):
        raise InvalidArgument(f"[{name}] option {pname!r} must be {_RULES[rule][0]}, got {value}")
    return value


_NO_PARAMETERS: tuple[list[int], list[float], str] = ([], [], "")  # never mutated


def _encode(name: str, params, options: dict) -> tuple[list[int], list[float], str]:
    if not params and not options:  # most binary and unary ops
        return _NO_PARAMETERS
    ints: list[int] = []
    floats: list[float] = []
    text = ""
    for pname, full_kind, default in params:
        kind, _, rule = full_kind.partition(":")
        value = options.pop(pname, default)
        if rule == "required":
            if value is None:
                raise OptionTypeError(f"[{name}] the option {pname!r} is required")
            rule = ""
        try:
            if kind in ("int", "int64"):
                ints.append(_int_option(name, pname, kind, rule, value))
            elif kind == "bool":
                if value is not True and value is not False:  # mlx's bool caster takes no other value
                    raise OptionTypeError  # worded below
                ints.append(1 if value else 0)
            elif kind == "float":
                try:
                    floats.append(float(value))
                except OverflowError:
                    raise MLXOverflowError(f"[{name}] option {pname!r} = {value!r} is too large for a float") from None
            elif kind == "axis":
                ints += [0, 0] if value is None else [1, _int_option(name, pname, kind, rule, value)]
            elif kind in ("axes", "shape", "strides"):
                if value is None and kind == "axes":
                    ints.append(-1)
                else:
                    if _is_int(value):
                        ints += [1, _int_option(name, pname, kind, rule, value, True)]
                    else:
                        values = list(value)
                        ints += [len(values), *(_int_option(name, pname, kind, rule, v) for v in values)]
            elif kind == "dtype":
                if value is not None and value not in _DTYPE_CODES:
                    raise OptionTypeError  # worded below
                ints.append(-1 if value is None else _DTYPE_CODES[value])
            elif kind == "str":
                if not isinstance(value, str):
                    raise OptionTypeError  # worded below
                text = value
        except (TypeError, ValueError) as exc:
            if str(exc).startswith(f"[{name}]"):
                raise
            raise OptionTypeError(f"[{name}] option {pname!r} must be {_KIND_WORDS[kind]}, got {value!r}") from None
    if options:
        raise InvalidArgumentType(f"[{name}] got unexpected option(s) {sorted(options)}; "
                                  f"it takes {[p[0] for p in params] or 'no options'}")
    return ints, floats, text


def _is_int(value: Any) -> bool:
    try:
        operator.index(value)
    except (TypeError, ValueError):  # mx.array's __index__ raises ValueError past one element
        return False
    return True


_KIND_WORDS = {kind: spec.words for kind, spec in KINDS.items()}


_check_finite_default = False


def set_check_finite(enabled: bool) -> bool:
    """Debug flag: make every op fail when a floating-point result holds NaN or inf.

    Ops can also ask per call with ``check_finite=True``. Returns the previous setting.
    """
    global _check_finite_default
    previous, _check_finite_default = _check_finite_default, bool(enabled)
    return previous


def submit(name: str, arrays: Sequence[Any], *, queue=None, device=None, lazy: bool = False,
           nowait: bool = False, check_finite: bool | None = None, donate: dict[int, int] | None = None,
           _deps: list | None = None, **options: Any):
    """Submit op `name` of the table; returns its JobFuture.

    ``device=`` promotes: the op runs on a queue of that device (the bound one
    if it matches, else the default) whatever device its inputs came from;
    lazy inputs owned by other queues are evaluated there first.
    """
    return submit_with(name, arrays, queue, device, lazy, nowait, check_finite, options, donate, _deps)


def index_value(value: Any) -> int | None:
    """`value` as an index (an int, NumPy's too), or None; a bool is none (True would be 1)."""
    if isinstance(value, (bool, np.bool_)) or not _is_int(value):
        return None
    return operator.index(value)


def donation_indices(name: str, donate: Any) -> dict[int, int]:
    """``donate`` ({input index: output index}) with int indices, or an InvalidArgumentType naming it."""
    if not isinstance(donate, dict):
        raise InvalidArgumentType(f"[{name}] donate must be a dict {{input index: output index}}, "
                                  f"got {type(donate).__name__}")
    indices = {}
    for index, result in donate.items():
        i, r = index_value(index), index_value(result)
        if i is None or r is None:
            raise InvalidArgumentType(f"[{name}] donate={donate!r}: input and output indices must be ints, "
                                      f"got {index!r}: {result!r}")
        indices[i] = r
    return indices


def submit_with(name: str, arrays: Sequence[Any], queue, device, lazy: bool, nowait: bool,
                check_finite: bool | None, options: dict[str, Any], donate: dict[int, int] | None = None,
                deps: list | None = None):
    """``submit`` with its keywords as arguments (the generated ops' path: no keyword packing)."""
    code, expected, params, weak_pairs = _OPS[name]
    if expected != VARIADIC and len(arrays) != expected:
        raise InvalidArgumentType(f"[{name}] takes {expected} array argument(s), got {len(arrays)}")
    if donate:
        given, donate = donate, donation_indices(name, donate)
        for index, result in donate.items():
            if not 0 <= index < len(arrays) or result < 0:
                raise InvalidArgument(f"[{name}] donate={given!r} names an input or output that does not exist "
                                      f"({len(arrays)} input(s) given)")
    inputs = _inputs(arrays, weak_pairs)
    ints, floats, text = _encode(name, params, dict(options)) if options or params else _NO_PARAMETERS
    target = queue if queue is not None else route(inputs, None, device, runtime=get_runtime)
    if check_finite is None:
        check_finite = _check_finite_default
    return target._submit_op(code, name, inputs, ints, floats, text, lazy, nowait, check_finite, donate, deps)


# ---- bounds checks of indices, off by default ----------------------------------

_bounds_checks = False


def set_bounds_checks(enabled: bool) -> bool:
    """Turn bounds checks of take/take_along_axis/put_along_axis/gather/scatter indices on or off.

    The matrix gathers (gather_mm, gather_qmm) and segmented_mm's segments are checked too.

    When on, indices are checked on the worker before the op and an
    out-of-range index raises ``MLXIndexError`` (MLX itself would read or
    write out of bounds). When off (the default) they cost nothing.
    Returns the previous setting.
    """
    global _bounds_checks
    previous, _bounds_checks = _bounds_checks, bool(enabled)
    return previous


def bounds_checks_enabled() -> bool:
    return _bounds_checks


def axis_size(a, axis) -> int | None:
    """The range an index along `axis` of `a` must stay in; None where the axis itself is invalid.

    An invalid axis gets no bounds check: the op itself refuses it on the
    worker, with mlx's own message.
    """
    if axis is None:
        return int(np.prod(a.shape)) if a.ndim else 1
    if not -a.ndim <= axis < a.ndim:
        return None
    return a.shape[axis]


def checked(name: str, arrays: list, checks: list[tuple], kwargs: dict):
    """Submit op `name`, after bounds checks of (indices, axis size[, extent]) when enabled.

    `extent` is how many elements from each index the op reads (a gather's
    slice size along that axis); the index plus it must stay in the axis.
    A check whose size is None (an invalid axis) is left to the op.

    The checks go to the op's own queue just ahead of it, and the op depends
    on them: it keeps its place in the FIFO and never starts if one fails.
    """
    if not _bounds_checks:
        return submit(name, arrays, **kwargs)
    options = dict(kwargs)
    queue = options.pop("queue", None)
    device = options.pop("device", None)
    arrays = _inputs(arrays, WEAK_PAIRS.get(name, ()))
    target = route(arrays, queue, device, runtime=get_runtime)
    checks_done = [submit("check_bounds", [check[0]], size=check[1], extent=check[2] if len(check) > 2 else 1,
                          op=name, queue=target) for check in checks if check[1] is not None]
    return submit(name, arrays, queue=target, _deps=checks_done, **options)


# Each quantization mode's pinned (group_size, bits); affine's are defaults.
QUANTIZATION_MODES = {"affine": None, "mxfp4": (32, 4), "mxfp8": (32, 8), "nvfp4": (16, 4)}


def check_mode(name: str, mode: str, group_size, bits) -> None:
    if mode not in QUANTIZATION_MODES:
        raise InvalidArgument(f"[{name}] unknown mode {mode!r}; expected one of {sorted(QUANTIZATION_MODES)}")
    pinned = QUANTIZATION_MODES[mode]
    if pinned is None:
        return
    if (group_size is not None and group_size != pinned[0]) or (bits is not None and bits != pinned[1]):
        raise InvalidArgument(f"[{name}] mode {mode!r} needs group_size={pinned[0]} and bits={pinned[1]}, "
                              f"got group_size={group_size} and bits={bits}")
