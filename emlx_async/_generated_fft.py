"""``mx.fft`` with mlx's own signatures, as awaitables. GENERATED, do not edit.

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

__all__ = ['fft', 'fft2', 'fftfreq', 'fftn', 'fftshift', 'ifft', 'ifft2', 'ifftn', 'ifftshift', 'irfft', 'irfft2', 'irfftn', 'istft', 'rfft', 'rfft2', 'rfftfreq', 'rfftn', 'stft']
_keep = (Any, Sequence, Literal, overload, mx, Dtype, array, scalar, StreamOrDevice)  # names the annotations use


def fft(a: array, n: int | None = None, axis: int = -1, norm: str = 'backward', stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """One dimensional discrete Fourier Transform.

    Awaitable ``mx.fft.fft``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fft1('fft', a, n, axis, norm, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.fft', fft, dict(a=a, n=n, axis=axis, norm=norm, stream=stream), _error) from None


def fft2(a: array, s: tuple[int, ...] | None = None, axes: Sequence[int] | None = [-2, -1], norm: str = 'backward', stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Two dimensional discrete Fourier Transform.

    Awaitable ``mx.fft.fft2``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fftn('fft', 'fft2', a, s, axes, norm, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.fft2', fft2, dict(a=a, s=s, axes=axes, norm=norm, stream=stream), _error) from None


def fftfreq(n: int, d: float = 1.0, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the discrete Fourier Transform sample frequencies.

    Awaitable ``mx.fft.fftfreq``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fftfreq(False, n, d, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.fftfreq', fftfreq, dict(n=n, d=d, stream=stream), _error) from None


def fftn(a: array, s: tuple[int, ...] | None = None, axes: Sequence[int] | None = None, norm: str = 'backward', stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """n-dimensional discrete Fourier Transform.

    Awaitable ``mx.fft.fftn``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fftn('fft', 'fftn', a, s, axes, norm, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.fftn', fftn, dict(a=a, s=s, axes=axes, norm=norm, stream=stream), _error) from None


def fftshift(a: array, axes: int | Sequence[int] | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Shift the zero-frequency component to the center of the spectrum.

    Awaitable ``mx.fft.fftshift``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fftshift(False, a, axes, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.fftshift', fftshift, dict(a=a, axes=axes, stream=stream), _error) from None


def ifft(a: array, n: int | None = None, axis: int = -1, norm: str = 'backward', stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """One dimensional inverse discrete Fourier Transform.

    Awaitable ``mx.fft.ifft``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fft1('ifft', a, n, axis, norm, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.ifft', ifft, dict(a=a, n=n, axis=axis, norm=norm, stream=stream), _error) from None


def ifft2(a: array, s: tuple[int, ...] | None = None, axes: Sequence[int] | None = [-2, -1], norm: str = 'backward', stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Two dimensional inverse discrete Fourier Transform.

    Awaitable ``mx.fft.ifft2``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fftn('ifft', 'ifft2', a, s, axes, norm, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.ifft2', ifft2, dict(a=a, s=s, axes=axes, norm=norm, stream=stream), _error) from None


def ifftn(a: array, s: tuple[int, ...] | None = None, axes: Sequence[int] | None = None, norm: str = 'backward', stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """n-dimensional inverse discrete Fourier Transform.

    Awaitable ``mx.fft.ifftn``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fftn('ifft', 'ifftn', a, s, axes, norm, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.ifftn', ifftn, dict(a=a, s=s, axes=axes, norm=norm, stream=stream), _error) from None


def ifftshift(a: array, axes: int | Sequence[int] | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """The inverse of :func:`fftshift`. While identical to :func:`fftshift` for even-length axes, the
    behavior differs for odd-length axes.

    Awaitable ``mx.fft.ifftshift``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fftshift(True, a, axes, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.ifftshift', ifftshift, dict(a=a, axes=axes, stream=stream), _error) from None


def irfft(a: array, n: int | None = None, axis: int = -1, norm: str = 'backward', stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """The inverse of :func:`rfft`.

    Awaitable ``mx.fft.irfft``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fft1('irfft', a, n, axis, norm, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.irfft', irfft, dict(a=a, n=n, axis=axis, norm=norm, stream=stream), _error) from None


def irfft2(a: array, s: tuple[int, ...] | None = None, axes: Sequence[int] | None = [-2, -1], norm: str = 'backward', stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """The inverse of :func:`rfft2`.

    Awaitable ``mx.fft.irfft2``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fftn('irfft', 'irfft2', a, s, axes, norm, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.irfft2', irfft2, dict(a=a, s=s, axes=axes, norm=norm, stream=stream), _error) from None


def irfftn(a: array, s: tuple[int, ...] | None = None, axes: Sequence[int] | None = None, norm: str = 'backward', stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """The inverse of :func:`rfftn`.

    Awaitable ``mx.fft.irfftn``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fftn('irfft', 'irfftn', a, s, axes, norm, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.irfftn', irfftn, dict(a=a, s=s, axes=axes, norm=norm, stream=stream), _error) from None


def istft(stft_matrix: array, n_fft: int | None = None, hop_length: int | None = None, win_length: int | None = None, window: array | None = None, center: bool = True, norm: str = 'backward', onesided: bool | None = None, length: int | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Inverse Short-Time Fourier Transform.

    Awaitable ``mx.fft.istft``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.istft(stft_matrix, n_fft, hop_length, win_length, window, center, norm, onesided, length, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.istft', istft, dict(stft_matrix=stft_matrix, n_fft=n_fft, hop_length=hop_length, win_length=win_length, window=window, center=center, norm=norm, onesided=onesided, length=length, stream=stream), _error) from None


def rfft(a: array, n: int | None = None, axis: int = -1, norm: str = 'backward', stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """One dimensional discrete Fourier Transform on a real input.

    Awaitable ``mx.fft.rfft``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fft1('rfft', a, n, axis, norm, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.rfft', rfft, dict(a=a, n=n, axis=axis, norm=norm, stream=stream), _error) from None


def rfft2(a: array, s: tuple[int, ...] | None = None, axes: Sequence[int] | None = [-2, -1], norm: str = 'backward', stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Two dimensional real discrete Fourier Transform.

    Awaitable ``mx.fft.rfft2``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fftn('rfft', 'rfft2', a, s, axes, norm, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.rfft2', rfft2, dict(a=a, s=s, axes=axes, norm=norm, stream=stream), _error) from None


def rfftfreq(n: int, d: float = 1.0, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Return the discrete Fourier Transform sample frequencies for use with :func:`rfft` and
    :func:`irfft`.

    Awaitable ``mx.fft.rfftfreq``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fftfreq(True, n, d, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.rfftfreq', rfftfreq, dict(n=n, d=d, stream=stream), _error) from None


def rfftn(a: array, s: tuple[int, ...] | None = None, axes: Sequence[int] | None = None, norm: str = 'backward', stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """n-dimensional real discrete Fourier Transform.

    Awaitable ``mx.fft.rfftn``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.fftn('rfft', 'rfftn', a, s, axes, norm, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.rfftn', rfftn, dict(a=a, s=s, axes=axes, norm=norm, stream=stream), _error) from None


def stft(x: array, n_fft: int = 2048, hop_length: int | None = None, win_length: int | None = None, window: array | None = None, center: bool = True, pad_mode: str = 'reflect', norm: str = 'backward', onesided: bool | None = None, stream: StreamOrDevice = None, *, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Short-Time Fourier Transform.

    Awaitable ``mx.fft.stft``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.stft(x, n_fft, hop_length, win_length, window, center, pad_mode, norm, onesided, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.fft.stft', stft, dict(x=x, n_fft=n_fft, hop_length=hop_length, win_length=win_length, window=window, center=center, pad_mode=pad_mode, norm=norm, onesided=onesided, stream=stream), _error) from None
