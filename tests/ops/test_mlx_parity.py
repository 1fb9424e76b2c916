"""mlx.core parity: every op called the way mlx is called, both ways, and its signature.

CALLS holds at least one representative mlx-style call per op (positional
options, as mlx allows them); each runs as plain mlx and as
``await ea.<namespace>.<op>`` and must give the same values, dtypes, shapes
and containers (list or tuple, as mlx returns them; multi-output ops are also
called with a single input and with none). Calls that plain mlx refuses (bad
input, or ops MLX's CPU backend does not run, such as qqmm) must raise an
instance of mlx's exception class with mlx's message. The signature test
holds every generated function to mlx's own (names, order, kinds, defaults),
with the exceptions listed in SIGNATURE_EXCEPTIONS.
"""

from __future__ import annotations

import inspect
import re
import runpy

import mlx.core as mx
import pytest

import emlx_async as ea
from emlx_async import _generated_ops
from emlx_async._op_table import _BINARY, _REDUCE, _UNARY
from emlx_async._op_table import ANSWERED_AT_CALL as _SPEC_AT_CALL
from support import ROOT
from support.arrays import Raised, same_outcome
from support.helpers import on_every_loop, on_loops

async_test = on_loops("asyncio")

GEN = runpy.run_path(str(ROOT / "tools" / "gen_api.py"))

k = mx.random.key(7)
X = mx.random.normal((3, 4, 5), key=k)
M = mx.random.normal((4, 4), key=mx.random.key(1))
P = mx.abs(M) + 1.5  # positive, > 1
U = mx.random.uniform(shape=(4, 4), key=mx.random.key(2)) * 0.9  # in (0, 0.9)
I = mx.array([[3, 1, 2], [0, 5, 4]], dtype=mx.int32)
IDX = mx.array([[0, 2], [1, 3]])
SPD = M @ M.T + 4 * mx.eye(4)
Q = mx.random.normal((2, 4, 6, 8), key=mx.random.key(3))
W = mx.random.normal((32, 64), key=mx.random.key(4))
mx.eval(X, M, P, U, I, IDX, SPD, Q, W)

_UNARY_INPUTS = {"arccosh": P, "arcsin": U, "arccos": U, "arctanh": U, "erfinv": U, "log": P, "log2": P,
                 "log10": P, "log1p": P, "sqrt": P, "rsqrt": P, "bitwise_invert": I, "logical_not": M > 0}
_BINARY_INPUTS = {"logical_and": (M > 0, M < 1), "logical_or": (M > 0, M < 1), "logical_xor": (M > 0, M < 1),
                  "bitwise_and": (I, I + 1), "bitwise_or": (I, I + 1), "bitwise_xor": (I, I + 1),
                  "left_shift": (I, 2), "right_shift": (I, 1), "power": (P, 2.0)}

# name -> (namespace, call with the namespace as argument)
CALLS: dict[str, tuple[str, object]] = {}
for _n in _UNARY:
    if _n != "copy":
        CALLS[_n] = ("ops", lambda m, n=_n: getattr(m, n)(_UNARY_INPUTS.get(n, M)))
for _n in _BINARY:
    CALLS[_n] = ("ops", lambda m, n=_n: getattr(m, n)(*_BINARY_INPUTS.get(n, (M, P))))
for _n in _REDUCE:
    CALLS[_n] = ("ops", lambda m, n=_n: getattr(m, n)(X, 1))

CALLS.update({
    "add scalar": ("ops", lambda m: m.add(M, 1.0)),
    "sum tuple axes keepdims": ("ops", lambda m: m.sum(X, (0, 2), True)),
    "zeros": ("ops", lambda m: m.zeros((2, 2))),
    "zeros int shape": ("ops", lambda m: m.zeros(3, mx.int32)),
    "ones": ("ops", lambda m: m.ones((2, 3), mx.float16)),
    "full": ("ops", lambda m: m.full((2, 3), 2.5)),
    "full int": ("ops", lambda m: m.full((2,), 7)),
    "full dtype": ("ops", lambda m: m.full((2, 2), 1, mx.float16)),
    "eye": ("ops", lambda m: m.eye(3, 4, 1)),
    "tri": ("ops", lambda m: m.tri(3, 4, 1)),
    "tril": ("ops", lambda m: m.tril(M, -1)),
    "triu": ("ops", lambda m: m.triu(M, 1)),
    "arange stop": ("ops", lambda m: m.arange(10)),
    "arange stop kw": ("ops", lambda m: m.arange(stop=10)),
    "arange start stop step": ("ops", lambda m: m.arange(1, 10, 3)),
    "arange float": ("ops", lambda m: m.arange(0.5, 3.0, 0.5)),
    "arange step kw": ("ops", lambda m: m.arange(10, step=3)),
    "arange dtype": ("ops", lambda m: m.arange(0, 5, 1, mx.float16)),
    "linspace": ("ops", lambda m: m.linspace(0, 1, 7)),
    "linspace no endpoint": ("ops", lambda m: m.linspace(0, 1, 8, False)),
    "zeros_like": ("ops", lambda m: m.zeros_like(I)),
    "ones_like dtype": ("ops", lambda m: m.ones_like(I, mx.float32)),
    "contiguous": ("ops", lambda m: m.contiguous(M.T)),
    "astype": ("ops", lambda m: m.astype(X, mx.float16)),
    "view": ("ops", lambda m: m.view(X, mx.int32)),
    "reshape": ("ops", lambda m: m.reshape(X, (12, 5))),
    "flatten": ("ops", lambda m: m.flatten(X, 1)),
    "transpose": ("ops", lambda m: m.transpose(X, (2, 0, 1))),
    "transpose default": ("ops", lambda m: m.transpose(X)),
    "swapaxes": ("ops", lambda m: m.swapaxes(X, 0, 2)),
    "moveaxis": ("ops", lambda m: m.moveaxis(X, 0, 2)),
    "squeeze": ("ops", lambda m: m.squeeze(X[:1], 0)),
    "expand_dims": ("ops", lambda m: m.expand_dims(X, (0, 2))),
    "broadcast_to": ("ops", lambda m: m.broadcast_to(X[:1], (2, 4, 5))),
    "flip": ("ops", lambda m: m.flip(M, 0)),
    "tile": ("ops", lambda m: m.tile(M, (2, 1))),
    "repeat": ("ops", lambda m: m.repeat(M, 2, 1)),
    "roll": ("ops", lambda m: m.roll(M, 1, 0)),
    "roll flat": ("ops", lambda m: m.roll(M, 3)),
    "roll tuples": ("ops", lambda m: m.roll(X, (1, -2), (0, 2))),
    "roll int over axes": ("ops", lambda m: m.roll(X, 2, (1, 2))),
    "pad int": ("ops", lambda m: m.pad(M, 1)),
    "pad pair": ("ops", lambda m: m.pad(M, (1, 2))),
    "pad pairs": ("ops", lambda m: m.pad(M, [(1, 0), (0, 2)], "constant", 3.0)),
    "pad edge": ("ops", lambda m: m.pad(M, 2, "edge")),
    "pad int array": ("ops", lambda m: m.pad(I, 1, constant_values=9)),
    "concatenate": ("ops", lambda m: m.concatenate([M, M * 2], 1)),
    "concatenate None": ("ops", lambda m: m.concatenate([M, X], None)),
    "stack": ("ops", lambda m: m.stack([M, M], 1)),
    "split": ("ops", lambda m: m.split(X, [1, 3], 1)),
    "split sections": ("ops", lambda m: m.split(M, 2)),
    "as_strided default": ("ops", lambda m: m.as_strided(M)),
    "as_strided": ("ops", lambda m: m.as_strided(M, (3, 2), (4, 1), 1)),
    "slice": ("ops", lambda m: m.slice(X, mx.array([1, 2]), [0, 2], [2, 4, 3])),
    "slice_update": ("ops", lambda m: m.slice_update(M, mx.zeros((2, 2)), mx.array([1, 1]), [0, 1])),
    "where": ("ops", lambda m: m.where(M > 0, M, -M)),
    "clip": ("ops", lambda m: m.clip(M, -0.5, 0.5)),
    "clip min only": ("ops", lambda m: m.clip(M, None, 0.5)),
    "round": ("ops", lambda m: m.round(M, 1)),
    "isclose": ("ops", lambda m: m.isclose(M, M + 1e-6)),
    "allclose": ("ops", lambda m: m.allclose(M, M * 1.01, 0.1)),
    "array_equal": ("ops", lambda m: m.array_equal(M, M)),
    "nan_to_num": ("ops", lambda m: m.nan_to_num(mx.array([float("nan"), float("inf"), -float("inf")]), 1.0, 9.0)),
    "var": ("ops", lambda m: m.var(X, 1, True, 1)),
    "std": ("ops", lambda m: m.std(X, 2)),
    "argmax": ("ops", lambda m: m.argmax(X, 1, True)),
    "argmin": ("ops", lambda m: m.argmin(X)),
    "cumsum": ("ops", lambda m: m.cumsum(X, 2, reverse=True)),
    "cumsum dtype": ("ops", lambda m: m.cumsum(I, 1, dtype=mx.float32)),
    "cumprod": ("ops", lambda m: m.cumprod(M, 0, inclusive=False)),
    "cummax": ("ops", lambda m: m.cummax(M, 1)),
    "cummin": ("ops", lambda m: m.cummin(M)),
    "logcumsumexp": ("ops", lambda m: m.logcumsumexp(M, 1)),
    "softmax": ("ops", lambda m: m.softmax(X, -1)),
    "softmax precise": ("ops", lambda m: m.softmax(X.astype(mx.float16), (1, 2), precise=True)),
    "sort": ("ops", lambda m: m.sort(X, 1)),
    "argsort": ("ops", lambda m: m.argsort(X)),
    "topk": ("ops", lambda m: m.topk(M, 2)),
    "partition": ("ops", lambda m: m.partition(M, 2, 1)),
    "argpartition": ("ops", lambda m: m.argpartition(M, 1)),
    "take": ("ops", lambda m: m.take(M, IDX, 1)),
    "take int": ("ops", lambda m: m.take(M, 1, axis=1)),
    "take flat": ("ops", lambda m: m.take(M, IDX)),
    "take_along_axis": ("ops", lambda m: m.take_along_axis(M, mx.array([[0, 2], [1, 3], [0, 0], [3, 1]]), 1)),
    "take_along_axis default axis": ("ops", lambda m: m.take_along_axis(M, mx.array([[0], [1], [2], [3]]))),
    "take_along_axis None": ("ops", lambda m: m.take_along_axis(M, mx.array([0, 5]), None)),
    "put_along_axis": ("ops", lambda m: m.put_along_axis(M, mx.array([[0], [2], [1], [3]]), mx.zeros((4, 1)), 1)),
    "put_along_axis None": ("ops", lambda m: m.put_along_axis(M, mx.array([0, 5, 15]), mx.array([9.0, 8.0, 7.0]),
                                                               None)),
    "tensordot": ("ops", lambda m: m.tensordot(M, M, 1)),
    "tensordot axes": ("ops", lambda m: m.tensordot(X, M, [[1], [0]])),
    "einsum": ("ops", lambda m: m.einsum("ij,jk->ik", M, M)),
    "addmm": ("ops", lambda m: m.addmm(M, M, M, 0.5, 2.0)),
    "conv_general": ("ops", lambda m: m.conv_general(X, mx.ones((2, 3, 5)), 1, 1)),
    "conv_general lo/hi": ("ops", lambda m: m.conv_general(X, mx.ones((2, 3, 5)), 1, ([1], [0]), 2, 1, 1, True)),
    "conv1d": ("ops", lambda m: m.conv1d(X, mx.ones((2, 3, 5)), 2, 1, 1, 1)),
    "conv2d": ("ops", lambda m: m.conv2d(Q, mx.ones((3, 2, 2, 8)), (1, 2), 1)),
    "conv3d": ("ops", lambda m: m.conv3d(Q[..., None], mx.ones((2, 2, 2, 2, 1)), 1, (0, 1, 0))),
    "conv_transpose1d": ("ops", lambda m: m.conv_transpose1d(X, mx.ones((2, 3, 5)), 2, 1)),
    "conv_transpose2d": ("ops", lambda m: m.conv_transpose2d(Q, mx.ones((3, 2, 2, 8)), 2, 0, 1, 1)),
    "conv_transpose3d": ("ops", lambda m: m.conv_transpose3d(Q[..., None], mx.ones((2, 2, 2, 2, 1)))),
    "convolve": ("ops", lambda m: m.convolve(M[0], mx.array([1.0, 2.0, 0.5]))),
    "convolve same": ("ops", lambda m: m.convolve(M.reshape(-1), mx.array([1.0, 2.0]), "same")),
    "convolve valid": ("ops", lambda m: m.convolve(M.reshape(-1), mx.array([1.0, 2.0, 3.0]), "valid")),
    "quantize": ("ops", lambda m: m.quantize(W, 64, 4)),
    "dequantize": ("ops", lambda m: m.dequantize(*mx.quantize(W), 64, 4)),
    "quantize global_scale": ("ops", lambda m: m.quantize(W, mode="nvfp4", global_scale=mx.array(0.5))),
    "dequantize global_scale": ("ops", lambda m: m.dequantize(*mx.quantize(W, mode="nvfp4"), mode="nvfp4",
                                                              global_scale=mx.array(0.5))),
    "dequantize dtype": ("ops", lambda m: m.dequantize(*mx.quantize(W), 64, 4, dtype=mx.float16)),
    "quantized_matmul": ("ops", lambda m: m.quantized_matmul(W[:2], *mx.quantize(W), True, 64, 4)),
    "isposinf": ("ops", lambda m: m.isposinf(mx.array([1.0, float("inf")]))),
    "isneginf": ("ops", lambda m: m.isneginf(mx.array([1.0, -float("inf")]))),
    "searchsorted": ("ops", lambda m: m.searchsorted(mx.array([1, 3, 5, 7]), mx.array([0, 3, 8]), "right")),
    "median": ("ops", lambda m: m.median(X, 1)),
    "diff": ("ops", lambda m: m.diff(X, 2, 1)),
    "trace": ("ops", lambda m: m.trace(M, 1)),
    "diagonal": ("ops", lambda m: m.diagonal(X, 0, 1, 2)),
    "diag": ("ops", lambda m: m.diag(M, -1)),
    "hadamard_transform": ("ops", lambda m: m.hadamard_transform(M, 0.5)),
    "trunc": ("ops", lambda m: m.trunc(M * 3)),
    "count_nonzero": ("ops", lambda m: m.count_nonzero(I, axis=1)),
    "divmod": ("ops", lambda m: m.divmod(I, 2)),
    "divmod float": ("ops", lambda m: m.divmod(M, P)),
    "vecdot": ("ops", lambda m: m.vecdot(M, P, axis=0)),
    "minmax": ("ops", lambda m: m.minmax(X, 1)),
    "unflatten": ("ops", lambda m: m.unflatten(X, 2, (5, 1))),
    "unstack": ("ops", lambda m: m.unstack(X, axis=1)),
    "segmented_mm": ("ops", lambda m: m.segmented_mm(M, P, mx.array([[0, 2], [2, 4]]))),
    "full_like": ("ops", lambda m: m.full_like(I, 2.5)),
    "full_like dtype": ("ops", lambda m: m.full_like(M, 3, mx.int32)),
    "matrix_transpose": ("ops", lambda m: m.matrix_transpose(X)),
    "meshgrid": ("ops", lambda m: m.meshgrid(M[0], P[1], indexing="ij")),
    "broadcast_arrays": ("ops", lambda m: m.broadcast_arrays(M[:1], P)),
    "atleast_1d": ("ops", lambda m: m.atleast_1d(mx.array(1.0))),
    "atleast_2d": ("ops", lambda m: m.atleast_2d(M[0], mx.array(2))),
    "atleast_3d": ("ops", lambda m: m.atleast_3d(M)),
    "hanning": ("ops", lambda m: m.hanning(8)),
    "hamming": ("ops", lambda m: m.hamming(8)),
    "bartlett": ("ops", lambda m: m.bartlett(7)),
    "blackman": ("ops", lambda m: m.blackman(9)),
    "gather_mm": ("ops", lambda m: m.gather_mm(M, mx.stack([M, P]), None, mx.array([1]))),
    "block_masked_mm": ("ops", lambda m: m.block_masked_mm(mx.ones((64, 64)), mx.ones((64, 64)), 32,
                                                           mx.array([[True, False], [False, True]]))),
    "acos": ("ops", lambda m: m.acos(U)), "acosh": ("ops", lambda m: m.acosh(P)), "asin": ("ops", lambda m: m.asin(U)),
    "asinh": ("ops", lambda m: m.asinh(M)), "atan": ("ops", lambda m: m.atan(M)),
    "atan2": ("ops", lambda m: m.atan2(M, P)), "atanh": ("ops", lambda m: m.atanh(U)),
    "bitwise_left_shift": ("ops", lambda m: m.bitwise_left_shift(I, 1)),
    "bitwise_right_shift": ("ops", lambda m: m.bitwise_right_shift(I, 1)),
    "conj": ("ops", lambda m: m.conj(M)), "pow": ("ops", lambda m: m.pow(P, 3)),
    "permute_dims": ("ops", lambda m: m.permute_dims(X, (1, 2, 0))), "empty": ("ops", lambda m: m.empty((2, 2))),
    "identity": ("ops", lambda m: m.identity(3, mx.int32)), "positive": ("ops", lambda m: m.positive(M)),
    "cumulative_sum": ("ops", lambda m: m.cumulative_sum(M, 1)),
    "cumulative_prod": ("ops", lambda m: m.cumulative_prod(M, 0, reverse=True)),
    "concat": ("ops", lambda m: m.concat([M, P], 1)), "empty_like": ("ops", lambda m: m.empty_like(M)),
    "linalg.cholesky_inv": ("linalg", lambda m: m.cholesky_inv(mx.linalg.cholesky(SPD, stream=mx.cpu),
                                                                stream=mx.cpu)),
    "linalg.cross": ("linalg", lambda m: m.cross(M[:, :3], P[:, :3])),
    "linalg.det": ("linalg", lambda m: m.det(SPD, stream=mx.cpu)),
    "linalg.slogdet": ("linalg", lambda m: m.slogdet(SPD, stream=mx.cpu)),
    "linalg.eig": ("linalg", lambda m: m.eig(SPD, stream=mx.cpu)),
    "linalg.eigvals": ("linalg", lambda m: m.eigvals(SPD, stream=mx.cpu)),
    "linalg.lu_factor": ("linalg", lambda m: m.lu_factor(M, stream=mx.cpu)),
    "fft.fftshift": ("fft", lambda m: m.fftshift(M, stream=mx.cpu)),
    "fft.ifftshift": ("fft", lambda m: m.ifftshift(X, 1, stream=mx.cpu)),
    "fft.fftfreq": ("fft", lambda m: m.fftfreq(8, 0.5, stream=mx.cpu)),
    "fft.rfftfreq": ("fft", lambda m: m.rfftfreq(9, stream=mx.cpu)),
    "unique": ("ops", lambda m: m.unique(I, 4)),
    "unique all": ("ops", lambda m: m.unique(I, 8, True, True, True, -1)),
    "to_fp8": ("ops", lambda m: m.to_fp8(M)),
    "from_fp8": ("ops", lambda m: m.from_fp8(mx.to_fp8(M), mx.float32)),
    "gather_qmm": ("ops", lambda m: m.gather_qmm(W[:2], *mx.quantize(W), rhs_indices=mx.array([0]))),
    "random.multivariate_normal": ("random", lambda m: m.multivariate_normal(mx.zeros((2,)), mx.eye(2), (3,),
                                                                               key=k, stream=mx.cpu)),
    "fft.stft": ("fft", lambda m: m.stft(M.reshape(-1), 8, 2, stream=mx.cpu)),
    "fft.stft window": ("fft", lambda m: m.stft(M.reshape(-1), 4, None, None, mx.hanning(4), False, "constant",
                                                "ortho", False, stream=mx.cpu)),
    "fft.istft": ("fft", lambda m: m.istft(mx.fft.stft(M.reshape(-1), 8, 2, stream=mx.cpu), 8, 2, length=16,
                                           stream=mx.cpu)),
    "stream=": ("ops", lambda m: m.multiply(M, 2.0, stream=mx.cpu)),
    "stream= device": ("ops", lambda m: m.sum(X, 1, stream=mx.Device(mx.cpu))),
    # linalg and fft: CPU-only in MLX, so both sides run on the CPU stream
    "linalg.inv": ("linalg", lambda m: m.inv(SPD, stream=mx.cpu)),
    "linalg.tri_inv": ("linalg", lambda m: m.tri_inv(mx.tril(SPD), False, stream=mx.cpu)),
    "linalg.pinv": ("linalg", lambda m: m.pinv(M, stream=mx.cpu)),
    "linalg.cholesky": ("linalg", lambda m: m.cholesky(SPD, True, stream=mx.cpu)),
    "linalg.qr": ("linalg", lambda m: m.qr(M, stream=mx.cpu)),
    "linalg.svd": ("linalg", lambda m: m.svd(M, False, stream=mx.cpu)),
    "linalg.lu": ("linalg", lambda m: m.lu(M, stream=mx.cpu)),
    "linalg.eigh": ("linalg", lambda m: m.eigh(SPD, "U", stream=mx.cpu)),
    "linalg.eigvalsh": ("linalg", lambda m: m.eigvalsh(SPD, stream=mx.cpu)),
    "linalg.solve": ("linalg", lambda m: m.solve(SPD, M, stream=mx.cpu)),
    "linalg.solve_triangular": ("linalg", lambda m: m.solve_triangular(mx.tril(SPD), M, upper=False, stream=mx.cpu)),
    "linalg.norm": ("linalg", lambda m: m.norm(M)),
    "linalg.norm ord": ("linalg", lambda m: m.norm(M, 1, 1)),
    "linalg.norm fro": ("linalg", lambda m: m.norm(M, "fro", (0, 1), True)),
    "linalg.norm inf": ("linalg", lambda m: m.norm(M, float("inf"))),
    "fft.fft": ("fft", lambda m: m.fft(M, stream=mx.cpu)),
    "fft.fft n norm": ("fft", lambda m: m.fft(M, 6, 0, "ortho", stream=mx.cpu)),
    "fft.ifft": ("fft", lambda m: m.ifft(M, None, 0, stream=mx.cpu)),
    "fft.rfft": ("fft", lambda m: m.rfft(M, 3, stream=mx.cpu)),
    "fft.irfft": ("fft", lambda m: m.irfft(mx.fft.rfft(M, stream=mx.cpu), 4, norm="forward", stream=mx.cpu)),
    "fft.fft2": ("fft", lambda m: m.fft2(M, stream=mx.cpu)),
    "fft.ifft2": ("fft", lambda m: m.ifft2(M, (2, 6), stream=mx.cpu)),
    "fft.rfft2": ("fft", lambda m: m.rfft2(X, stream=mx.cpu)),
    "fft.irfft2": ("fft", lambda m: m.irfft2(mx.fft.rfft2(X, stream=mx.cpu), stream=mx.cpu)),
    "fft.fftn": ("fft", lambda m: m.fftn(X, stream=mx.cpu)),
    "fft.ifftn": ("fft", lambda m: m.ifftn(X, None, (0, 2), stream=mx.cpu)),
    "fft.rfftn": ("fft", lambda m: m.rfftn(X, (4, 6), (1, 2), stream=mx.cpu)),
    "fft.irfftn": ("fft", lambda m: m.irfftn(mx.fft.rfftn(X, stream=mx.cpu), stream=mx.cpu)),
    # random, with explicit keys (key-less calls: test_random_follows_the_global_state)
    "random.key": ("random", lambda m: m.key(12345678901234)),
    "random.split": ("random", lambda m: m.split(k, 3)),
    "random.uniform": ("random", lambda m: m.uniform(-1, 2, (3, 4), key=k)),
    "random.uniform dtype": ("random", lambda m: m.uniform(shape=(5,), dtype=mx.float16, key=k)),
    "random.normal": ("random", lambda m: m.normal((3, 4), key=k)),
    "random.normal loc scale": ("random", lambda m: m.normal((3,), mx.float32, 1.0, 2.0, k)),
    "random.randint": ("random", lambda m: m.randint(0, 10, (4, 4), key=k)),
    "random.bernoulli": ("random", lambda m: m.bernoulli(0.3, (6,), k)),
    "random.bernoulli array p": ("random", lambda m: m.bernoulli(U, key=k)),
    "random.truncated_normal": ("random", lambda m: m.truncated_normal(-1.0, 1.0, (5,), key=k)),
    "random.gumbel": ("random", lambda m: m.gumbel((2, 3), key=k)),
    "random.categorical": ("random", lambda m: m.categorical(M, key=k)),
    "random.categorical samples": ("random", lambda m: m.categorical(M, -1, num_samples=5, key=k)),
    "random.categorical shape": ("random", lambda m: m.categorical(M, 1, (3, 4), key=k)),
    "random.permutation": ("random", lambda m: m.permutation(10, key=k)),
    "random.permutation array": ("random", lambda m: m.permutation(M, 1, k)),
    "random.laplace": ("random", lambda m: m.laplace((4,), mx.float32, 1.0, 2.0, k)),
    "matrix_norm": ("ops", lambda m: m.matrix_norm(M, "nuc", stream=mx.cpu)),
    "einsum_path": ("ops", lambda m: m.einsum_path("ij,jk,kl->il", M, X[0], X[0].T)),
    # Multi-output ops with one input and with none: the container and its length are mlx's.
    "meshgrid one": ("ops", lambda m: m.meshgrid(M[0])),
    "meshgrid one sparse ij": ("ops", lambda m: m.meshgrid(M[0], sparse=True, indexing="ij")),
    "meshgrid none": ("ops", lambda m: m.meshgrid()),
    "broadcast_arrays one": ("ops", lambda m: m.broadcast_arrays(M)),
    "broadcast_arrays scalar": ("ops", lambda m: m.broadcast_arrays(mx.array(1.5))),
    "broadcast_arrays none": ("ops", lambda m: m.broadcast_arrays()),
    "atleast_1d one": ("ops", lambda m: m.atleast_1d(mx.array(2.0))),
    "atleast_2d none": ("ops", lambda m: m.atleast_2d()),
    "atleast_3d two": ("ops", lambda m: m.atleast_3d(M[0], M)),
    "split one section": ("ops", lambda m: m.split(M, 1)),
    "split no indices": ("ops", lambda m: m.split(M, [])),
    "split empty": ("ops", lambda m: m.split(mx.zeros((0, 3)), [0], 0)),
    "unstack one": ("ops", lambda m: m.unstack(M[:1])),
    "unstack empty": ("ops", lambda m: m.unstack(mx.zeros((0, 3)))),
    "unique index": ("ops", lambda m: m.unique(I, 6, True)),
    "unique counts": ("ops", lambda m: m.unique(I, 6, return_counts=True)),
    "divmod scalar": ("ops", lambda m: m.divmod(mx.array(7), 2)),
    "minmax axis": ("ops", lambda m: m.minmax(M, 0)),
    "quantize mxfp4": ("ops", lambda m: m.quantize(W, mode="mxfp4")),
    "concatenate one": ("ops", lambda m: m.concatenate([M])),
    "stack one": ("ops", lambda m: m.stack([M])),
    "linalg.svd 1x1": ("linalg", lambda m: m.svd(mx.ones((1, 1)), stream=mx.cpu)),
    "linalg.eigh 1x1": ("linalg", lambda m: m.eigh(mx.ones((1, 1)), stream=mx.cpu)),
    "random.split none": ("random", lambda m: m.split(k, 0)),
    "random.split one": ("random", lambda m: m.split(k, 1)),
    # What plain mlx refuses, refused alike. MLX's CPU backend has no qqmm kernels:
    # there both raise "NYI"; with a GPU both compute and the values must agree.
    "qqmm": ("ops", lambda m: m.qqmm(W[:2], W)),
    "qqmm quantized w": ("ops", lambda m: m.qqmm(W[:2], *mx.quantize(W, mode="mxfp8"), mode="mxfp8")),
    "qqmm global scales": ("ops", lambda m: m.qqmm(W[:2], *mx.quantize(W, mode="nvfp4", global_scale=mx.array(0.5)),
                                                    global_scale_x=mx.array(0.5), global_scale_w=mx.array(0.5))),
    "qqmm bad dtype": ("ops", lambda m: m.qqmm(I, I)),
    "qqmm bad shapes": ("ops", lambda m: m.qqmm(W[:2], W[:, :32])),
    "gather_qqmm": ("ops", lambda m: m.gather_qqmm(W[:2], mx.stack([W, W]), rhs_indices=mx.array([1]))),
    "gather_qqmm quantized w": ("ops", lambda m: m.gather_qqmm(W[:2], *mx.quantize(mx.stack([W, W]), mode="mxfp8"),
                                                              None, mx.array([0]), mode="mxfp8",
                                                              sorted_indices=True)),
    "einsum_path bad": ("ops", lambda m: m.einsum_path("ij->kk", M)),
    "matmul bad": ("ops", lambda m: m.matmul(X, M)),
    "reshape bad": ("ops", lambda m: m.reshape(M, (3, 5))),
    "sum bad axis": ("ops", lambda m: m.sum(M, 5)),
    "take bad indices": ("ops", lambda m: m.take(M, mx.array([0.5]))),
    "transpose bad": ("ops", lambda m: m.transpose(M, (0, 0))),
    "split bad": ("ops", lambda m: m.split(M, 3)),
    "bitwise_and bad": ("ops", lambda m: m.bitwise_and(M, M)),
    "squeeze bad": ("ops", lambda m: m.squeeze(M, 0)),
    "quantize bad": ("ops", lambda m: m.quantize(M[:, :2], 64, 4)),
    "conv1d bad": ("ops", lambda m: m.conv1d(X, mx.ones((2, 3, 7)))),
    "meshgrid bad": ("ops", lambda m: m.meshgrid(M[0], indexing="zz")),
    "arange bad": ("ops", lambda m: m.arange(0, 10, 0)),
    "linalg.inv bad": ("linalg", lambda m: m.inv(X, stream=mx.cpu)),
    "linalg.qr bad": ("linalg", lambda m: m.qr(I, stream=mx.cpu)),
    "random.normal bad key": ("random", lambda m: m.normal((2,), key=M)),
    "random.categorical bad axis": ("random", lambda m: m.categorical(M, 5, key=k)),
})

_MX = {"ops": mx, "linalg": mx.linalg, "fft": mx.fft, "random": mx.random}
_EA = {"ops": ea.ops, "linalg": ea.linalg, "fft": ea.fft, "random": ea.random}
_ALL = {"ops": _generated_ops.__all__, "linalg": ea.linalg.__all__, "fft": ea.fft.__all__,
        "random": [n for n in ea.random.__all__ if n != "seed"]}


def _arrays_in(value) -> list:
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _arrays_in(v)]
    return [value] if isinstance(value, mx.array) else []


@async_test
async def test_every_op_matches_mlx_called_the_mlx_way(rt):
    """One job per call, all submitted at once: the whole walk is one short pipeline."""
    labels = list(CALLS)
    wants = []
    for label in labels:
        namespace, call = CALLS[label]
        try:
            want = call(_MX[namespace])
            mx.eval(_arrays_in(want))
        except Exception as exc:  # noqa: BLE001 - an error is the expected outcome of some calls
            want = Raised(exc)
        wants.append(want)
    futures = []
    for label in labels:
        namespace, call = CALLS[label]
        try:
            futures.append(call(_EA[namespace]))
        except Exception as exc:  # noqa: BLE001 - checked against mlx's below
            futures.append(Raised(exc))
    failures = []
    for label, future, want in zip(labels, futures, wants):
        try:
            try:
                got = future if isinstance(future, Raised) else await future
            except Exception as exc:  # noqa: BLE001 - checked against mlx's
                got = Raised(exc)
            same_outcome(got, want, label)
            _check_annotation(label, got)
        except Exception as exc:  # noqa: BLE001 - report every divergence at once
            failures.append(f"{label}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    assert not failures, "\n".join(failures)
    covered = {label.split(" ")[0] for label in labels}
    missing = _generated_names() - covered - {"copy"}
    assert not missing, f"ops without a conformance call: {sorted(missing)}"
    assert covered - {"stream="} <= _generated_names(), sorted(covered - _generated_names())
    print(f"\nmlx parity: {len(labels)} mlx-style calls over {len(covered - {'stream='}) + 1} ops match mlx")


def _alternatives(annotation: str) -> list[str]:
    """The top-level members of a union annotation ("array | tuple[array, ...]")."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(annotation):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "|" and depth == 0:
            parts.append(annotation[start:i].strip())
            start = i + 1
    return parts + [annotation[start:].strip()]


def _check_annotation(label: str, got) -> None:
    """A result's container is one its function's return annotation admits (what mypy users rely on)."""
    if isinstance(got, Raised) or label.startswith("stream="):
        return
    name = label.split(" ")[0]
    namespace, _, short = name.rpartition(".")
    annotation = getattr(_EA[namespace or "ops"], short).__annotations__["return"]
    assert annotation.startswith("JobFuture[") and annotation.endswith("]"), f"{label}: {annotation}"
    admitted = _alternatives(annotation[len("JobFuture["):-1])
    kind = {list: "list[", tuple: "tuple["}.get(type(got), "array")
    assert any(a == kind or a.startswith(kind) for a in admitted), f"{label}: {type(got).__name__} vs {annotation}"


def _generated_names() -> set[str]:
    """Every generated function, as the walk labels it ("sum", "linalg.qr"): the README's count."""
    return {f"{ns}.{n}" if ns != "ops" else n for ns, names in _ALL.items() for n in names}


def test_readme_op_count_is_what_the_walk_covers():
    """The README states how many functions take mlx's signatures; the conformance walk covers each one."""
    text = " ".join((ROOT / "README.md").read_text().split())
    found = re.search(r"(\d+) functions take mlx's own signatures: (\d+) of `mlx.core` in `ea.ops`, (\d+) of "
                      r"`mx.linalg`, (\d+) of `mx.fft` and (\d+) of `mx.random`", text)
    assert found, "the README's op count sentence is missing or reworded"
    total, *per_namespace = (int(v) for v in found.groups())
    assert per_namespace == [len(_ALL[ns]) for ns in ("ops", "linalg", "fft", "random")]
    assert total == len(_generated_names()) == sum(per_namespace)


@async_test
async def test_copy_matches_mx_array(rt):
    same_outcome(await ea.ops.copy(M), mx.array(M), "copy")


@async_test
async def test_random_follows_the_global_state(rt):
    mx.random.seed(42)
    want = [mx.random.normal((3,)), mx.random.uniform(shape=(2,)), mx.random.randint(0, 9, (4,)),
            mx.random.categorical(M), mx.random.permutation(6), mx.random.normal((2,))]
    mx.random.seed(42)
    q1, q2 = await rt.acquire_queue(), await rt.acquire_queue()
    try:
        # key-less calls take their keys at call time, in call order, whatever queue runs them
        futures = [ea.random.normal((3,), queue=q1), ea.random.uniform(shape=(2,), queue=q2),
                   ea.random.randint(0, 9, (4,), queue=q1)]
        interleaved = mx.random.categorical(M)  # plain mlx draws from the same state in between
        futures += [ea.random.permutation(6, queue=q2), ea.random.normal((2,), stream=mx.default_device())]
        got = [await f for f in futures]
    finally:
        rt.release_queue(q1)
        rt.release_queue(q2)
    same_outcome(got[:3] + [interleaved] + got[3:], want, "random after seed")
    # seeding again replays the sequence
    mx.random.seed(42)
    same_outcome(await ea.random.normal((3,)), want[0], "replay")


def _mlx_params(namespace: str, name: str) -> list[tuple[str, object, object]]:
    """(name, kind, default) of mlx's own parameters, stream aside."""
    module = GEN["NAMESPACES"][namespace][0]
    text, _ = GEN["mlx_signature"](module, name)
    sig = inspect.signature(_compile(text))
    return [(p.name, p.kind, p.default) for p in sig.parameters.values() if p.name != "stream"]


def _compile(text: str):
    scope = {"array": mx.array, "Dtype": mx.Dtype, **{n: getattr(mx, n) for n in dir(mx)
                                                     if isinstance(getattr(mx, n), mx.Dtype)}}
    exec("from __future__ import annotations\n" + text + ": ...", scope)  # noqa: S102 - mlx's own text
    return scope[text.split("(")[0][4:].strip()]


RUNTIME = {"stream", "queue", "device", "lazy", "nowait", "check_finite"}

# Documented differences from mlx's signatures.
SIGNATURE_EXCEPTIONS = {
    ("ops", "copy"): "not in mlx.core (mx.array(a) there)",
    ("ops", "arange"): "mlx has two overloads, arange(start, stop, step) and arange(stop, step); one signature "
                       "with every bound optional takes both",
    ("ops", "slice"): "mlx's dynamic form (start_indices, axes, slice_size) plus the static start=/stop=/strides= "
                      "keywords; so mlx's parameters get None defaults",
    ("ops", "slice_update"): "as slice",
}


# Functions that read only shapes and return no arrays: answered at the call, no job (the op spec's list).
ANSWERED_AT_CALL = {(path.rpartition(".")[0] or "ops", path.rpartition(".")[2]) for path in _SPEC_AT_CALL}


@pytest.mark.parametrize("namespace", ["ops", "linalg", "fft", "random"])
def test_signatures_match_mlx(namespace):
    checked = 0
    for name in _ALL[namespace]:
        if (namespace, name) in SIGNATURE_EXCEPTIONS:
            continue
        ours = inspect.signature(getattr(_EA[namespace], name))
        got = [(p.name, p.kind, p.default) for p in ours.parameters.values() if p.name not in RUNTIME]
        assert got == _mlx_params(namespace, name), f"{namespace}.{name}"
        if (namespace, name) in ANSWERED_AT_CALL:  # no job, so no runtime keywords: exactly mlx's parameters
            assert not set(ours.parameters) & RUNTIME, f"{namespace}.{name}"
            checked += 1
            continue
        assert set(ours.parameters) >= RUNTIME, f"{namespace}.{name} lacks a runtime keyword"
        for runtime_name in RUNTIME - {"stream"}:
            assert ours.parameters[runtime_name].kind is inspect.Parameter.KEYWORD_ONLY
        checked += 1
    assert checked >= {"ops": 200, "linalg": 19, "fft": 18, "random": 12}[namespace]


def test_fast_signatures_follow_mlx():
    """ea.fast is hand-written: mlx's parameters in mlx's order; extras documented in its docstring."""
    for name in ("rms_norm", "layer_norm", "rope", "scaled_dot_product_attention"):
        ours = list(inspect.signature(getattr(ea.fast, name)).parameters)
        text, _ = GEN["mlx_signature"](mx.fast, name)
        theirs = list(inspect.signature(_compile(text)).parameters)
        assert ours[:len(theirs)] == theirs, name


def test_generated_files_are_current():
    for namespace in GEN["NAMESPACES"]:
        path = GEN["target"](namespace)
        assert path.read_text() == GEN["generate"](namespace), f"{path.name} is stale: run python tools/gen_api.py"


def test_ops_are_typed_module_functions():
    """Real functions with annotations (not injected into globals()), so type checkers see them."""
    for namespace, names in _ALL.items():
        for name in names:
            fn = getattr(_EA[namespace], name)
            assert fn.__module__ == f"emlx_async._generated_{namespace}", f"{namespace}.{name}"
            assert fn.__annotations__["return"].startswith("JobFuture["), f"{namespace}.{name}"
            assert fn.__doc__ and f"``mx.{'' if namespace == 'ops' else namespace + '.'}{name}``" in fn.__doc__


@async_test
async def test_hand_written_ops_take_stream_too(rt):
    got = await ea.ops.scatter_add(mx.zeros((4,)), mx.array([0, 0, 3]), mx.ones((3, 1)), axes=(0,), stream=mx.cpu)
    assert got.tolist() == [2.0, 0.0, 0.0, 1.0]
    got = await ea.ops.window_scatter_max(mx.array([[1.0, 3.0], [2.0, 0.0]]), mx.ones((1, 1)), window=(2, 2),
                                          stream="cpu")
    assert got.tolist() == [[0.0, 1.0], [0.0, 0.0]]
    assert (await ea.fast.rms_norm(M, None, 1e-5, stream=mx.cpu)).shape == M.shape


@async_test
async def test_stream_picks_a_queue_of_its_device(rt):
    lazy = await ea.ops.add(M, 1.0, lazy=True, stream=mx.cpu)
    assert rt.queue_of(lazy) is rt.default_queue("cpu")
    same_outcome(await ea.eval(lazy), M + 1.0, "stream=mx.cpu")
    if not mx.is_available(mx.gpu):
        with pytest.raises(ea.DeviceUnavailable):
            ea.ops.add(M, 1.0, stream=mx.gpu)


@async_test
async def test_bounds_checks_cover_the_new_index_taking_ops(rt):
    assert ea.ops.set_bounds_checks(True) is False
    try:
        with pytest.raises(ea.MLXIndexError, match=r"\[gather_mm\] index 2"):
            await ea.ops.gather_mm(M, mx.stack([M, M]), None, mx.array([2]))
        with pytest.raises(ea.MLXIndexError, match=r"\[segmented_mm\] index 5"):
            await ea.ops.segmented_mm(M, M, mx.array([[0, 5]]))
        with pytest.raises(ea.MLXIndexError, match=r"\[put_along_axis_flat\] index 16"):
            await ea.ops.put_along_axis(M, mx.array([16]), mx.array([1.0]), None)
        same_outcome(await ea.ops.segmented_mm(M, M, mx.array([[0, 4]])), mx.segmented_mm(M, M, mx.array([[0, 4]])), "ok")
    finally:
        ea.ops.set_bounds_checks(False)


@on_every_loop
async def test_einsum_path_is_answered_at_the_call():
    """No job: a resolved future, even for a lazy operand owned by a queue (only its shape is read)."""
    lazy = await ea.ops.multiply(M, 2.0, lazy=True)
    future = ea.ops.einsum_path("ij,jk->ik", lazy, M)
    assert future.done()
    assert await future == mx.einsum_path("ij,jk->ik", M, M)
    with pytest.raises(ValueError, match=r"\[einsum_path\] Repeat indices"):
        ea.ops.einsum_path("ij->kk", M)  # mlx's error, at the call as in mlx
    await ea.eval(lazy)
