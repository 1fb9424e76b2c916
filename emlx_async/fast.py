"""``mx.fast`` kernels as awaitables on the owning queue."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from .ops import submit


def rms_norm(x, weight=None, /, eps: float = 1e-5, **kwargs: Any):
    """``mx.fast.rms_norm``; `weight` None means no scaling."""
    weight = mx.ones((x.shape[-1],), dtype=x.dtype) if weight is None else weight
    return submit("fast_rms_norm", [x, weight], eps=eps, **kwargs)


def layer_norm(x, weight=None, bias=None, /, eps: float = 1e-5, **kwargs: Any):
    """``mx.fast.layer_norm``, with or without bias."""
    weight = mx.ones((x.shape[-1],), dtype=x.dtype) if weight is None else weight
    if bias is None:
        return submit("fast_layer_norm_no_bias", [x, weight], eps=eps, **kwargs)
    return submit("fast_layer_norm", [x, weight, bias], eps=eps, **kwargs)


def rope(x, dims: int, /, *, traditional: bool, base: float | None, scale: float, offset=0,
         freqs=None, **kwargs: Any):
    """``mx.fast.rope``: `offset` an int, or an array of per-batch offsets; or precomputed `freqs`.

    MLX rotates along the second-to-last axis (the sequence axis of a
    {B, H, T, D} input). A {B, T, H, D} input must be transposed first,
    otherwise heads are rotated as if they were positions; ``x.ndim == 4``
    inputs are taken as {B, H, T, D}, as MLX does.
    """
    if freqs is not None:
        if base is not None:
            raise ValueError("[rope] give either base or freqs, not both")
        if not isinstance(offset, int):
            raise ValueError("[rope] precomputed freqs need an int offset")
        return submit("fast_rope_freqs", [x, freqs], dims=dims, traditional=traditional, scale=scale,
                      offset=offset, **kwargs)
    if base is None:
        raise ValueError("[rope] base is required when freqs is not given")
    if isinstance(offset, int):
        return submit("fast_rope", [x], dims=dims, traditional=traditional, base=base, scale=scale,
                      offset=offset, **kwargs)
    return submit("fast_rope_offsets", [x, offset], dims=dims, traditional=traditional, base=base,
                  scale=scale, **kwargs)


def scaled_dot_product_attention(q, k, v, /, *, scale: float, mask=None, sinks=None, **kwargs: Any):
    """``mx.fast.scaled_dot_product_attention``: `mask` None, "causal" or an additive/boolean array;
    `sinks` optional attention sinks. Grouped-query attention works as in MLX."""
    if mask is not None and not isinstance(mask, (str, mx.array)):
        raise TypeError(f"[scaled_dot_product_attention] mask must be None, 'causal' or an array, got {mask!r}")
    if isinstance(mask, mx.array):
        if sinks is not None:
            raise ValueError("[scaled_dot_product_attention] array masks with sinks are not supported here")
        return submit("fast_sdpa_masked", [q, k, v, mask], scale=scale, **kwargs)
    if sinks is not None:
        return submit("fast_sdpa_sinks", [q, k, v, sinks], scale=scale, mask=mask or "", **kwargs)
    return submit("fast_sdpa", [q, k, v], scale=scale, mask=mask or "", **kwargs)
