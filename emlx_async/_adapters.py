"""From mlx.core's signatures to op-table submissions.

The generated modules (``_generated_*.py``) hold the public functions with
mlx's own signatures; each calls `op` with its table options, or one of the
adapters here where mlx's parameters need translating (int-or-pair paddings,
``None`` meaning "the input's shape", a key drawn from MLX's random state,
...). Every function takes the runtime keywords as a dict made by `runtime`.
"""

from __future__ import annotations

import dis
import inspect
import operator
import sys
import typing
from collections.abc import Sequence
from typing import Any, Union

import mlx.core as mx
import numpy as np

from . import _backend
from ._convert import OptionTypeError as OptionTypeError  # the generated functions catch it
from ._convert import to_array
from ._devices import stream_device
from ._errors import InvalidArgument, InvalidArgumentType, MLXValueError
from ._submit import _is_int, axis_size, check_mode, checked, submit, submit_with

scalar = Union[bool, int, float, complex]
# mlx's own `stream=`: a stream, a device or a device name; it picks a queue of that device.
StreamOrDevice = Union[mx.Stream, mx.Device, mx.DeviceType, str, None]


def runtime(stream, queue, device, lazy, nowait, check_finite) -> dict[str, Any]:
    """The runtime keywords of a call; ``stream=`` acts like ``device=`` (its device)."""
    return dict(queue=queue, device=stream_device(stream, device), lazy=lazy, nowait=nowait, check_finite=check_finite)


def op(name: str, arrays: list, rt: dict, **options: Any):
    return submit_with(name, arrays, rt["queue"], rt["device"], rt["lazy"], rt["nowait"], rt["check_finite"],
                       options)


def _is_sequence(value) -> bool:
    """A sequence as nanobind's casters take one (PySequence_Check): not a dict, a set or an iterator."""
    return not isinstance(value, dict) and hasattr(type(value), "__getitem__") and hasattr(type(value), "__len__")


def _ints(values) -> list[int]:
    """A sequence of ints as nanobind's list caster takes one (not a str, bytes or dict); anything else
    is an OptionTypeError, answered with mlx's binding's TypeError."""
    if type(values) is not list and type(values) is not tuple and (
            isinstance(values, (str, bytes)) or not _is_sequence(values)):
        raise OptionTypeError(f"expects a sequence of ints, got {values!r}")
    try:
        return [operator.index(v) for v in values]
    except (TypeError, ValueError):  # mx.array's iter()/__index__ raise either
        raise OptionTypeError(f"expects a sequence of ints, got {values!r}") from None


def _per_axis(value, n: int) -> list[int]:
    """mlx's conv{n}d forms: an int for every spatial axis, or (from 2-D) a sequence of n ints.

    Any other kind or length is an OptionTypeError, answered with mlx's binding's TypeError.
    """
    if _is_int(value):
        return [operator.index(value)] * n
    # nanobind's casters take any sequence: a list or tuple, a NumPy or an mx array.
    if n > 1 and not isinstance(value, (str, bytes)) and hasattr(value, "__len__") \
            and hasattr(value, "__getitem__") and len(value) == n and all(_is_int(v) for v in value):
        return _ints(value)
    raise OptionTypeError(f"expects an int{f' or {n} ints' if n > 1 else ''}, got {value!r}")


def _int_or_ints(value):
    """conv_general's `int | Sequence[int]`: passed on as mlx's binding does, its C++ checks the length."""
    return [value] if _is_int(value) else value


# ---- mlx's overloads, resolved as nanobind resolves them ------------------------------------

# mlx's own functions by path ("mx.topk"), as they were at import: the messages below come from
# them even where a caller has since replaced an mx attribute.
_MLX = {f"{prefix}{name}": getattr(module, name)
        for prefix, module in (("mx.", mx), ("mx.linalg.", mx.linalg), ("mx.fft.", mx.fft), ("mx.random.", mx.random),
                                 ("mx.fast.", mx.fast))
        for name in dir(module) if not name.startswith("_")}

_ANNOTATION_TYPES = {"int": (int,), "float": (float, int), "None": (type(None),), "Dtype": (mx.Dtype,)}


def _fits(value, annotation) -> bool:
    if not isinstance(annotation, str):
        return True
    kinds = [_ANNOTATION_TYPES.get(part.strip()) for part in annotation.split("|")]
    return any(kind is None or isinstance(value, kind) for kind in kinds)


def _nb_type_name(value) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def resolve(function, mlx_path: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of a call, bound to the first of `function`'s typed overloads that takes them.

    The overloads are mlx's, tried in mlx's order. A call none of them takes
    raises TypeError with nanobind's message for the same call to mlx's function.
    """
    for overload in typing.get_overloads(function):
        signature = inspect.signature(overload)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            continue
        if all(_fits(value, signature.parameters[name].annotation) for name, value in bound.arguments.items()):
            bound.apply_defaults()
            return dict(bound.arguments)
    mlx_function = _MLX[mlx_path]
    name = mlx_function.__name__
    supported = "\n".join(f"    {k}. {text[4:] if text.startswith('def ') else text}"
                          for k, (text, *_) in enumerate(mlx_function.__nb_signature__, 1))
    types = [_nb_type_name(v) for v in args]
    if kwargs:
        types.append("kwargs = { " + ", ".join(f"{k}: {_nb_type_name(v)}" for k, v in kwargs.items()) + " }")
    raise OptionTypeError(f"{name}(): incompatible function arguments. The following argument types are supported:\n"
                          f"{supported}\n\nInvoked with types: {', '.join(types)}")


# mlx 0.32 dies (SIGABRT) on an int past int32 in these functions' shapes before it refuses a call.
_ABORTS_ON_HUGE_INTS = {"mx.random.bernoulli", "mx.random.truncated_normal", "mx.random.categorical"}


def _crashes_mlx(mlx_path: str, value: Any) -> bool:
    """A value mlx 0.32 dies on before it refuses the call: a numpy datetime64 or timedelta64
    scalar (SIGSEGV converting it); an int past int32, in a list or tuple, for _ABORTS_ON_HUGE_INTS."""
    if mlx_path in _ABORTS_ON_HUGE_INTS:
        if isinstance(value, (list, tuple)):
            return any(_crashes_mlx(mlx_path, v) for v in value)
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and not _INT32_MIN <= value <= _INT32_MAX:
            return True
    return isinstance(value, np.generic) and value.dtype.kind in "mM"


def _as_callers_pass_them(parameters, values: dict[str, Any]) -> tuple[list, dict[str, Any]]:
    """Where the call cannot be read: inputs by position, options by keyword, defaults left out."""
    args: list = []
    kwargs: dict[str, Any] = {}
    pending: list = []  # positional values at their defaults, passed only if a later one is not
    for name, parameter in parameters.items():
        if name not in values:
            continue
        value = values[name]
        optional = parameter.default is not inspect.Parameter.empty
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            args += [*pending, *value]
            pending = []
        elif parameter.kind is inspect.Parameter.KEYWORD_ONLY or (
                optional and parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD):
            # options by keyword, as callers pass them (conv1d(x, w, stride=(1,))): mlx's message names them so
            if not optional or value is not parameter.default:
                kwargs[name] = value
        elif optional and value is parameter.default:
            pending.append(value)
        else:
            args += [*pending, value]
            pending = []
    return args, kwargs


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _how_called(function, parameters) -> tuple[int, tuple[str, ...]] | None:
    """(how many arguments by position, the keywords in their order) of the call to `function` now
    being refused, read from its caller's bytecode (error path only: nothing on a call that succeeds).

    None where it cannot be read: a call through ``*args``/``**kwargs`` or from C, a function with
    ``*args``, or bytecode of a form not known here.
    """
    try:
        own = sys._getframe(2)  # _how_called <- mlx_type_error <- function
    except ValueError:
        return None
    caller = own.f_back
    if own.f_code is not function.__code__ or caller is None:
        return None
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters.values()):
        return None
    code, last = caller.f_code, caller.f_lasti
    try:  # 3.11 and 3.12 leave f_lasti on the call's last cache entry; 3.13 on the call
        seen = [i for i in dis.get_instructions(code) if i.offset <= last]
    except Exception:  # noqa: BLE001 - unreadable: the fallback
        return None
    if not seen or seen[-1].opname not in ("CALL", "CALL_KW") or seen[-1].arg is None:
        return None
    count = seen[-1].arg
    before = [i for i in seen[:-1] if i.opname != "PRECALL"][-1:]  # 3.11: KW_NAMES, PRECALL, CALL
    keywords: Any = ()
    if seen[-1].opname == "CALL_KW":  # 3.13: the names are a constant loaded just before
        keywords = before[0].argval if before and before[0].opname == "LOAD_CONST" else None
    elif before and before[0].opname == "KW_NAMES":  # 3.11, 3.12
        index = before[0].arg
        keywords = code.co_consts[index] if index is not None and index < len(code.co_consts) else None
    if not isinstance(keywords, tuple) or not all(isinstance(k, str) and k in parameters for k in keywords):
        return None
    positional = count - len(keywords)
    names = [name for name, p in parameters.items() if p.kind in _POSITIONAL]
    if not 0 <= positional <= len(names):
        return None
    return positional, keywords


def mlx_type_error(mlx_path: str, function, values: dict[str, Any], error: TypeError) -> TypeError:
    """mlx's own TypeError (its message, as an OptionTypeError) for the call `function(**values)` made to mlx's function, else `error`.

    Parameters still at their defaults are left out, as a caller would. Calling
    mlx here is safe: nanobind refuses an argument of the wrong type before any
    of MLX's C++ runs; should mlx take the call after all, its lazy result is
    dropped unevaluated and `error` stands.
    """
    if isinstance(values.get("stream"), str):  # a device name, which only our stream= takes
        values = {**values, "stream": {"cpu": mx.cpu, "gpu": mx.gpu}.get(values["stream"].lower(), values["stream"])}
    parameters = inspect.signature(function).parameters
    calls = [_as_callers_pass_them(parameters, values)]
    how = _how_called(function, parameters)
    if how is not None and all(name in values for name in list(parameters)[:how[0]]):
        # as the caller passed them: mlx's message lists them the same way (the call read is tried
        # first; one read wrong, as a call from C through functools.partial or map, gets the other)
        positional, keywords = how
        calls.insert(0, ([values[name] for name in list(parameters)[:positional]],
                         {name: values[name] for name in keywords if name in values}))
    for args, kwargs in calls:
        if any(_crashes_mlx(mlx_path, value) for value in (*args, *kwargs.values())):
            return error
        try:
            _MLX[mlx_path](*args, **kwargs)
        except TypeError as theirs:
            return OptionTypeError(*theirs.args)  # mlx's message, as the package's class
        except Exception:  # noqa: BLE001 - mlx took the types and refused a value: our error names the option
            return error
    return error


def _index_array(value) -> mx.array:
    """Indices stay integers (a plain int would otherwise be typed like the data); mlx refuses lists."""
    return value if isinstance(value, mx.array) else to_array(value)


# ---- creation ----------------------------------------------------------------

def arange(bound: dict[str, Any], rt):
    start, stop, step, dtype = (bound.get(name) for name in ("start", "stop", "step", "dtype"))
    if stop is None:  # arange(stop, ...), or mlx's arange(stop, None, step)
        start, stop = 0, start
    if start is None:
        start = 0
    if step is None:
        step = 1
    if dtype is None:  # mlx: int32 when every bound is an int (int64 past its range), else float32
        bounds = (start, stop, step)
        if all(isinstance(v, int) for v in bounds):
            dtype = mx.int32 if all(-2**31 <= v < 2**31 for v in bounds) else mx.int64
        else:
            dtype = mx.float32
    return op("arange", [], rt, start=start, stop=stop, step=step, dtype=dtype)


def linspace(start, stop, num, endpoint, dtype, rt):
    return op("linspace_endpoint", [], rt, start=start, stop=stop, num=50 if num is None else num,
              endpoint=endpoint, dtype=dtype)


def zeros_like(a, dtype, rt):
    if dtype is None:
        return op("zeros_like", [a], rt)
    return op("zeros", [], rt, shape=tuple(a.shape), dtype=dtype)


def ones_like(a, dtype, rt):
    if dtype is None:
        return op("ones_like", [a], rt)
    return op("ones", [], rt, shape=tuple(a.shape), dtype=dtype)


# ---- shapes ----------------------------------------------------------------------

def _int_sequence(value) -> Sequence | None:
    """A sequence as nanobind's tuple caster takes one (bytes too: pad((1, 2)) and pad(b"\\x01\\x02")
    agree; not a dict, a set or an iterator), else None."""
    if isinstance(value, (list, tuple)):
        return value
    if not _is_sequence(value):
        return None
    try:
        return list(value)
    except (TypeError, ValueError):  # a 0-d mx.array (or NumPy array) has a __len__ that raises
        return None


_INT32_MIN, _INT32_MAX = -2**31, 2**31 - 1


def _is_index(value) -> bool:
    """An int as nanobind's caster of a C++ int takes one: an index within int32 (no bool array)."""
    if not isinstance(value, int):
        if isinstance(value, (list, tuple)) or not _is_int(value):
            return False
        value = operator.index(value)
    return _INT32_MIN <= value <= _INT32_MAX


def _pad_pairs(ndim: int, pad_width) -> list[int]:
    """mlx's forms, in its binding's order: an int, (n,), (before, after), or a (before, after) pair per axis.

    A value of none of those forms is an OptionTypeError (answered with mlx's binding's TypeError);
    a count of pairs other than one or ndim gets mlx's ValueError.
    """
    if _is_index(pad_width):
        pairs = [(pad_width, pad_width)] * ndim
    else:
        items = _int_sequence(pad_width)
        if items is None:
            raise OptionTypeError(f"[pad] pad_width must be an int, a pair or a list of pairs, got {pad_width!r}")
        if len(items) in (1, 2) and all(_is_index(v) for v in items):  # tuple[int] or tuple[int, int]
            pairs = [(items[0], items[-1])] * ndim
        else:
            pairs = []
            for item in items:
                pair = _int_sequence(item)
                if pair is None or len(pair) != 2 or not (_is_index(pair[0]) and _is_index(pair[1])):
                    raise OptionTypeError(f"[pad] each pad_width pair must be two ints, got {item!r}")
                pairs.append((pair[0], pair[1]))
            if len(pairs) == 1:
                pairs = pairs * ndim
            elif len(pairs) != ndim:  # mlx's ops.cpp (pad), its own words
                raise MLXValueError(f"Invalid number of padding sizes passed to pad with axes of size {ndim}")
    return [operator.index(v) for pair in pairs for v in pair]


def pad(a, pad_width, mode, constant_values, rt):
    value = to_array(constant_values, a.dtype)  # mlx: typed by the array, as a weak scalar
    return op("pad_mode", [a, value], rt, pad_width=_pad_pairs(a.ndim, pad_width), mode=mode)


def as_strided(a, shape, strides, offset, rt):
    shape = list(a.shape) if shape is None else _ints(shape)
    if strides is None:  # row-contiguous strides of `shape`
        strides, step = [], 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
    if _is_int(offset) and operator.index(offset) < 0:  # mlx's binding takes a size_t: its TypeError
        raise OptionTypeError(f"[as_strided] offset must be non-negative, got {offset!r}")
    return op("as_strided", [a], rt, shape=shape, strides=_ints(strides), offset=offset)


def concatenate(arrays, axis, rt):
    if axis is None:  # mlx: the arrays flattened, end to end
        return op("concatenate_flat", list(arrays), rt)
    return op("concatenate", list(arrays), rt, axis=axis)


def stack(arrays, axis, rt):
    return op("stack", list(arrays), rt, axis=0 if axis is None else axis)


def roll(a, shift, axis, rt):
    if isinstance(shift, int) and (axis is None or isinstance(axis, int)):
        return op("roll", [a], rt, shift=shift, axis=axis)
    # mlx's overloads: a tuple of shifts with one int axis (or none) rolls by their sum
    one_axis = isinstance(axis, int)
    return op("roll_axes", [a], rt, shift=shift, scalar_shift=isinstance(shift, int), one_axis=one_axis,
              axis=[axis] if one_axis else axis)


def split(a, indices_or_sections, axis, rt):
    if isinstance(indices_or_sections, int):  # mlx refuses a count below 1 itself, with its message
        return op("split", [a], rt, sections=indices_or_sections, axis=axis)
    return op("split", [a], rt, indices=list(indices_or_sections), axis=axis)


def slice(a, start_indices, axes, slice_size, start, stop, strides, rt):  # noqa: A001 - mlx's name
    if start is not None or stop is not None:  # the static form: Python slice bounds per axis
        if start_indices is not None:
            raise InvalidArgumentType("[slice] give start_indices/axes/slice_size (mlx) or start/stop[/strides], not both")
        return op("slice", [a], rt, start=start, stop=stop, strides=strides or ())
    return op("slice_dynamic", [a, _index_array(start_indices)], rt, axes=_ints(axes), slice_size=_ints(slice_size))


def slice_update(a, update, start_indices, axes, start, stop, strides, rt):
    if start is not None or stop is not None:
        if start_indices is not None:
            raise InvalidArgumentType("[slice_update] give start_indices/axes (mlx) or start/stop[/strides], not both")
        return op("slice_update", [a, update], rt, start=start, stop=stop, strides=strides or ())
    return op("slice_update_dynamic", [a, update, _index_array(start_indices)], rt, axes=_ints(axes))


def contiguous(a, allow_col_major, rt):
    return op("contiguous_col_major", [a], rt, allow_col_major=allow_col_major)


# ---- elementwise and scans -------------------------------------------------------------

def clip(a, a_min, a_max, rt):
    if a_min is None and a_max is None:
        raise MLXValueError("At most one of a_min and a_max may be None")  # mlx's binding, its own words
    if a_min is None:
        return op("minimum", [a, a_max], rt)
    if a_max is None:
        return op("maximum", [a, a_min], rt)
    return op("clip", [a, a_min, a_max], rt)


def nan_to_num(a, nan, posinf, neginf, rt):
    return op("nan_to_num_inf", [a], rt, nan=nan, has_posinf=posinf is not None, posinf=posinf or 0.0,
              has_neginf=neginf is not None, neginf=neginf or 0.0)


def cumsum(a, axis, reverse, inclusive, dtype, rt, name="cumsum_dtype"):
    return op(name, [a], rt, axis=axis, reverse=reverse, inclusive=inclusive, dtype=dtype)


def cumprod(a, axis, reverse, inclusive, dtype, rt):
    return cumsum(a, axis, reverse, inclusive, dtype, rt, name="cumprod_dtype")


def hadamard_transform(a, scale, rt):
    return op("hadamard_transform", [a], rt, has_scale=scale is not None, scale=1.0 if scale is None else scale)


# ---- indexing, with the optional bounds checks of ops.set_bounds_checks -----------------

def take(a, indices, axis, rt):
    indices = _index_array(indices)
    return checked("take", [a, indices], [(indices, axis_size(a, axis))], dict(axis=axis, **rt))


def take_along_axis(a, indices, axis, rt):
    return checked("take_along_axis", [a, indices], [(indices, axis_size(a, axis))],
                         dict(axis=axis, **rt))


def put_along_axis(a, indices, values, axis, rt):
    if axis is None:  # mlx: along the flattened array
        return checked("put_along_axis_flat", [a, indices, values], [(indices, axis_size(a, None))],
                             dict(rt))
    return checked("put_along_axis", [a, indices, values], [(indices, axis_size(a, axis))],
                         dict(axis=axis, **rt))


# ---- contractions and convolutions --------------------------------------------------------

def einsum(subscripts, operands, rt):
    return op("einsum", list(operands), rt, subscripts=subscripts)


def tensordot(a, b, axes, rt):
    # mlx's binding: an int (numpy's and mx's scalars too), or a list of two sequences of ints
    if _is_int(axes):
        return op("tensordot", [a, b], rt, axes=operator.index(axes))
    pair = _int_sequence(axes)
    if pair is None or any(_int_sequence(side) is None for side in pair):
        raise OptionTypeError(f"expects an int or two sequences of ints, got {axes!r}")
    if len(pair) != 2:
        raise MLXValueError("[tensordot] axes must be a list of two lists.")
    return op("tensordot_axes", [a, b], rt, axes_a=_ints(pair[0]), axes_b=_ints(pair[1]))


def conv_general(input, weight, stride, padding, kernel_dilation, input_dilation, groups, flip, rt):  # noqa: A002
    # mlx's binding: an int is one value (MLX broadcasts it), a sequence of ints both sides, else (lo, hi)
    if _is_int(padding) or (isinstance(padding, Sequence) and all(_is_int(p) for p in padding)):
        lo = hi = _int_or_ints(padding)
    else:
        try:
            lo, hi = padding
        except (TypeError, ValueError):
            raise OptionTypeError(f"[conv_general] padding takes ints or (lo, hi), got {padding!r}") from None
    return op("conv_general", [input, weight], rt, stride=_int_or_ints(stride), padding_lo=lo, padding_hi=hi,
              kernel_dilation=_int_or_ints(kernel_dilation), input_dilation=_int_or_ints(input_dilation),
              groups=groups, flip=flip)


def _conv(n: int, name: str, input, weight, stride, padding, dilation, groups, rt, output_padding=None):  # noqa: A002
    options = dict(stride=_per_axis(stride, n), padding=_per_axis(padding, n), dilation=_per_axis(dilation, n),
                   groups=groups)
    if output_padding is None:
        return op("conv_nd", [input, weight], rt, **options)
    return op("conv_transpose_nd", [input, weight], rt, output_padding=_per_axis(output_padding, n), **options)


def conv1d(input, weight, stride, padding, dilation, groups, rt):  # noqa: A002
    return _conv(1, "conv1d", input, weight, stride, padding, dilation, groups, rt)


def conv2d(input, weight, stride, padding, dilation, groups, rt):  # noqa: A002
    return _conv(2, "conv2d", input, weight, stride, padding, dilation, groups, rt)


def conv3d(input, weight, stride, padding, dilation, groups, rt):  # noqa: A002
    return _conv(3, "conv3d", input, weight, stride, padding, dilation, groups, rt)


def conv_transpose1d(input, weight, stride, padding, dilation, output_padding, groups, rt):  # noqa: A002
    return _conv(1, "conv_transpose1d", input, weight, stride, padding, dilation, groups, rt, output_padding)


def conv_transpose2d(input, weight, stride, padding, dilation, output_padding, groups, rt):  # noqa: A002
    return _conv(2, "conv_transpose2d", input, weight, stride, padding, dilation, groups, rt, output_padding)


def conv_transpose3d(input, weight, stride, padding, dilation, output_padding, groups, rt):  # noqa: A002
    return _conv(3, "conv_transpose3d", input, weight, stride, padding, dilation, groups, rt, output_padding)


# ---- quantization -----------------------------------------------------------------------

def quantize(w, group_size, bits, mode, global_scale, rt):
    if global_scale is not None:
        return op("quantize_scaled", [w, global_scale], rt, group_size=group_size, bits=bits, mode=mode)
    return op("quantize", [w], rt, group_size=group_size, bits=bits, mode=mode)


def dequantize(w, scales, biases, group_size, bits, mode, global_scale, dtype, rt):
    arrays = [w, scales] + [x for x in (biases, global_scale) if x is not None]
    if global_scale is None and dtype is None:
        return op("dequantize", arrays, rt, group_size=group_size, bits=bits, mode=mode)
    return op("dequantize_full", arrays, rt, group_size=group_size, bits=bits, mode=mode,
              has_biases=biases is not None, has_global_scale=global_scale is not None, dtype=dtype)


def quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode, rt):
    arrays = [x, w, scales] + ([biases] if biases is not None else [])
    return op("quantized_matmul", arrays, rt, transpose=transpose, group_size=group_size, bits=bits, mode=mode)


# ---- linalg and fft -------------------------------------------------------------------------

def norm(a, ord, axis, keepdims, rt):  # noqa: A002 - mlx's name
    axis = [axis] if isinstance(axis, int) else axis
    if ord is None:
        return op("linalg_norm", [a], rt, axis=axis, keepdims=keepdims)
    if isinstance(ord, str):
        return op("norm_str", [a], rt, ord=ord, axis=axis, keepdims=keepdims)
    return op("norm_ord", [a], rt, ord=ord, axis=axis, keepdims=keepdims)


_FFT_KINDS = {"fft": 0, "ifft": 1, "rfft": 2, "irfft": 3}


_NORMS = {"backward": 0, "ortho": 1, "forward": 2}


def _fft_norm(name: str, norm):
    """mlx checks the norm in its binding (python/src/fft.cpp: parse_norm); its message, naming the function."""
    if norm not in _NORMS:
        raise MLXValueError(f"[{name}] Invalid norm. Expected one of {{'backward', 'ortho', 'forward'}}.")
    return norm


def fft1(kind: str, a, n, axis, norm, rt):
    return op("fft_any", [a], rt, kind=_FFT_KINDS[kind], n=None if n is None else [n], axes=[axis],
              norm=_fft_norm(kind, norm))


def fftn(kind: str, name: str, a, s, axes, norm, rt):
    norm = _fft_norm(name, norm)
    if axes is None:  # mlx: every axis; sizes need their axes
        if s is not None:
            raise MLXValueError(f"[{name}] `axes` should not be `None` if `s` is not `None`.")
        axes = list(range(a.ndim))
    return op("fft_any", [a], rt, kind=_FFT_KINDS[kind], n=None if s is None else _ints(s), axes=_ints(axes),
              norm=norm)


# ---- random: the key is explicit, or drawn from MLX's global random state -----------------

def next_key() -> mx.array:
    """The key a key-less ``mx.random`` call would use now, taken from the same global state.

    A key-less mlx call splits the global key into (new state, key). A cheap
    key-less call that is never evaluated advances the state exactly the way
    the caller's call would have, and the key is the second half of the split.
    """
    previous = mx.random.state[0]  # type: ignore[index]  # mlx types the state as a plain object
    mx.random.uniform(shape=(0,))  # advances mx.random.state by one split; never evaluated
    return mx.random.split(previous)[1]


def _key(key) -> mx.array:
    return next_key() if key is None else key


def random_key(seed, rt):
    return op("random_key", [], rt, seed=str(operator.index(seed)))


def random_split(key, num, rt):
    return op("random_split", [key], rt, num=num)


def _as_array(value, dtype=None) -> mx.array:
    if isinstance(value, mx.array):
        return value
    return mx.array(value) if dtype is None else mx.array(value, dtype=dtype)


def random_uniform(low, high, shape, dtype, key, rt):
    return op("random_uniform", [_as_array(low), _as_array(high), _key(key)], rt, shape=_ints(shape), dtype=dtype)


def random_normal(shape, dtype, loc, scale, key, rt):
    dtype = mx.float32 if dtype is None else dtype
    arrays = [_key(key)]
    if loc is not None:
        arrays.append(_as_array(loc, dtype))
    if scale is not None:
        arrays.append(_as_array(scale, dtype))
    return op("random_normal", arrays, rt, shape=_ints(shape), dtype=dtype, has_loc=loc is not None,
              has_scale=scale is not None)


def random_randint(low, high, shape, dtype, key, rt):
    return op("random_randint", [_as_array(low), _as_array(high), _key(key)], rt, shape=_ints(shape), dtype=dtype)


def random_bernoulli(p, shape, key, rt):
    return op("random_bernoulli", [_as_array(p), _key(key)], rt, shape=None if shape is None else _ints(shape))


def random_truncated_normal(lower, upper, shape, dtype, key, rt):
    return op("random_truncated_normal", [_as_array(lower), _as_array(upper), _key(key)], rt,
              shape=None if shape is None else _ints(shape), dtype=dtype)


def random_gumbel(shape, dtype, key, rt):
    return op("random_gumbel", [_key(key)], rt, shape=_ints(shape), dtype=dtype)


def random_categorical(logits, axis, shape, num_samples, key, rt):
    return op("random_categorical", [logits, _key(key)], rt, axis=axis,
              shape=None if shape is None else _ints(shape), num_samples=num_samples)


def random_permutation(x, axis, key, rt):
    if isinstance(x, int):
        return op("random_permutation_n", [_key(key)], rt, n=x)
    return op("random_permutation", [x, _key(key)], rt, axis=axis)


def random_laplace(shape, dtype, loc, scale, key, rt):
    return op("random_laplace", [_key(key)], rt, shape=_ints(shape), dtype=dtype, loc=loc, scale=scale)


# ---- more of mlx.core ---------------------------------------------------------------------

def full(shape, vals, dtype, rt):
    # mlx: `vals` converted with `dtype` as its hint, then filled as it is (so a bool dtype with an int is int32)
    return op("full", [to_array(vals, dtype)], rt, shape=shape, dtype=None)


def full_like(a, vals, dtype, rt):
    dtype = a.dtype if dtype is None else dtype
    return op("full", [to_array(vals, dtype)], rt, shape=tuple(a.shape), dtype=dtype)


def matrix_transpose(a, rt):
    return op("swapaxes", [a], rt, axis1=-1, axis2=-2)


def meshgrid(arrays, sparse, indexing, rt):
    return op("meshgrid", list(arrays), rt, sparse=bool(sparse), indexing="xy" if indexing is None else indexing)


def broadcast_arrays(arrays, rt):
    return op("broadcast_arrays", list(arrays), rt)


def atleast_1d(arys, rt, ndim=1):
    return op("atleast_nd", list(arys), rt, ndim=ndim)


def atleast_2d(arys, rt):
    return atleast_1d(arys, rt, 2)


def atleast_3d(arys, rt):
    return atleast_1d(arys, rt, 3)


_WINDOWS = {"hanning": 0, "hamming": 1, "bartlett": 2, "blackman": 3}


def window(kind: str, M, rt):  # noqa: N803 - mlx's name
    return op("window", [], rt, kind=_WINDOWS[kind], M=M)


def _batch_size(x) -> int:
    """How many matrices a {..., M, N} operand holds: the range its gather indices index."""
    size = 1
    for n in x.shape[:-2]:
        size *= n
    return size


def _matrix_checks(lhs, lhs_of, rhs, rhs_of) -> list:
    return [(i, _batch_size(of)) for i, of in ((lhs, lhs_of), (rhs, rhs_of)) if i is not None]


def gather_mm(a, b, lhs_indices, rhs_indices, sorted_indices, rt):
    arrays = [a, b] + [i for i in (lhs_indices, rhs_indices) if i is not None]
    return checked("gather_mm", arrays, _matrix_checks(lhs_indices, a, rhs_indices, b),
                         dict(has_lhs=lhs_indices is not None, has_rhs=rhs_indices is not None,
                              sorted_indices=sorted_indices, **rt))


def segmented_mm(a, b, segments, rt):
    # segments hold [start, end) ranges of a's last axis: an end may equal its size
    return checked("segmented_mm", [a, b, segments], [(segments, a.shape[-1] + 1)] if a.ndim else [],
                         dict(rt))


def block_masked_mm(a, b, block_size, mask_out, mask_lhs, mask_rhs, rt):
    masks = (mask_out, mask_lhs, mask_rhs)
    return op("block_masked_mm", [a, b] + [m for m in masks if m is not None], rt, block_size=block_size,
              has_out=mask_out is not None, has_lhs=mask_lhs is not None, has_rhs=mask_rhs is not None)


def fftshift(inverse: bool, a, axes, rt):
    axes = [axes] if isinstance(axes, int) else axes
    return op("fft_shift", [a], rt, inverse=inverse, axes=axes)


def fftfreq(real: bool, n, d, rt):
    return op("fft_freq", [], rt, n=n, d=d, real=real)


def unique(a, size, return_index, return_inverse, return_counts, fill_value, rt):
    arrays = [a] + ([_as_array(fill_value, a.dtype)] if fill_value is not None else [])
    return op("unique", arrays, rt, size=size, return_index=return_index, return_inverse=return_inverse,
              return_counts=return_counts)


def gather_qmm(x, w, scales, biases, lhs_indices, rhs_indices, transpose, group_size, bits, mode, global_scale,
               sorted_indices, rt):
    optional = (biases, lhs_indices, rhs_indices, global_scale)
    return checked("gather_qmm", [x, w, scales] + [v for v in optional if v is not None],
                         _matrix_checks(lhs_indices, x, rhs_indices, w),
                         dict(has_biases=biases is not None, has_lhs=lhs_indices is not None,
                              has_rhs=rhs_indices is not None, has_global_scale=global_scale is not None,
                              transpose=transpose, group_size=group_size, bits=bits, mode=mode,
                              sorted_indices=sorted_indices, **rt))


def qqmm(x, w, scales, group_size, bits, mode, global_scale_x, global_scale_w, rt):
    check_mode("qqmm", mode, group_size, bits)
    optional = (scales, global_scale_x, global_scale_w)
    return op("qqmm", [x, w] + [v for v in optional if v is not None], rt, has_scales=scales is not None,
              group_size=group_size, bits=bits, mode=mode, has_global_scale_x=global_scale_x is not None,
              has_global_scale_w=global_scale_w is not None)


def gather_qqmm(x, w, scales, lhs_indices, rhs_indices, group_size, bits, mode, global_scale_x, global_scale_w,
                sorted_indices, rt):
    check_mode("gather_qqmm", mode, group_size, bits)
    optional = (scales, lhs_indices, rhs_indices, global_scale_x, global_scale_w)
    return checked("gather_qqmm", [x, w] + [v for v in optional if v is not None],
                         _matrix_checks(lhs_indices, x, rhs_indices, w),
                         dict(has_scales=scales is not None, has_lhs=lhs_indices is not None,
                              has_rhs=rhs_indices is not None, group_size=group_size, bits=bits, mode=mode,
                              has_global_scale_x=global_scale_x is not None,
                              has_global_scale_w=global_scale_w is not None, sorted_indices=sorted_indices, **rt))


def einsum_path(subscripts, operands) -> Any:
    """mx.einsum_path, whose answer is already known when it is called.

    It reads only the operands' shapes (never their data, so lazy operands
    owned by a queue are fine) and returns a path and a text, not arrays: there
    is nothing to run on a worker, and a round trip would only add a wake-up.
    mlx's own errors (bad subscripts) raise here, at the call, as in mlx.
    """
    path = mx.einsum_path(subscripts, *operands)
    future = _backend.current().new_future()
    future.set_result(path)
    return future


def random_multivariate_normal(mean, cov, shape, dtype, key, rt):
    return op("random_multivariate_normal", [mean, cov, _key(key)], rt, shape=_ints(shape), dtype=dtype)


def _norm_code(name: str, norm: str) -> int:
    return _NORMS[_fft_norm(name, norm)]


def stft(x, n_fft, hop_length, win_length, window, center, pad_mode, norm, onesided, rt):
    return op("fft_stft", [x] + ([window] if window is not None else []), rt, n_fft=n_fft, hop_length=hop_length,
              win_length=win_length, center=center, norm=_norm_code("stft", norm), has_onesided=onesided is not None,
              onesided=bool(onesided), pad_mode=pad_mode)


def istft(stft_matrix, n_fft, hop_length, win_length, window, center, norm, onesided, length, rt):
    return op("fft_istft", [stft_matrix] + ([window] if window is not None else []), rt, n_fft=n_fft,
              hop_length=hop_length, win_length=win_length, center=center, norm=_norm_code("istft", norm),
              has_onesided=onesided is not None, onesided=bool(onesided), length=length)
