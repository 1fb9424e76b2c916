"""The op spec itself: every op reached where it says, the shim built from it, and broadcasting."""

from __future__ import annotations

import ast
import asyncio
import pathlib

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import emlx_async as ea
from emlx_async import (_generated_fft, _generated_linalg, _generated_ops, _generated_random, _op_table,
                        _submit)
from emlx_async._op_table import OPS
from support.arrays import check


PACKAGE = pathlib.Path(ea.__file__).parent
NAMESPACES = {"ops": ea.ops, "linalg": ea.linalg, "fft": ea.fft, "random": ea.random}


def _public(path: str):
    namespace, _, name = path.rpartition(".")
    return getattr(NAMESPACES[namespace or "ops"], name, None)


def _adapter_strings() -> dict[str, set[str]]:
    """Each function of _adapters.py: the string constants it and the module functions it calls hold."""
    tree = ast.parse((PACKAGE / "_adapters.py").read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    own = {name: {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
           for name, node in functions.items()}
    calls = {name: {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                    and n.func.id in functions} for name, node in functions.items()}
    reached = {}
    for name in functions:
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo += calls[current]
        reached[name] = set().union(*(own[f] for f in seen))
    return reached


def _module_strings(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_every_op_is_reached_where_its_spec_says():
    """Each op's `mlx` functions exist and submit it; each `via` submits it by name."""
    adapters = _adapter_strings()
    for op in OPS:
        for fn in op.mlx:
            assert _public(fn.path) is not None, f"{op.name}: mx.{fn.path} is not generated"
            if fn.adapter:
                assert fn.adapter in adapters, f"{op.name}: no adapter _adapters.{fn.adapter}"
                assert op.name in adapters[fn.adapter], f"{op.name}: _adapters.{fn.adapter} never submits it"
        for where in op.via:
            if where == "submit":  # only through ea.ops.submit, by name
                assert op.name in _submit._OPS
            elif where.startswith("_adapters."):
                assert op.name in adapters[where.split(".", 1)[1]], f"{op.name}: {where} never submits it"
            else:
                assert op.name in _module_strings(where), f"{op.name}: {where}.py never submits it"


def test_every_generated_function_comes_from_the_spec():
    """No public mlx-signature function without an op spec (or an at-call entry) behind it."""
    declared = {fn.path for op in OPS for fn in op.mlx} | set(_op_table.ANSWERED_AT_CALL)
    generated = {(f"{ns}." if ns != "ops" else "") + name
                 for ns, module in (("ops", _generated_ops), ("linalg", _generated_linalg), ("fft", _generated_fft),
                                    ("random", _generated_random)) for name in module.__all__}
    assert generated == declared


def test_the_shim_was_built_from_this_spec():
    assert ea._native.lib.emlx_op_count() == len(OPS)
    assert ea._native.ffi.string(ea._native.lib.emlx_op_table_digest()).decode() == _op_table.dispatch_digest()
    # the digest covers what the C++ dispatch is generated from: an op's expression, kinds and order
    before, ops = _op_table.dispatch_digest(), list(OPS)
    assert _op_table.dispatch_digest(ops) == before
    for changed in ([ops[0]._replace(cpp="mx::negative(x0, s)")] + ops[1:], [ops[1], ops[0]] + ops[2:],
                    [ops[0]._replace(params=(("k", "int64", 0),))] + ops[1:], ops[:-1]):
        assert _op_table.dispatch_digest(changed) != before
    python_only = [ops[0]._replace(outputs=_op_table.TUPLE, mlx=(), via=("submit",))] + ops[1:]
    assert _op_table.dispatch_digest(python_only) == before  # facts only Python uses need no rebuild


def test_outputs_follow_the_spec():
    """Results come back as the spec's outputs say: a list, a tuple, or one array."""
    async def run():
        async with ea.Runtime():
            parts = await ea.ops.split(mx.arange(6), 3)
            lo_hi = await ea.ops.minmax(mx.arange(6))
            one = await ea.ops.atleast_1d(mx.array(1))
            several = await ea.ops.atleast_1d(mx.array(1), mx.array(2))
            return parts, lo_hi, one, several

    parts, lo_hi, one, several = asyncio.run(run())
    spec = {op.name: op.outputs for op in OPS}
    assert spec["split"] == _op_table.LIST and isinstance(parts, list) and len(parts) == 3
    assert spec["minmax"] == _op_table.TUPLE and isinstance(lo_hi, tuple) and len(lo_hi) == 2
    assert spec["atleast_nd"] == _op_table.LIST_OR_ARRAY
    assert isinstance(one, mx.array) and isinstance(several, list) and len(several) == 2


def test_parameter_kinds_are_described_once():
    """The encoder's ranges, rules and words are the spec's KINDS and RULES; the spec refuses unknown kinds."""
    assert _submit._KIND_WORDS == {kind: spec.words for kind, spec in _op_table.KINDS.items()}
    assert _submit._INT_RANGES["shape"] == ("a 32-bit int", -2**31, 2**31 - 1)
    assert _submit._INT_RANGES["strides"] == ("a 64-bit int", -2**63, 2**63 - 1)
    assert set(_submit._RULES) == set(_op_table.RULES)
    for rule, (words, condition) in _op_table.RULES.items():
        assert _submit._RULES[rule][0] == words
        assert [_submit._RULES[rule][1](v) for v in (-1, 0, 1)] == [eval(condition, {"v": v}) for v in (-1, 0, 1)]  # noqa: S307
    for bad in ("float:positive", "bool:required", "int:even", "complex"):
        with pytest.raises(ValueError, match="op spec"):
            _op_table.op("bad", 1, [("x", bad, 0)], "x0", via=("submit",))
    with pytest.raises(ValueError, match="neither"):
        _op_table.op("bad", 1, [], "x0")
    with pytest.raises(ValueError, match="must be nonzero, got 0"):
        ea.ops.submit("conv_general", [mx.ones((1, 4, 1)), mx.ones((1, 1, 1))], groups=0)


shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape_a=shapes, shape_b=shapes, name=st.sampled_from(["add", "multiply", "maximum", "greater", "subtract"]))
def test_binary_broadcasting_matches_mlx(shape_a, shape_b, name):
    a = mx.arange(int(np.prod(shape_a)), dtype=mx.float32).reshape(shape_a)
    b = mx.ones(shape_b) * 2
    mx.eval(a, b)

    async def run():
        async with ea.Runtime() as runtime:
            await check(lambda: getattr(ea.ops, name)(a, b, queue=runtime.default_queue()),
                        lambda: getattr(mx, name)(a, b))

    asyncio.run(run())


def test_memory_controls_return_previous_values():
    info = ea.memory.memory_info()
    assert set(info) == {"active", "peak", "cache"} and all(v >= 0 for v in info.values())
    previous = ea.memory.set_cache_limit(1 << 20)
    assert ea.memory.set_cache_limit(previous) == 1 << 20
    previous = ea.memory.set_memory_limit(1 << 34)
    assert ea.memory.set_memory_limit(previous) == 1 << 34
    ea.memory.reset_peak_memory()
    ea.memory.clear_cache()
    with pytest.raises(ValueError, match="non-negative"):
        ea.memory.set_cache_limit(-1)
    with pytest.raises(ValueError, match="fit 64 bits"):
        ea.memory.set_memory_limit(2**70)
    for bad in (True, "1", None, 1.5):  # True set a 1-byte limit; the others failed inside the comparison
        with pytest.raises(TypeError, match="memory limit must be an int of bytes"):
            ea.memory.set_memory_limit(bad)
    assert ea.memory.set_memory_limit(np.int64(1 << 34)) == previous
    assert ea.memory.set_memory_limit(previous) == 1 << 34


def test_generated_functions_reach_submit_by_import():
    """No import-time injection: _adapters imports the submit path; fft, linalg and random never import ops."""
    import ast
    import pathlib

    from emlx_async import _adapters, _submit

    assert _adapters.submit is _submit.submit and not hasattr(_adapters, "bind")
    package = pathlib.Path(ea.__file__).parent
    for name in ("fft", "linalg", "random"):
        tree = ast.parse((package / f"{name}.py").read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for alias in node.names} | {node.module for node in ast.walk(tree)
                                                if isinstance(node, ast.ImportFrom) and node.module}
        assert "ops" not in imported, f"{name}.py imports ops"


def test_a_shim_from_another_spec_is_refused_at_import():
    """Op codes are spec positions: a shim whose digest differs must not run ops (a reorder kept the count)."""
    import subprocess
    import sys

    # the spec module loaded first, with another digest, then the package on top of it
    code = ("import importlib.util, sys\n"
            f"found = importlib.util.spec_from_file_location('emlx_async._op_table', {_op_table.__file__!r})\n"
            "spec = importlib.util.module_from_spec(found)\n"
            "found.loader.exec_module(spec)\n"
            "spec.dispatch_digest = lambda ops=None: 'another spec'\n"
            "sys.modules['emlx_async._op_table'] = spec\n"
            "try:\n"
            "    import emlx_async\n"
            "except ImportError as error:\n"
            "    print('refused:', error)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused: emlx_async's shim was built from a different op spec" in done.stdout, done.stderr
