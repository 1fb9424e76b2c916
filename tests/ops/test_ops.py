"""Every native op against plain mlx.core on the same inputs, and its errors."""

from __future__ import annotations

import anyio
import mlx.core as mx
import numpy as np
import pytest

import emlx_async as ea
from emlx_async._op_table import _BINARY, _REDUCE, _UNARY
from support.arrays import assert_same, check
from support.helpers import on_every_loop, wait_all


DTYPES = [mx.float32, mx.float16, mx.bfloat16, mx.int32, mx.bool_]


def sample(dtype, shape=(3, 4), seed=0):
    x = mx.random.normal(shape, key=mx.random.key(seed)) * 2
    if dtype == mx.bool_:
        x = x > 0
    elif dtype == mx.int32:
        x = mx.round(x * 3)
    x = x.astype(dtype)
    mx.eval(x)
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", _UNARY)
@on_every_loop
async def test_unary(rt, name, dtype):
    x = sample(dtype)
    reference = getattr(mx, name, None) or (lambda v: mx.array(v))  # mlx.core has no copy()
    await check(lambda: getattr(ea.ops, name)(x), lambda: reference(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", _BINARY)
@on_every_loop
async def test_binary(rt, name, dtype):
    a, b = sample(dtype, (4, 4), 1), sample(dtype, (4, 4), 2)
    await check(lambda: getattr(ea.ops, name)(a, b), lambda: getattr(mx, name)(a, b))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.int32, mx.bool_])
@pytest.mark.parametrize("name", _REDUCE + ["var", "std"])
@pytest.mark.parametrize("axis, keepdims", [(None, False), (1, True), ((0, 1), False), (-1, False)])
@on_every_loop
async def test_reductions(rt, name, dtype, axis, keepdims):
    x = sample(dtype, (3, 4, 5))
    await check(lambda: getattr(ea.ops, name)(x, axis=axis, keepdims=keepdims),
                lambda: getattr(mx, name)(x, axis=axis, keepdims=keepdims))


X = sample(mx.float32, (3, 4, 5))
M = sample(mx.float32, (4, 4), 3)
IDX = mx.array([[0, 2], [1, 3]])
SPD = M @ M.T + 4 * mx.eye(4)
mx.eval(SPD)

CASES = [
    ("zeros", lambda ops: ops.zeros(shape=(2, 3), dtype=mx.int32), lambda: mx.zeros((2, 3), mx.int32)),
    ("ones", lambda ops: ops.ones(shape=(4,)), lambda: mx.ones((4,))),
    ("full", lambda ops: ops.full((2, 2), mx.array(2.5)), lambda: mx.full((2, 2), mx.array(2.5))),
    ("eye", lambda ops: ops.eye(n=3, m=4, k=1), lambda: mx.eye(3, 4, 1)),
    ("arange", lambda ops: ops.arange(start=1.0, stop=7, step=2), lambda: mx.arange(1.0, 7.0, 2.0)),
    ("linspace", lambda ops: ops.linspace(start=0, stop=1, num=5), lambda: mx.linspace(0, 1, 5)),
    ("tril", lambda ops: ops.tril(M, k=-1), lambda: mx.tril(M, k=-1)),
    ("contiguous", lambda ops: ops.contiguous(M.T), lambda: mx.contiguous(M.T)),
    ("astype", lambda ops: ops.astype(X, mx.float16), lambda: X.astype(mx.float16)),
    ("view", lambda ops: ops.view(X, dtype=mx.int32), lambda: X.view(mx.int32)),
    ("reshape", lambda ops: ops.reshape(X, shape=(12, 5)), lambda: X.reshape(12, 5)),
    ("flatten", lambda ops: ops.flatten(X, start_axis=1), lambda: mx.flatten(X, start_axis=1)),
    ("transpose", lambda ops: ops.transpose(X, axes=(2, 0, 1)), lambda: mx.transpose(X, (2, 0, 1))),
    ("transpose all", lambda ops: ops.transpose(X), lambda: mx.transpose(X)),
    ("swapaxes", lambda ops: ops.swapaxes(X, axis1=0, axis2=2), lambda: mx.swapaxes(X, 0, 2)),
    ("moveaxis", lambda ops: ops.moveaxis(X, source=0, destination=2), lambda: mx.moveaxis(X, 0, 2)),
    ("squeeze", lambda ops: ops.squeeze(X[:1]), lambda: mx.squeeze(X[:1])),
    ("expand_dims", lambda ops: ops.expand_dims(X, axis=(0, 2)), lambda: mx.expand_dims(X, (0, 2))),
    ("broadcast_to", lambda ops: ops.broadcast_to(X[:1], shape=(2, 4, 5)), lambda: mx.broadcast_to(X[:1], (2, 4, 5))),
    ("flip", lambda ops: ops.flip(M, axis=0), lambda: M[::-1]),
    ("tile", lambda ops: ops.tile(M, (2, 1)), lambda: mx.tile(M, (2, 1))),
    ("repeat", lambda ops: ops.repeat(M, repeats=2, axis=1), lambda: mx.repeat(M, 2, axis=1)),
    ("roll", lambda ops: ops.roll(M, 1, 0), lambda: mx.roll(M, 1, axis=0)),
    ("pad", lambda ops: ops.pad(M, pad_width=((1, 0), (0, 2)), constant_values=3.0),
     lambda: mx.pad(M, ((1, 0), (0, 2)), constant_values=3.0)),
    ("pad bytes", lambda ops: ops.pad(M, b"\x01\x02"), lambda: mx.pad(M, (1, 2))),
    ("pad 0-d int array", lambda ops: ops.pad(M, mx.array(1)), lambda: mx.pad(M, 1)),
    ("slice mlx's form", lambda ops: ops.slice(M, mx.array([1, 0]), (0, 1), (2, 3)),
     lambda: mx.slice(M, mx.array([1, 0]), (0, 1), (2, 3))),
    ("slice_update mlx's form", lambda ops: ops.slice_update(M, mx.zeros((2, 2)), mx.array([1, 1]), (0, 1)),
     lambda: mx.slice_update(M, mx.zeros((2, 2)), mx.array([1, 1]), (0, 1))),
    ("concatenate", lambda ops: ops.concatenate([M, M * 2], axis=1), lambda: mx.concatenate([M, M * 2], axis=1)),
    ("stack", lambda ops: ops.stack([M, M], axis=0), lambda: mx.stack([M, M])),
    ("split", lambda ops: ops.split(X, (1, 3), axis=1), lambda: mx.split(X, [1, 3], axis=1)),
    ("split sections", lambda ops: ops.split(M, 2), lambda: mx.split(M, 2)),
    ("slice", lambda ops: ops.slice(X, start=(0, 1, 0), stop=(2, 3, 5)), lambda: X[0:2, 1:3, 0:5]),
    ("slice_update", lambda ops: ops.slice_update(M, mx.zeros((2, 2)), start=(1, 1), stop=(3, 3)),
     lambda: _slice_update_reference()),
    ("where", lambda ops: ops.where(M > 0, M, -M), lambda: mx.where(M > 0, M, -M)),
    ("clip", lambda ops: ops.clip(M, mx.array(-0.5), mx.array(0.5)), lambda: mx.clip(M, -0.5, 0.5)),
    ("round", lambda ops: ops.round(M, decimals=1), lambda: mx.round(M, 1)),
    ("isclose", lambda ops: ops.isclose(M, M + 1e-6), lambda: mx.isclose(M, M + 1e-6)),
    ("allclose", lambda ops: ops.allclose(M, M * 1.01, rtol=0.1), lambda: mx.allclose(M, M * 1.01, rtol=0.1)),
    ("argmax", lambda ops: ops.argmax(X, axis=1, keepdims=True), lambda: mx.argmax(X, axis=1, keepdims=True)),
    ("argmin all", lambda ops: ops.argmin(X), lambda: mx.argmin(X)),
    ("cumsum", lambda ops: ops.cumsum(X, axis=2, reverse=True), lambda: mx.cumsum(X, axis=2, reverse=True)),
    ("cumprod", lambda ops: ops.cumprod(M, axis=0, inclusive=False), lambda: mx.cumprod(M, axis=0, inclusive=False)),
    ("cummax", lambda ops: ops.cummax(M, axis=1), lambda: mx.cummax(M, axis=1)),
    ("cummin", lambda ops: ops.cummin(M), lambda: mx.cummin(M)),
    ("softmax", lambda ops: ops.softmax(X, axis=-1), lambda: mx.softmax(X, axis=-1)),
    ("sort", lambda ops: ops.sort(X, axis=1), lambda: mx.sort(X, axis=1)),
    ("argsort", lambda ops: ops.argsort(X), lambda: mx.argsort(X)),
    ("topk", lambda ops: ops.topk(M, k=2), lambda: mx.topk(M, 2)),
    ("take", lambda ops: ops.take(M, IDX, axis=1), lambda: mx.take(M, IDX, axis=1)),
    ("take flat", lambda ops: ops.take(M, IDX), lambda: mx.take(M, IDX)),
    ("take_along_axis", lambda ops: ops.take_along_axis(M, IDX, axis=1), lambda: mx.take_along_axis(M, IDX, axis=1)),
    ("put_along_axis", lambda ops: ops.put_along_axis(M, IDX, mx.zeros((2, 2)), axis=1),
     lambda: mx.put_along_axis(M, IDX, mx.zeros((2, 2)), axis=1)),
    ("tensordot", lambda ops: ops.tensordot(M, M, axes=1), lambda: mx.tensordot(M, M, axes=1)),
    ("einsum", lambda ops: ops.einsum("ij,jk->ik", M, M), lambda: mx.einsum("ij,jk->ik", M, M)),
    ("addmm", lambda ops: ops.addmm(M, M, M, alpha=0.5, beta=2.0), lambda: mx.addmm(M, M, M, alpha=0.5, beta=2.0)),
    ("conv_general", lambda ops: ops.conv_general(X, mx.ones((2, 3, 5)), stride=1, padding=1),
     lambda: mx.conv_general(X, mx.ones((2, 3, 5)), stride=1, padding=1)),
    ("scatter_add", lambda ops: ops.scatter_add(mx.zeros((4,)), mx.array([0, 0, 3]), mx.ones((3, 1)), axes=(0,)),
     lambda: mx.zeros((4,)).at[mx.array([0, 0, 3])].add(mx.ones(3))),
    ("linalg.inv", lambda ops: ea.linalg.inv(SPD), lambda: mx.linalg.inv(SPD, stream=mx.cpu)),
    ("linalg.cholesky", lambda ops: ea.linalg.cholesky(SPD), lambda: mx.linalg.cholesky(SPD, stream=mx.cpu)),
    ("linalg.qr", lambda ops: ea.linalg.qr(M), lambda: mx.linalg.qr(M, stream=mx.cpu)),
    ("linalg.svd", lambda ops: ea.linalg.svd(M), lambda: mx.linalg.svd(M, stream=mx.cpu)),
    ("linalg.lu", lambda ops: ea.linalg.lu(M), lambda: mx.linalg.lu(M, stream=mx.cpu)),
    ("linalg.eigh", lambda ops: ea.linalg.eigh(SPD), lambda: mx.linalg.eigh(SPD, stream=mx.cpu)),
    ("linalg.pinv", lambda ops: ea.linalg.pinv(M), lambda: mx.linalg.pinv(M, stream=mx.cpu)),
    ("linalg.solve", lambda ops: ea.linalg.solve(SPD, M), lambda: mx.linalg.solve(SPD, M, stream=mx.cpu)),
    ("linalg.solve_triangular", lambda ops: ea.linalg.solve_triangular(mx.tril(SPD), M),
     lambda: mx.linalg.solve_triangular(mx.tril(SPD), M, stream=mx.cpu)),
    ("linalg.tri_inv", lambda ops: ea.linalg.tri_inv(mx.tril(SPD)), lambda: mx.linalg.tri_inv(mx.tril(SPD), stream=mx.cpu)),
    ("linalg.norm", lambda ops: ea.linalg.norm(M), lambda: mx.linalg.norm(M)),
    ("fft.fft", lambda ops: ea.fft.fft(M), lambda: mx.fft.fft(M, stream=mx.cpu)),
    ("fft.ifft", lambda ops: ea.fft.ifft(M, axis=0), lambda: mx.fft.ifft(M, axis=0, stream=mx.cpu)),
    ("fft.fft2", lambda ops: ea.fft.fft2(M), lambda: mx.fft.fft2(M, stream=mx.cpu)),
    ("fft.ifft2", lambda ops: ea.fft.ifft2(M), lambda: mx.fft.ifft2(M, stream=mx.cpu)),
    ("fft.rfft", lambda ops: ea.fft.rfft(M), lambda: mx.fft.rfft(M, stream=mx.cpu)),
]


def _slice_update_reference():
    out = mx.array(M)
    out[1:3, 1:3] = mx.zeros((2, 2))
    return out


@pytest.mark.parametrize("label, ours, reference", CASES, ids=[c[0] for c in CASES])
@on_every_loop
async def test_ops_with_options(rt, label, ours, reference):
    await check(lambda: ours(ea.ops), reference)


B, H, T, D = 2, 4, 6, 8
Q = sample(mx.float32, (B, H, T, D), 5)
K = sample(mx.float32, (B, 2, T, D), 6)  # grouped-query: 2 kv heads
V = sample(mx.float32, (B, 2, T, D), 7)
W = sample(mx.float32, (D,), 8)

FAST = [
    ("rms_norm", lambda: ea.fast.rms_norm(Q, W, eps=1e-5), lambda: mx.fast.rms_norm(Q, W, eps=1e-5)),
    ("rms_norm no weight", lambda: ea.fast.rms_norm(Q, None), lambda: mx.fast.rms_norm(Q, None, eps=1e-5)),
    ("layer_norm", lambda: ea.fast.layer_norm(Q, W, W, eps=1e-5), lambda: mx.fast.layer_norm(Q, W, W, eps=1e-5)),
    ("layer_norm no bias", lambda: ea.fast.layer_norm(Q, W, None), lambda: mx.fast.layer_norm(Q, W, None, eps=1e-5)),
    ("rope", lambda: ea.fast.rope(Q, D, traditional=False, base=10000.0, scale=1.0, offset=3),
     lambda: mx.fast.rope(Q, D, traditional=False, base=10000.0, scale=1.0, offset=3)),
    ("rope traditional", lambda: ea.fast.rope(Q, D, traditional=True, base=500.0, scale=0.5, offset=0),
     lambda: mx.fast.rope(Q, D, traditional=True, base=500.0, scale=0.5, offset=0)),
    ("rope per-batch offsets", lambda: ea.fast.rope(Q, D, traditional=False, base=10000.0, scale=1.0,
                                                    offset=mx.array([0, 5])),
     lambda: mx.fast.rope(Q, D, traditional=False, base=10000.0, scale=1.0, offset=mx.array([0, 5]))),
    ("rope freqs", lambda: ea.fast.rope(Q, D, traditional=False, base=None, scale=1.0, offset=2,
                                        freqs=mx.arange(1, D // 2 + 1, dtype=mx.float32)),
     lambda: mx.fast.rope(Q, D, traditional=False, base=None, scale=1.0, offset=2,
                          freqs=mx.arange(1, D // 2 + 1, dtype=mx.float32))),
    ("rope freqs, a numpy offset", lambda: ea.fast.rope(Q, D, traditional=False, base=None, scale=1.0,
                                                        offset=np.int64(2), freqs=mx.arange(1, D // 2 + 1, dtype=mx.float32)),
     lambda: mx.fast.rope(Q, D, traditional=False, base=None, scale=1.0, offset=np.int64(2),
                          freqs=mx.arange(1, D // 2 + 1, dtype=mx.float32))),
    ("rope BTHD layout", lambda: ea.fast.rope(Q.swapaxes(1, 2), D, traditional=False, base=10000.0, scale=1.0,
                                              offset=1, layout="BTHD"),
     lambda: mx.fast.rope(Q, D, traditional=False, base=10000.0, scale=1.0, offset=1).swapaxes(1, 2)),
    ("sdpa", lambda: ea.fast.scaled_dot_product_attention(Q, K, V, scale=0.3),
     lambda: mx.fast.scaled_dot_product_attention(Q, K, V, scale=0.3)),
    ("sdpa causal", lambda: ea.fast.scaled_dot_product_attention(Q, K, V, scale=0.3, mask="causal"),
     lambda: mx.fast.scaled_dot_product_attention(Q, K, V, scale=0.3, mask="causal")),
    ("sdpa additive mask", lambda: ea.fast.scaled_dot_product_attention(Q, K, V, scale=0.3, mask=mx.zeros((T, T))),
     lambda: mx.fast.scaled_dot_product_attention(Q, K, V, scale=0.3, mask=mx.zeros((T, T)))),
    ("sdpa bool mask", lambda: ea.fast.scaled_dot_product_attention(Q, K, V, scale=0.3, mask=mx.tri(T, T) > 0),
     lambda: mx.fast.scaled_dot_product_attention(Q, K, V, scale=0.3, mask=mx.tri(T, T) > 0)),
    ("sdpa sinks", lambda: ea.fast.scaled_dot_product_attention(Q, K, V, scale=0.3, sinks=mx.zeros((H,))),
     lambda: mx.fast.scaled_dot_product_attention(Q, K, V, scale=0.3, sinks=mx.zeros((H,)))),
]


@pytest.mark.parametrize("label, ours, reference", FAST, ids=[c[0] for c in FAST])
@on_every_loop
async def test_fast_kernels(rt, label, ours, reference):
    await check(ours, reference)


@pytest.mark.parametrize("mode, group_size, bits", [("affine", 64, 4), ("affine", 32, 8), ("mxfp4", 32, 4),
                                                     ("mxfp8", 32, 8), ("nvfp4", 16, 4)])
@on_every_loop
async def test_quantize_round_trip_and_matmul(rt, mode, group_size, bits):
    w = sample(mx.float32, (32, 128), 9)
    x = sample(mx.float32, (4, 128), 10)
    try:
        want = mx.quantize(w, group_size=group_size, bits=bits, mode=mode)
        mx.eval(want)
    except (ValueError, RuntimeError) as exc:
        pytest.skip(f"MLX has no {mode} on this backend: {exc}")
    got = await ea.ops.quantize(w, group_size=group_size, bits=bits, mode=mode)
    assert_same(got, tuple(want))
    back = await ea.ops.dequantize(*got, group_size=group_size, bits=bits, mode=mode)
    assert_same(back, mx.dequantize(*want, group_size=group_size, bits=bits, mode=mode))
    scale = float(mx.abs(w).max())
    assert float(mx.abs(back - w).max()) < scale * (0.2 if bits == 4 else 0.05)
    product = await ea.ops.quantized_matmul(x, *got, transpose=True, group_size=group_size, bits=bits, mode=mode)
    assert_same(product, mx.quantized_matmul(x, *want, transpose=True, group_size=group_size, bits=bits, mode=mode))


@on_every_loop
async def test_quantization_modes_pin_group_size_and_bits(rt):
    # mlx checks the mode and its pinned sizes itself (its messages: test_mlx_conformance.py)
    with pytest.raises(ValueError, match=r"^\[quantize\] mxfp4 quantization requires group size 32 but got 64\.$"):
        await ea.ops.quantize(mx.ones((4, 64)), group_size=64, bits=4, mode="mxfp4")
    with pytest.raises(ValueError, match=r"^\[quantize\] Invalid quantization mode 'int3'\.$"):
        await ea.ops.quantize(mx.ones((4, 64)), mode="int3")
    # except quantized_matmul's, which mlx takes (nvfp4 with group size 32): refused after mlx's own checks
    x, w, scales = mx.ones((2, 64)), mx.zeros((64, 8), mx.uint32), mx.zeros((64, 2), mx.uint8)
    with pytest.raises(ValueError, match="mode 'nvfp4' needs group_size=16 and bits=4"):
        await ea.ops.quantized_matmul(x, w, scales, group_size=32, mode="nvfp4")
    with pytest.raises(ValueError, match="mode 'nvfp4' needs group_size=16 and bits=4"):
        await ea.ops.gather_qmm(x, w[None], scales[None], rhs_indices=mx.array([0]), group_size=32, mode="nvfp4")


@on_every_loop
async def test_errors_are_clear_and_the_queue_keeps_working(rt):
    with pytest.raises(ea.MLXValueError, match=r"^\[matmul\] Last dimension"):
        await ea.ops.matmul(mx.ones((2, 3)), mx.ones((2, 3)))
    with pytest.raises(IndexError, match=r"Invalid axis 5 for array with 2 dimensions"):
        await ea.ops.sum(mx.ones((2, 3)), axis=5)
    with pytest.raises(ValueError, match=r"\[reshape\]"):
        await ea.ops.reshape(mx.ones((2, 3)), shape=(4, 4))
    with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'b'"):
        ea.ops.add(mx.ones(2))
    with pytest.raises(TypeError, match=r"\[add\] takes 2 array argument\(s\), got 1"):
        ea.ops.submit("add", [mx.ones(2)])
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'axes'"):
        ea.ops.sum(mx.ones(2), axes=0)
    with pytest.raises(TypeError) as theirs:  # a type mlx's binding refuses: mlx's own message
        mx.astype(mx.ones(2), "float32")
    with pytest.raises(TypeError) as ours:
        ea.ops.astype(mx.ones(2), "float32")
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(TypeError, match=r"\[astype\] option 'dtype' must be an mlx dtype"):
        ea.ops.submit("astype", [mx.ones(2)], dtype="float32")  # the table's own message, below the mlx names
    with pytest.raises(TypeError, match=r"\[astype\] the option 'dtype' is required"):
        ea.ops.submit("astype", [mx.ones(2)])
    assert (await ea.ops.add(mx.ones(2), 1)).tolist() == [2.0, 2.0]


@on_every_loop
async def test_check_finite_flag(rt):
    with pytest.raises(ea.MLXRuntimeError, match="non-finite"):
        await ea.ops.log(mx.array([-1.0, 1.0]), check_finite=True)
    assert (await ea.ops.log(mx.array([1.0]), check_finite=True)).item() == 0.0
    assert np.isnan((await ea.ops.log(mx.array([-1.0]))).item())  # off by default
    assert ea.ops.set_check_finite(True) is False
    try:
        with pytest.raises(ea.MLXRuntimeError, match="non-finite"):
            await ea.fast.rms_norm(mx.array([[float("nan"), 1.0]]))
        assert np.isnan((await ea.ops.log(mx.array([-1.0]), check_finite=False)).item())  # per call wins
    finally:
        assert ea.ops.set_check_finite(False) is True


@on_every_loop
async def test_lazy_chains_fuse_on_their_queue_and_cross_queues(rt):
    q1, q2 = await rt.acquire_queue(), await rt.acquire_queue()
    try:
        a = await ea.ops.add(M, 1.0, queue=q1, lazy=True)
        assert rt.queue_of(a) is q1
        b = await ea.ops.multiply(a, a, lazy=True)  # routed to a's owner
        assert rt.queue_of(b) is q1
        c = await ea.ops.sum(b, axis=0, queue=q2)  # crosses: evaluated on q1 first
        assert_same(c, mx.sum((M + 1) * (M + 1), axis=0))
    finally:
        rt.release_queue(q1)
        rt.release_queue(q2)


@on_every_loop
async def test_pipelining_256_ops_in_flight_in_order(rt):
    q = rt.default_queue()
    futures = [ea.ops.add(M, float(i), queue=q) for i in range(256)]
    assert q.pending > 1
    finished: list[int] = []
    for i, future in enumerate(futures):
        future.add_done_callback(lambda _f, i=i: finished.append(i))
    results = await wait_all(*futures)
    await anyio.sleep(0)  # asyncio runs done-callbacks one loop iteration after the result is set
    assert finished == list(range(256))  # one worker, one FIFO: they ran and completed in order
    for i, r in enumerate(results):
        assert_same(r, M + float(i))




def reference_kv_step(q, k, v, k_cache, v_cache, offset, scale, key_mask=None):
    """The same step written with plain MLX ops."""
    T = k.shape[1]
    k_cache = mx.array(k_cache)
    v_cache = mx.array(v_cache)
    k_cache[:, offset:offset + T] = k
    v_cache[:, offset:offset + T] = v
    length = offset + T
    keys = k_cache[:, :length].transpose(0, 2, 1, 3)
    values = v_cache[:, :length].transpose(0, 2, 1, 3)
    causal = mx.arange(length)[None, :] <= mx.arange(offset, length)[:, None]
    mask = causal[None, None]
    if key_mask is not None:
        mask = mask & key_mask[:, None, None, :length]
    out = mx.fast.scaled_dot_product_attention(q.transpose(0, 2, 1, 3), keys, values, scale=scale, mask=mask)
    return out.transpose(0, 2, 1, 3), k_cache, v_cache


@pytest.mark.parametrize("donate", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@on_every_loop
async def test_kv_cache_attention_over_a_multi_step_decode(rt, donate, masked):
    Bt, Tmax, Hq, Hkv, Dh = 2, 12, 4, 2, 8
    k_cache, v_cache = mx.zeros((Bt, Tmax, Hkv, Dh)), mx.zeros((Bt, Tmax, Hkv, Dh))
    ref_k, ref_v = mx.array(k_cache), mx.array(v_cache)
    key_mask = mx.array([[True] * Tmax, [False] + [True] * (Tmax - 1)]) if masked else None
    mx.eval(k_cache, v_cache, ref_k, ref_v)
    offset, step_lengths = 0, [5, 1, 1, 1, 2]  # a prompt, then decode steps
    for i, T in enumerate(step_lengths):
        q = sample(mx.float32, (Bt, T, Hq, Dh), 20 + i)
        k = sample(mx.float32, (Bt, T, Hkv, Dh), 40 + i)
        v = sample(mx.float32, (Bt, T, Hkv, Dh), 60 + i)
        want, ref_k, ref_v = reference_kv_step(q, k, v, ref_k, ref_v, offset, 0.35, key_mask)
        mx.eval(want, ref_k, ref_v)
        if donate:
            out = await ea.attention.kv_cache_attention(q, k, v, k_cache, v_cache, offset=offset, scale=0.35,
                                                        key_mask=key_mask, donate=True)
        else:
            out, k_cache, v_cache = await ea.attention.kv_cache_attention(
                q, k, v, k_cache, v_cache, offset=offset, scale=0.35, key_mask=key_mask)
        np.testing.assert_allclose(np.array(out), np.array(want), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.array(k_cache), np.array(ref_k))
        np.testing.assert_array_equal(np.array(v_cache), np.array(ref_v))
        offset += T


@on_every_loop
async def test_kv_cache_attention_rejects_overflow(rt):
    cache = mx.zeros((1, 4, 1, 8))
    x = mx.ones((1, 2, 1, 8))
    with pytest.raises(ValueError, match=r"offset 3 \+ 2 new positions exceed the cache length 4"):
        await ea.attention.kv_cache_attention(x, x, x, cache, cache, offset=3, scale=1.0)


@on_every_loop
async def test_bounds_checks_are_opt_in(rt):
    a = mx.arange(8).reshape(2, 4)
    bad = mx.array([0, 4])
    assert ea.ops.set_bounds_checks(True) is False
    try:
        with pytest.raises(ea.MLXIndexError, match=r"\[take\] index 4 is out of bounds for an axis of size 4"):
            await ea.ops.take(a, bad, axis=1)
        with pytest.raises(ea.MLXIndexError, match=r"\[take_along_axis\] index -5"):
            await ea.ops.take_along_axis(a, mx.array([[0, -5]]), axis=1)
        with pytest.raises(ea.MLXIndexError, match=r"\[scatter_add\] index 2"):
            await ea.ops.scatter_add(mx.zeros((2,)), mx.array([2]), mx.ones((1, 1)), axes=(0,))
        good = await ea.ops.take(a, mx.array([0, 3, -1]), axis=1)
        assert good.tolist() == [[0, 3, 3], [4, 7, 7]]
    finally:
        assert ea.ops.set_bounds_checks(False) is True
    await ea.ops.take(a, bad, axis=1)  # unchecked: MLX's own behaviour, no error raised


def reference_window_scatter(operand, source, window, strides, padding, take_max):
    x = np.array(operand, dtype=np.float64)
    fill = -np.inf if take_max else np.inf
    padded = np.pad(x, padding, constant_values=fill)
    out = np.zeros(padded.shape)
    src = np.array(source)
    for index in np.ndindex(*src.shape):
        corner = [i * s for i, s in zip(index, strides)]
        region = padded[tuple(slice(c, c + w) for c, w in zip(corner, window))]
        k = np.argmax(region) if take_max else np.argmin(region)
        local = np.unravel_index(k, region.shape)
        out[tuple(c + l for c, l in zip(corner, local))] += src[index]
    return out[tuple(slice(lo, lo + n) for (lo, _), n in zip(padding, x.shape))]


@pytest.mark.parametrize("take_max", [True, False])
@pytest.mark.parametrize("window, strides, padding", [((2, 2), (2, 2), ((0, 0), (0, 0))),
                                                      ((3, 3), (1, 1), ((1, 1), (1, 1))),
                                                      ((2, 3), (1, 2), ((0, 1), (1, 0)))])
@on_every_loop
async def test_window_scatter_against_a_reference(rt, take_max, window, strides, padding):
    operand = sample(mx.float32, (6, 7), 30)
    out_shape = tuple((n + lo + hi - w) // s + 1 for n, (lo, hi), w, s in zip(operand.shape, padding, window, strides))
    source = sample(mx.float32, out_shape, 31)
    fn = ea.ops.window_scatter_max if take_max else ea.ops.window_scatter_min
    got = await fn(operand, source, window=window, strides=strides, padding=padding)
    want = reference_window_scatter(operand, source, window, strides, padding, take_max)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-6, atol=1e-6)


@on_every_loop
async def test_window_scatter_rejects_mismatched_source(rt):
    with pytest.raises(ValueError, match=r"\[window_scatter_max\] source must have the windows' shape"):
        await ea.ops.window_scatter_max(mx.ones((4, 4)), mx.ones((3, 3)), window=(2, 2))


@on_every_loop
async def test_swiglu(rt):
    import mlx.nn as nn

    gate, up = sample(mx.float32, (3, 8), 50), sample(mx.float32, (3, 8), 51)
    np.testing.assert_allclose(np.array(await ea.fast.swiglu(gate, up)), np.array(nn.silu(gate) * up),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims", [D, D // 2])
@on_every_loop
async def test_rope_with_per_token_positions(rt, traditional, dims):
    positions = mx.array([[0, 3, 4, 9, 10, 11], [5, 5, 2, 0, 1, 7]])
    got = await ea.fast.rope(Q, dims, traditional=traditional, base=10000.0, scale=0.5, offset=positions)
    want = mx.concatenate([
        mx.concatenate([mx.fast.rope(Q[b:b + 1, :, t:t + 1], dims, traditional=traditional, base=10000.0,
                                     scale=0.5, offset=positions[b, t].item()) for t in range(T)], axis=2)
        for b in range(B)], axis=0)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)


@on_every_loop
async def test_sdpa_causal_with_key_padding_mask(rt):
    key_mask = mx.array([[True] * T, [False, False] + [True] * (T - 2)])
    got = await ea.fast.scaled_dot_product_attention(Q, K, V, scale=0.3, mask="causal", key_mask=key_mask)
    causal = mx.arange(T)[None, :] <= mx.arange(T)[:, None]
    want = mx.fast.scaled_dot_product_attention(Q, K, V, scale=0.3, mask=causal[None, None] & key_mask[:, None, None])
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="key_mask goes with mask='causal'"):
        ea.fast.scaled_dot_product_attention(Q, K, V, scale=0.3, key_mask=key_mask)


@on_every_loop
async def test_device_promotion_runs_on_a_queue_of_that_device(rt):
    q1 = await rt.acquire_queue()
    try:
        lazy = await ea.ops.add(M, 1.0, queue=q1, lazy=True)
        out = await ea.ops.multiply(lazy, 2.0, device="cpu")  # not q1: the cpu default queue
        assert_same(out, (M + 1) * 2)
        lazy = await ea.ops.add(M, 1.0, queue=q1, lazy=True)
        promoted = await ea.ops.multiply(lazy, 2.0, device="cpu", lazy=True)
        assert rt.queue_of(promoted) is rt.default_queue("cpu")  # it ran there, not on the input's owner
        assert rt.queue_of(promoted) is not q1
        assert_same(await ea.eval(promoted), (M + 1) * 2)
        if not mx.is_available(mx.gpu):
            with pytest.raises(ea.DeviceUnavailable):
                ea.ops.multiply(M, 2.0, device="gpu")
    finally:
        rt.release_queue(q1)
