"""``mx.fast`` kernels as awaitables on the owning queue.

Written by hand (several table ops behind one mlx function); the signatures
follow mlx's, with these documented extras: `eps` and `weight` have
defaults; rope takes ``layout=`` and per-token positions as `offset`;
scaled_dot_product_attention takes ``key_mask=``. Every function takes mlx's
``stream=`` and the runtime keywords (queue=, device=, lazy=, nowait=,
check_finite=).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from ._adapters import OptionTypeError, mlx_type_error
from ._devices import stream_device
from ._errors import InvalidArgument, MLXValueError
from ._submit import submit


def _arrays(*values) -> None:
    """mlx's ``array`` (and ``array | None``) parameters: its binding takes an mx.array and nothing
    else (no NumPy array, no Python scalar); any other is an OptionTypeError, answered with mlx's TypeError."""
    for value in values:
        if value is not None and not isinstance(value, mx.array):
            raise OptionTypeError(f"expects an mx.array, got {type(value).__name__}")


def _stream(stream, kwargs: dict) -> dict:
    """mlx's ``stream=`` picks a queue of that stream's device, like ``device=``."""
    kwargs["device"] = stream_device(stream, kwargs.get("device"))
    return kwargs


def rms_norm(x, weight=None, eps: float = 1e-5, *, stream=None, **kwargs: Any):
    """``mx.fast.rms_norm``; `weight` None means no scaling."""
    try:
        if type(x) is not mx.array or (weight is not None and type(weight) is not mx.array):
            _arrays(x, weight)
        kwargs = _stream(stream, kwargs)
        scale = mx.ones((x.shape[-1],), dtype=x.dtype) if weight is None else weight
        return submit("fast_rms_norm", [x, scale], eps=eps, **kwargs)
    except OptionTypeError as error:  # an option of a type mlx's binding refuses: its message
        raise mlx_type_error("mx.fast.rms_norm", rms_norm, dict(x=x, weight=weight, eps=eps, stream=stream),
                             error) from None


def layer_norm(x, weight=None, bias=None, eps: float = 1e-5, *, stream=None, **kwargs: Any):
    """``mx.fast.layer_norm``, with or without bias."""
    try:
        _arrays(x, weight, bias)
        kwargs = _stream(stream, kwargs)
        scale = mx.ones((x.shape[-1],), dtype=x.dtype) if weight is None else weight
        if bias is None:
            return submit("fast_layer_norm_no_bias", [x, scale], eps=eps, **kwargs)
        return submit("fast_layer_norm", [x, scale, bias], eps=eps, **kwargs)
    except OptionTypeError as error:  # an option of a type mlx's binding refuses: its message
        raise mlx_type_error("mx.fast.layer_norm", layer_norm,
                             dict(x=x, weight=weight, bias=bias, eps=eps, stream=stream), error) from None


def rope(a, dims: int, *, traditional: bool, base: float | None, scale: float, offset=0,
         freqs=None, stream=None, layout: str = "BHTD", **kwargs: Any):
    """``mx.fast.rope``: `offset` an int, per-batch offsets {B}, per-token positions {B, T}; or `freqs`.

    MLX rotates along the second-to-last axis, the sequence axis of a
    {B, H, T, D} input. Given a {B, T, H, D} input it would silently rotate
    heads as if they were positions; say ``layout="BTHD"`` and the sequence
    axis is moved into place and back (three fused lazy jobs on one queue).
    """
    try:
        x = a
        _arrays(a, freqs)
        kwargs = _stream(stream, kwargs)
        if layout not in ("BHTD", "BTHD"):
            raise InvalidArgument(f"[rope] layout must be 'BHTD' or 'BTHD', got {layout!r}")
        if base is None and freqs is None:  # mlx's checks, in its order and words
            raise MLXValueError("[rope] Neither base nor freqs has a value.")
        if base is not None and freqs is not None:
            raise MLXValueError("[rope] Only one of base or freqs can have a value.")
        if isinstance(offset, bool):
            raise MLXValueError("[rope] offset must be an integer but got type bool.")  # mlx's words
        if isinstance(offset, np.integer):
            offset = int(offset)  # an int, as mlx's binding takes it
        if layout == "BTHD":
            if x.ndim != 4:
                raise InvalidArgument(f"[rope] layout 'BTHD' needs a 4-D input, got shape {tuple(x.shape)}")
            return _rope_bthd(x, dims, traditional, base, scale, offset, freqs, kwargs)  # a coroutine: any backend
        if freqs is not None:
            if not isinstance(offset, int):
                raise InvalidArgument("[rope] precomputed freqs need an int offset")
            return submit("fast_rope_freqs", [x, freqs], dims=dims, traditional=traditional, scale=scale,
                          offset=offset, **kwargs)
        if isinstance(offset, mx.array) and offset.ndim == 2:  # a position per token, {B, T}
            return submit("fast_rope_positions", [x, offset], dims=dims, traditional=traditional, base=base,
                          scale=scale, **kwargs)
        if isinstance(offset, int):
            return submit("fast_rope", [x], dims=dims, traditional=traditional, base=base, scale=scale,
                          offset=offset, **kwargs)
        return submit("fast_rope_offsets", [x, offset], dims=dims, traditional=traditional, base=base,
                      scale=scale, **kwargs)
    except OptionTypeError as error:  # an option of a type mlx's binding refuses: its message
        raise mlx_type_error("mx.fast.rope", rope, dict(a=a, dims=dims, traditional=traditional, base=base, scale=scale,
                                                     offset=offset, freqs=freqs, stream=stream), error) from None


async def _rope_bthd(x, dims, traditional, base, scale, offset, freqs, kwargs):
    lazy = kwargs.pop("lazy", False)
    moved = await submit("swapaxes", [x], axis1=1, axis2=2, lazy=True, **kwargs)
    kwargs.pop("queue", None)  # the rest follows the lazy array's owner
    rotated = await rope(moved, dims, traditional=traditional, base=base, scale=scale, offset=offset,
                         freqs=freqs, lazy=True, **kwargs)
    return await submit("swapaxes", [rotated], axis1=1, axis2=2, lazy=lazy, **kwargs)


def swiglu(gate, up, /, *, stream=None, **kwargs: Any):
    """``silu(gate) * up`` in one job (the gated MLP activation)."""
    kwargs = _stream(stream, kwargs)
    return submit("fast_swiglu", [gate, up], **kwargs)


def scaled_dot_product_attention(q, k, v, *, scale: float, mask=None, sinks=None, force_fused: bool = False,
                                 stream=None, key_mask=None, **kwargs: Any):
    """``mx.fast.scaled_dot_product_attention``: `mask` None, "causal" or an additive/boolean array;
    `sinks` optional attention sinks; ``mask="causal"`` with `key_mask` {B, L} (True = attend)
    also hides padded keys. Grouped-query attention works as in MLX. `force_fused` is accepted
    for mlx's signature; MLX picks the kernel either way here."""
    try:
        _arrays(q, k, v, sinks)
        kwargs = _stream(stream, kwargs)
        if key_mask is not None:
            if mask != "causal" or sinks is not None:
                raise InvalidArgument("[scaled_dot_product_attention] key_mask goes with mask='causal' and no sinks")
            return submit("fast_sdpa_causal_key_mask", [q, k, v, key_mask], scale=scale, **kwargs)
        if mask is not None and not isinstance(mask, (str, mx.array)):
            raise OptionTypeError(f"[scaled_dot_product_attention] mask must be None, 'causal' or an array, got {mask!r}")
        if isinstance(mask, str) and mask != "causal":  # mlx's binding, its own words ("" too)
            raise MLXValueError(f"[scaled_dot_product_attention] invalid mask option '{mask}'. Must be 'causal', or an array.")
        if isinstance(mask, mx.array):
            if sinks is not None:
                raise InvalidArgument("[scaled_dot_product_attention] array masks with sinks are not supported here")
            return submit("fast_sdpa_masked", [q, k, v, mask], scale=scale, **kwargs)
        if sinks is not None:
            return submit("fast_sdpa_sinks", [q, k, v, sinks], scale=scale, mask=mask or "", **kwargs)
        return submit("fast_sdpa", [q, k, v], scale=scale, mask=mask or "", **kwargs)
    except OptionTypeError as error:  # an option of a type mlx's binding refuses: its message
        raise mlx_type_error("mx.fast.scaled_dot_product_attention", scaled_dot_product_attention,
                             dict(q=q, k=k, v=v, scale=scale, mask=mask, sinks=sinks, force_fused=force_fused,
                                  stream=stream), error) from None
