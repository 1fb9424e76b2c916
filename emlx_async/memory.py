"""MLX memory control. These act on process-wide allocator state, so they
are plain functions safe to call from the loop (no queue is involved)."""

from __future__ import annotations

import operator
from typing import Any

import mlx.core as mx

from ._dtypes import INT_RANGES
from ._errors import InvalidArgument, InvalidArgumentType


def memory_info() -> dict[str, int]:
    """Bytes: ``active`` (in use by arrays), ``peak`` (since the last reset), ``cache`` (held for reuse)."""
    return {"active": mx.get_active_memory(), "peak": mx.get_peak_memory(), "cache": mx.get_cache_memory()}


def clear_cache() -> None:
    """Release the allocator's cached buffers."""
    mx.clear_cache()


def reset_peak_memory() -> None:
    mx.reset_peak_memory()


def set_memory_limit(limit: int) -> int:
    """Set the memory limit in bytes; returns the previous one."""
    return mx.set_memory_limit(_bytes("memory", limit))


def set_cache_limit(limit: int) -> int:
    """Set the cache limit in bytes; returns the previous one."""
    return mx.set_cache_limit(_bytes("cache", limit))


def _bytes(what: str, limit: Any) -> int:
    """`limit` as MLX's size_t: an int (a bool is not one: True set a 1-byte limit)."""
    if isinstance(limit, bool):
        raise InvalidArgumentType(f"{what} limit must be an int of bytes, got a bool")
    try:
        limit = operator.index(limit)
    except TypeError:
        raise InvalidArgumentType(f"{what} limit must be an int of bytes, got {type(limit).__name__}") from None
    if not 0 <= limit <= INT_RANGES[mx.uint64][1]:
        raise InvalidArgument(f"{what} limit must be non-negative and fit 64 bits, got {limit}")
    return limit
