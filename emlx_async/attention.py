"""Fused KV-cache update + causal attention, one native job per decode step."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from .ops import submit


def kv_cache_attention(q: mx.array, k: mx.array, v: mx.array, k_cache: mx.array, v_cache: mx.array, /, *,
                       offset: int, scale: float, key_mask: mx.array | None = None, donate: bool = False,
                       **kwargs: Any):
    """Write `k`, `v` into preallocated caches at `offset`, then attend causally.

    Shapes: q {B, T, N_q, D}; k, v {B, T, N_kv, D}; caches {B, T_max, N_kv, D};
    `key_mask` {B, T_max} (True = attend) hides padded keys. Grouped-query
    attention works as in MLX (N_q a multiple of N_kv). Resolves to
    ``(out, k_cache', v_cache')`` with out {B, T, N_q, D}.

    With ``donate=True`` the caches are updated in place: the job takes the
    only reference to their buffers (so MLX reuses them), the awaitable
    resolves to ``out`` alone, and `k_cache` / `v_cache` hold the updated
    caches once it completes. Do not read them while the job is in flight.

    Example:
        >>> out = await ea.attention.kv_cache_attention(q, k, v, kc, vc, offset=t, scale=d ** -0.5, donate=True)
    """
    arrays = [q, k, v, k_cache, v_cache] + ([key_mask] if key_mask is not None else [])
    return submit("kv_cache_attention", arrays, offset=offset, scale=scale,
                  donate={3: 1, 4: 2} if donate else None, **kwargs)
