"""A llama decode step that can be traced once and replayed natively (ea.trace).

mlx-lm's own step keeps its KV cache in Python objects that grow; a traced
graph needs fixed shapes instead. This step takes the token, its position
(an int32 scalar array) and preallocated caches ``{1, N_kv, T_max, D}`` per
layer, writes the new keys and values at the position (a dynamic
slice_update), attends over the positions up to it (a mask), and returns the
greedy next token with the updated caches. Every shape is fixed, so
``await ea.trace(step, *decode_inputs(...))`` captures it, weights included
as constants, and each replay is one native job: no Python, no GIL.
Donating the caches (``donate={2: 1, 3: 2, ...}``: input 2 + i to output
1 + i) lets MLX write the new position into them in place.

Each worker that replays the step imports its own copy of the graph and of
its constants. With ``weights_as_inputs=True`` the weights are inputs
instead (``model_weights(model)``, passed after the caches), so every queue
shares the model's one copy.
"""

from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten


def _layout(model) -> tuple[int, int, int]:
    attn = model.model.layers[0].self_attn
    return len(model.model.layers), attn.n_kv_heads, attn.head_dim


def empty_caches(model, max_len: int, dtype=mx.float32) -> list[mx.array]:
    """Zeroed key and value caches, k0, v0, k1, v1, ... ({1, N_kv, max_len, D} each)."""
    layers, heads_kv, dim = _layout(model)
    return [mx.zeros((1, heads_kv, max_len, dim), dtype=dtype) for _ in range(2 * layers)]


def decode_inputs(model, max_len: int, token: int = 0, position: int = 0, dtype=mx.float32) -> list[mx.array]:
    """Example inputs of the step: token {1, 1}, position {}, then the caches."""
    return [mx.array([[token]], dtype=mx.int32), mx.array(position, dtype=mx.int32),
            *empty_caches(model, max_len, dtype)]


def model_weights(model) -> list[mx.array]:
    """The model's parameters in the order a ``weights_as_inputs`` step takes them."""
    return [value for _, value in tree_flatten(model.parameters())]


def make_decode_step(model, *, weights_as_inputs: bool = False) -> Callable[..., Any]:
    """step(token, position, k0, v0, ...[, *weights]) -> (next_token {1}, k0', v0', ...) for an mlx-lm llama model."""
    inner = model.model
    layers = len(inner.layers)
    names = [name for name, _ in tree_flatten(model.parameters())]

    def step(token: mx.array, position: mx.array, *rest: mx.array):
        if not weights_as_inputs:
            return decode(token, position, *rest)
        caches, weights = rest[:2 * layers], rest[2 * layers:]
        if len(weights) != len(names):
            raise ValueError(f"the step takes the model's {len(names)} weights after the caches, got {len(weights)}")
        # Swap the given arrays in for the parameters while the graph is
        # built (traced: they become inputs), then put the model back.
        saved = model.parameters()
        model.update(tree_unflatten(list(zip(names, weights))))
        try:
            return decode(token, position, *caches)
        finally:
            model.update(saved)

    def decode(token: mx.array, position: mx.array, *caches: mx.array):
        h = inner.embed_tokens(token)
        max_len = caches[0].shape[2]
        # Keys at positions after `position` are still zeros: hide them.
        visible = mx.arange(max_len, dtype=mx.int32) <= position
        start = mx.reshape(position, (1,))
        new_caches = []
        for i, layer in enumerate(inner.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).reshape(1, 1, attn.n_heads, -1).transpose(0, 2, 1, 3)
            k = attn.k_proj(x).reshape(1, 1, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
            v = attn.v_proj(x).reshape(1, 1, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
            q = attn.rope(q, offset=position)
            k = attn.rope(k, offset=position)
            k_cache = mx.slice_update(caches[2 * i], k.astype(caches[2 * i].dtype), start, axes=(2,))
            v_cache = mx.slice_update(caches[2 * i + 1], v.astype(caches[2 * i + 1].dtype), start, axes=(2,))
            out = mx.fast.scaled_dot_product_attention(q, k_cache.astype(q.dtype), v_cache.astype(q.dtype),
                                                       scale=attn.scale, mask=visible)
            h = h + attn.o_proj(out.transpose(0, 2, 1, 3).reshape(1, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            new_caches += [k_cache, v_cache]
        h = inner.norm(h)
        logits = model.lm_head(h) if hasattr(model, "lm_head") and not model.args.tie_word_embeddings \
            else inner.embed_tokens.as_linear(h)
        next_token = mx.argmax(logits[:, -1, :], axis=-1).astype(mx.int32)
        return (next_token, *new_caches)

    return step
