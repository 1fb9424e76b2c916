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


def forward(model, token: mx.array, position: mx.array, caches) -> tuple[mx.array, list[mx.array]]:
    """Logits {1, V} of `token` {1, 1} at `position`, and the caches with its keys and values written."""
    inner = model.model
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
    return logits[:, -1, :], new_caches


def _with_weights(model, weights_as_inputs: bool, body: Callable[..., Any], n_fixed: int) -> Callable[..., Any]:
    """`body(*fixed)` as a step taking the model's weights after its `n_fixed` inputs when asked."""
    names = [name for name, _ in tree_flatten(model.parameters())]

    def step(*inputs: mx.array):
        if not weights_as_inputs:
            return body(*inputs)
        fixed, weights = inputs[:n_fixed], inputs[n_fixed:]
        if len(weights) != len(names):
            raise ValueError(f"the step takes the model's {len(names)} weights after the caches, got {len(weights)}")
        # Swap the given arrays in for the parameters while the graph is
        # built (traced: they become inputs), then put the model back.
        saved = model.parameters()
        model.update(tree_unflatten(list(zip(names, weights))))
        try:
            return body(*fixed)
        finally:
            model.update(saved)

    return step


def make_decode_step(model, *, weights_as_inputs: bool = False) -> Callable[..., Any]:
    """step(token, position, k0, v0, ...[, *weights]) -> (next_token {1}, k0', v0', ...) for an mlx-lm llama model."""
    layers = len(model.model.layers)

    def decode(token: mx.array, position: mx.array, *caches: mx.array):
        logits, new_caches = forward(model, token, position, caches)
        return (mx.argmax(logits, axis=-1).astype(mx.int32), *new_caches)

    return _with_weights(model, weights_as_inputs, decode, 2 + 2 * layers)


# ---- sampling inside the graph -------------------------------------------------

def sampling_inputs(temperature: float, top_p: float, top_k: int, vocab_size: int) -> list[mx.array]:
    """The sampler's options as the step's inputs: 1/temperature (0: greedy), top_p, top_k (0: off).

    1/temperature is computed in Python, as the Python sampler does, so both
    multiply the same float32.
    """
    inv_temperature = 0.0 if temperature == 0 else 1 / temperature
    return [mx.array(inv_temperature, dtype=mx.float32), mx.array(top_p, dtype=mx.float32),
            mx.array(top_k if 0 < top_k < vocab_size else 0, dtype=mx.int32)]


def sample(logits: mx.array, key: mx.array, inv_temperature: mx.array, top_p: mx.array,
           top_k: mx.array) -> tuple[mx.array, mx.array]:
    """(next token {1, 1} int32, next key) from `logits` {1, V}: greedy when 1/temperature is 0,
    else top-p, then top-k, then temperature (mlx-lm's order), drawn with `key`.

    The same math as the engine's Python sampler with the same key: top-p is
    mlx-lm's apply_top_p with top_p an input; top-k keeps the logprobs at or
    above the k-th largest (apply_top_k keeps exactly k, so they differ only
    when the k-th largest value is tied).
    """
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    # apply_top_p, top_p an input.
    sorted_logprobs = mx.sort(logprobs, axis=-1)
    sorted_probs = mx.exp(sorted_logprobs.astype(mx.float32))
    mass_above = mx.cumsum(sorted_probs, axis=-1, reverse=True, inclusive=False)
    total_mass = mass_above[..., :1] + sorted_probs[..., :1]
    num_dropped = (mass_above >= top_p * total_mass).sum(axis=-1, keepdims=True)
    threshold = mx.take_along_axis(sorted_logprobs, num_dropped, axis=-1)
    use_top_p = (top_p > 0) & (top_p < 1)
    logprobs = mx.where(use_top_p & (logprobs < threshold), -float("inf"), logprobs)
    # top-k: the k-th largest of what top-p left.
    vocab = logprobs.shape[-1]
    kth_index = mx.clip(vocab - top_k, 0, vocab - 1).astype(mx.int32).reshape(1, 1)
    kth = mx.take_along_axis(mx.sort(logprobs, axis=-1), kth_index, axis=-1)
    logprobs = mx.where((top_k > 0) & (logprobs < kth), -float("inf"), logprobs)
    # The Python sampler splits its key on every sampled step.
    pair = mx.random.split(key)
    drawn = mx.random.categorical(logprobs * inv_temperature, key=pair[1])
    greedy = inv_temperature == 0
    token = mx.where(greedy, mx.argmax(logits, axis=-1), drawn).astype(mx.int32).reshape(1, 1)
    return token, mx.where(greedy, key, pair[0])


def make_sampling_step(model, *, weights_as_inputs: bool = False) -> Callable[..., Any]:
    """step(k0, v0, ..., key, token, position, inv_temperature, top_p, top_k[, *weights])
    -> (next_token {1, 1}, key', k0', v0', ...): one decode step with the sampler inside.

    ``key`` is an ``mx.random.key`` ({2} uint32) and the options come from
    ``sampling_inputs``. Donate ``{0: 2, 1: 3, ..., 2 * layers: 1}`` to keep the
    caches and the key in the caller's arrays (they come first because the
    op path's donation mask names the first 64 inputs).
    """
    layers = len(model.model.layers)

    def decode(*inputs):
        caches, (key, token, position, inv_temperature, top_p, top_k) = inputs[:2 * layers], inputs[2 * layers:]
        logits, new_caches = forward(model, token, position, caches)
        next_token, next_key = sample(logits, key, inv_temperature, top_p, top_k)
        return (next_token, next_key, *new_caches)

    return _with_weights(model, weights_as_inputs, decode, 6 + 2 * layers)
