"""MLX memory control. These act on process-wide allocator state, so they
are plain functions safe to call from the loop (no queue is involved)."""

from __future__ import annotations

import mlx.core as mx


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
    if limit < 0:
        raise ValueError(f"memory limit must be non-negative, got {limit}")
    return mx.set_memory_limit(limit)


def set_cache_limit(limit: int) -> int:
    """Set the cache limit in bytes; returns the previous one."""
    if limit < 0:
        raise ValueError(f"cache limit must be non-negative, got {limit}")
    return mx.set_cache_limit(limit)
