"""Hostile op arguments: each gives the right answer or a clear exception, and the queue lives on.

Each case would crash, hang or corrupt plain MLX (or did so through the op
table before validation), so each runs in a fresh interpreter: a crash or a
hang fails the case with its output instead of ending the test run. After
the op, the same queue must still run a job.

Each case's interpreter runs one event loop; the cases take asyncio, uvloop
and trio in turn (a fresh interpreter per case and loop would triple the
cost for checks that happen before any loop is involved).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from support.helpers import BACKENDS

PROGRAM = """
import faulthandler
faulthandler.dump_traceback_later({timeout}, exit=True)  # a hang becomes a failure with stacks
import mlx.core as mx
import numpy as np
import emlx_async as ea
from emlx_async import MLXIndexError, MLXRuntimeError, MLXValueError
from emlx_async._op_table import OPS

CODES = {{name: code for code, (name, *_rest) in enumerate(OPS)}}

def raw(q, name, arrays, ints, floats=(), text=""):
    # Submits without ops.py's encoding, to reach the native decoder's checks.
    return q._submit_op(CODES[name], name, list(arrays), list(ints), list(floats), text, False, False, False, None)

async def main():
    async with ea.Runtime() as rt:
        q = rt.default_queue()
{setup}
        try:
            result = await ({expr})
        except BaseException as exc:
            print("RAISED", type(exc).__name__, "|", exc, flush=True)
            assert isinstance(exc, {expected}), f"wrong exception type {{type(exc)}}"
        else:
            print("RESULT", result, flush=True)
            assert {expected} is None, "no exception"
            check = {check}
            assert check(result), f"wrong result {{result!r}}"
        assert (await ea.ops.add(mx.array(1), 2, queue=q)).item() == 3
        print("QUEUE OK", flush=True)

{run}
"""

RUN = {"asyncio": "import asyncio\nasyncio.run(main())", "uvloop": "import uvloop\nuvloop.run(main())",
       "trio": "import trio\ntrio.run(main)"}


def in_turn(cases):
    """pytest params for `cases` (id first), each with the next loop of BACKENDS appended."""
    return [pytest.param(*case[1:], BACKENDS[i % len(BACKENDS)], id=f"{case[0]}-{BACKENDS[i % len(BACKENDS)]}")
            for i, case in enumerate(cases)]


def run_case(expr: str, expected: str, match: str = "", setup: str = "", check: str = "lambda r: True",
             timeout: float = 30, backend: str = "asyncio"):
    code = PROGRAM.format(expr=expr, expected=expected, check=check, timeout=timeout, run=RUN[backend],
                          setup=textwrap.indent(textwrap.dedent(setup), " " * 8))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout + 30)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"exit status {result.returncode}:\n{output[-3000:]}"
    assert "QUEUE OK" in result.stdout, output[-3000:]
    if match:
        assert match in result.stdout, output[-3000:]


ARRAY = "mx.ones((2, 3, 4))"
QW = "mx.ones((4, 8), dtype=mx.uint32)"  # 64 columns quantized at 4 bits

# (id, expression, expected exception (None: a result), text in the message)
CASES = [
    # Ints past 32 bits were truncated by the native decoder (zeros(shape=[2**40])
    # gave shape (0,), axis=2**32+1 reduced axis 1); mlx.core raises OverflowError
    # with its own message for a shape (for other options nanobind's TypeError: an
    # OverflowError naming the option says more).
    ("zeros-shape-2**40", "ea.ops.zeros(shape=[2**40])", "OverflowError",
     "Integer value 1099511627776 is outside the supported range [-2147483648, 2147483647]."),
    ("sum-axis-2**32+1", f"ea.ops.sum({ARRAY}, axis=2**32 + 1)", "OverflowError", "'axis'"),
    ("topk-k-2**32+1", f"ea.ops.topk({ARRAY}, k=2**32 + 1)", "OverflowError", "'k'"),
    ("roll-shift-2**32+1", f"ea.ops.roll({ARRAY}, 2**32 + 1)", "OverflowError", "'shift'"),
    ("eye-n-2**32+3", "ea.ops.eye(n=2**32 + 3)", "OverflowError", "'n'"),
    ("float-option-too-big", f"ea.ops.isclose({ARRAY}, {ARRAY}, rtol=10**400)", "OverflowError", "'rtol'"),
    # A refused option sends the call to mlx for its message; mlx dies (SIGABRT) on a shape int past
    # int32 in these three before it refuses: the package's own error stands.
    ("bernoulli-shape-2**31-bad-stream", "ea.random.bernoulli(0.5, (2**31,), stream=123)", "TypeError", "stream="),
    ("truncated_normal-shape-2**31-bad-stream", "ea.random.truncated_normal(-1.0, 1.0, (2**31,), stream=123)",
     "TypeError", "stream="),
    ("categorical-shape-2**31-bad-stream", "ea.random.categorical(mx.zeros((2,)), shape=(2**31,), stream=123)",
     "TypeError", "stream="),
    # offset + T wrapped in 32 bits and passed the cache-length check.
    ("kv-cache-offset-2**31-1",
     "ea.attention.kv_cache_attention(mx.ones((1, 1, 2, 4)), mx.ones((1, 1, 1, 4)), mx.ones((1, 1, 1, 4)), "
     "mx.zeros((1, 8, 1, 4)), mx.zeros((1, 8, 1, 4)), offset=2**31 - 1, scale=1.0)", "ValueError",
     "exceed the cache length"),
    # The native decoder itself, bypassing the Python checks.
    ("native-shape-2**40", "raw(q, 'zeros', [], [1, 2**40, -1])", "MLXValueError", "'shape' = 1099511627776"),
    ("native-axis-2**32+1", f"raw(q, 'sum', [{ARRAY}], [1, 2**32 + 1, 0])", "MLXValueError", "'axis'"),
    ("native-missing-params", f"raw(q, 'sum', [{ARRAY}], [1])", "MLXValueError", "missing"),
    ("native-extra-params", f"raw(q, 'abs', [{ARRAY}], [7])", "MLXValueError", "more parameters"),
    ("native-huge-list-count", f"raw(q, 'reshape', [{ARRAY}], [2**40, 1])", "MLXValueError", "missing"),
    ("native-groups-0",
     "raw(q, 'conv_general', [mx.ones((1, 8, 4)), mx.ones((4, 3, 4))], [0, 0, 0, 0, 0, 0, 0])",
     "MLXValueError", "'groups' must be nonzero"),
    # Bounds checks compared uint64 indices as int64: 2**64 - 1 passed as -1.
    ("take-uint64-index",
     "ea.ops.take(mx.arange(10), mx.array(np.array([2**64 - 1], dtype=np.uint64)))", "MLXIndexError",
     "18446744073709551615"),
    ("scatter-uint64-index",
     "ea.ops.scatter(mx.arange(10), [mx.array(np.array([2**64 - 2], dtype=np.uint64))], "
     "mx.ones((1, 1), dtype=mx.int32), axes=[0])", "MLXIndexError", "out of bounds"),
    # A gather slice that starts in bounds but runs past the axis reads past the array.
    ("check-bounds-slice-past-the-end",
     "ea.ops.submit('check_bounds', [mx.array([0, 3])], size=4, op='gather', extent=2)", "MLXIndexError",
     "a slice of 2 from position 3"),
    ("check-bounds-negative-slice-past-the-end",
     "ea.ops.submit('check_bounds', [mx.array([-1])], size=4, op='gather', extent=2)", "MLXIndexError",
     "from position 3"),
    ("check-bounds-unsigned-slice-past-the-end",
     "ea.ops.submit('check_bounds', [mx.array([3], dtype=mx.uint8)], size=4, op='gather', extent=2)",
     "MLXIndexError", "out of bounds"),
    ("take-axis-none-size-over-int32",
     "ea.ops.take(mx.zeros((1,), dtype=mx.uint8), mx.array([3], dtype=mx.uint32))", "MLXIndexError", "size 1"),
    # Allocation failure is SIGSEGV in MLX, even under set_memory_limit.
    ("ones-2**20-squared", "ea.ops.ones(shape=(2**20, 2**20))", "MLXRuntimeError", "allocation limit"),
    ("broadcast-huge", "ea.ops.broadcast_to(mx.array(1.0), shape=(2**20, 2**20))", "MLXRuntimeError",
     "allocation limit"),
    ("tile-huge", "ea.ops.tile(mx.ones((2**10, 2**10)), (2**10, 2**10))", "MLXRuntimeError",
     "allocation limit"),
    ("repeat-huge", "ea.ops.repeat(mx.ones((2**12, 2**10)), repeats=2**12, axis=0)", "MLXRuntimeError",
     "allocation limit"),
    ("size-overflows-64-bits", "ea.ops.zeros(shape=(2**31 - 1,) * 3)", "MLXRuntimeError", "more than 2**64"),
    ("pad-overflows-int32", "ea.ops.pad(mx.ones((4,)), pad_width=[2**31 - 2, 0])", "MLXValueError",
     "outside [0, 2**31)"),
    ("window-scatter-padding-overflow",
     "ea.ops.window_scatter_max(mx.ones((4,)), mx.ones((1,)), window=[2], strides=[2**31 - 1], "
     "padding=[(2**31 - 2, 0)])", "MLXValueError", "outside [0, 2**31)"),
    # Divisions by zero in MLX (SIGFPE).
    ("quantize-group-size-0", "ea.ops.quantize(mx.ones((4, 64)), group_size=0, bits=4)", "ValueError",
     "'group_size' must be positive"),
    ("conv-groups-0", "ea.ops.conv_general(mx.ones((1, 8, 4)), mx.ones((4, 3, 4)), groups=0)", "ValueError",
     "'groups' must be nonzero"),
    ("conv1d-no-channels", "ea.ops.conv1d(mx.ones((1, 9, 0)), mx.ones((2, 3, 0)))", "MLXValueError",
     "input has no channels"),
    ("conv-transpose2d-no-channels-negative-groups",
     "ea.ops.conv_transpose2d(mx.ones((1, 6, 6, 0)), mx.ones((2, 3, 3, 0)), groups=-1)", "MLXValueError",
     "input has no channels"),
    ("slice-stride-0", "ea.ops.slice(mx.ones((10,)), start=[0], stop=[10], strides=[0])", "ValueError",
     "'strides' must be nonzero"),
    ("slice-update-stride-0",
     "ea.ops.slice_update(mx.ones((10,)), mx.ones((5,)), start=[0], stop=[10], strides=[0])", "ValueError",
     "'strides' must be nonzero"),
    ("quantized-matmul-bits-0",
     f"ea.ops.quantized_matmul(mx.ones((2, 64)), {QW}, mx.ones((4, 1)), mx.ones((4, 1)), group_size=64, bits=0)",
     "ValueError", "'bits' must be positive"),
    ("conv-no-input-channels", "ea.ops.conv_general(mx.ones((1, 8, 0)), mx.ones((4, 3, 0)))", "MLXValueError",
     "no channels"),
    ("quantized-matmul-empty-w",
     "ea.ops.quantized_matmul(mx.ones((2, 0)), mx.ones((4, 0), dtype=mx.uint32), mx.ones((4, 0)), "
     "mx.ones((4, 0)), group_size=64, bits=4)", "MLXValueError", "inner (contracted) dimension is empty"),
    ("quantized-matmul-empty-inner-untransposed",
     "ea.ops.quantized_matmul(mx.ones((2, 0)), mx.ones((0, 8), dtype=mx.uint32), mx.ones((0, 1)), "
     "mx.ones((0, 1)), transpose=False, group_size=64, bits=4)", "MLXValueError", "inner (contracted)"),
    # A zero-sized conv kernel reaches BLAS, whose error handler exits the process (status 0).
    ("conv-zero-sized-kernel", "ea.ops.conv_general(mx.ones((1, 8, 4)), mx.ones((4, 0, 4)))", "MLXValueError",
     "zero-sized kernel"),
    # Out-of-bounds reads: quantized_matmul with too few scales, as_strided past the input.
    ("quantized-matmul-short-scales",
     f"ea.ops.quantized_matmul(mx.ones((2, 64)), {QW}, mx.ones((1, 1)), mx.ones((1, 1)), group_size=64, bits=4)",
     "MLXValueError", "scales have shape (1, 1)"),
    ("as-strided-past-the-end", "ea.ops.as_strided(mx.ones((4,)), shape=(4,), strides=(10**6,))",
     "MLXValueError", "out of bounds"),
    ("as-strided-offset-past-the-end", "ea.ops.as_strided(mx.ones((4,)), shape=(4,), strides=(1,), offset=10**6)",
     "MLXValueError", "out of bounds"),
    ("as-strided-negative-reach", "ea.ops.as_strided(mx.ones((4,)), shape=(4,), strides=(-1,), offset=2)",
     "MLXValueError", "out of bounds"),
    ("as-strided-offset-negative", "ea.ops.as_strided(mx.ones((4,)), shape=(1,), strides=(1,), offset=-1)",
     "TypeError", "as_strided(): incompatible function arguments"),  # mlx's binding takes a size_t
    # Keys without heads: MLX takes the query heads modulo the key heads (SIGFPE).
    ("sdpa-keys-without-heads",
     "ea.fast.scaled_dot_product_attention(mx.ones((1, 2, 2, 4)), mx.ones((1, 0, 2, 4)), mx.ones((1, 0, 2, 4)), "
     "scale=1.0)", "MLXValueError", "no heads"),
    ("sdpa-masked-keys-without-heads",
     "ea.ops.submit('fast_sdpa_masked', [mx.ones((1, 2, 2, 4)), mx.ones((1, 0, 2, 4)), mx.ones((1, 0, 2, 4)), "
     "mx.ones((2, 2), dtype=mx.bool_)], scale=1.0)", "MLXValueError", "no heads"),
    ("kv-cache-without-heads",
     "ea.attention.kv_cache_attention(mx.ones((1, 1, 2, 4)), mx.ones((1, 1, 0, 4)), mx.ones((1, 1, 0, 4)), "
     "mx.zeros((1, 8, 0, 4)), mx.zeros((1, 8, 0, 4)), offset=0, scale=1.0)", "MLXValueError", "no heads"),
    # MLX throws a bare string here, which reached Python as "unknown C++ exception".
    ("scatter-bool-indices", "ea.ops.scatter(mx.zeros((3,)), [mx.array([True])], mx.ones((1, 1)), axes=[0])",
     "MLXValueError", "Boolean indices"),
    ("dequantize-one-array", f"ea.ops.submit('dequantize', [{QW}])", "MLXValueError", "expects 2 to 3"),
    ("quantized-matmul-two-arrays", f"ea.ops.submit('quantized_matmul', [mx.ones((2, 64)), {QW}])",
     "MLXValueError", "expects 3 to 4"),
    ("sdpa-key-mask-low-rank",
     "ea.ops.submit('fast_sdpa_causal_key_mask', [mx.ones((2,)), mx.ones((2,)), mx.ones((2,)), mx.ones((2,))])",
     "MLXValueError", "{B, N, T, D}"),
]


@pytest.mark.parametrize("expr, expected, match, backend", in_turn(CASES))
def test_hostile_option_is_refused_and_queue_survives(expr, expected, match, backend):
    # A 4 GiB memory limit keeps the allocation cases machine-independent.
    run_case(expr, expected, match, setup="ea.ops.set_bounds_checks(True)\nea.memory.set_memory_limit(1 << 32)",
             backend=backend)


# Right answers where plain MLX crashes or hangs.
RESULTS = [
    # linalg of 0x0 matrices: SIGFPE in MLX's LAPACK set-up; the answer is empty.
    ("inv-0x0", "ea.linalg.inv(mx.ones((0, 0)))", "lambda r: r.shape == (0, 0) and r.dtype == mx.float32"),
    ("inv-batch-of-0x0", "ea.linalg.inv(mx.ones((2, 0, 0)))", "lambda r: r.shape == (2, 0, 0)"),
    ("tri-inv-0x0", "ea.linalg.tri_inv(mx.ones((0, 0)))", "lambda r: r.shape == (0, 0)"),
    ("lu-0x0", "ea.linalg.lu(mx.ones((0, 0)))", "lambda r: [a.shape for a in r] == [(0,), (0, 0), (0, 0)]"),
    ("solve-0x0", "ea.linalg.solve(mx.ones((0, 0)), mx.ones((0,)))", "lambda r: r.shape == (0,)"),
    ("solve-triangular-0x0", "ea.linalg.solve_triangular(mx.ones((0, 0)), mx.ones((0,)))",
     "lambda r: r.shape == (0,)"),
    # Still an error MLX's way: a 0x0 int matrix is refused for its dtype, not answered.
    ("as-strided-in-bounds", "ea.ops.as_strided(mx.arange(6), shape=(2, 2), strides=(3, 1), offset=1)",
     "lambda r: r.tolist() == [[1, 2], [4, 5]]"),
    ("as-strided-negative-stride", "ea.ops.as_strided(mx.arange(4), shape=(4,), strides=(-1,), offset=3)",
     "lambda r: r.tolist() == [3, 2, 1, 0]"),
    ("take-uint64-in-bounds", "ea.ops.take(mx.arange(10), mx.array(np.array([9, 0], dtype=np.uint64)))",
     "lambda r: r.tolist() == [9, 0]"),
    ("take-negative-in-bounds", "ea.ops.take(mx.arange(10), mx.array([-1, -10]))",
     "lambda r: r.tolist() == [9, 0]"),
    # The most negative int divided by -1: x86's idiv traps (SIGFPE); numpy's answers.
    ("floor-divide-int32-min-by-minus-one",
     "ea.ops.floor_divide(mx.array([-2**31, 7, -7, 5]), mx.array([-1, -1, 2, 0]))",
     "lambda r: r.dtype == mx.int32 and r.tolist() == [-2**31, -7, -4, 0]"),
    ("floor-divide-int64-min-by-minus-one",
     "ea.ops.floor_divide(mx.array(np.array([-2**63, 9], dtype=np.int64)), mx.array(np.array([-1, -2], dtype=np.int64)))",
     "lambda r: r.dtype == mx.int64 and r.tolist() == [-2**63, -5]"),
    ("remainder-int32-min-by-minus-one",
     "ea.ops.remainder(mx.array([-2**31, 7, -7]), mx.array([-1, -1, 3]))",
     "lambda r: r.dtype == mx.int32 and r.tolist() == [0, 0, 2]"),
    ("floor-divide-by-uint32-max-is-not-minus-one",
     "ea.ops.floor_divide(mx.array([-5]), mx.array(np.array([2**32 - 1], dtype=np.uint32)))",
     "lambda r: r.dtype == mx.int64 and r.tolist() == [-1]"),
    ("quantized-matmul-no-output-columns",
     "ea.ops.quantized_matmul(mx.ones((2, 64)), mx.ones((0, 8), dtype=mx.uint32), mx.ones((0, 1)), "
     "mx.ones((0, 1)), group_size=64, bits=4)", "lambda r: r.shape == (2, 0)"),
    ("check-bounds-slices-in-bounds",
     "ea.ops.submit('check_bounds', [mx.array([0, 2, -2, -4])], size=4, op='gather', extent=2)",
     "lambda r: r.tolist() == [0, 2, -2, -4]"),
    ("conv-empty-output-channels", "ea.ops.conv_general(mx.ones((1, 8, 4)), mx.ones((0, 3, 4)))",
     "lambda r: r.shape == (1, 6, 0)"),
]


@pytest.mark.parametrize("expr, check, backend", in_turn(RESULTS))
def test_hostile_input_gets_the_right_answer(expr, check, backend):
    run_case(expr, "None", check=check, setup="ea.ops.set_bounds_checks(True)", backend=backend)


def test_second_sum_of_empty_transposed_array_does_not_hang():
    # MLX's CPU reduction of an empty, transposed array can loop forever
    # (the second sum of a (0, 2, 5, 3) array transposed to (0, 5, 2, 3)).
    setup = """
    x = mx.zeros((0, 2, 5, 3)).transpose(0, 2, 1, 3)
    y = mx.zeros((2, 0, 3)).transpose(1, 0, 2)
    for _ in range(3):
        for name in ("sum", "prod", "mean", "all", "any"):
            r = await getattr(ea.ops, name)(x, axis=0, keepdims=True, queue=q)
            assert r.shape == (1, 5, 2, 3), r.shape
            r = await getattr(ea.ops, name)(y, axis=0, queue=q)
            assert r.shape == (2, 3), r.shape
        assert (await ea.ops.sum(x, axis=0, keepdims=True, queue=q)).sum().item() == 0
    """
    run_case("ea.ops.prod(x, axis=0, keepdims=True)", "None", setup=setup,
             check="lambda r: r.shape == (1, 5, 2, 3) and bool(mx.all(r == 1))", timeout=20, backend="trio")


def test_memory_limit_lowers_the_allocation_limit():
    setup = """
    previous = ea.memory.set_memory_limit(1 << 30)
    assert (await ea.ops.ones(shape=(1024, 1024), queue=q)).shape == (1024, 1024)
    """
    # 4 GiB of float32 under a 1 GiB limit: refused instead of a SIGSEGV.
    run_case("ea.ops.ones(shape=(2**16, 2**14))", "MLXRuntimeError", "allocation limit", setup=setup,
             backend="uvloop")


def test_lazy_inputs_are_checked_at_their_own_sizes():
    # An op on a lazy input checks only the nodes it adds, and still refuses a huge one.
    setup = """
    lazy = await ea.ops.ones(shape=(8, 8), lazy=True, queue=q)
    assert (await ea.ops.sum(lazy, queue=q)).item() == 64
    """
    run_case("ea.ops.tile(lazy, (2**14, 2**14))", "MLXRuntimeError", "allocation limit", setup=setup,
             backend="trio")


def test_gather_slice_past_the_end_is_refused_with_bounds_checks():
    # In bounds index 3, slice of 2 rows of a 4-row array: MLX reads past the end (heap garbage).
    run_case("ea.ops.gather(mx.arange(16).reshape(4, 4), [mx.array([3])], axes=[0], slice_sizes=[2, 4])",
             "MLXIndexError", setup="ea.ops.set_bounds_checks(True)", backend="uvloop")


def test_live_arrays_count_against_the_allocation_limit():
    # Two 16 GB results on a 23 GB machine ended the process: live arrays count too.
    setup = """
    ea.memory.set_memory_limit(1 << 30)
    held = await ea.ops.ones(shape=(150, 2**20), queue=q)  # 600 MB, kept alive
    """
    run_case("ea.ops.ones(shape=(150, 2**20), queue=q)", "MLXRuntimeError", "held by live arrays", setup=setup,
             backend="trio")
