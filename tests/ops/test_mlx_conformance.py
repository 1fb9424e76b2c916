"""mlx.core's behaviour to the last dtype and message, modelled on MLX's own tests.

Each case runs as plain mlx and through ``ea.ops`` and must agree: the same
dtype, shape and values, or an instance of mlx's exception class with mlx's
message. The grids cover mlx's weak typing of Python scalars and NumPy
values (python/src/utils.cpp: to_arrays), roll's overloads (test_roll),
arange's overload resolution (test_arange_overload_dispatch) and the
messages of calls mlx refuses.
"""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np
import pytest

import emlx_async as ea
from emlx_async._op_table import WEAK_PAIRS
from support.arrays import Raised, same_outcome
from support.helpers import on_loops

async_test = on_loops("asyncio")

DTYPES = [mx.bool_, mx.uint8, mx.uint32, mx.uint64, mx.int8, mx.int16, mx.int32, mx.int64, mx.float16,
          mx.bfloat16, mx.float32, mx.complex64]
# Python scalars of each kind, values past a small type's range, and NumPy values (weak too)
SCALARS = [True, False, 2, -1, 300, 2**40, 2.5, 1e10, 1 + 2j, np.float64(1.5), np.int64(3), np.bool_(True),
           np.array([1.5, 2.0]), np.array([3, 4], dtype=np.int16)]
INT_DIVISION = {"divmod", "floor_divide", "remainder"}


def _outcome(call):
    try:
        value = call()
        mx.eval(value)
        return value
    except Exception as exc:  # noqa: BLE001 - an error is the expected outcome of some calls
        return Raised(exc)


async def _agree(cases: list[tuple[str, object]]) -> int:
    """Run each `call(namespace)` with mx and with ea (all submitted before the first await); compare."""
    wants = [_outcome(lambda call=call: call(mx)) for _, call in cases]
    futures = []
    for _, call in cases:
        try:
            futures.append(call(ea))
        except Exception as exc:  # noqa: BLE001 - compared with mlx's below
            futures.append(Raised(exc))
    failures = []
    for (label, _), future, want in zip(cases, futures, wants):
        try:
            got = future if isinstance(future, Raised) else await future
        except Exception as exc:  # noqa: BLE001 - compared with mlx's
            got = Raised(exc)
        try:
            same_outcome(got, want, label)
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, f"{len(failures)} of {len(cases)} differ from mlx:\n" + "\n".join(failures[:40])
    return len(cases)


def _ops(namespace):
    return namespace if namespace is mx else namespace.ops


def _operand(dtype) -> mx.array:
    # no zero: an integer division by zero is undefined in mlx (its divmod kernel traps)
    values = mx.array([True, True]) if dtype == mx.bool_ else mx.array([1, 2], dtype=dtype)
    mx.eval(values)
    return values


def _wraps_to_zero(dtype, scalar) -> bool:
    """An int a bool operand turns into int32 wraps; past 32 bits it may wrap to a zero divisor."""
    return type(scalar) is int and scalar >= 2**32


@async_test
async def test_python_scalars_are_weakly_typed_as_in_mlx(rt):
    """Every op mlx weak-types, on a grid of dtypes x scalar kinds, the scalar on either side."""
    cases = []
    for name, pairs in WEAK_PAIRS.items():
        if name in ("where", "clip"):
            continue
        assert pairs == ((0, 1),), name
        for dtype in DTYPES:
            a = _operand(dtype)
            for scalar in SCALARS:
                if name in INT_DIVISION and (_wraps_to_zero(dtype, scalar) or scalar is False):
                    continue
                label = f"{name}({dtype}, {scalar!r})"
                cases.append((label, lambda m, f=name, a=a, b=scalar: getattr(_ops(m), f)(a, b)))
                cases.append((label + " swapped", lambda m, f=name, a=a, b=scalar: getattr(_ops(m), f)(b, a)))
    assert await _agree(cases) > 5000


@async_test
async def test_where_and_clip_weakly_type_like_mlx(rt):
    condition = mx.array([True, False])
    mx.eval(condition)
    cases = []
    for dtype in DTYPES:
        a = _operand(dtype)
        for scalar in SCALARS:
            label = f"({dtype}, {scalar!r})"
            cases += [
                ("where x" + label, lambda m, a=a, b=scalar: _ops(m).where(condition, a, b)),
                ("where y" + label, lambda m, a=a, b=scalar: _ops(m).where(condition, b, a)),
                ("where scalar condition" + label, lambda m, a=a, b=scalar: _ops(m).where(True, a, b)),
                ("clip min" + label, lambda m, a=a, b=scalar: _ops(m).clip(a, b, None)),
                ("clip max" + label, lambda m, a=a, b=scalar: _ops(m).clip(a, None, b)),
            ]
    cases += [("where two scalars", lambda m: _ops(m).where(condition, 2, 2.5)),
              ("add two scalars", lambda m: _ops(m).add(2, 2.5)),
              ("add a list", lambda m: _ops(m).add(mx.array([1]), [1.5]))]
    await _agree(cases)


@async_test
async def test_the_issues_examples(rt):
    b = mx.array([True, False])
    assert (await ea.ops.add(b, 2)).tolist() == [3, 2]
    assert (await ea.ops.add(b, 2)).dtype == mx.int32
    assert (await ea.ops.divide(b, 2)).tolist() == [0.5, 0.0]
    assert (await ea.ops.equal(b, 2)).tolist() == [False, False]
    assert (await ea.ops.add(mx.array([1, 2]), 2.5)).dtype == mx.float32
    assert (await ea.ops.add(mx.array([1.0], dtype=mx.float16), 2.0)).dtype == mx.float16


@async_test
async def test_fill_values_are_typed_by_the_dtype_as_in_mlx(rt):
    """full, full_like and pad convert their value with the dtype as its hint (mlx's to_array)."""
    cases = []
    for dtype in DTYPES:
        a = _operand(dtype)
        for scalar in [True, 1, 300, -1, 2.5, 1 + 2j]:
            label = f"({dtype}, {scalar!r})"
            cases += [
                ("full" + label, lambda m, d=dtype, v=scalar: _ops(m).full((2,), v, dtype=d)),
                ("full no dtype" + label, lambda m, v=scalar: _ops(m).full((2,), v)),
                ("full_like" + label, lambda m, a=a, v=scalar: _ops(m).full_like(a, v)),
                ("pad" + label, lambda m, a=a, v=scalar: _ops(m).pad(a, 1, constant_values=v)),
            ]
    await _agree(cases)


@async_test
async def test_roll_like_mlx(rt):
    """mlx's test_roll: every shift form with every axis form, a tuple of shifts with one axis included."""
    x = mx.arange(60).reshape(3, 4, 5)
    mx.eval(x)
    cases = []
    for shift in [0, 1, -2, 7, (1,), (1, 1), (2, -1), (1, 2, 3)]:
        for axis in [None, 0, 1, -1, (0,), (0, 1), (2, 0), (0, 1, 2)]:
            cases.append((f"roll({shift}, {axis})", lambda m, s=shift, a=axis: _ops(m).roll(x, s, a)))
    await _agree(cases)
    # the issue's case: mlx adds the shifts along the one axis
    assert (await ea.ops.roll(x, (1, 1), 0)).tolist() == mx.roll(x, 2, 0).tolist()


@async_test
async def test_arange_resolves_mlx_overloads(rt):
    """mlx's test_arange_overload_dispatch, and the calls neither overload takes."""
    calls = {
        "stop": lambda m: _ops(m).arange(5), "start stop": lambda m: _ops(m).arange(1, 5),
        "stop step": lambda m: _ops(m).arange(-3, step=-1), "start None step": lambda m: _ops(m).arange(-3, None, -1),
        "keywords": lambda m: _ops(m).arange(stop=2, step=0.5), "start= stop=": lambda m: _ops(m).arange(start=1, stop=3),
        "dtype": lambda m: _ops(m).arange(0, 5, 1, mx.float16), "dtype kw": lambda m: _ops(m).arange(3, dtype=mx.int8),
        "nan": lambda m: _ops(m).arange(float("nan"), 1, 5), "inf step": lambda m: _ops(m).arange(0, float("inf"), float("inf")),
        "past int32": lambda m: _ops(m).arange(0, 2**40),
        "start= step=": lambda m: _ops(m).arange(start=1, step=2), "nothing": lambda m: _ops(m).arange(),
        "None": lambda m: _ops(m).arange(None), "dtype positional": lambda m: _ops(m).arange(3, mx.float16),
        "stop twice": lambda m: _ops(m).arange(1, 5, stop=3), "a string": lambda m: _ops(m).arange("3"),
    }
    await _agree(list(calls.items()))
    with pytest.raises(TypeError, match=r"arange\(\): incompatible function arguments"):
        ea.ops.arange(start=1, step=2)


@async_test
async def test_bad_calls_raise_mlxs_class_and_message(rt):
    x = mx.arange(6).reshape(2, 3)
    flat = mx.ones((6,))
    idx = mx.array([[0, 1, 0]])
    mx.eval(x, flat, idx)
    fft = {"fft": lambda m: m.fft.fft(flat, norm="invalid"), "rfft2": lambda m: m.fft.rfft2(x, norm="bad"),
           "ifftn": lambda m: m.fft.ifftn(x, norm="bad"), "stft": lambda m: m.fft.stft(flat, n_fft=4, norm="bad")}
    calls = {
        "take_along_axis axis": lambda m: _ops(m).take_along_axis(x, idx, 5),
        "take_along_axis negative axis": lambda m: _ops(m).take_along_axis(x, idx, -3),
        "put_along_axis axis": lambda m: _ops(m).put_along_axis(x, idx, idx, 5),
        "take axis": lambda m: _ops(m).take(x, idx, 2),
        "split 0": lambda m: _ops(m).split(x, 0), "split -1": lambda m: _ops(m).split(x, -1),
        "zeros 2**31": lambda m: _ops(m).zeros((2**31,)), "ones 2**31": lambda m: _ops(m).ones((2**31, 1)),
        "full 2**31": lambda m: _ops(m).full((2**31,), 1.0),
        "broadcast_to 2**31": lambda m: _ops(m).broadcast_to(x, (2**31, 3)),
        "as_strided negative": lambda m: _ops(m).as_strided(x, (-1, 2), (1, 1)),
        "reshape array": lambda m: _ops(m).reshape(flat, mx.array([4, 2])),
        "reshape 2-d array": lambda m: _ops(m).reshape(flat, mx.array([[3, 2]])),
        "reshape float array": lambda m: _ops(m).reshape(flat, mx.array([3.0, 2.0])),
        "topk array k": lambda m: _ops(m).topk(flat, mx.array(9)),
        "topk 1-d array k": lambda m: _ops(m).topk(flat, mx.array([2])),
        "topk float k": lambda m: _ops(m).topk(flat, 2.0),
        "overflowing scalar": lambda m: _ops(m).add(mx.array([1], dtype=mx.int8), 300),
        "roll too few shifts": lambda m: _ops(m).roll(x, (1,), (0, 1)),
        "divmod complex": lambda m: _ops(m).divmod(x, 1 + 2j),
        "astype None": lambda m: _ops(m).astype(x, None), "view None": lambda m: _ops(m).view(x, None),
        "expand_dims None": lambda m: _ops(m).expand_dims(x, None),
        "astype a string": lambda m: _ops(m).astype(x, "float32"),
        **{f"{name} norm": call for name, call in fft.items()},
    }
    await _agree(list(calls.items()))


@async_test
async def test_pad_width_takes_mlxs_forms_only(rt):
    """mlx's test_pad: an int, (n,), [n], (before, after), [(before, after)] or one pair per axis.

    Anything else is mlx's binding's TypeError (a pair of three, a (1,) among pairs, a float); a
    count of pairs neither one nor ndim is mlx's ValueError; both with mlx's messages.
    """
    a = mx.zeros((1, 1, 1))
    x = mx.ones((2, 3))
    mx.eval(a, x)
    forms = [1, (1,), [1], (1, 2), [(1, 2)], ((1, 2),), ((1, 2), (2, 1), (2, 2)), [[1, 2], [0, 1], [2, 0]],
             (True, 1), np.array([1, 2]),
             # nanobind's tuple caster takes bytes (a bytearray too) and a 0-d int array as an int
             b"\x01\x02", bytearray(b"\x01"), [b"\x01\x02"], mx.array(1), np.array(1), (mx.array(1), 2),
             mx.array([1, 2]), np.int64(2), range(1, 3)]
    refused = [(1, 2, 3), [(1,)], [(1, 2), (3,)], [(1, 2, 3), (1, 1), (0, 0)], [], [(1, 1)] * 2, [(1, 1)] * 4,
               1.5, "x", None, [(1.5, 1), (1, 1), (1, 1)], [1, (1, 1)],
               # a 0-d array of a float or bool (no iter()), a dict (no sequence: not its keys), a set,
               # an iterator, an int past int32 (mlx's int caster refuses it: no overflow error)
               mx.array(1.5), mx.array(True), np.array(1.5), np.float64(1.0), np.bool_(True), (mx.array(True), 1),
               mx.array([1.5, 2.5]), {1: 2}, {0: 1, 1: 1, 2: 0}, [{1: 2}, (1, 1), (1, 1)], {1, 2}, iter([1, 2]),
               2**40, (0, 2**31), [(0, 2**31)], [(0, -2**31 - 1), (0, 0), (0, 0)], np.int64(2**40)]
    cases = [(f"pad {pw!r}", lambda m, pw=pw: _ops(m).pad(a, pw)) for pw in forms + refused]
    cases += [(f"pad edge {pw!r}", lambda m, pw=pw: _ops(m).pad(x, pw, mode="edge")) for pw in [[(1, 1)] * 3, 1.5, [(1,)]]]
    await _agree(cases)
    assert (await ea.ops.pad(a, ((1, 2), (2, 1), (2, 2)))).shape == (4, 4, 5)


@async_test
async def test_sequence_options_of_other_types_get_mlxs_type_error(rt):
    """A shape, axes or strides that is no sequence of ints: mlx's binding's TypeError, its message."""
    x = mx.ones((2, 3))
    mx.eval(x)
    calls = {
        "random.normal shape='x'": lambda m: m.random.normal(shape="x", key=mx.random.key(0)),
        "random.uniform shape=(1.5,)": lambda m: m.random.uniform(shape=(1.5,), key=mx.random.key(0)),
        "random.randint shape=2": lambda m: m.random.randint(0, 3, shape=2, key=mx.random.key(0)),
        "random.gumbel shape=None": lambda m: m.random.gumbel(shape=None, key=mx.random.key(0)),
        "fft.fftn axes=('a',)": lambda m: m.fft.fftn(x, axes=("a",)),
        "tensordot axes=(['a'], [0])": lambda m: _ops(m).tensordot(x, x, axes=(["a"], [0])),
        # an int of numpy's or mx's is an int; an int for a side, None or a str is refused; not two lists
        "tensordot axes=np.int64(0)": lambda m: _ops(m).tensordot(x, x, axes=np.int64(0)),
        "tensordot axes=mx.array(1)": lambda m: _ops(m).tensordot(x, x.T, axes=mx.array(1)),
        "tensordot axes=([1], 0)": lambda m: _ops(m).tensordot(x, x.T, axes=([1], 0)),
        "tensordot axes=(2, 3)": lambda m: _ops(m).tensordot(x, x, axes=(2, 3)),
        "tensordot axes=None": lambda m: _ops(m).tensordot(x, x, axes=None),
        "tensordot axes=[]": lambda m: _ops(m).tensordot(x, x, axes=[]),
        "tensordot axes=three lists": lambda m: _ops(m).tensordot(x, x, axes=[[0], [0], [1]]),
        "as_strided strides=1.5": lambda m: _ops(m).as_strided(x, shape=(2,), strides=1.5),
        "as_strided offset=-1": lambda m: _ops(m).as_strided(x, shape=(2,), strides=(1,), offset=-1),
        "clip None None": lambda m: _ops(m).clip(x, None, None),
        # nanobind's list caster: no dict (its keys), no bytes (a bytearray is a sequence of ints), no set
        "random.normal shape=dict": lambda m: m.random.normal({2: 3}, key=mx.random.key(0)),
        "random.normal shape=bytes": lambda m: m.random.normal(b"\x02", key=mx.random.key(0)),
        "random.normal shape=bytearray": lambda m: m.random.normal(bytearray(b"\x02"), key=mx.random.key(0)),
        "random.normal shape=set": lambda m: m.random.normal({2}, key=mx.random.key(0)),
        "random.normal shape=mx.array": lambda m: m.random.normal(mx.array([2, 1]), key=mx.random.key(0)),
        "random.uniform shape=dict": lambda m: m.random.uniform(shape={2: 3}, key=mx.random.key(0)),
        "random.randint shape=dict": lambda m: m.random.randint(0, 3, {2: 1}, key=mx.random.key(0)),
        "random.bernoulli shape=dict": lambda m: m.random.bernoulli(0.5, {2: 1}, key=mx.random.key(0)),
        "random.gumbel shape=bytes": lambda m: m.random.gumbel(b"\x02", key=mx.random.key(0)),
        "random.truncated_normal shape=dict": lambda m: m.random.truncated_normal(0, 1, {2: 1}, key=mx.random.key(0)),
        "random.categorical shape=dict": lambda m: m.random.categorical(x, shape={2: 1}, key=mx.random.key(0)),
        "as_strided shape=dict": lambda m: _ops(m).as_strided(x, {2: 1}, (1,)),
        "as_strided strides=dict": lambda m: _ops(m).as_strided(x, (2,), {1: 1}),
        "as_strided shape=bytes": lambda m: _ops(m).as_strided(x, b"\x02", (1,)),
        "as_strided strides=bytes": lambda m: _ops(m).as_strided(x, (2,), b"\x01"),
        "as_strided shape=iterator": lambda m: _ops(m).as_strided(x, iter([2]), (1,)),
        "as_strided shape=np": lambda m: _ops(m).as_strided(x, np.array([2]), (1,)),
        # slice/slice_update in mlx's form (their static start=/stop= form is ours): mlx's message
        "slice slice_size=2": lambda m: _ops(m).slice(x, mx.array([0]), (1,), 2),
        "slice axes=2": lambda m: _ops(m).slice(x, mx.array([0]), 2, (1,)),
        "slice slice_size=(2.0,)": lambda m: _ops(m).slice(x, mx.array([0]), (1,), (2.0,)),
        "slice keywords": lambda m: _ops(m).slice(x, mx.array([0]), axes=(1,), slice_size=(2.0,)),
        "slice start_indices list": lambda m: _ops(m).slice(x, [0], (1,), (2,)),
        "slice good": lambda m: _ops(m).slice(x, mx.array([1]), (1,), (2,)),
        "slice_update axes=1": lambda m: _ops(m).slice_update(x, x[:1, :2], mx.array([0]), 1),
        "slice_update axes=(1.0,)": lambda m: _ops(m).slice_update(x, x[:1, :2], mx.array([0]), (1.0,)),
        "slice_update good": lambda m: _ops(m).slice_update(x, x[:1, :2], mx.array([1, 1]), (0, 1)),
    }
    await _agree(list(calls.items()))
    with pytest.raises(ea.OptionTypeError, match=r"^\[slice\] option 'start'"):  # the static form: our words
        ea.ops.slice(x, start="x", stop=(1, 3))


@async_test
async def test_fast_takes_what_mlxs_binding_takes(rt):
    """mx.fast's `array` parameters take an mx.array only (no Python scalar, NumPy array or list):
    mlx's TypeError, its message; rope's base and freqs are checked in mlx's words."""
    x = mx.ones((2, 4))
    w = mx.ones((4,))
    q = mx.ones((1, 2, 3, 4))
    mx.eval(x, w, q)
    n = np.ones((4,), np.float32)
    calls = {
        "rms_norm weight=1.0": lambda m: m.fast.rms_norm(x, 1.0, 1e-5),
        "rms_norm weight=1": lambda m: m.fast.rms_norm(x, 1, 1e-5),
        "rms_norm weight numpy": lambda m: m.fast.rms_norm(x, n, 1e-5),
        "rms_norm x list, None": lambda m: m.fast.rms_norm([1.0, 2.0], None),
        "rms_norm x list": lambda m: m.fast.rms_norm([1.0, 2.0], w),
        "rms_norm x numpy": lambda m: m.fast.rms_norm(np.ones((2, 4), np.float32), None),
        "rms_norm x numpy, weight": lambda m: m.fast.rms_norm(np.ones((2, 4), np.float32), w),
        "rms_norm good": lambda m: m.fast.rms_norm(x, w, 1e-5),
        "rms_norm good None": lambda m: m.fast.rms_norm(x, None, 1e-5),
        "layer_norm weight=1.0": lambda m: m.fast.layer_norm(x, 1.0, None, 1e-5),
        "layer_norm bias=1.0": lambda m: m.fast.layer_norm(x, w, 1.0, 1e-5),
        "layer_norm weight numpy": lambda m: m.fast.layer_norm(x, n, None, 1e-5),
        "layer_norm bias numpy": lambda m: m.fast.layer_norm(x, w, n, 1e-5),
        "layer_norm x list": lambda m: m.fast.layer_norm([1.0, 2.0], None, None, 1e-5),
        "layer_norm good": lambda m: m.fast.layer_norm(x, w, w, 1e-5),
        "sdpa sinks=0.0": lambda m: m.fast.scaled_dot_product_attention(q, q, q, scale=1.0, sinks=0.0),
        "sdpa sinks numpy": lambda m: m.fast.scaled_dot_product_attention(q, q, q, scale=1.0,
                                                                          sinks=np.zeros(2, np.float32)),
        "sdpa q numpy": lambda m: m.fast.scaled_dot_product_attention(np.ones((1, 2, 3, 4), np.float32), q, q,
                                                                      scale=1.0),
        "sdpa v 1.0": lambda m: m.fast.scaled_dot_product_attention(q, q, 1.0, scale=1.0),
        "sdpa good sinks": lambda m: m.fast.scaled_dot_product_attention(q, q, q, scale=1.0, sinks=mx.zeros((2,))),
        "rope a numpy": lambda m: m.fast.rope(np.ones((1, 2, 3, 4), np.float32), 4, traditional=False, base=1e4,
                                              scale=1.0, offset=0),
        "rope freqs numpy": lambda m: m.fast.rope(q, 4, traditional=False, base=None, scale=1.0, offset=0,
                                                  freqs=np.ones(2, np.float32)),
        "rope no base, no freqs": lambda m: m.fast.rope(q, 4, traditional=False, base=None, scale=1.0, offset=0),
        "rope no base, no freqs, offset=True": lambda m: m.fast.rope(q, 4, traditional=False, base=None, scale=1.0,
                                                                     offset=True),
        "rope base and freqs": lambda m: m.fast.rope(q, 4, traditional=False, base=1e4, scale=1.0, offset=0,
                                                     freqs=mx.ones((2,))),
        "rope good freqs": lambda m: m.fast.rope(q, 4, traditional=False, base=None, scale=1.0, offset=0,
                                                 freqs=mx.ones((2,))),
    }
    await _agree(list(calls.items()))


@async_test
async def test_refused_arguments_are_listed_as_the_caller_passed_them(rt):
    """nanobind's "Invoked with types" lists positional arguments, then `kwargs = { ... }` in the
    caller's order: mlx's message for the very call made, positional or by keyword."""
    x = mx.ones((2, 3))
    w = mx.ones((3,))
    q = mx.ones((1, 1, 2, 4))
    mx.eval(x, w, q)
    calls = {
        "sum axis positional": lambda m: _ops(m).sum(x, "x"),
        "sum axis keyword": lambda m: _ops(m).sum(x, axis="x"),
        "sum keywords reordered": lambda m: _ops(m).sum(x, keepdims=1, axis=0),
        "sum None positional": lambda m: _ops(m).sum(x, None, "x"),
        "zeros dtype positional": lambda m: _ops(m).zeros((2,), "x"),
        "nan_to_num positional": lambda m: _ops(m).nan_to_num(x, "x"),
        "pad mode positional": lambda m: _ops(m).pad(x, 1.5, "edge"),
        "pad by keyword": lambda m: _ops(m).pad(x, pad_width=1.5, mode="edge"),
        "as_strided positional": lambda m: _ops(m).as_strided(x, (2,), (1,), -1),
        "add stream positional": lambda m: _ops(m).add(x, x, x),
        "bernoulli p positional": lambda m: m.random.bernoulli(0.5, key="x"),
        "normal shape positional": lambda m: m.random.normal("x"),
        "fft.fft n positional": lambda m: m.fft.fft(x, "x"),
        "linalg.norm ord positional": lambda m: m.linalg.norm(x, 2, "x"),
        "fast.layer_norm eps positional": lambda m: m.fast.layer_norm(x, None, None, "x"),
        "fast.layer_norm eps keyword": lambda m: m.fast.layer_norm(x, w, None, eps="x"),
        "fast.rms_norm weight": lambda m: m.fast.rms_norm(x, "w", 1e-5),
        "fast.rms_norm eps None": lambda m: m.fast.rms_norm(x, w, eps=None),
        "fast.rope dims 'x'": lambda m: m.fast.rope(q, "x", traditional=False, base=1e4, scale=1.0, offset=0),
        "fast.rope traditional=1": lambda m: m.fast.rope(q, 4, traditional=1, base=1e4, scale=1.0, offset=0),
        "fast.rope base 'x'": lambda m: m.fast.rope(q, 4, traditional=False, base="x", scale=1.0, offset=0),
        "fast.rope offset=True": lambda m: m.fast.rope(q, 4, traditional=False, base=1e4, scale=1.0, offset=True),
        "fast sdpa scale 'x'": lambda m: m.fast.scaled_dot_product_attention(q, q, q, scale="x"),
        "fast sdpa mask=1": lambda m: m.fast.scaled_dot_product_attention(q, q, q, scale=1.0, mask=1),
        "fast sdpa sinks 'x'": lambda m: m.fast.scaled_dot_product_attention(q, q, q, scale=1.0, sinks="x"),
        # and the call's own words where mlx's binding refuses a value
        "fast sdpa mask 'bad'": lambda m: m.fast.scaled_dot_product_attention(q, q, q, scale=1.0, mask="bad"),
        "fast sdpa mask ''": lambda m: m.fast.scaled_dot_product_attention(q, q, q, scale=1.0, mask=""),
    }
    await _agree(list(calls.items()))
    # called through *args / **kwargs the call is not read: options are listed by keyword
    args, kwargs = (x,), {"axis": "x"}
    with pytest.raises(TypeError, match=r"Invoked with types: mlx.core.array, kwargs = \{ axis: str \}$"):
        ea.ops.sum(*args, **kwargs)
    # called from C (functools.partial, map): the caller's bytecode is not the op's call; mlx's message still
    for call in (lambda: functools.partial(ea.ops.sum, axis="x")(x), lambda: functools.partial(ea.ops.sum, x)("x"),
                 lambda: list(map(ea.ops.sum, [x], ["x"]))):
        with pytest.raises(TypeError, match=r"^sum\(\): incompatible function arguments"):
            call()


@async_test
async def test_an_invalid_axis_gets_mlxs_message_with_bounds_checks_on(rt):
    """The check of an invalid axis is left to the op itself, which refuses it with mlx's message."""
    x = mx.arange(6).reshape(2, 3)
    idx = mx.array([[0, 1, 0]])
    mx.eval(x, idx)
    previous = ea.ops.set_bounds_checks(True)
    try:
        await _agree([
            ("take_along_axis", lambda m: _ops(m).take_along_axis(x, idx, 5)),
            ("put_along_axis", lambda m: _ops(m).put_along_axis(x, idx, idx, -3)),
            ("take", lambda m: _ops(m).take(x, idx, 2)),
        ])
        with pytest.raises(ea.MLXIndexError, match=r"\[take_along_axis\] index 7"):  # a valid axis is checked
            await ea.ops.take_along_axis(x, mx.array([[0, 7, 0]]), 1)
    finally:
        ea.ops.set_bounds_checks(previous)


@async_test
async def test_campaign_calls_get_mlxs_outcome(rt):
    """Calls from routing MLX's own tests through ea.ops: mlx's result, or mlx's class and message.

    Each was checked on plain mlx first: none of them crashes it, so mlx's own checks answer them.
    """
    a = mx.array([1.0, -2.0])
    x1, w1 = mx.ones((1, 9, 4)), mx.ones((2, 3, 4))
    x2, w2 = mx.ones((1, 6, 6, 4)), mx.ones((2, 3, 3, 4))
    x3, w3 = mx.ones((1, 6, 6, 6, 4)), mx.ones((2, 3, 3, 3, 4))
    w64, w32 = mx.ones((64, 64)), mx.ones((64, 32))
    wq, sq, bq = mx.quantize(w64, 64, 4)
    xq = mx.ones((10, 64))
    u32, u8 = mx.zeros((64, 8), mx.uint32), mx.zeros((64, 2), mx.uint8)
    mx.eval(a, x1, w1, x2, w2, x3, w3, w64, w32, wq, sq, bq, xq, u32, u8)
    quantization = {  # mlx checks modes and pinned sizes itself (D2), and quantized_matmul's shapes (D3)
        "quantize mode xyz": lambda m: _ops(m).quantize(w64, mode="xyz"),
        "quantize mxfp4 bits=3": lambda m: _ops(m).quantize(w32, bits=3, mode="mxfp4"),
        "quantize mxfp4 group_size=64": lambda m: _ops(m).quantize(w32, group_size=64, mode="mxfp4"),
        "quantize nvfp4 group_size=32": lambda m: _ops(m).quantize(w64, group_size=32, mode="nvfp4"),
        "quantize mxfp8 bits=4": lambda m: _ops(m).quantize(w64, bits=4, mode="mxfp8"),
        "dequantize nvfp4 group_size=32": lambda m: _ops(m).dequantize(mx.zeros((64, 2), mx.uint32),
                                                                       mx.zeros((64, 1), mx.uint8), group_size=32,
                                                                       mode="nvfp4"),
        "dequantize mode xyz": lambda m: _ops(m).dequantize(wq, sq, bq, mode="xyz"),
        "quantized_matmul mode xyz": lambda m: _ops(m).quantized_matmul(xq, wq, sq, bq, mode="xyz"),
        "quantized_matmul mxfp4 bits=3": lambda m: _ops(m).quantized_matmul(xq, u32, u8, bits=3, mode="mxfp4"),
        "quantized_matmul mxfp4": lambda m: _ops(m).quantized_matmul(xq, u32, u8, mode="mxfp4"),
        "quantized_matmul scales (32,8)": lambda m: _ops(m).quantized_matmul(
            mx.ones((10, 256)), mx.zeros((64, 32), mx.uint32), mx.ones((32, 8)), mx.ones((32, 8))),
        "quantized_matmul scales and biases differ": lambda m: _ops(m).quantized_matmul(
            mx.ones((10, 256)), mx.zeros((64, 32), mx.uint32), mx.ones((8, 32)), mx.ones((32, 8))),
        "gather_qmm mode xyz": lambda m: _ops(m).gather_qmm(xq, wq[None], sq[None], bq[None],
                                                            rhs_indices=mx.array([0]), mode="xyz"),
    }
    shapes = {  # a bare int past int32 gets mlx's message for that form (D4)
        "zeros 2**31": lambda m: _ops(m).zeros(2**31), "ones 2**31": lambda m: _ops(m).ones(2**31),
        "full 2**31": lambda m: _ops(m).full(2**31, 0.0), "zeros -1": lambda m: _ops(m).zeros(-1),
    }
    conv = {  # the forms mlx's bindings take (D5), conv_general's own length checks (D6), negative groups (D7)
        "conv1d stride=(1,)": lambda m: _ops(m).conv1d(x1, w1, stride=(1,)),
        "conv_transpose1d output_padding=(0,)": lambda m: _ops(m).conv_transpose1d(x1, w1, output_padding=(0,)),
        "conv2d stride=(1,1,1)": lambda m: _ops(m).conv2d(x2, w2, stride=(1, 1, 1)),
        "conv2d stride=1.5": lambda m: _ops(m).conv2d(x2, w2, stride=1.5),
        "conv2d padding=None": lambda m: _ops(m).conv2d(x2, w2, padding=None),
        "conv2d list input": lambda m: _ops(m).conv2d(x2.tolist(), w2),
        "conv2d stride=[2,1]": lambda m: _ops(m).conv2d(x2, w2, stride=[2, 1]),
        "conv2d stride=True": lambda m: _ops(m).conv2d(x2, w2, stride=True),
        "conv2d stride=(np.int64,1)": lambda m: _ops(m).conv2d(x2, w2, stride=(np.int64(2), 1)),
        # nanobind's casters take any sequence: NumPy and mx arrays as well.
        "conv2d stride=np.array": lambda m: _ops(m).conv2d(x2, w2, stride=np.array([2, 1])),
        "conv2d padding=mx.array": lambda m: _ops(m).conv2d(x2, w2, padding=mx.array([1, 0])),
        "conv_transpose2d stride=np.array": lambda m: _ops(m).conv_transpose2d(x2, w2, stride=np.array([1, 1])),
        "conv3d stride=(1,1)": lambda m: _ops(m).conv3d(x3, w3, stride=(1, 1)),
        "conv_general stride=[1,1] 1-D": lambda m: _ops(m).conv_general(x1, w1, stride=[1, 1]),
        "conv_general padding=(1,2) 1-D": lambda m: _ops(m).conv_general(x1, w1, padding=(1, 2)),
        "conv_general padding=([1],[2]) 2-D": lambda m: _ops(m).conv_general(x2, w2, padding=([1], [2])),
        "conv_general stride=[] 2-D": lambda m: _ops(m).conv_general(x2, w2, stride=[]),
        "conv_general kernel_dilation=[2] 2-D": lambda m: _ops(m).conv_general(x2, w2, kernel_dilation=[2]),
        "conv_general input_dilation=[1,1,1] 2-D": lambda m: _ops(m).conv_general(x2, w2, input_dilation=[1, 1, 1]),
        "conv_general stride=1.5": lambda m: _ops(m).conv_general(x2, w2, stride=1.5),
        "conv_general padding=None": lambda m: _ops(m).conv_general(x2, w2, padding=None),
        "conv1d groups=-1": lambda m: _ops(m).conv1d(x1, w1, groups=-1),
        "conv_general groups=-1": lambda m: _ops(m).conv_general(x2, w2, groups=-1),
        "conv_transpose2d groups=-2": lambda m: _ops(m).conv_transpose2d(x2, w2, groups=-2),
        "conv3d groups=-1": lambda m: _ops(m).conv3d(x3, w3, groups=-1),
    }
    options = {  # bool options take only bools (D8); stream= only a stream or device (D9)
        "conv_general flip=1": lambda m: _ops(m).conv_general(x1, w1, flip=1),
        "sum keepdims=1": lambda m: _ops(m).sum(a, keepdims=1),
        "sum keepdims=np.bool_": lambda m: _ops(m).sum(a, keepdims=np.bool_(True)),
        "sum keepdims=None": lambda m: _ops(m).sum(a, keepdims=None),
        "cumsum reverse='yes'": lambda m: _ops(m).cumsum(a, reverse="yes"),
        "add stream=array": lambda m: _ops(m).add(a, a, stream=a),
        "sum stream=array": lambda m: _ops(m).sum(a, stream=a),
        "sum stream='x'": lambda m: _ops(m).sum(a, stream="x"),
        "add stream=mx.cpu": lambda m: _ops(m).add(a, a, stream=mx.cpu),
    }
    inputs = {  # mlx 0.32 makes no array of a list (D10); unconvertible values (N1)
        "abs list": lambda m: _ops(m).abs([1, -2]), "abs tuple": lambda m: _ops(m).abs((1, -2)),
        "maximum list": lambda m: _ops(m).maximum([1.0, 2.0], 0),
        "where list": lambda m: _ops(m).where([True, False], a, 1),
        "matmul lists": lambda m: _ops(m).matmul([[1.0]], [[2.0]]),
        "reshape list": lambda m: _ops(m).reshape([1, 2], (2,)),
        "take list indices": lambda m: _ops(m).take(a, [0]),
        "take int index": lambda m: _ops(m).take(a, 1),
        "concatenate lists": lambda m: _ops(m).concatenate([[1], [2]]),
        "stack lists": lambda m: _ops(m).stack([[1], [2]]),
        "clip list": lambda m: _ops(m).clip([1.0, 2.0], 0, 1),
        "add object ndarray": lambda m: _ops(m).add(np.array([1, 2], dtype=object), 1),
        "add str ndarray": lambda m: _ops(m).add(np.array(["a"]), 1),
        # 0-d ones and numpy scalars of such dtypes (they gave std::bad_cast)
        "add 0-d str ndarray": lambda m: _ops(m).add(np.array("abc"), 1),
        "add 0-d bytes ndarray": lambda m: _ops(m).add(np.array(b"ab"), 1),
        "add 0-d object ndarray of an object": lambda m: _ops(m).add(np.array(object()), 1),
        "add np.str_": lambda m: _ops(m).add(np.str_("x"), 1), "abs np.str_": lambda m: _ops(m).abs(np.str_("x")),
        "add np.void": lambda m: _ops(m).add(np.void(b"ab"), 1),
        "add None": lambda m: _ops(m).add(None, 1), "abs None": lambda m: _ops(m).abs(None),
        "add a string": lambda m: _ops(m).add("x", 1), "abs a string": lambda m: _ops(m).abs("x"),
        "concatenate nothing": lambda m: _ops(m).concatenate([]),
        "concatenate nothing flat": lambda m: _ops(m).concatenate([], axis=None),
        "stack nothing": lambda m: _ops(m).stack([]),
    }
    await _agree([*quantization.items(), *shapes.items(), *conv.items(), *options.items(), *inputs.items()])
    # Where mlx has no answer of its own: it dies on a datetime64 or timedelta64 scalar (SIGSEGV),
    # also when asked for its TypeError; it makes a complex64 of a 0-d object array holding a number.
    for value in (np.datetime64("2020-01-01"), np.timedelta64(3)):
        for call in (lambda: ea.ops.add(value, 1), lambda: ea.ops.matmul(value, a), lambda: ea.ops.take(a, value)):
            with pytest.raises(ea.InvalidInputType, match=rf"^Invalid type {type(value).__name__} received in"):
                await call()
    with pytest.raises(ea.InvalidInputType, match=r"^Invalid type ndarray received in array initialization"):
        await ea.ops.add(np.array(3, dtype=object), 1)
    # mlx fails on NumPy's other byte order (std::bad_cast): its values are read
    swapped = np.array([1.5, -2.0], dtype=">f4")
    assert (await ea.ops.add(swapped, 1)).tolist() == [2.5, -1.0]
    assert (await ea.ops.multiply(mx.array([2.0, 2.0]), swapped)).tolist() == [3.0, -4.0]
    # a third positional of add is mlx's stream: mlx's TypeError (its message shows the value as a keyword)
    with pytest.raises(TypeError, match=r"^add\(\): incompatible function arguments"):
        ea.ops.add(a, a, a)
