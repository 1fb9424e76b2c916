"""The op table itself: every entry exposed, and broadcasting against mlx.core."""

from __future__ import annotations

import asyncio

import mlx.core as mx
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import emlx_async as ea
from support.arrays import check


def test_every_table_op_is_exposed():
    from emlx_async._op_table import OPS

    exposed = set(ea.ops.names()) | {f"linalg_{n}" for n in dir(ea.linalg)} | {f"fft_{n}" for n in dir(ea.fft)}
    exposed |= {f"random_{n}" for n in dir(ea.random)}
    # mlx-signature variants, reached through the generated functions (emlx_async/_adapters.py)
    variants = {"pad", "pad_mode", "slice_dynamic", "slice_update_dynamic", "tensordot_axes", "linspace_endpoint",
                "nan_to_num_inf", "cumsum_dtype", "cumprod_dtype", "contiguous_col_major", "fft_any", "norm_ord",
                "norm_str", "random_permutation_n", "conv_nd", "conv_transpose_nd", "window", "atleast_nd",
                "fft_shift", "fft_freq", "concatenate_flat", "roll_axes", "put_along_axis_flat",
                "quantize_scaled", "dequantize_full"}
    fast = {"fast_rms_norm", "fast_layer_norm", "fast_layer_norm_no_bias", "fast_rope", "fast_rope_offsets",
            "fast_rope_freqs", "fast_sdpa", "fast_sdpa_masked", "fast_sdpa_sinks",
            "fast_rope_positions", "fast_swiglu", "fast_sdpa_causal_key_mask",
            "kv_cache_attention",  # ea.attention
            "check_bounds",  # internal: ea.ops.set_bounds_checks
            "replay", "replay_multi"}  # ea.trace's TracedFunction
    missing = {name for name, *_ in OPS} - exposed - fast - variants
    assert not missing
    assert ea._native.lib.emlx_op_count() == len(OPS)


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
    import pytest

    with pytest.raises(ValueError, match="non-negative"):
        ea.memory.set_cache_limit(-1)


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
