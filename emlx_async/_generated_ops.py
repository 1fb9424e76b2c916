"""``mx`` with mlx's own signatures, as awaitables. GENERATED, do not edit.

Regenerate with ``python tools/gen_api.py`` (from mlx 0.32.4's signatures and emlx_async/_op_table.py);
the test test_generated_files_are_current checks this file is current.
"""

# ruff: noqa: A001, A002, E501
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import mlx.core as mx
from mlx.core import Dtype, array

from . import _adapters as _ad
from ._adapters import StreamOrDevice, scalar

if TYPE_CHECKING:
    from ._backend import JobFuture
    from ._devices import DeviceLike
    from ._queue import CommandQueue

__all__ = ['abs', 'acos', 'acosh', 'add', 'addmm', 'all', 'allclose', 'any', 'arange', 'arccos', 'arccosh', 'arcsin', 'arcsinh', 'arctan', 'arctan2', 'arctanh', 'argmax', 'argmin', 'argpartition', 'argsort', 'array_equal', 'as_strided', 'asin', 'asinh', 'astype', 'atan', 'atan2', 'atanh', 'atleast_1d', 'atleast_2d', 'atleast_3d', 'bartlett', 'bitwise_and', 'bitwise_invert', 'bitwise_left_shift', 'bitwise_or', 'bitwise_right_shift', 'bitwise_xor', 'blackman', 'block_masked_mm', 'broadcast_arrays', 'broadcast_to', 'ceil', 'clip', 'concat', 'concatenate', 'conj', 'conjugate', 'contiguous', 'conv1d', 'conv2d', 'conv3d', 'conv_general', 'conv_transpose1d', 'conv_transpose2d', 'conv_transpose3d', 'convolve', 'copy', 'cos', 'cosh', 'count_nonzero', 'cummax', 'cummin', 'cumprod', 'cumsum', 'cumulative_prod', 'cumulative_sum', 'degrees', 'dequantize', 'diag', 'diagonal', 'diff', 'divide', 'divmod', 'einsum', 'einsum_path', 'empty', 'empty_like', 'equal', 'erf', 'erfinv', 'exp', 'expand_dims', 'expm1', 'eye', 'flatten', 'flip', 'floor', 'floor_divide', 'from_fp8', 'full', 'full_like', 'gather_mm', 'gather_qmm', 'gather_qqmm', 'greater', 'greater_equal', 'hadamard_transform', 'hamming', 'hanning', 'identity', 'imag', 'inner', 'isclose', 'isfinite', 'isinf', 'isnan', 'isneginf', 'isposinf', 'kron', 'left_shift', 'less', 'less_equal', 'linspace', 'log', 'log10', 'log1p', 'log2', 'logaddexp', 'logcumsumexp', 'logical_and', 'logical_not', 'logical_or', 'logical_xor', 'logsumexp', 'matmul', 'matrix_norm', 'matrix_transpose', 'max', 'maximum', 'mean', 'median', 'meshgrid', 'min', 'minimum', 'minmax', 'moveaxis', 'multiply', 'nan_to_num', 'negative', 'not_equal', 'ones', 'ones_like', 'outer', 'pad', 'partition', 'permute_dims', 'positive', 'pow', 'power', 'prod', 'put_along_axis', 'qqmm', 'quantize', 'quantized_matmul', 'radians', 'real', 'reciprocal', 'remainder', 'repeat', 'reshape', 'right_shift', 'roll', 'round', 'rsqrt', 'searchsorted', 'segmented_mm', 'sigmoid', 'sign', 'sin', 'sinh', 'slice', 'slice_update', 'softmax', 'sort', 'split', 'sqrt', 'square', 'squeeze', 'stack', 'std', 'stop_gradient', 'subtract', 'sum', 'swapaxes', 'take', 'take_along_axis', 'tan', 'tanh', 'tensordot', 'tile', 'to_fp8', 'topk', 'trace', 'transpose', 'tri', 'tril', 'triu', 'trunc', 'unflatten', 'unique', 'unstack', 'var', 'vecdot', 'view', 'where', 'zeros', 'zeros_like']
_keep = (Any, Sequence, Literal, overload, mx, Dtype, array, scalar, StreamOrDevice)  # names the annotations use


def abs(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise absolute value.

    Awaitable ``mx.abs``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('abs', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.abs', abs, dict(a=a, stream=stream), _error) from None


def acos(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse cosine.

    Awaitable ``mx.acos``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arccos', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.acos', acos, dict(a=a, stream=stream), _error) from None


def acosh(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse hyperbolic cosine.

    Awaitable ``mx.acosh``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arccosh', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.acosh', acosh, dict(a=a, stream=stream), _error) from None


def add(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise addition.

    Awaitable ``mx.add``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('add', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.add', add, dict(a=a, b=b, stream=stream), _error) from None


def addmm(c: array, a: array, b: array, /, alpha: float = 1.0, beta: float = 1.0, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Matrix multiplication with addition and optional scaling.

    Awaitable ``mx.addmm``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('addmm', [c, a, b], _rt, alpha=alpha, beta=beta)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.addmm', addmm, dict(c=c, a=a, b=b, alpha=alpha, beta=beta, stream=stream), _error) from None


def all(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """An `and` reduction over the given axes.

    Awaitable ``mx.all``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('all', [a], _rt, axis=axis, keepdims=keepdims)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.all', all, dict(a=a, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def allclose(a: array, b: array, /, rtol: float = 1e-05, atol: float = 1e-08, *, equal_nan: bool = False, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Approximate comparison of two arrays.

    Awaitable ``mx.allclose``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('allclose', [a, b], _rt, rtol=rtol, atol=atol, equal_nan=equal_nan)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.allclose', allclose, dict(a=a, b=b, rtol=rtol, atol=atol, equal_nan=equal_nan, stream=stream), _error) from None


def any(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """An `or` reduction over the given axes.

    Awaitable ``mx.any``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('any', [a], _rt, axis=axis, keepdims=keepdims)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.any', any, dict(a=a, axis=axis, keepdims=keepdims, stream=stream), _error) from None


@overload
def arange(start: int | float, stop: int | float | None, step: int | float | None = None, dtype: Dtype | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]: ...


@overload
def arange(stop: int | float, step: int | float | None = None, dtype: Dtype | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]: ...


def arange(*args: Any, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None, **kwargs: Any) -> JobFuture[array]:
    """Generates ranges of numbers.

    Awaitable ``mx.arange``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device. mlx's overloads are resolved as mlx resolves
    them.
    """
    _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
    return _ad.arange(_ad.resolve(arange, 'mx.arange', args, kwargs), _rt)


def arccos(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse cosine.

    Awaitable ``mx.arccos``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arccos', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.arccos', arccos, dict(a=a, stream=stream), _error) from None


def arccosh(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse hyperbolic cosine.

    Awaitable ``mx.arccosh``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arccosh', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.arccosh', arccosh, dict(a=a, stream=stream), _error) from None


def arcsin(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse sine.

    Awaitable ``mx.arcsin``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arcsin', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.arcsin', arcsin, dict(a=a, stream=stream), _error) from None


def arcsinh(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse hyperbolic sine.

    Awaitable ``mx.arcsinh``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arcsinh', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.arcsinh', arcsinh, dict(a=a, stream=stream), _error) from None


def arctan(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse tangent.

    Awaitable ``mx.arctan``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arctan', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.arctan', arctan, dict(a=a, stream=stream), _error) from None


def arctan2(a: scalar | array, b: scalar | array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse tangent of the ratio of two arrays.

    Awaitable ``mx.arctan2``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arctan2', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.arctan2', arctan2, dict(a=a, b=b, stream=stream), _error) from None


def arctanh(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse hyperbolic tangent.

    Awaitable ``mx.arctanh``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arctanh', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.arctanh', arctanh, dict(a=a, stream=stream), _error) from None


def argmax(a: array, /, axis: None | int = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Indices of the maximum values along the axis.

    Awaitable ``mx.argmax``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('argmax', [a], _rt, axis=axis, keepdims=keepdims)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.argmax', argmax, dict(a=a, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def argmin(a: array, /, axis: None | int = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Indices of the minimum values along the axis.

    Awaitable ``mx.argmin``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('argmin', [a], _rt, axis=axis, keepdims=keepdims)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.argmin', argmin, dict(a=a, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def argpartition(a: array, /, kth: int, axis: None | int = -1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Returns the indices that partition the array.

    Awaitable ``mx.argpartition``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('argpartition', [a], _rt, kth=kth, axis=axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.argpartition', argpartition, dict(a=a, kth=kth, axis=axis, stream=stream), _error) from None


def argsort(a: array, /, axis: None | int = -1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Returns the indices that sort the array.

    Awaitable ``mx.argsort``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('argsort', [a], _rt, axis=axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.argsort', argsort, dict(a=a, axis=axis, stream=stream), _error) from None


def array_equal(a: scalar | array, b: scalar | array, equal_nan: bool = False, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Array equality check.

    Awaitable ``mx.array_equal``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('array_equal', [a, b], _rt, equal_nan=equal_nan)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.array_equal', array_equal, dict(a=a, b=b, equal_nan=equal_nan, stream=stream), _error) from None


def as_strided(a: array, /, shape: Sequence[int] | None = None, strides: Sequence[int] | None = None, offset: int = 0, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Create a view into the array with the given shape and strides.

    Awaitable ``mx.as_strided``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.as_strided(a, shape, strides, offset, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.as_strided', as_strided, dict(a=a, shape=shape, strides=strides, offset=offset, stream=stream), _error) from None


def asin(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse sine.

    Awaitable ``mx.asin``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arcsin', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.asin', asin, dict(a=a, stream=stream), _error) from None


def asinh(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse hyperbolic sine.

    Awaitable ``mx.asinh``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arcsinh', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.asinh', asinh, dict(a=a, stream=stream), _error) from None


def astype(a: array, dtype: Dtype, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Cast the array to a specified type.

    Awaitable ``mx.astype``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('astype', [a], _rt, dtype=dtype)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.astype', astype, dict(a=a, dtype=dtype, stream=stream), _error) from None


def atan(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse tangent.

    Awaitable ``mx.atan``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arctan', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.atan', atan, dict(a=a, stream=stream), _error) from None


def atan2(a: scalar | array, b: scalar | array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse tangent of the ratio of two arrays.

    Awaitable ``mx.atan2``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arctan2', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.atan2', atan2, dict(a=a, b=b, stream=stream), _error) from None


def atanh(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse hyperbolic tangent.

    Awaitable ``mx.atanh``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('arctanh', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.atanh', atanh, dict(a=a, stream=stream), _error) from None


def atleast_1d(*arys: array, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array | list[array]]:
    """Convert all arrays to have at least one dimension.

    Awaitable ``mx.atleast_1d``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.atleast_1d(arys, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.atleast_1d', atleast_1d, dict(arys=arys, stream=stream), _error) from None


def atleast_2d(*arys: array, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array | list[array]]:
    """Convert all arrays to have at least two dimensions.

    Awaitable ``mx.atleast_2d``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.atleast_2d(arys, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.atleast_2d', atleast_2d, dict(arys=arys, stream=stream), _error) from None


def atleast_3d(*arys: array, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array | list[array]]:
    """Convert all arrays to have at least three dimensions.

    Awaitable ``mx.atleast_3d``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.atleast_3d(arys, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.atleast_3d', atleast_3d, dict(arys=arys, stream=stream), _error) from None


def bartlett(M: int, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the Bartlett window.

    Awaitable ``mx.bartlett``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.window('bartlett', M, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.bartlett', bartlett, dict(M=M, stream=stream), _error) from None


def bitwise_and(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise bitwise and.

    Awaitable ``mx.bitwise_and``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('bitwise_and', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.bitwise_and', bitwise_and, dict(a=a, b=b, stream=stream), _error) from None


def bitwise_invert(a: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise bitwise inverse.

    Awaitable ``mx.bitwise_invert``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('bitwise_invert', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.bitwise_invert', bitwise_invert, dict(a=a, stream=stream), _error) from None


def bitwise_left_shift(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise left shift.

    Awaitable ``mx.bitwise_left_shift``, built and run natively on a queue: returns a JobFuture.
    Also takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('left_shift', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.bitwise_left_shift', bitwise_left_shift, dict(a=a, b=b, stream=stream), _error) from None


def bitwise_or(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise bitwise or.

    Awaitable ``mx.bitwise_or``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('bitwise_or', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.bitwise_or', bitwise_or, dict(a=a, b=b, stream=stream), _error) from None


def bitwise_right_shift(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise right shift.

    Awaitable ``mx.bitwise_right_shift``, built and run natively on a queue: returns a JobFuture.
    Also takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('right_shift', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.bitwise_right_shift', bitwise_right_shift, dict(a=a, b=b, stream=stream), _error) from None


def bitwise_xor(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise bitwise xor.

    Awaitable ``mx.bitwise_xor``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('bitwise_xor', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.bitwise_xor', bitwise_xor, dict(a=a, b=b, stream=stream), _error) from None


def blackman(M: int, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the Blackman window.

    Awaitable ``mx.blackman``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.window('blackman', M, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.blackman', blackman, dict(M=M, stream=stream), _error) from None


def block_masked_mm(a: array, b: array, /, block_size: int = 64, mask_out: array | None = None, mask_lhs: array | None = None, mask_rhs: array | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Matrix multiplication with block masking.

    Awaitable ``mx.block_masked_mm``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.block_masked_mm(a, b, block_size, mask_out, mask_lhs, mask_rhs, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.block_masked_mm', block_masked_mm, dict(a=a, b=b, block_size=block_size, mask_out=mask_out, mask_lhs=mask_lhs, mask_rhs=mask_rhs, stream=stream), _error) from None


def broadcast_arrays(*arrays: array, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[list[array]]:
    """Broadcast arrays against one another.

    Awaitable ``mx.broadcast_arrays``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.broadcast_arrays(arrays, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.broadcast_arrays', broadcast_arrays, dict(arrays=arrays, stream=stream), _error) from None


def broadcast_to(a: scalar | array, /, shape: Sequence[int], *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Broadcast an array to the given shape.

    Awaitable ``mx.broadcast_to``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('broadcast_to', [a], _rt, shape=shape)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.broadcast_to', broadcast_to, dict(a=a, shape=shape, stream=stream), _error) from None


def ceil(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise ceil.

    Awaitable ``mx.ceil``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('ceil', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.ceil', ceil, dict(a=a, stream=stream), _error) from None


def clip(a: array, /, a_min: scalar | array | None, a_max: scalar | array | None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Clip the values of the array between the given minimum and maximum.

    Awaitable ``mx.clip``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.clip(a, a_min, a_max, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.clip', clip, dict(a=a, a_min=a_min, a_max=a_max, stream=stream), _error) from None


def concat(arrays: list[array], axis: int | None = 0, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """See :func:`concatenate`.

    Awaitable ``mx.concat``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.concatenate(arrays, axis, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.concat', concat, dict(arrays=arrays, axis=axis, stream=stream), _error) from None


def concatenate(arrays: list[array], axis: int | None = 0, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Concatenate the arrays along the given axis.

    Awaitable ``mx.concatenate``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.concatenate(arrays, axis, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.concatenate', concatenate, dict(arrays=arrays, axis=axis, stream=stream), _error) from None


def conj(a: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the elementwise complex conjugate of the input. Alias for `mx.conjugate`.

    Awaitable ``mx.conj``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('conjugate', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.conj', conj, dict(a=a, stream=stream), _error) from None


def conjugate(a: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the elementwise complex conjugate of the input. Alias for `mx.conj`.

    Awaitable ``mx.conjugate``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('conjugate', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.conjugate', conjugate, dict(a=a, stream=stream), _error) from None


def contiguous(a: array, /, allow_col_major: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Force an array to be row contiguous. Copy if necessary.

    Awaitable ``mx.contiguous``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.contiguous(a, allow_col_major, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.contiguous', contiguous, dict(a=a, allow_col_major=allow_col_major, stream=stream), _error) from None


def conv1d(input: array, weight: array, /, stride: int = 1, padding: int = 0, dilation: int = 1, groups: int = 1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """1D convolution over an input with several channels

    Awaitable ``mx.conv1d``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.conv1d(input, weight, stride, padding, dilation, groups, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.conv1d', conv1d, dict(input=input, weight=weight, stride=stride, padding=padding, dilation=dilation, groups=groups, stream=stream), _error) from None


def conv2d(input: array, weight: array, /, stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1, groups: int = 1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """2D convolution over an input with several channels

    Awaitable ``mx.conv2d``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.conv2d(input, weight, stride, padding, dilation, groups, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.conv2d', conv2d, dict(input=input, weight=weight, stride=stride, padding=padding, dilation=dilation, groups=groups, stream=stream), _error) from None


def conv3d(input: array, weight: array, /, stride: int | tuple[int, int, int] = 1, padding: int | tuple[int, int, int] = 0, dilation: int | tuple[int, int, int] = 1, groups: int = 1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """3D convolution over an input with several channels

    Awaitable ``mx.conv3d``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.conv3d(input, weight, stride, padding, dilation, groups, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.conv3d', conv3d, dict(input=input, weight=weight, stride=stride, padding=padding, dilation=dilation, groups=groups, stream=stream), _error) from None


def conv_general(input: array, weight: array, /, stride: int | Sequence[int] = 1, padding: int | Sequence[int] | tuple[Sequence[int], Sequence[int]] = 0, kernel_dilation: int | Sequence[int] = 1, input_dilation: int | Sequence[int] = 1, groups: int = 1, flip: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """General convolution over an input with several channels

    Awaitable ``mx.conv_general``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.conv_general(input, weight, stride, padding, kernel_dilation, input_dilation, groups, flip, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.conv_general', conv_general, dict(input=input, weight=weight, stride=stride, padding=padding, kernel_dilation=kernel_dilation, input_dilation=input_dilation, groups=groups, flip=flip, stream=stream), _error) from None


def conv_transpose1d(input: array, weight: array, /, stride: int = 1, padding: int = 0, dilation: int = 1, output_padding: int = 0, groups: int = 1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """1D transposed convolution over an input with several channels

    Awaitable ``mx.conv_transpose1d``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.conv_transpose1d(input, weight, stride, padding, dilation, output_padding, groups, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.conv_transpose1d', conv_transpose1d, dict(input=input, weight=weight, stride=stride, padding=padding, dilation=dilation, output_padding=output_padding, groups=groups, stream=stream), _error) from None


def conv_transpose2d(input: array, weight: array, /, stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1, output_padding: int | tuple[int, int] = 0, groups: int = 1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """2D transposed convolution over an input with several channels

    Awaitable ``mx.conv_transpose2d``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.conv_transpose2d(input, weight, stride, padding, dilation, output_padding, groups, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.conv_transpose2d', conv_transpose2d, dict(input=input, weight=weight, stride=stride, padding=padding, dilation=dilation, output_padding=output_padding, groups=groups, stream=stream), _error) from None


def conv_transpose3d(input: array, weight: array, /, stride: int | tuple[int, int, int] = 1, padding: int | tuple[int, int, int] = 0, dilation: int | tuple[int, int, int] = 1, output_padding: int | tuple[int, int, int] = 0, groups: int = 1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """3D transposed convolution over an input with several channels

    Awaitable ``mx.conv_transpose3d``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.conv_transpose3d(input, weight, stride, padding, dilation, output_padding, groups, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.conv_transpose3d', conv_transpose3d, dict(input=input, weight=weight, stride=stride, padding=padding, dilation=dilation, output_padding=output_padding, groups=groups, stream=stream), _error) from None


def convolve(a: array, v: array, /, mode: str = 'full', *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """The discrete convolution of 1D arrays.

    Awaitable ``mx.convolve``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('convolve', [a, v], _rt, mode=mode)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.convolve', convolve, dict(a=a, v=v, mode=mode, stream=stream), _error) from None


def copy(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """A copy of the array (``mx.array(a)`` in mlx.core).

    Awaitable ``mx.copy``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
    return _ad.op('copy', [a], _rt)


def cos(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise cosine.

    Awaitable ``mx.cos``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('cos', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.cos', cos, dict(a=a, stream=stream), _error) from None


def cosh(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise hyperbolic cosine.

    Awaitable ``mx.cosh``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('cosh', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.cosh', cosh, dict(a=a, stream=stream), _error) from None


def count_nonzero(a: array, /, *, axis: None | int | Sequence[int] = None, keepdims: bool = False, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Count the number of non-zero elements along the given axis.

    Awaitable ``mx.count_nonzero``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('count_nonzero', [a], _rt, axis=axis, keepdims=keepdims)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.count_nonzero', count_nonzero, dict(a=a, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def cummax(a: array, /, axis: int | None = None, *, reverse: bool = False, inclusive: bool = True, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the cumulative maximum of the elements along the given axis.

    Awaitable ``mx.cummax``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('cummax', [a], _rt, axis=axis, reverse=reverse, inclusive=inclusive)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.cummax', cummax, dict(a=a, axis=axis, reverse=reverse, inclusive=inclusive, stream=stream), _error) from None


def cummin(a: array, /, axis: int | None = None, *, reverse: bool = False, inclusive: bool = True, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the cumulative minimum of the elements along the given axis.

    Awaitable ``mx.cummin``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('cummin', [a], _rt, axis=axis, reverse=reverse, inclusive=inclusive)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.cummin', cummin, dict(a=a, axis=axis, reverse=reverse, inclusive=inclusive, stream=stream), _error) from None


def cumprod(a: array, /, axis: int | None = None, *, reverse: bool = False, inclusive: bool = True, dtype: Dtype | None = None, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the cumulative product of the elements along the given axis.

    Awaitable ``mx.cumprod``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.cumprod(a, axis, reverse, inclusive, dtype, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.cumprod', cumprod, dict(a=a, axis=axis, reverse=reverse, inclusive=inclusive, dtype=dtype, stream=stream), _error) from None


def cumsum(a: array, /, axis: int | None = None, *, reverse: bool = False, inclusive: bool = True, dtype: Dtype | None = None, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the cumulative sum of the elements along the given axis.

    Awaitable ``mx.cumsum``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.cumsum(a, axis, reverse, inclusive, dtype, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.cumsum', cumsum, dict(a=a, axis=axis, reverse=reverse, inclusive=inclusive, dtype=dtype, stream=stream), _error) from None


def cumulative_prod(a: array, /, axis: int | None = None, *, reverse: bool = False, inclusive: bool = True, dtype: Dtype | None = None, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the cumulative product of the elements along the given axis.

    Awaitable ``mx.cumulative_prod``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.cumprod(a, axis, reverse, inclusive, dtype, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.cumulative_prod', cumulative_prod, dict(a=a, axis=axis, reverse=reverse, inclusive=inclusive, dtype=dtype, stream=stream), _error) from None


def cumulative_sum(a: array, /, axis: int | None = None, *, reverse: bool = False, inclusive: bool = True, dtype: Dtype | None = None, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the cumulative sum of the elements along the given axis.

    Awaitable ``mx.cumulative_sum``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.cumsum(a, axis, reverse, inclusive, dtype, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.cumulative_sum', cumulative_sum, dict(a=a, axis=axis, reverse=reverse, inclusive=inclusive, dtype=dtype, stream=stream), _error) from None


def degrees(a: scalar | array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Convert angles from radians to degrees.

    Awaitable ``mx.degrees``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('degrees', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.degrees', degrees, dict(a=a, stream=stream), _error) from None


def dequantize(w: array, /, scales: array, biases: array | None = None, group_size: int | None = None, bits: int | None = None, mode: str = 'affine', global_scale: array | None = None, dtype: Dtype | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Dequantize the matrix ``w`` using quantization parameters.

    Awaitable ``mx.dequantize``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.dequantize(w, scales, biases, group_size, bits, mode, global_scale, dtype, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.dequantize', dequantize, dict(w=w, scales=scales, biases=biases, group_size=group_size, bits=bits, mode=mode, global_scale=global_scale, dtype=dtype, stream=stream), _error) from None


def diag(a: array, /, k: int = 0, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Extract a diagonal or construct a diagonal matrix. If ``a`` is 1-D then a diagonal matrix is
    constructed with ``a`` on the :math:`k`-th diagonal. If ``a`` is 2-D then the :math:`k`-th
    diagonal is returned.

    Awaitable ``mx.diag``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('diag', [a], _rt, k=k)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.diag', diag, dict(a=a, k=k, stream=stream), _error) from None


def diagonal(a: array, offset: int = 0, axis1: int = 0, axis2: int = 1, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return specified diagonals.

    Awaitable ``mx.diagonal``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('diagonal', [a], _rt, offset=offset, axis1=axis1, axis2=axis2)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.diagonal', diagonal, dict(a=a, offset=offset, axis1=axis1, axis2=axis2, stream=stream), _error) from None


def diff(a: array, /, n: int = 1, axis: int = -1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """The n-th discrete difference along the given axis.

    Awaitable ``mx.diff``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('diff', [a], _rt, n=n, axis=axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.diff', diff, dict(a=a, n=n, axis=axis, stream=stream), _error) from None


def divide(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise division.

    Awaitable ``mx.divide``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('divide', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.divide', divide, dict(a=a, b=b, stream=stream), _error) from None


def divmod(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[list[array]]:
    """Element-wise quotient and remainder.

    Awaitable ``mx.divmod``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('divmod', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.divmod', divmod, dict(a=a, b=b, stream=stream), _error) from None


def einsum(subscripts: str, *operands, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Perform the Einstein summation convention on the operands.

    Awaitable ``mx.einsum``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.einsum(subscripts, operands, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.einsum', einsum, dict(subscripts=subscripts, operands=operands, stream=stream), _error) from None


def einsum_path(subscripts: str, *operands: array) -> JobFuture[tuple[list[tuple[int, int]], str]]:
    """Compute the contraction order for the given Einstein summation.

    Awaitable ``mx.einsum_path``, answered at the call: it reads only the operands' shapes and
    returns no arrays, so no job runs; the JobFuture is already resolved and mlx's errors raise at
    the call.
    """
    return _ad.einsum_path(subscripts, operands)


def empty(shape: int | Sequence[int], dtype: Dtype | None = mx.float32, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Construct an array of zeros.

    Awaitable ``mx.empty``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('zeros', [], _rt, shape=shape, dtype=dtype)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.empty', empty, dict(shape=shape, dtype=dtype, stream=stream), _error) from None


def empty_like(a: array, /, dtype: Dtype | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """An array of zeros like the input.

    Awaitable ``mx.empty_like``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.zeros_like(a, dtype, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.empty_like', empty_like, dict(a=a, dtype=dtype, stream=stream), _error) from None


def equal(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise equality.

    Awaitable ``mx.equal``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('equal', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.equal', equal, dict(a=a, b=b, stream=stream), _error) from None


def erf(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise error function.

    Awaitable ``mx.erf``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('erf', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.erf', erf, dict(a=a, stream=stream), _error) from None


def erfinv(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise inverse of :func:`erf`.

    Awaitable ``mx.erfinv``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('erfinv', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.erfinv', erfinv, dict(a=a, stream=stream), _error) from None


def exp(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise exponential.

    Awaitable ``mx.exp``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('exp', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.exp', exp, dict(a=a, stream=stream), _error) from None


def expand_dims(a: array, /, axis: int | Sequence[int], *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Add a size one dimension at the given axis.

    Awaitable ``mx.expand_dims``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('expand_dims', [a], _rt, axis=axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.expand_dims', expand_dims, dict(a=a, axis=axis, stream=stream), _error) from None


def expm1(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise exponential minus 1.

    Awaitable ``mx.expm1``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('expm1', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.expm1', expm1, dict(a=a, stream=stream), _error) from None


def eye(n: int, m: int | None = None, k: int = 0, dtype: Dtype | None = mx.float32, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Create an identity matrix or a general diagonal matrix.

    Awaitable ``mx.eye``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('eye', [], _rt, n=n, m=m, k=k, dtype=dtype)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.eye', eye, dict(n=n, m=m, k=k, dtype=dtype, stream=stream), _error) from None


def flatten(a: array, /, start_axis: int = 0, end_axis: int = -1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Flatten an array.

    Awaitable ``mx.flatten``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('flatten', [a], _rt, start_axis=start_axis, end_axis=end_axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.flatten', flatten, dict(a=a, start_axis=start_axis, end_axis=end_axis, stream=stream), _error) from None


def flip(a: array, /, axis: None | int | Sequence[int] = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Reverse the order of elements along the given axis.

    Awaitable ``mx.flip``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('flip', [a], _rt, axis=axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.flip', flip, dict(a=a, axis=axis, stream=stream), _error) from None


def floor(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise floor.

    Awaitable ``mx.floor``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('floor', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.floor', floor, dict(a=a, stream=stream), _error) from None


def floor_divide(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise integer division.

    Awaitable ``mx.floor_divide``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('floor_divide', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.floor_divide', floor_divide, dict(a=a, b=b, stream=stream), _error) from None


def from_fp8(x: array, dtype: Dtype = mx.bfloat16, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Convert the array from fp8 (e4m3) to another floating-point type.

    Awaitable ``mx.from_fp8``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('from_fp8', [x], _rt, dtype=dtype)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.from_fp8', from_fp8, dict(x=x, dtype=dtype, stream=stream), _error) from None


def full(shape: int | Sequence[int], vals: scalar | array, dtype: Dtype | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Construct an array with the given value.

    Awaitable ``mx.full``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.full(shape, vals, dtype, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.full', full, dict(shape=shape, vals=vals, dtype=dtype, stream=stream), _error) from None


def full_like(a: array, vals: scalar | array, dtype: Dtype | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """An array filled with ``vals`` with the same shape as the input.

    Awaitable ``mx.full_like``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.full_like(a, vals, dtype, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.full_like', full_like, dict(a=a, vals=vals, dtype=dtype, stream=stream), _error) from None


def gather_mm(a: array, b: array, /, lhs_indices: array | None = None, rhs_indices: array | None = None, *, sorted_indices: bool = False, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Matrix multiplication with matrix-level gather.

    Awaitable ``mx.gather_mm``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.gather_mm(a, b, lhs_indices, rhs_indices, sorted_indices, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.gather_mm', gather_mm, dict(a=a, b=b, lhs_indices=lhs_indices, rhs_indices=rhs_indices, sorted_indices=sorted_indices, stream=stream), _error) from None


def gather_qmm(x: array, w: array, /, scales: array, biases: array | None = None, lhs_indices: array | None = None, rhs_indices: array | None = None, transpose: bool = True, group_size: int | None = None, bits: int | None = None, mode: str = 'affine', global_scale: array | None = None, *, sorted_indices: bool = False, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Perform quantized matrix multiplication with matrix-level gather.

    Awaitable ``mx.gather_qmm``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.gather_qmm(x, w, scales, biases, lhs_indices, rhs_indices, transpose, group_size, bits, mode, global_scale, sorted_indices, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.gather_qmm', gather_qmm, dict(x=x, w=w, scales=scales, biases=biases, lhs_indices=lhs_indices, rhs_indices=rhs_indices, transpose=transpose, group_size=group_size, bits=bits, mode=mode, global_scale=global_scale, sorted_indices=sorted_indices, stream=stream), _error) from None


def gather_qqmm(x: array, w: array, /, scales: array | None = None, lhs_indices: array | None = None, rhs_indices: array | None = None, group_size: int | None = None, bits: int | None = None, mode: str = 'nvfp4', global_scale_x: array | None = None, global_scale_w: array | None = None, *, sorted_indices: bool = False, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Fused :func:`qqmm` with matrix-level gather.

    Awaitable ``mx.gather_qqmm``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.gather_qqmm(x, w, scales, lhs_indices, rhs_indices, group_size, bits, mode, global_scale_x, global_scale_w, sorted_indices, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.gather_qqmm', gather_qqmm, dict(x=x, w=w, scales=scales, lhs_indices=lhs_indices, rhs_indices=rhs_indices, group_size=group_size, bits=bits, mode=mode, global_scale_x=global_scale_x, global_scale_w=global_scale_w, sorted_indices=sorted_indices, stream=stream), _error) from None


def greater(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise greater than.

    Awaitable ``mx.greater``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('greater', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.greater', greater, dict(a=a, b=b, stream=stream), _error) from None


def greater_equal(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise greater or equal.

    Awaitable ``mx.greater_equal``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('greater_equal', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.greater_equal', greater_equal, dict(a=a, b=b, stream=stream), _error) from None


def hadamard_transform(a: array, scale: float | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Perform the Walsh-Hadamard transform along the final axis.

    Awaitable ``mx.hadamard_transform``, built and run natively on a queue: returns a JobFuture.
    Also takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.hadamard_transform(a, scale, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.hadamard_transform', hadamard_transform, dict(a=a, scale=scale, stream=stream), _error) from None


def hamming(M: int, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the Hamming window.

    Awaitable ``mx.hamming``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.window('hamming', M, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.hamming', hamming, dict(M=M, stream=stream), _error) from None


def hanning(M: int, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the Hanning window.

    Awaitable ``mx.hanning``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.window('hanning', M, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.hanning', hanning, dict(M=M, stream=stream), _error) from None


def identity(n: int, dtype: Dtype | None = mx.float32, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Create a square identity matrix.

    Awaitable ``mx.identity``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('eye', [], _rt, n=n, dtype=dtype)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.identity', identity, dict(n=n, dtype=dtype, stream=stream), _error) from None


def imag(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Returns the imaginary part of a complex array.

    Awaitable ``mx.imag``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('imag', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.imag', imag, dict(a=a, stream=stream), _error) from None


def inner(a: array, b: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Ordinary inner product of vectors for 1-D arrays, in higher dimensions a sum product over the
    last axes.

    Awaitable ``mx.inner``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('inner', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.inner', inner, dict(a=a, b=b, stream=stream), _error) from None


def isclose(a: array, b: array, /, rtol: float = 1e-05, atol: float = 1e-08, *, equal_nan: bool = False, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Returns a boolean array where two arrays are element-wise equal within a tolerance.

    Awaitable ``mx.isclose``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('isclose', [a, b], _rt, rtol=rtol, atol=atol, equal_nan=equal_nan)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.isclose', isclose, dict(a=a, b=b, rtol=rtol, atol=atol, equal_nan=equal_nan, stream=stream), _error) from None


def isfinite(a: array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return a boolean array indicating which elements are finite.

    Awaitable ``mx.isfinite``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('isfinite', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.isfinite', isfinite, dict(a=a, stream=stream), _error) from None


def isinf(a: array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return a boolean array indicating which elements are +/- inifnity.

    Awaitable ``mx.isinf``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('isinf', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.isinf', isinf, dict(a=a, stream=stream), _error) from None


def isnan(a: array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return a boolean array indicating which elements are NaN.

    Awaitable ``mx.isnan``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('isnan', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.isnan', isnan, dict(a=a, stream=stream), _error) from None


def isneginf(a: array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return a boolean array indicating which elements are negative infinity.

    Awaitable ``mx.isneginf``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('isneginf', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.isneginf', isneginf, dict(a=a, stream=stream), _error) from None


def isposinf(a: array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return a boolean array indicating which elements are positive infinity.

    Awaitable ``mx.isposinf``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('isposinf', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.isposinf', isposinf, dict(a=a, stream=stream), _error) from None


def kron(a: array, b: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the Kronecker product of two arrays ``a`` and ``b``.

    Awaitable ``mx.kron``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('kron', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.kron', kron, dict(a=a, b=b, stream=stream), _error) from None


def left_shift(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise left shift.

    Awaitable ``mx.left_shift``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('left_shift', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.left_shift', left_shift, dict(a=a, b=b, stream=stream), _error) from None


def less(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise less than.

    Awaitable ``mx.less``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('less', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.less', less, dict(a=a, b=b, stream=stream), _error) from None


def less_equal(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise less than or equal.

    Awaitable ``mx.less_equal``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('less_equal', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.less_equal', less_equal, dict(a=a, b=b, stream=stream), _error) from None


def linspace(start: scalar, stop: scalar, num: int | None = 50, endpoint: bool = True, dtype: Dtype | None = mx.float32, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Generate ``num`` evenly spaced numbers over interval ``[start, stop]``.

    Awaitable ``mx.linspace``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.linspace(start, stop, num, endpoint, dtype, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linspace', linspace, dict(start=start, stop=stop, num=num, endpoint=endpoint, dtype=dtype, stream=stream), _error) from None


def log(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise natural logarithm.

    Awaitable ``mx.log``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('log', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.log', log, dict(a=a, stream=stream), _error) from None


def log10(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise base-10 logarithm.

    Awaitable ``mx.log10``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('log10', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.log10', log10, dict(a=a, stream=stream), _error) from None


def log1p(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise natural log of one plus the array.

    Awaitable ``mx.log1p``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('log1p', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.log1p', log1p, dict(a=a, stream=stream), _error) from None


def log2(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise base-2 logarithm.

    Awaitable ``mx.log2``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('log2', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.log2', log2, dict(a=a, stream=stream), _error) from None


def logaddexp(a: scalar | array, b: scalar | array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise log-add-exp.

    Awaitable ``mx.logaddexp``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('logaddexp', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.logaddexp', logaddexp, dict(a=a, b=b, stream=stream), _error) from None


def logcumsumexp(a: array, /, axis: int | None = None, *, reverse: bool = False, inclusive: bool = True, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the cumulative logsumexp of the elements along the given axis.

    Awaitable ``mx.logcumsumexp``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('logcumsumexp', [a], _rt, axis=axis, reverse=reverse, inclusive=inclusive)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.logcumsumexp', logcumsumexp, dict(a=a, axis=axis, reverse=reverse, inclusive=inclusive, stream=stream), _error) from None


def logical_and(a: array, b: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise logical and.

    Awaitable ``mx.logical_and``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('logical_and', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.logical_and', logical_and, dict(a=a, b=b, stream=stream), _error) from None


def logical_not(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise logical not.

    Awaitable ``mx.logical_not``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('logical_not', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.logical_not', logical_not, dict(a=a, stream=stream), _error) from None


def logical_or(a: array, b: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise logical or.

    Awaitable ``mx.logical_or``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('logical_or', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.logical_or', logical_or, dict(a=a, b=b, stream=stream), _error) from None


def logical_xor(a: scalar | array, b: scalar | array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise logical exclusive or.

    Awaitable ``mx.logical_xor``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('logical_xor', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.logical_xor', logical_xor, dict(a=a, b=b, stream=stream), _error) from None


def logsumexp(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """A `log-sum-exp` reduction over the given axes.

    Awaitable ``mx.logsumexp``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('logsumexp', [a], _rt, axis=axis, keepdims=keepdims)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.logsumexp', logsumexp, dict(a=a, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def matmul(a: array, b: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Matrix multiplication.

    Awaitable ``mx.matmul``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('matmul', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.matmul', matmul, dict(a=a, b=b, stream=stream), _error) from None


def matrix_norm(a: array, /, ord: None | int | float | str = None, axis: None | int | list[int] = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Matrix or vector norm.

    Awaitable ``mx.matrix_norm``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.norm(a, ord, axis, keepdims, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.matrix_norm', matrix_norm, dict(a=a, ord=ord, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def matrix_transpose(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Transpose the last two dimensions of the array.

    Awaitable ``mx.matrix_transpose``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.matrix_transpose(a, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.matrix_transpose', matrix_transpose, dict(a=a, stream=stream), _error) from None


def max(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """A `max` reduction over the given axes.

    Awaitable ``mx.max``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('max', [a], _rt, axis=axis, keepdims=keepdims)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.max', max, dict(a=a, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def maximum(a: scalar | array, b: scalar | array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise maximum.

    Awaitable ``mx.maximum``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('maximum', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.maximum', maximum, dict(a=a, b=b, stream=stream), _error) from None


def mean(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the mean(s) over the given axes.

    Awaitable ``mx.mean``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('mean', [a], _rt, axis=axis, keepdims=keepdims)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.mean', mean, dict(a=a, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def median(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the median(s) over the given axes.

    Awaitable ``mx.median``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('median', [a], _rt, axis=axis, keepdims=keepdims)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.median', median, dict(a=a, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def meshgrid(*arrays: array, sparse: bool | None = False, indexing: str | None = 'xy', stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[tuple[array, ...]]:
    """Generate multidimensional coordinate grids from 1-D coordinate arrays

    Awaitable ``mx.meshgrid``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.meshgrid(arrays, sparse, indexing, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.meshgrid', meshgrid, dict(arrays=arrays, sparse=sparse, indexing=indexing, stream=stream), _error) from None


def min(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """A `min` reduction over the given axes.

    Awaitable ``mx.min``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('min', [a], _rt, axis=axis, keepdims=keepdims)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.min', min, dict(a=a, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def minimum(a: scalar | array, b: scalar | array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise minimum.

    Awaitable ``mx.minimum``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('minimum', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.minimum', minimum, dict(a=a, b=b, stream=stream), _error) from None


def minmax(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[tuple[array, array]]:
    """Return the minimum and maximum over the given axes.

    Awaitable ``mx.minmax``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('minmax', [a], _rt, axis=axis, keepdims=keepdims)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.minmax', minmax, dict(a=a, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def moveaxis(a: array, /, source: int, destination: int, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Move an axis to a new position.

    Awaitable ``mx.moveaxis``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('moveaxis', [a], _rt, source=source, destination=destination)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.moveaxis', moveaxis, dict(a=a, source=source, destination=destination, stream=stream), _error) from None


def multiply(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise multiplication.

    Awaitable ``mx.multiply``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('multiply', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.multiply', multiply, dict(a=a, b=b, stream=stream), _error) from None


def nan_to_num(a: scalar | array, nan: float = 0, posinf: float | None = None, neginf: float | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Replace NaN and Inf values with finite numbers.

    Awaitable ``mx.nan_to_num``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.nan_to_num(a, nan, posinf, neginf, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.nan_to_num', nan_to_num, dict(a=a, nan=nan, posinf=posinf, neginf=neginf, stream=stream), _error) from None


def negative(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise negation.

    Awaitable ``mx.negative``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('negative', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.negative', negative, dict(a=a, stream=stream), _error) from None


def not_equal(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise not equal.

    Awaitable ``mx.not_equal``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('not_equal', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.not_equal', not_equal, dict(a=a, b=b, stream=stream), _error) from None


def ones(shape: int | Sequence[int], dtype: Dtype | None = mx.float32, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Construct an array of ones.

    Awaitable ``mx.ones``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('ones', [], _rt, shape=shape, dtype=dtype)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.ones', ones, dict(shape=shape, dtype=dtype, stream=stream), _error) from None


def ones_like(a: array, /, dtype: Dtype | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """An array of ones like the input.

    Awaitable ``mx.ones_like``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.ones_like(a, dtype, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.ones_like', ones_like, dict(a=a, dtype=dtype, stream=stream), _error) from None


def outer(a: array, b: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the outer product of two 1-D arrays, if the array's passed are not 1-D a flatten op will
    be run beforehand.

    Awaitable ``mx.outer``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('outer', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.outer', outer, dict(a=a, b=b, stream=stream), _error) from None


def pad(a: array, pad_width: int | tuple[int] | tuple[int, int] | list[tuple[int, int]], mode: Literal['constant', 'edge', 'reflect', 'symmetric'] = 'constant', constant_values: scalar | array = 0, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Pad an array with a constant value

    Awaitable ``mx.pad``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.pad(a, pad_width, mode, constant_values, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.pad', pad, dict(a=a, pad_width=pad_width, mode=mode, constant_values=constant_values, stream=stream), _error) from None


def partition(a: array, /, kth: int, axis: None | int = -1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Returns a partitioned copy of the array such that the smaller ``kth`` elements are first.

    Awaitable ``mx.partition``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('partition', [a], _rt, kth=kth, axis=axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.partition', partition, dict(a=a, kth=kth, axis=axis, stream=stream), _error) from None


def permute_dims(a: array, /, axes: Sequence[int] | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """See :func:`transpose`.

    Awaitable ``mx.permute_dims``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('transpose', [a], _rt, axes=axes)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.permute_dims', permute_dims, dict(a=a, axes=axes, stream=stream), _error) from None


def positive(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise unary plus. Returns a copy of the input.

    Awaitable ``mx.positive``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('copy', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.positive', positive, dict(a=a, stream=stream), _error) from None


def pow(a: scalar | array, b: scalar | array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise power operation.

    Awaitable ``mx.pow``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('power', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.pow', pow, dict(a=a, b=b, stream=stream), _error) from None


def power(a: scalar | array, b: scalar | array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise power operation.

    Awaitable ``mx.power``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('power', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.power', power, dict(a=a, b=b, stream=stream), _error) from None


def prod(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """An product reduction over the given axes.

    Awaitable ``mx.prod``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('prod', [a], _rt, axis=axis, keepdims=keepdims)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.prod', prod, dict(a=a, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def put_along_axis(a: array, /, indices: array, values: array, axis: int | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Put values along an axis at the specified indices.

    Awaitable ``mx.put_along_axis``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.put_along_axis(a, indices, values, axis, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.put_along_axis', put_along_axis, dict(a=a, indices=indices, values=values, axis=axis, stream=stream), _error) from None


def qqmm(x: array, w: array, scales: array | None = None, group_size: int | None = None, bits: int | None = None, mode: str = 'nvfp4', global_scale_x: array | None = None, global_scale_w: array | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Perform a matrix multiplication using a possibly quantized weight matrix ``w`` and a non-
    quantized input ``x``. The input ``x`` is quantized on the fly. The weight matrix ``w`` is used
    as-is if it is already quantized; otherwise, it is quantized on the fly.

    Awaitable ``mx.qqmm``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.qqmm(x, w, scales, group_size, bits, mode, global_scale_x, global_scale_w, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.qqmm', qqmm, dict(x=x, w=w, scales=scales, group_size=group_size, bits=bits, mode=mode, global_scale_x=global_scale_x, global_scale_w=global_scale_w, stream=stream), _error) from None


def quantize(w: array, /, group_size: int | None = None, bits: int | None = None, mode: str = 'affine', *, global_scale: array | None = None, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[list[array]]:
    """Quantize the array ``w``.

    Awaitable ``mx.quantize``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.quantize(w, group_size, bits, mode, global_scale, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.quantize', quantize, dict(w=w, group_size=group_size, bits=bits, mode=mode, global_scale=global_scale, stream=stream), _error) from None


def quantized_matmul(x: array, w: array, /, scales: array, biases: array | None = None, transpose: bool = True, group_size: int | None = None, bits: int | None = None, mode: str = 'affine', *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Perform the matrix multiplication with the quantized matrix ``w``. The quantization uses one
    floating point scale and bias per ``group_size`` of elements. Each element in ``w`` takes
    ``bits`` bits and is packed in an unsigned 32 bit integer.

    Awaitable ``mx.quantized_matmul``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.quantized_matmul', quantized_matmul, dict(x=x, w=w, scales=scales, biases=biases, transpose=transpose, group_size=group_size, bits=bits, mode=mode, stream=stream), _error) from None


def radians(a: scalar | array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Convert angles from degrees to radians.

    Awaitable ``mx.radians``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('radians', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.radians', radians, dict(a=a, stream=stream), _error) from None


def real(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Returns the real part of a complex array.

    Awaitable ``mx.real``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('real', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.real', real, dict(a=a, stream=stream), _error) from None


def reciprocal(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise reciprocal.

    Awaitable ``mx.reciprocal``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('reciprocal', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.reciprocal', reciprocal, dict(a=a, stream=stream), _error) from None


def remainder(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise remainder of division.

    Awaitable ``mx.remainder``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('remainder', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.remainder', remainder, dict(a=a, b=b, stream=stream), _error) from None


def repeat(array: array, repeats: int, axis: int | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Repeat an array along a specified axis.

    Awaitable ``mx.repeat``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('repeat', [array], _rt, repeats=repeats, axis=axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.repeat', repeat, dict(array=array, repeats=repeats, axis=axis, stream=stream), _error) from None


def reshape(a: array, /, shape: Sequence[int], *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Reshape an array while preserving the size.

    Awaitable ``mx.reshape``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('reshape', [a], _rt, shape=shape)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.reshape', reshape, dict(a=a, shape=shape, stream=stream), _error) from None


def right_shift(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise right shift.

    Awaitable ``mx.right_shift``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('right_shift', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.right_shift', right_shift, dict(a=a, b=b, stream=stream), _error) from None


def roll(a: array, shift: int | tuple[int], axis: None | int | tuple[int] = None, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Roll array elements along a given axis.

    Awaitable ``mx.roll``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.roll(a, shift, axis, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.roll', roll, dict(a=a, shift=shift, axis=axis, stream=stream), _error) from None


def round(a: array, /, decimals: int = 0, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Round to the given number of decimals.

    Awaitable ``mx.round``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('round', [a], _rt, decimals=decimals)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.round', round, dict(a=a, decimals=decimals, stream=stream), _error) from None


def rsqrt(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise reciprocal and square root.

    Awaitable ``mx.rsqrt``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('rsqrt', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.rsqrt', rsqrt, dict(a=a, stream=stream), _error) from None


def searchsorted(sorted_sequence: array, values: array, /, side: str = 'left', *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Find the indices that keep ``sorted_sequence`` sorted when inserting ``values``.

    Awaitable ``mx.searchsorted``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('searchsorted', [sorted_sequence, values], _rt, side=side)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.searchsorted', searchsorted, dict(sorted_sequence=sorted_sequence, values=values, side=side, stream=stream), _error) from None


def segmented_mm(a: array, b: array, /, segments: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Perform a matrix multiplication but segment the inner dimension and save the result for each
    segment separately.

    Awaitable ``mx.segmented_mm``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.segmented_mm(a, b, segments, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.segmented_mm', segmented_mm, dict(a=a, b=b, segments=segments, stream=stream), _error) from None


def sigmoid(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise logistic sigmoid.

    Awaitable ``mx.sigmoid``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('sigmoid', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.sigmoid', sigmoid, dict(a=a, stream=stream), _error) from None


def sign(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise sign.

    Awaitable ``mx.sign``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('sign', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.sign', sign, dict(a=a, stream=stream), _error) from None


def sin(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise sine.

    Awaitable ``mx.sin``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('sin', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.sin', sin, dict(a=a, stream=stream), _error) from None


def sinh(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise hyperbolic sine.

    Awaitable ``mx.sinh``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('sinh', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.sinh', sinh, dict(a=a, stream=stream), _error) from None


def slice(a: array, start_indices: array | Sequence[int] | None = None, axes: Sequence[int] | None = None, slice_size: Sequence[int] | None = None, *, start: Sequence[int] | None = None, stop: Sequence[int] | None = None, strides: Sequence[int] | None = None, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Extract a sub-array: mlx's form (start_indices, axes, slice_size), or the static form start=,
    stop= and strides= (Python slice bounds, one per axis).

    Awaitable ``mx.slice``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.slice(a, start_indices, axes, slice_size, start, stop, strides, _rt)
    except _ad.OptionTypeError as _error:
        if start is not None or stop is not None or strides is not None:
            raise
        raise _ad.mlx_type_error('mx.slice', slice, dict(a=a, start_indices=start_indices, axes=axes, slice_size=slice_size, stream=stream), _error) from None


def slice_update(a: array, update: array, start_indices: array | Sequence[int] | None = None, axes: Sequence[int] | None = None, *, start: Sequence[int] | None = None, stop: Sequence[int] | None = None, strides: Sequence[int] | None = None, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Update a sub-array: mlx's form (start_indices, axes), or the static form start=, stop= and
    strides= (Python slice bounds, one per axis).

    Awaitable ``mx.slice_update``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.slice_update(a, update, start_indices, axes, start, stop, strides, _rt)
    except _ad.OptionTypeError as _error:
        if start is not None or stop is not None or strides is not None:
            raise
        raise _ad.mlx_type_error('mx.slice_update', slice_update, dict(a=a, update=update, start_indices=start_indices, axes=axes, stream=stream), _error) from None


def softmax(a: array, /, axis: None | int | Sequence[int] = None, *, precise: bool = False, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Perform the softmax along the given axis.

    Awaitable ``mx.softmax``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('softmax', [a], _rt, axis=axis, precise=precise)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.softmax', softmax, dict(a=a, axis=axis, precise=precise, stream=stream), _error) from None


def sort(a: array, /, axis: None | int = -1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Returns a sorted copy of the array.

    Awaitable ``mx.sort``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('sort', [a], _rt, axis=axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.sort', sort, dict(a=a, axis=axis, stream=stream), _error) from None


def split(a: array, /, indices_or_sections: int | Sequence[int], axis: int = 0, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[list[array]]:
    """Split an array along a given axis.

    Awaitable ``mx.split``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.split(a, indices_or_sections, axis, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.split', split, dict(a=a, indices_or_sections=indices_or_sections, axis=axis, stream=stream), _error) from None


def sqrt(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise square root.

    Awaitable ``mx.sqrt``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('sqrt', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.sqrt', sqrt, dict(a=a, stream=stream), _error) from None


def square(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise square.

    Awaitable ``mx.square``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('square', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.square', square, dict(a=a, stream=stream), _error) from None


def squeeze(a: array, /, axis: None | int | Sequence[int] = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Remove length one axes from an array.

    Awaitable ``mx.squeeze``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('squeeze', [a], _rt, axis=axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.squeeze', squeeze, dict(a=a, axis=axis, stream=stream), _error) from None


def stack(arrays: list[array], axis: int | None = 0, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Stacks the arrays along a new axis.

    Awaitable ``mx.stack``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.stack(arrays, axis, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.stack', stack, dict(arrays=arrays, axis=axis, stream=stream), _error) from None


def std(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, ddof: int = 0, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the standard deviation(s) over the given axes.

    Awaitable ``mx.std``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('std', [a], _rt, axis=axis, keepdims=keepdims, ddof=ddof)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.std', std, dict(a=a, axis=axis, keepdims=keepdims, ddof=ddof, stream=stream), _error) from None


def stop_gradient(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Stop gradients from being computed.

    Awaitable ``mx.stop_gradient``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('stop_gradient', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.stop_gradient', stop_gradient, dict(a=a, stream=stream), _error) from None


def subtract(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise subtraction.

    Awaitable ``mx.subtract``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('subtract', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.subtract', subtract, dict(a=a, b=b, stream=stream), _error) from None


def sum(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Sum reduce the array over the given axes.

    Awaitable ``mx.sum``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('sum', [a], _rt, axis=axis, keepdims=keepdims)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.sum', sum, dict(a=a, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def swapaxes(a: array, /, axis1: int, axis2: int, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Swap two axes of an array.

    Awaitable ``mx.swapaxes``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('swapaxes', [a], _rt, axis1=axis1, axis2=axis2)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.swapaxes', swapaxes, dict(a=a, axis1=axis1, axis2=axis2, stream=stream), _error) from None


def take(a: array, /, indices: int | array, axis: int | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Take elements along an axis.

    Awaitable ``mx.take``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.take(a, indices, axis, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.take', take, dict(a=a, indices=indices, axis=axis, stream=stream), _error) from None


def take_along_axis(a: array, /, indices: array, axis: int | None = -1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Take values along an axis at the specified indices.

    Awaitable ``mx.take_along_axis``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.take_along_axis(a, indices, axis, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.take_along_axis', take_along_axis, dict(a=a, indices=indices, axis=axis, stream=stream), _error) from None


def tan(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise tangent.

    Awaitable ``mx.tan``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('tan', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.tan', tan, dict(a=a, stream=stream), _error) from None


def tanh(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise hyperbolic tangent.

    Awaitable ``mx.tanh``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('tanh', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.tanh', tanh, dict(a=a, stream=stream), _error) from None


def tensordot(a: array, b: array, /, axes: int | list[Sequence[int]] = 2, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the tensor dot product along the specified axes.

    Awaitable ``mx.tensordot``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.tensordot(a, b, axes, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.tensordot', tensordot, dict(a=a, b=b, axes=axes, stream=stream), _error) from None


def tile(a: array, reps: int | Sequence[int], /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Construct an array by repeating ``a`` the number of times given by ``reps``.

    Awaitable ``mx.tile``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('tile', [a], _rt, reps=reps)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.tile', tile, dict(a=a, reps=reps, stream=stream), _error) from None


def to_fp8(x: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Convert the array to fp8 (e4m3) from another floating-point type.

    Awaitable ``mx.to_fp8``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('to_fp8', [x], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.to_fp8', to_fp8, dict(x=x, stream=stream), _error) from None


def topk(a: array, /, k: int, axis: None | int = -1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Returns the ``k`` largest elements from the input along a given axis.

    Awaitable ``mx.topk``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('topk', [a], _rt, k=k, axis=axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.topk', topk, dict(a=a, k=k, axis=axis, stream=stream), _error) from None


def trace(a: array, /, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype: Dtype | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the sum along a specified diagonal in the given array.

    Awaitable ``mx.trace``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('trace', [a], _rt, offset=offset, axis1=axis1, axis2=axis2, dtype=dtype)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.trace', trace, dict(a=a, offset=offset, axis1=axis1, axis2=axis2, dtype=dtype, stream=stream), _error) from None


def transpose(a: array, /, axes: Sequence[int] | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Transpose the dimensions of the array.

    Awaitable ``mx.transpose``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('transpose', [a], _rt, axes=axes)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.transpose', transpose, dict(a=a, axes=axes, stream=stream), _error) from None


def tri(n: int, m: int | None = None, k: int = 0, dtype: Dtype | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """An array with ones at and below the given diagonal and zeros elsewhere.

    Awaitable ``mx.tri``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('tri', [], _rt, n=n, m=m, k=k, dtype=dtype)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.tri', tri, dict(n=n, m=m, k=k, dtype=dtype, stream=stream), _error) from None


def tril(x: array, k: int = 0, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Zeros the array above the given diagonal.

    Awaitable ``mx.tril``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('tril', [x], _rt, k=k)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.tril', tril, dict(x=x, k=k, stream=stream), _error) from None


def triu(x: array, k: int = 0, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Zeros the array below the given diagonal.

    Awaitable ``mx.triu``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('triu', [x], _rt, k=k)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.triu', triu, dict(x=x, k=k, stream=stream), _error) from None


def trunc(a: array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Element-wise truncation towards zero.

    Awaitable ``mx.trunc``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('trunc', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.trunc', trunc, dict(a=a, stream=stream), _error) from None


def unflatten(a: array, /, axis: int, shape: Sequence[int], *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Unflatten an axis of an array to a shape.

    Awaitable ``mx.unflatten``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('unflatten', [a], _rt, axis=axis, shape=shape)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.unflatten', unflatten, dict(a=a, axis=axis, shape=shape, stream=stream), _error) from None


def unique(a: array, /, size: int, return_index: bool = False, return_inverse: bool = False, return_counts: bool = False, fill_value: scalar | array | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array | tuple[array, ...]]:
    """Returns the sorted unique elements of the flattened array.

    Awaitable ``mx.unique``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.unique(a, size, return_index, return_inverse, return_counts, fill_value, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.unique', unique, dict(a=a, size=size, return_index=return_index, return_inverse=return_inverse, return_counts=return_counts, fill_value=fill_value, stream=stream), _error) from None


def unstack(x: array, /, *, axis: int = 0, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[tuple[array, ...]]:
    """Split an array into a sequence of arrays along the given axis.

    Awaitable ``mx.unstack``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('unstack', [x], _rt, axis=axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.unstack', unstack, dict(x=x, axis=axis, stream=stream), _error) from None


def var(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, ddof: int = 0, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the variance(s) over the given axes.

    Awaitable ``mx.var``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('var', [a], _rt, axis=axis, keepdims=keepdims, ddof=ddof)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.var', var, dict(a=a, axis=axis, keepdims=keepdims, ddof=ddof, stream=stream), _error) from None


def vecdot(a: array, b: array, /, *, axis: int = -1, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the vector dot product of two arrays along an axis.

    Awaitable ``mx.vecdot``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('vecdot', [a, b], _rt, axis=axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.vecdot', vecdot, dict(a=a, b=b, axis=axis, stream=stream), _error) from None


def view(a: scalar | array, dtype: Dtype, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """View the array as a different type.

    Awaitable ``mx.view``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('view', [a], _rt, dtype=dtype)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.view', view, dict(a=a, dtype=dtype, stream=stream), _error) from None


def where(condition: scalar | array, x: scalar | array, y: scalar | array, /, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Select from ``x`` or ``y`` according to ``condition``.

    Awaitable ``mx.where``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('where', [condition, x, y], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.where', where, dict(condition=condition, x=x, y=y, stream=stream), _error) from None


def zeros(shape: int | Sequence[int], dtype: Dtype | None = mx.float32, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Construct an array of zeros.

    Awaitable ``mx.zeros``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('zeros', [], _rt, shape=shape, dtype=dtype)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.zeros', zeros, dict(shape=shape, dtype=dtype, stream=stream), _error) from None


def zeros_like(a: array, /, dtype: Dtype | None = None, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """An array of zeros like the input.

    Awaitable ``mx.zeros_like``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.zeros_like(a, dtype, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.zeros_like', zeros_like, dict(a=a, dtype=dtype, stream=stream), _error) from None
