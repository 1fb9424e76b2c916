"""Fuzz every op of the table with random shapes, dtypes and hostile option values.

Hypothesis draws cases here; a child interpreter runs them one by one on one
queue, so a crash or a hang in MLX (or in the shim) fails the test with the
case that caused it instead of killing the test run. A case passes when the
op returns, or raises an ordinary exception with a message, and the queue
then still runs a job. Any crash found here becomes a case in
tests/test_hostile_ops.py.

`EMLX_FUZZ_EXAMPLES` sets the number of cases (`make fuzz` runs many more).
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

EXAMPLES = int(os.environ.get("EMLX_FUZZ_EXAMPLES", "120"))
CASE_TIMEOUT = 20  # seconds: a case that runs longer counts as a hang

DTYPES = ["bool_", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16",
          "float32", "float64", "bfloat16", "complex64"]
HOSTILE_INTS = [0, -1, 2**31 - 1, -2**31, 2**31, -2**31 - 1, 2**32 + 1, 2**63 - 1, -2**63, 2**64, 10**30]
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
import asyncio, faulthandler, json, sys
import mlx.core as mx
import numpy as np
import emlx_async as ea
from emlx_async._op_table import OPS

# Keep fuzzed allocations small: the allocation limit follows MLX's memory limit.
ea.memory.set_memory_limit(1 << 28)
ea.ops.set_bounds_checks(True)  # without them MLX reads out of bounds by design
SPECS = {name: (arrays, params) for name, arrays, params, _ in OPS}
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

asyncio.run(main())
""".replace("CASE_TIMEOUT", str(CASE_TIMEOUT))


class Child:
    """The interpreter that runs cases; restarted after it dies."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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
small_dims = st.lists(st.one_of(st.integers(0, 4), st.sampled_from([8, 16, 32, 64])), min_size=0, max_size=4)


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
    "layout": st.sampled_from(["contiguous", "contiguous", "transposed"]),
    "values": st.sampled_from(["normal", "small", "small", "edge"]),
})


@st.composite
def cases(draw):
    name, arrays, params, _ = draw(st.sampled_from(OPS))
    count = draw(st.integers(0, 6)) if arrays == VARIADIC else arrays
    specs = draw(st.lists(array_spec, min_size=count, max_size=count))
    # Related shapes are likelier to pass MLX's own checks and reach the kernels.
    if specs and draw(st.booleans()):
        for spec in specs[1:]:
            spec["shape"] = list(specs[0]["shape"])
    options = {}
    for pname, kind, _default in params:
        if draw(st.booleans()):
            value = draw(option(pname, kind))
            options[pname] = value
    return {"op": name, "arrays": specs, "options": options}


@pytest.fixture
def child():
    runner = Child()
    yield runner
    runner.close()


def test_fuzz_every_op_survives_hostile_arguments(child):
    seen: dict[str, int] = {}

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
    @given(case=cases())
    def run(case):
        out = child.run(case)
        seen[out["status"]] = seen.get(out["status"], 0) + 1
        if out["status"] == "raised":
            # A clear error: an ordinary exception with a message.
            assert out["type"] not in ("SystemError", "MemoryError") and out["message"].strip(), (case, out)
            assert "bad_cast" not in out["message"] and "unknown C++ exception" not in out["message"], (case, out)

    run()
    assert sum(seen.values()) > 0
