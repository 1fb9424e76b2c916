"""Fuzz every op of the table with random shapes, dtypes and hostile option values.

Hypothesis draws cases here; a child interpreter runs them one by one on one
queue, so a crash or a hang in MLX (or in the shim) fails the test with the
case that caused it instead of killing the test run. A case passes when the
op returns, or raises an ordinary exception with a message, and the queue
then still runs a job. Any crash found here becomes a case in
tests/ops/test_hostile_ops.py.

There is one child per event loop (asyncio, uvloop, trio); the ops take
them in turn.

Without `EMLX_FUZZ_EXAMPLES` the suite runs a fixed, short set of cases per
op; with it (`make fuzz` sets 300) each op gets that many fresh random cases.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emlx_async._op_table import OPS, VARIADIC
from support.helpers import BACKENDS

EXAMPLES = int(os.environ.get("EMLX_FUZZ_EXAMPLES", "8"))  # per op
# The short run in the normal suite draws the same cases every time; `make fuzz` explores.
DERANDOMIZE = "EMLX_FUZZ_EXAMPLES" not in os.environ
CASE_TIMEOUT = 45  # seconds: a case that runs longer counts as a hang (generous: shared CPUs)

DTYPES = ["bool_", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16",
          "float32", "float64", "bfloat16", "complex64"]
HOSTILE_INTS = [0, -1, 2**10, 2**16, 2**20, 2**30, -2**30, 2**31 - 1, -2**31, 2**31, -2**31 - 1, 2**32 + 1, 2**63 - 1,
                -2**63, 2**64, 10**30]
FLOATS = [0.0, 1.0, -1.0, 0.5, 2.0, 1e-5, 1e30, -1e30, math.nan, math.inf, -math.inf]
STRINGS = {
    "mode": ["affine", "mxfp4", "mxfp8", "nvfp4", "", "bogus"],
    "mask": ["", "causal", "array", "bogus"],
    "UPLO": ["L", "U", "X", ""],
    "subscripts": ["ij,jk->ik", "ii->i", "i,i->", "ij->ji", "...i,...i->...", "i->", "", "ij,->", "a->aa",
                   "ijk,ikl->ijl", "i,j->ij"],
    "op": ["take", "gather", ""],
}

CHILD = r"""
import faulthandler, json, sys
import mlx.core as mx
import numpy as np
import emlx_async as ea
from emlx_async._op_table import OPS

# Keep fuzzed allocations small: the allocation limit follows MLX's memory limit.
ea.memory.set_memory_limit(1 << 28)
ea.ops.set_bounds_checks(True)  # without them MLX reads out of bounds by design
SPECS = {op.name: (op.arrays, op.params) for op in OPS}
EDGE = {"bool_": [True, False], "float16": [0.0, -1.0, 65504.0, float("inf"), float("nan")],
        "bfloat16": [0.0, -1.0, float("inf"), float("nan")], "float32": [0.0, -1.0, float("inf"), float("nan")],
        "float64": [0.0, -1.0, float("inf"), float("nan")], "complex64": [0.0, 1j, float("nan")]}


def build(spec, seed):
    shape, dtype, layout, values = spec["shape"], spec["dtype"], spec["layout"], spec["values"]
    dt = getattr(mx, dtype)
    if layout == "transposed":
        shape = shape[::-1]
    n = int(np.prod(shape)) if shape else 1
    rng = np.random.default_rng(seed)
    if values == "small":
        data = rng.integers(-3, 4, size=n)
    elif values == "edge":
        if mx.issubdtype(dt, mx.integer):
            info = np.iinfo(np.dtype(dtype))
            data = rng.choice(np.array([0, 1, info.max, info.min, info.max - 1], dtype=np.dtype(dtype)), size=n)
        else:
            data = rng.choice(np.array(EDGE[dtype]), size=n)
    else:
        data = rng.normal(size=n) * 3
    if dtype in ("bfloat16",):
        x = mx.array(data.astype(np.float32)).astype(dt)
    elif dtype == "bool_":
        x = mx.array(np.asarray(data).astype(bool) if values != "edge" else data.astype(bool))
    else:
        x = mx.array(np.asarray(data).astype(np.dtype(dtype) if dtype != "complex64" else np.complex64))
    x = x.reshape(shape)
    if layout == "transposed":
        x = x.T
    mx.eval(x)
    return x


def call(q, name, arrays, options):
    o = dict(options, queue=q)
    if name in ("take", "take_along_axis", "put_along_axis"):
        return getattr(ea.ops, name)(*arrays, **o)
    if name in ("scatter", "scatter_add"):
        return getattr(ea.ops, name)(arrays[0], arrays[1:-1], arrays[-1], **o)
    if name == "gather":
        return ea.ops.gather(arrays[0], arrays[1:], **o)
    if name in ("quantize", "dequantize", "quantized_matmul"):
        return getattr(ea.ops, name)(*arrays, **o)
    # Index-taking variants, through the mlx-signature functions that check their indices.
    if name == "put_along_axis_flat":
        return ea.ops.put_along_axis(*arrays, None, queue=q)
    if name in ("gather_mm", "segmented_mm"):
        return getattr(ea.ops, name)(*arrays[:4 if name == "gather_mm" else 3], queue=q)
    if name == "gather_qmm":
        return ea.ops.gather_qmm(*arrays[:6], queue=q)
    return ea.ops.submit(name, arrays, **o)


async def main():
    async with ea.Runtime() as rt:
        q = rt.default_queue()
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            case = json.loads(line)
            faulthandler.dump_traceback_later(CASE_TIMEOUT, exit=True)
            try:
                arrays = [build(spec, k) for k, spec in enumerate(case["arrays"])]
                for k, spec in enumerate(case["arrays"]):
                    if spec["layout"] == "lazy":  # an unevaluated graph owned by the queue
                        arrays[k] = await ea.ops.copy(arrays[k], lazy=True, queue=q)
                options = {k: getattr(mx, v) if k == "dtype" and v is not None else v  # dtypes travel as names
                           for k, v in case["options"].items()}
                result = await call(q, case["op"], arrays, options)
                mx.eval(result)
                out = {"status": "ok"}
            except Exception as exc:
                out = {"status": "raised", "type": type(exc).__name__, "message": str(exc)[:300]}
            assert (await ea.ops.add(mx.array(1), 2, queue=q)).item() == 3, "the queue stopped working"
            faulthandler.cancel_dump_traceback_later()
            print(json.dumps(out), flush=True)

if sys.argv[1] == "trio":
    import trio
    trio.run(main)
elif sys.argv[1] == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    import asyncio
    asyncio.run(main())
""".replace("CASE_TIMEOUT", str(CASE_TIMEOUT))


class Child:
    """The interpreter that runs cases on one event loop (`backend`); restarted after it dies."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, self.backend], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        line = self.proc.stdout.readline()
        assert line and json.loads(line) == {"ready": True}, self.proc.stderr.read()

    def run(self, case: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:  # the child died: crash, hang (its watchdog), or a dead queue
            self.proc.stdin.close()
            status = self.proc.wait()
            stderr = self.proc.stderr.read()
            self.proc.stdout.close()
            self.proc.stderr.close()
            self.proc = None
            pytest.fail(f"case killed the process (exit status {status}): {json.dumps(case)}\n{stderr[-3000:]}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
            self.proc.stdout.close()
            self.proc.stderr.close()
            self.proc = None


ints = st.one_of(st.integers(-3, 5), st.sampled_from(HOSTILE_INTS))
# Huge dimensions pass the size filter below only beside a zero one: empty arrays with extreme shapes.
small_dims = st.lists(st.one_of(st.integers(0, 4), st.sampled_from([8, 16, 32, 64]), st.sampled_from([2**20, 2**31 - 1])),
                      min_size=0, max_size=4)


def option(pname: str, kind: str):
    base = kind.partition(":")[0]
    if base in ("int", "int64"):
        return ints
    if base == "axis":
        return st.one_of(st.none(), ints)
    if base == "axes":
        return st.one_of(st.none(), st.lists(ints, max_size=4))
    if base in ("shape", "strides"):
        return st.lists(st.one_of(st.integers(-1, 5), st.sampled_from(HOSTILE_INTS)), max_size=5)
    if base == "bool":
        return st.booleans()
    if base == "float":
        return st.sampled_from(FLOATS)
    if base == "dtype":
        return st.one_of(st.none(), st.sampled_from(DTYPES))
    return st.sampled_from(STRINGS.get(pname, ["", "x"]))


array_spec = st.fixed_dictionaries({
    "shape": small_dims.filter(lambda s: math.prod(s) <= 4096),
    "dtype": st.sampled_from(DTYPES),
    "layout": st.sampled_from(["contiguous", "contiguous", "transposed", "lazy"]),
    "values": st.sampled_from(["normal", "small", "small", "edge"]),
})


def spec(shape, dtype="float32", values="normal", layout="contiguous") -> dict:
    return {"shape": list(shape), "dtype": dtype, "layout": layout, "values": values}


dim = st.integers(0, 4)
float_dtype = st.sampled_from(["float32", "float32", "float16", "bfloat16", "float64"])
index_dtype = st.sampled_from(["int32", "int32", "uint32", "int64", "uint64", "int8", "uint8"])


@st.composite
def structured(draw, name):
    """Arrays shaped the way op `name` wants them, and fitting options, so cases reach MLX's kernels.

    Returns (array specs, option hints), or (None, {}) for ops the generic cases serve well.
    """
    dt = draw(float_dtype)
    n, m, b = draw(dim), draw(dim), draw(dim)
    if name.startswith("linalg_"):
        batch = draw(st.sampled_from([[], [b]]))
        a = spec(batch + [n, n], dt)
        if name in ("linalg_solve", "linalg_solve_triangular"):
            return [a, spec(batch + [n] + draw(st.sampled_from([[], [m]])), dt)], {}
        return [a], {}
    if name.startswith("fast_sdpa") or name == "kv_cache_attention":
        heads_kv = draw(st.integers(0, 2))
        heads_q = heads_kv * draw(st.integers(1, 2))
        t, length, d = draw(st.integers(0, 3)), draw(st.integers(0, 4)), draw(st.sampled_from([0, 1, 4, 8]))
        if name == "kv_cache_attention":
            arrays = [spec([b, t, heads_q, d], dt), spec([b, t, heads_kv, d], dt), spec([b, t, heads_kv, d], dt),
                      spec([b, length, heads_kv, d], dt), spec([b, length, heads_kv, d], dt)]
            mask = draw(st.sampled_from([[], [spec([b, length], "bool_")]]))
            return arrays + mask, {"offset": draw(st.integers(-1, length))}
        q, kv = spec([b, heads_q, t, d], dt), spec([b, heads_kv, length, d], dt)
        extra = {"fast_sdpa_masked": [spec(draw(st.sampled_from([[t, length], [b, 1, t, length]])),
                                           draw(st.sampled_from(["bool_", dt])))],
                 "fast_sdpa_sinks": [spec([heads_q], dt)],
                 "fast_sdpa_causal_key_mask": [spec([b, length], "bool_")]}.get(name, [])
        return [q, kv, dict(kv)] + extra, {}
    if name.startswith("fast_rope"):
        d = draw(st.sampled_from([0, 1, 2, 4, 8]))
        x = spec([b, n, m, d], dt)
        extra = {"fast_rope_offsets": [spec([b], draw(index_dtype), "small")],
                 "fast_rope_freqs": [spec([d // 2], "float32")],
                 "fast_rope_positions": [spec([b, m], draw(index_dtype), "small")]}.get(name, [])
        return [x] + extra, {"dims": draw(st.sampled_from([d, d, d - 1, d // 2, 2 * d]))}
    if name in ("fast_rms_norm", "fast_layer_norm", "fast_layer_norm_no_bias"):
        d = draw(dim)
        return [spec([n, d], dt)] + [spec([d], dt)] * (2 if name == "fast_layer_norm" else 1), {}
    if name in ("quantize", "dequantize", "quantized_matmul"):
        k = draw(st.sampled_from([0, 32, 64, 128]))
        bits, group = draw(st.sampled_from([2, 4, 8])), draw(st.sampled_from([32, 64]))
        hints = {"bits": bits, "group_size": group, "mode": "affine"}
        if name == "quantize":
            return [spec([n, k], dt)], hints
        cols, groups = k * bits // 32, k // group
        w = [spec([n, cols], "uint32", "edge"), spec([n, groups], dt), spec([n, groups], dt)]
        return ([spec([m, k], dt)] if name == "quantized_matmul" else []) + w, hints
    if name == "conv_general":
        cin, groups = draw(st.integers(0, 4)), draw(st.integers(1, 2))
        x, w = spec([b, draw(dim) + 2, cin * groups], dt), spec([m * groups, draw(dim), cin], dt)
        return [x, w], {"groups": groups}
    if name == "einsum":
        return [spec([n, m], dt), spec([m, b], dt)], {"subscripts": "ij,jk->ik"}
    if name in ("take", "take_along_axis", "put_along_axis", "gather", "scatter", "scatter_add"):
        a = spec([n + 1, m + 1], draw(st.sampled_from(["float32", "int32", "bool_"])))
        idx = spec(draw(st.sampled_from([[2], [n + 1, m + 1], [1, 1]])), draw(index_dtype),
                   draw(st.sampled_from(["small", "small", "edge"])))
        axis = draw(st.sampled_from([0, 1, -1]))
        if name == "put_along_axis":
            return [a, idx, spec(idx["shape"], a["dtype"])], {"axis": axis}
        if name in ("scatter", "scatter_add"):
            return [a, idx, spec(idx["shape"] + [1, m + 1], a["dtype"])], {"axes": [0]}
        if name == "gather":
            return [a, idx], {"axes": [0], "slice_sizes": [1, draw(st.integers(0, m + 2))]}
        return [a, idx], {"axis": axis}
    return None, {}


REQUIRED = {"take_along_axis": "axis", "put_along_axis": "axis", "scatter": "axes", "scatter_add": "axes",
            "gather": "axes", "astype": "dtype", "view": "dtype", "expand_dims": "axis"}


SPECS = {op.name: (op.arrays, op.params) for op in OPS}


@st.composite
def cases(draw, name):
    arrays, params = SPECS[name]
    specs, hints = draw(structured(name)) if draw(st.booleans()) else (None, {})
    if specs is None:
        count = draw(st.integers(0, 6)) if arrays == VARIADIC else arrays
        specs = draw(st.lists(array_spec, min_size=count, max_size=count))
        # Related shapes and dtypes are likelier to pass MLX's own checks and reach the kernels.
        if specs and draw(st.booleans()):
            for other in specs[1:]:
                other["shape"] = list(specs[0]["shape"])
        if specs and draw(st.booleans()):
            for other in specs[1:]:
                other["dtype"] = specs[0]["dtype"]
    elif draw(st.integers(0, 2)) == 0:
        specs[0]["layout"] = draw(st.sampled_from(["transposed", "lazy"]))
    options = {}
    for pname, kind, _default in params:
        if pname in hints and draw(st.integers(0, 3)) > 0:
            options[pname] = hints[pname]
        elif REQUIRED.get(name) == pname or draw(st.integers(0, 3)) > 0:
            options[pname] = draw(option(pname, kind))
    if name == "gather" and "slice_sizes" not in options:
        options["slice_sizes"] = draw(st.lists(st.integers(0, 3), min_size=2, max_size=2))
    return {"op": name, "arrays": specs, "options": options}


@pytest.fixture(scope="module")
def children():
    runners = {backend: Child(backend) for backend in BACKENDS}
    for runner in runners.values():
        runner.start()  # before the per-test fd baselines (conftest.py: no_leaks)
    yield runners
    for runner in runners.values():
        runner.close()


@pytest.mark.parametrize("name, backend", [pytest.param(name, BACKENDS[i % len(BACKENDS)],
                                                         id=f"{name}-{BACKENDS[i % len(BACKENDS)]}")
                                           for i, name in enumerate(SPECS)])
def test_fuzz_op_survives_hostile_arguments(children, name, backend):
    child = children[backend]

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
    @given(case=cases(name))
    def run(case):
        out = child.run(case)
        if out["status"] == "raised":
            # A clear error: an ordinary exception with a message.
            assert out["type"] not in ("SystemError", "MemoryError") and out["message"].strip(), (case, out)
            assert "bad_cast" not in out["message"] and "unknown C++ exception" not in out["message"], (case, out)

    run()
