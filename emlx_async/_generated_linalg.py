"""``mx.linalg`` with mlx's own signatures, as awaitables. GENERATED, do not edit.

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

__all__ = ['cholesky', 'cholesky_inv', 'cross', 'det', 'eig', 'eigh', 'eigvals', 'eigvalsh', 'inv', 'lu', 'lu_factor', 'norm', 'pinv', 'qr', 'slogdet', 'solve', 'solve_triangular', 'svd', 'tri_inv']
_keep = (Any, Sequence, Literal, overload, mx, Dtype, array, scalar, StreamOrDevice)  # names the annotations use


def cholesky(a: array, upper: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the Cholesky decomposition of a real symmetric positive semi-definite matrix.

    Awaitable ``mx.linalg.cholesky``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_cholesky', [a], _rt, upper=upper)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.cholesky', cholesky, dict(a=a, upper=upper, stream=stream), _error) from None


def cholesky_inv(a: array, upper: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the inverse of a real symmetric positive semi-definite matrix using it's Cholesky
    decomposition.

    Awaitable ``mx.linalg.cholesky_inv``, built and run natively on a queue: returns a JobFuture.
    Also takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_cholesky_inv', [a], _rt, upper=upper)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.cholesky_inv', cholesky_inv, dict(a=a, upper=upper, stream=stream), _error) from None


def cross(a: array, b: array, axis: int = -1, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the cross product of two arrays along a specified axis.

    Awaitable ``mx.linalg.cross``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_cross', [a, b], _rt, axis=axis)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.cross', cross, dict(a=a, b=b, axis=axis, stream=stream), _error) from None


def det(a: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the determinant of a square matrix.

    Awaitable ``mx.linalg.det``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_det', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.det', det, dict(a=a, stream=stream), _error) from None


def eig(a: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[tuple[array, array]]:
    """Compute the eigenvalues and eigenvectors of a square matrix.

    Awaitable ``mx.linalg.eig``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_eig', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.eig', eig, dict(a=a, stream=stream), _error) from None


def eigh(a: array, UPLO: str = 'L', *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[tuple[array, array]]:
    """Compute the eigenvalues and eigenvectors of a complex Hermitian or real symmetric matrix.

    Awaitable ``mx.linalg.eigh``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_eigh', [a], _rt, UPLO=UPLO)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.eigh', eigh, dict(a=a, UPLO=UPLO, stream=stream), _error) from None


def eigvals(a: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the eigenvalues of a square matrix.

    Awaitable ``mx.linalg.eigvals``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_eigvals', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.eigvals', eigvals, dict(a=a, stream=stream), _error) from None


def eigvalsh(a: array, UPLO: str = 'L', *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the eigenvalues of a complex Hermitian or real symmetric matrix.

    Awaitable ``mx.linalg.eigvalsh``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_eigvalsh', [a], _rt, UPLO=UPLO)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.eigvalsh', eigvalsh, dict(a=a, UPLO=UPLO, stream=stream), _error) from None


def inv(a: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the inverse of a square matrix.

    Awaitable ``mx.linalg.inv``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_inv', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.inv', inv, dict(a=a, stream=stream), _error) from None


def lu(a: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[tuple[array, array, array]]:
    """Compute the LU factorization of the given matrix ``A``.

    Awaitable ``mx.linalg.lu``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_lu', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.lu', lu, dict(a=a, stream=stream), _error) from None


def lu_factor(a: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[tuple[array, array]]:
    """Computes a compact representation of the LU factorization.

    Awaitable ``mx.linalg.lu_factor``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_lu_factor', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.lu_factor', lu_factor, dict(a=a, stream=stream), _error) from None


def norm(a: array, /, ord: None | int | float | str = None, axis: None | int | list[int] = None, keepdims: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Matrix or vector norm.

    Awaitable ``mx.linalg.norm``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.norm(a, ord, axis, keepdims, _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.norm', norm, dict(a=a, ord=ord, axis=axis, keepdims=keepdims, stream=stream), _error) from None


def pinv(a: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the (Moore-Penrose) pseudo-inverse of a matrix.

    Awaitable ``mx.linalg.pinv``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_pinv', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.pinv', pinv, dict(a=a, stream=stream), _error) from None


def qr(a: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[tuple[array, array]]:
    """The QR factorization of the input matrix.

    Awaitable ``mx.linalg.qr``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_qr', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.qr', qr, dict(a=a, stream=stream), _error) from None


def slogdet(a: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[tuple[array, array]]:
    """Compute the sign and natural log of the absolute value of the determinant of a square matrix.

    Awaitable ``mx.linalg.slogdet``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_slogdet', [a], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.slogdet', slogdet, dict(a=a, stream=stream), _error) from None


def solve(a: array, b: array, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the solution to a system of linear equations ``AX = B``.

    Awaitable ``mx.linalg.solve``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_solve', [a, b], _rt)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.solve', solve, dict(a=a, b=b, stream=stream), _error) from None


def solve_triangular(a: array, b: array, *, upper: bool = False, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Computes the solution of a triangular system of linear equations ``AX = B``.

    Awaitable ``mx.linalg.solve_triangular``, built and run natively on a queue: returns a
    JobFuture. Also takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_solve_triangular', [a, b], _rt, upper=upper)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.solve_triangular', solve_triangular, dict(a=a, b=b, upper=upper, stream=stream), _error) from None


def svd(a: array, compute_uv: bool = True, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[tuple[array, array, array] | array]:
    """The Singular Value Decomposition (SVD) of the input matrix.

    Awaitable ``mx.linalg.svd``, built and run natively on a queue: returns a JobFuture. Also takes
    ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops);
    ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_svd', [a], _rt, compute_uv=compute_uv)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.svd', svd, dict(a=a, compute_uv=compute_uv, stream=stream), _error) from None


def tri_inv(a: array, upper: bool = False, *, stream: StreamOrDevice = None, queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, nowait: bool = False, check_finite: bool | None = None) -> JobFuture[array]:
    """Compute the inverse of a triangular square matrix.

    Awaitable ``mx.linalg.tri_inv``, built and run natively on a queue: returns a JobFuture. Also
    takes ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see
    emlx_async.ops); ``stream=`` picks a queue of that stream's device.
    """
    try:
        _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)
        return _ad.op('linalg_tri_inv', [a], _rt, upper=upper)
    except _ad.OptionTypeError as _error:
        raise _ad.mlx_type_error('mx.linalg.tri_inv', tri_inv, dict(a=a, upper=upper, stream=stream), _error) from None
