"""Sampling inside a traced decode step: the sampler as graph ops, its options as inputs.

The replayed step (llm/replay_step.py) ends in ``sample``: greedy,
top-p, top-k and temperature with each row's own random key, the same math
as the engine's Python sampler with the same key, so a replayed stream draws
the Python step's tokens. ``sampling_inputs`` (one stream) and
``sampling_rows`` (a batch) make the options' arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from .penalties import filter_min_p


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
           top_k: mx.array, log_min_p: mx.array | None = None) -> tuple[mx.array, mx.array]:
    """(next tokens {B, 1} int32, next keys) from `logits` {B, V}: greedy where 1/temperature
    is 0, else top-p, then min-p (`log_min_p`, the penalized step's input: log(min_p),
    -inf for off), then top-k, then temperature (mlx-lm's order), each row
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
    if log_min_p is not None:
        logprobs = filter_min_p(logprobs, log_min_p)
    # top-k: the k-th largest of what top-p (and min-p) left. Both keep a top set, so
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
