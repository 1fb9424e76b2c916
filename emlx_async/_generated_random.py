"""``mx.random`` with mlx's own signatures, as awaitables. GENERATED, do not edit.

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

__all__ = ['bernoulli', 'categorical', 'gumbel', 'key', 'laplace', 'multivariate_normal', 'normal', 'permutation', 'randint', 'split', 'truncated_normal', 'uniform']
_keep = (Any, Sequence, Literal, overload, mx, Dtype, array, scalar, StreamOrDevice)  # names the annotations use


def bernoulli(p: scalar | array = 0.5, shape: Sequence[int] | None = None, key: array | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Generate Bernoulli random values.

    Awaitable ``mx.random.bernoulli``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.random_bernoulli(p, shape, key, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.random.bernoulli', bernoulli, dict(p=p, shape=shape, key=key, stream=stream), _error) from None


def categorical(logits: array, axis: int = -1, shape: Sequence[int] | None = None, num_samples: int | None = None, key: array | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Sample from a categorical distribution.

    Awaitable ``mx.random.categorical``, built and run natively on a queue: returns a JobFuture.
    Also takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.random_categorical(logits, axis, shape, num_samples, key, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.random.categorical', categorical, dict(logits=logits, axis=axis, shape=shape, num_samples=num_samples, key=key, stream=stream), _error) from None


def gumbel(shape: Sequence[int] = [], dtype: Dtype | None = mx.float32, key: array | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Sample from the standard Gumbel distribution.

    Awaitable ``mx.random.gumbel``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.random_gumbel(shape, dtype, key, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.random.gumbel', gumbel, dict(shape=shape, dtype=dtype, key=key, stream=stream), _error) from None


def key(seed: int, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Get a PRNG key from a seed.

    Awaitable ``mx.random.key``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.random_key(seed, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.random.key', key, dict(seed=seed, stream=stream), _error) from None


def laplace(shape: Sequence[int] = [], dtype: Dtype | None = mx.float32, loc: float = 0.0, scale: float = 1.0, key: array | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Sample numbers from a Laplace distribution.

    Awaitable ``mx.random.laplace``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.random_laplace(shape, dtype, loc, scale, key, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.random.laplace', laplace, dict(shape=shape, dtype=dtype, loc=loc, scale=scale, key=key, stream=stream), _error) from None


def multivariate_normal(mean: array, cov: array, shape: Sequence[int] = [], dtype: Dtype | None = mx.float32, key: array | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Generate jointly-normal random samples given a mean and covariance.

    Awaitable ``mx.random.multivariate_normal``, built and run natively on a queue: returns a
    JobFuture. Also takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.random_multivariate_normal(mean, cov, shape, dtype, key, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.random.multivariate_normal', multivariate_normal, dict(mean=mean, cov=cov, shape=shape, dtype=dtype, key=key, stream=stream), _error) from None


def normal(shape: Sequence[int] = [], dtype: Dtype | None = mx.float32, loc: scalar | array | None = None, scale: scalar | array | None = None, key: array | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Generate normally distributed random numbers.

    Awaitable ``mx.random.normal``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.random_normal(shape, dtype, loc, scale, key, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.random.normal', normal, dict(shape=shape, dtype=dtype, loc=loc, scale=scale, key=key, stream=stream), _error) from None


def permutation(x: int | array, axis: int = 0, key: array | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Generate a random permutation or permute the entries of an array.

    Awaitable ``mx.random.permutation``, built and run natively on a queue: returns a JobFuture.
    Also takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.random_permutation(x, axis, key, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.random.permutation', permutation, dict(x=x, axis=axis, key=key, stream=stream), _error) from None


def randint(low: scalar | array, high: scalar | array, shape: Sequence[int] = [], dtype: Dtype | None = mx.int32, key: array | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Generate random integers from the given interval.

    Awaitable ``mx.random.randint``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.random_randint(low, high, shape, dtype, key, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.random.randint', randint, dict(low=low, high=high, shape=shape, dtype=dtype, key=key, stream=stream), _error) from None


def split(key: array, num: int = 2, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Split a PRNG key into sub keys.

    Awaitable ``mx.random.split``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.random_split(key, num, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.random.split', split, dict(key=key, num=num, stream=stream), _error) from None


def truncated_normal(lower: scalar | array, upper: scalar | array, shape: Sequence[int] | None = None, dtype: Dtype | None = mx.float32, key: array | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Generate values from a truncated normal distribution.

    Awaitable ``mx.random.truncated_normal``, built and run natively on a queue: returns a
    JobFuture. Also takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.random_truncated_normal(lower, upper, shape, dtype, key, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.random.truncated_normal', truncated_normal, dict(lower=lower, upper=upper, shape=shape, dtype=dtype, key=key, stream=stream), _error) from None


def uniform(low: scalar | array = 0, high: scalar | array = 1, shape: Sequence[int] = [], dtype: Dtype | None = mx.float32, key: array | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Generate uniformly distributed random numbers.

    Awaitable ``mx.random.uniform``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.random_uniform(low, high, shape, dtype, key, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.random.uniform', uniform, dict(low=low, high=high, shape=shape, dtype=dtype, key=key, stream=stream), _error) from None
