"""mlx-lm's KV-cache options: what they refuse before any model runs."""

from __future__ import annotations

import pytest

from emlx_async.llm.cache_options import CacheOptions


@pytest.mark.parametrize("options, name", [(dict(kv_bits=4, kv_group_size=0), "kv_group_size"),
                                           (dict(kv_bits=4, kv_group_size=-32), "kv_group_size"),
                                           (dict(kv_bits=0), "kv_bits"), (dict(kv_bits=-1), "kv_bits")])
def test_quantization_options_must_be_positive(options, name):
    # A group size of 0 reached mlx's quantize, which divides by it: SIGFPE, the process gone.
    with pytest.raises(ValueError, match=f"{name} must be a positive int"):
        CacheOptions(**options)


def test_positive_options_are_left_to_mlx():
    assert CacheOptions(kv_bits=8, kv_group_size=64).describe() == "8-bit keys and values (group size 64)"


@pytest.mark.parametrize("value", [None, 64.0, "64", True])
def test_kv_group_size_takes_an_int_only(value):
    # None reached mlx-lm's quantize, which took its own default in silence; omitted, it is 64.
    with pytest.raises(ValueError, match=f"kv_group_size must be an int, got {value!r}"):
        CacheOptions(kv_bits=4, kv_group_size=value)
    assert CacheOptions(kv_bits=4).kv_group_size == 64
