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

from collections.abc import Sequence
from typing import Any, Callable

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten


def layout(model) -> tuple[int, int, int]:
    """(layers, key-value heads, head size) of an mlx-lm llama model."""
    attn = model.model.layers[0].self_attn
    return len(model.model.layers), attn.n_kv_heads, attn.head_dim


def empty_caches(model, max_len: int, dtype=mx.float32, rows: int = 1) -> list[mx.array]:
    """Zeroed key and value caches, k0, v0, k1, v1, ... ({rows, N_kv, max_len, D} each)."""
    layers, heads_kv, dim = layout(model)
    return [mx.zeros((rows, heads_kv, max_len, dim), dtype=dtype) for _ in range(2 * layers)]


def example_caches(model, max_len: int, dtype=mx.float32, rows: int = 1) -> list[mx.array]:
    """Stand-ins of the caches' shape and dtype for tracing: one zero broadcast, so
    tracing a long batched cache allocates nothing."""
    layers, heads_kv, dim = layout(model)
    zero = mx.zeros((1, 1, 1, 1), dtype=dtype)
    return [mx.broadcast_to(zero, (rows, heads_kv, max_len, dim)) for _ in range(2 * layers)]


def decode_inputs(model, max_len: int, token: int = 0, position: int = 0, dtype=mx.float32) -> list[mx.array]:
    """Example inputs of the step: token {1, 1}, position {}, then the caches."""
    return [mx.array([[token]], dtype=mx.int32), mx.array(position, dtype=mx.int32),
            *empty_caches(model, max_len, dtype)]


def model_weights(model) -> list[mx.array]:
    """The model's parameters in the order a ``weights_as_inputs`` step takes them."""
    return [value for _, value in tree_flatten(model.parameters())]


def forward(model, token: mx.array, position: mx.array, caches) -> tuple[mx.array, list[mx.array]]:
    """Logits {B, V} of `token` {B, 1} at `position` ({} or {B}: each row's own), and
    the caches {B, N_kv, T, D} with the new keys and values written at it."""
    inner = model.model
    rows = token.shape[0]
    h = inner.embed_tokens(token)
    max_len = caches[0].shape[2]
    positions = mx.reshape(position, (-1,))
    # Keys at positions after a row's own are still zeros (or an earlier
    # request's): hide them.
    visible = (mx.arange(max_len, dtype=mx.int32)[None] <= positions[:, None]).reshape(rows, 1, 1, max_len)
    if rows == 1:
        write = _write_at(mx.reshape(position, (1,)))
    else:
        write = _write_rows(positions)
    new_caches = []
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).reshape(rows, 1, attn.n_heads, -1).transpose(0, 2, 1, 3)
        k = attn.k_proj(x).reshape(rows, 1, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = attn.v_proj(x).reshape(rows, 1, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q = attn.rope(q, offset=position)
        k = attn.rope(k, offset=position)
        k_cache, v_cache = write(caches[2 * i], k), write(caches[2 * i + 1], v)
        out = mx.fast.scaled_dot_product_attention(q, k_cache.astype(q.dtype), v_cache.astype(q.dtype),
                                                   scale=attn.scale, mask=visible)
        h = h + attn.o_proj(out.transpose(0, 2, 1, 3).reshape(rows, 1, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        new_caches += [k_cache, v_cache]
    h = inner.norm(h)
    logits = model.lm_head(h) if hasattr(model, "lm_head") and not model.args.tie_word_embeddings \
        else inner.embed_tokens.as_linear(h)
    return logits[:, -1, :], new_caches


def _write_at(start: mx.array) -> Callable[[mx.array, mx.array], mx.array]:
    """One row: a dynamic slice_update at `start` {1} (in place when the cache is donated)."""
    return lambda cache, new: mx.slice_update(cache, new.astype(cache.dtype), start, axes=(2,))


def _write_rows(positions: mx.array) -> Callable[[mx.array, mx.array], mx.array]:
    """Each row at its own position: a scatter along the time axis (in place when donated)."""
    def write(cache: mx.array, new: mx.array) -> mx.array:
        index = mx.broadcast_to(positions.reshape(-1, 1, 1, 1), new.shape)
        return mx.put_along_axis(cache, index, new.astype(cache.dtype), axis=2)

    return write


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
    return [mx.array(value, dtype=dtype)
            for value, dtype in zip(_option_values(temperature, top_p, top_k, vocab_size), _OPTION_DTYPES)]


def sampling_rows(options: Sequence[tuple[float, float, int]], vocab_size: int) -> list[mx.array]:
    """``sampling_inputs`` for a batch: each option as a {B} array, one entry per row."""
    columns = zip(*(_option_values(*row, vocab_size) for row in options))
    return [mx.array(list(column), dtype=dtype) for column, dtype in zip(columns, _OPTION_DTYPES)]


_OPTION_DTYPES = (mx.float32, mx.float32, mx.int32)


def _option_values(temperature: float, top_p: float, top_k: int, vocab_size: int) -> tuple[float, float, int]:
    return 0.0 if temperature == 0 else 1 / temperature, top_p, top_k if 0 < top_k < vocab_size else 0


def sample(logits: mx.array, key: mx.array, inv_temperature: mx.array, top_p: mx.array,
           top_k: mx.array) -> tuple[mx.array, mx.array]:
    """(next tokens {B, 1} int32, next keys) from `logits` {B, V}: greedy where 1/temperature
    is 0, else top-p, then top-k, then temperature (mlx-lm's order), each row
    drawn with its own key.

    `key` is one key {2} (B = 1) or a key per row {B, 2}; the options are
    scalars or {B}. The same math as the engine's Python sampler with the
    same key: top-p is mlx-lm's apply_top_p with top_p an input; top-k keeps
    the logprobs at or above the k-th largest (apply_top_k keeps exactly k,
    so they differ only when the k-th largest value is tied).
    """
    rows, vocab = logits.shape
    inv_temperature, top_p, top_k = (mx.reshape(x, (-1, 1)) for x in (inv_temperature, top_p, top_k))
    keys = mx.reshape(key, (-1, 2))
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
    # top-k: the k-th largest of what top-p left. Top-p keeps a top set, so
    # that is the k-th largest overall when it kept k or more, and when it
    # kept fewer the k-th largest overall is below all of them: the first
    # sort serves both (a sort of the vocabulary costs milliseconds on a CPU).
    kth_index = mx.clip(vocab - top_k, 0, vocab - 1).astype(mx.int32)
    kth = mx.take_along_axis(sorted_logprobs, kth_index, axis=-1)
    logprobs = mx.where((top_k > 0) & (logprobs < kth), -float("inf"), logprobs)
    scaled = logprobs * inv_temperature
    # The Python sampler splits its key on every sampled step, and each row
    # draws with its own: one split and one draw per row.
    drawn, split_keys = [], []
    for row in range(rows):
        pair = mx.random.split(keys[row])
        drawn.append(mx.random.categorical(scaled[row:row + 1], key=pair[1]))
        split_keys.append(pair[0])
    greedy = inv_temperature == 0
    token = mx.where(greedy, mx.argmax(logits, axis=-1, keepdims=True),
                     mx.concatenate(drawn).reshape(rows, 1)).astype(mx.int32)
    return token, mx.where(greedy, keys, mx.stack(split_keys)).reshape(key.shape)


def make_sampling_step(model, *, weights_as_inputs: bool = False, greedy: bool = False) -> Callable[..., Any]:
    """step(k0, v0, ..., key, token, position, inv_temperature, top_p, top_k[, *weights])
    -> (next_token {B, 1}, key', k0', v0', ...): one decode step with the sampler inside.

    One stream: ``key`` is an ``mx.random.key`` ({2} uint32), token {1, 1},
    position and the options (``sampling_inputs``) scalars. B streams in one
    batch: caches {B, ...}, keys {B, 2}, tokens {B, 1}, and positions and
    options {B} (``sampling_rows``), each row at its own position. Donate
    ``{0: 2, 1: 3, ..., 2 * layers: 1}`` to update the caches and the key in
    place, in the caller's arrays.

    ``greedy=True``: the same inputs and outputs, but only the argmax (the
    options are ignored and the key comes back as it was): sampling sorts
    the vocabulary, which costs a CPU step several percent, so greedy
    streams get a step of their own.
    """
    layers = len(model.model.layers)

    def decode(*inputs):
        caches, (key, token, position, inv_temperature, top_p, top_k) = inputs[:2 * layers], inputs[2 * layers:]
        logits, new_caches = forward(model, token, position, caches)
        if greedy:
            return (mx.argmax(logits, axis=-1, keepdims=True).astype(mx.int32), key, *new_caches)
        next_token, next_key = sample(logits, key, inv_temperature, top_p, top_k)
        return (next_token, next_key, *new_caches)

    return _with_weights(model, weights_as_inputs, decode, 6 + 2 * layers)
