"""Arrays against plain mlx.core: inputs, comparisons, and the small graphs traced in several files."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from emlx_async import _interop


def rand(*shape, seed=0):
    """An evaluated normal sample of `shape`, the same for the same seed."""
    x = mx.random.normal(shape, key=mx.random.key(seed))
    mx.eval(x)
    return x


def as_np(x):
    if isinstance(x, (list, tuple)):
        return [as_np(v) for v in x]
    return np.array(x.astype(mx.float32) if x.dtype == mx.bfloat16 else x)


def assert_same(got, want):
    """Bit-equal to mlx's result (an array, or a list or tuple of them), and already evaluated."""
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
        return
    assert _interop.array_state(got).state == _interop.AVAILABLE
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(as_np(got), as_np(want))


class Raised:
    """A call that raised, on either side (mlx raises at the call or at eval, ours at the call or the await)."""

    def __init__(self, exc: BaseException):
        self.exc = exc


def same_outcome(got, want, label: str) -> None:
    """The same as mlx's outcome: equal arrays (dtype, shape, values; lists of them elementwise; other
    values equal), or mlx's exception class with mlx's message (ours may be a subclass: MLXValueError
    is a ValueError)."""
    if isinstance(want, Raised) or isinstance(got, Raised):
        assert isinstance(want, Raised), f"{label}: raised {got.exc!r}, mlx did not"
        assert isinstance(got, Raised), f"{label}: mlx raised {want.exc!r}, this did not"
        assert isinstance(got.exc, type(want.exc)), f"{label}: {type(got.exc)} is not a {type(want.exc)}"
        assert str(got.exc) == str(want.exc), f"{label}: message {str(got.exc)!r} != {str(want.exc)!r}"
        return
    if isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{label}: {type(got)} != {type(want)}"
        for g, w in zip(got, want):
            same_outcome(g, w, label)
        return
    if not isinstance(want, mx.array):  # einsum_path's path and text
        assert got == want, f"{label}: {got!r} != {want!r}"
        return
    assert got.dtype == want.dtype, f"{label}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{label}: shape {got.shape} != {want.shape}"
    np.testing.assert_array_equal(as_np(got), as_np(want), err_msg=label)


def close(got, want):
    """Equal to mlx's result within float tolerance, with its shapes and dtypes."""
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    want = list(want) if isinstance(want, (list, tuple)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-5, atol=1e-6)


async def check(ours, reference):
    """Same result as plain MLX, or the same kind of error with MLX's message."""
    try:
        want = reference()
        mx.eval(want)
    except (ValueError, RuntimeError, TypeError) as exc:
        with pytest.raises(type(exc) if not isinstance(exc, TypeError) else (TypeError, ValueError)) as info:
            await ours()
        assert str(exc).split("]")[0] in str(info.value)
        return
    assert_same(await ours(), want)


# Small graphs to trace and compile.

def matmul_reduce(x, y):
    return (x @ y).sum(axis=1)


def several(x, y):
    z = x @ y
    return z, mx.max(z, axis=0), (z > 0).astype(mx.int32)
