"""Penalties, logit bias and min-p: their options, each request's token history,
and the math both decode steps share.

* ``presence_penalty`` and ``frequency_penalty`` have OpenAI's meaning over the
  tokens generated so far: a logit drops by ``frequency * count`` and, once the
  token has been generated, by ``presence``.
* ``repetition_penalty`` has mlx-lm's meaning: the logits of the last
  ``REPETITION_CONTEXT`` tokens (prompt and answer, mlx-lm's default context)
  are divided by it where positive and multiplied by it where negative.
* ``logit_bias`` adds a bias to the logits of the given token ids.
* ``min_p`` is a sampler filter (mlx-lm's ``apply_min_p``, between top-p and
  top-k); it rides here because only the step variant with these inputs has it.
* ``min_tokens`` (vLLM's) keeps the ``banned`` ids (the engine's end-of-sequence
  and the request's stop token ids) from being sampled while fewer tokens than
  it have been generated: the bias row is the banned one (those ids at -inf)
  until then, and the plain one after, which every step takes as an input, so
  the graph is the penalized step's as it is.

Logits processors run before the sampler's filters, in mlx-lm's order: bias,
repetition, presence, frequency. ``adjust`` and ``record`` are graph ops: the
replayed step (llm/replay_step.py) calls them in its graph with a row's
counts {B, V} and window {B, W} chained from step to step like the caches,
and the Python steps call the same functions on the same arrays
(``TokenHistory``), so both give the same logits and, with the same key,
the same tokens.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import make_logits_processors

from .. import InvalidArgument
from .. import InvalidOption as InvalidOption
from .types import brief, is_int

# mlx-lm's default context of the repetition penalty (make_logits_processors).
REPETITION_CONTEXT: int = inspect.signature(make_logits_processors).parameters["repetition_context_size"].default
# OpenAI's bounds.
MAX_PENALTY = 2.0
MAX_BIAS = 100.0
# repetition_penalty's bounds (mlx-lm sets none). The step divides logits by it in
# their own dtype: below 1e-38 the quotient is inf in float32 (1e-39 sampled noise and
# answered NaN logprobs), and float16's 65504 is passed far sooner. Within these a
# float16 logit up to 655 stays finite either way.
MIN_REPETITION = 0.01
MAX_REPETITION = 100.0


@dataclass(frozen=True)
class Penalties:
    """A request's penalties, logit bias and min-p; the defaults change nothing."""

    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids ascending
    min_p: float = 0.0
    # The ids not sampled while fewer than min_tokens tokens are generated (the engine sets them).
    min_tokens: int = 0
    banned: tuple[int, ...] = ()

    @property
    def log_min_p(self) -> float:
        """min_p as the step takes it: log(min_p), -inf when off (keeps every token)."""
        return math.log(self.min_p) if self.min_p > 0 else -math.inf


NEUTRAL = Penalties()
OPTIONS = frozenset({"presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_p",
                     "min_tokens"})


def check_penalties(vocab_size: int | None, *, presence_penalty: Any = None, frequency_penalty: Any = None,
                    repetition_penalty: Any = None, logit_bias: Any = None, min_p: Any = None,
                    min_tokens: Any = None) -> Penalties | None:
    """The options as ``Penalties``, None when every one is absent or neutral (the requests
    that take today's step), or InvalidOption naming the bad one.

    Bounds: penalties in [-2, 2] (OpenAI's), repetition_penalty in [0.01, 100] (1 is off),
    min_p in [0, 1], logit_bias a dict of token ids (ints below `vocab_size`)
    to biases in [-100, 100], min_tokens an int >= 0 (its banned ids are the engine's to set).
    """
    def real(name: str, value: Any, default: float, low: float, high: float) -> float:
        if value is None:
            return default
        try:
            number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
        except OverflowError:  # an int past float's range
            number = math.nan
        if not math.isfinite(number) or number < low or number > high:
            raise InvalidOption(name, f"{name} must be a number in [{low:g}, {high:g}], got {brief(value)}")
        return number

    presence = real("presence_penalty", presence_penalty, 0.0, -MAX_PENALTY, MAX_PENALTY)
    frequency = real("frequency_penalty", frequency_penalty, 0.0, -MAX_PENALTY, MAX_PENALTY)
    repetition = real("repetition_penalty", repetition_penalty, 1.0, MIN_REPETITION, MAX_REPETITION)
    minimum = real("min_p", min_p, 0.0, 0.0, 1.0)
    bias: list[tuple[int, float]] = []
    if logit_bias is not None:
        if not isinstance(logit_bias, Mapping):
            raise InvalidOption("logit_bias", f"logit_bias must be a dict of token ids to biases, "
                                f"got {type(logit_bias).__name__}")
        for token, value in logit_bias.items():
            if not is_int(token) or token < 0 or (vocab_size is not None and token >= vocab_size):
                raise InvalidOption("logit_bias", f"logit_bias: token id {brief(token)} is outside the vocabulary "
                                    f"(ids 0 to {'?' if vocab_size is None else vocab_size - 1})")
            bias.append((int(token), real("logit_bias", value, 0.0, -MAX_BIAS, MAX_BIAS)))
    if min_tokens is not None and (not is_int(min_tokens) or min_tokens < 0):
        raise InvalidOption("min_tokens", f"min_tokens must be an int >= 0, got {brief(min_tokens)}")
    penalties = Penalties(presence, frequency, repetition, tuple(sorted(b for b in bias if b[1] != 0)), minimum,
                          int(min_tokens or 0))
    return None if penalties == NEUTRAL else penalties


# ---- the math, as graph ops ------------------------------------------------------

def record(counts: mx.array, window: mx.array, token: mx.array, position: mx.array) -> tuple[mx.array, mx.array]:
    """The history after `token` ({B, 1}) at `position` ({} or {B}): its count in `counts`
    {B, V} goes up by one and it takes slot ``position % W`` of `window` {B, W}."""
    token = mx.reshape(token, (-1, 1)).astype(mx.int32)
    counts = mx.put_along_axis(counts, token, mx.take_along_axis(counts, token, axis=-1) + 1, axis=-1)
    slot = (mx.reshape(position, (-1, 1)) % window.shape[-1]).astype(mx.int32)
    return counts, mx.put_along_axis(window, slot, token, axis=-1)


def adjust(logits: mx.array, counts: mx.array, window: mx.array, bias: mx.array, presence: mx.array,
           frequency: mx.array, repetition: mx.array) -> mx.array:
    """`logits` {B, V} after the logits processors, in mlx-lm's order: `bias` {B, V} added,
    the `window`'s tokens' logits divided (positive) or multiplied (negative) by
    `repetition`, `presence` off every generated token, `frequency` off per
    generation (`counts`). The options are scalars or {B}, cast to the logits' dtype
    as mlx-lm's Python floats are; neutral options leave a row's logits unchanged."""
    dtype = logits.dtype
    presence, repetition = (mx.reshape(x, (-1, 1)).astype(dtype) for x in (presence, repetition))
    frequency = mx.reshape(frequency, (-1, 1)).astype(mx.float32)
    logits = logits + bias.astype(dtype)
    # mlx-lm's gather and scatter of the window's logits (W of them, not a pass over V;
    # a token twice in the window is written twice with the same value).
    recent = mx.take_along_axis(logits, window, axis=-1)
    logits = mx.put_along_axis(logits, window, mx.where(recent < 0, recent * repetition, recent / repetition), axis=-1)
    logits = mx.where(counts > 0, logits - presence, logits)
    # The frequency term in float32 whatever the logits' dtype: a count (int32, bounded by
    # the context) is not exact in float16 past 2048, and frequency * count leaves
    # float16's range past 65504 / |frequency| (32,752 repeats at 2): inf, then NaN
    # logprobs. The sum is capped at the dtype's largest value, since a negative penalty
    # that lifts a logit past it would make it +inf; a logit pushed below the range
    # is -inf, a token ruled out, as a bias of -100 would.
    penalized = logits.astype(mx.float32) - frequency * counts.astype(mx.float32)
    return mx.minimum(penalized, mx.finfo(dtype).max).astype(dtype)


def filter_min_p(logprobs: mx.array, log_min_p: mx.array) -> mx.array:
    """mlx-lm's apply_min_p with log(min_p) an input ({} or {B}; -inf keeps every token)."""
    top = mx.max(logprobs, axis=-1, keepdims=True)
    return mx.where(logprobs < top + mx.reshape(log_min_p, (-1, 1)).astype(logprobs.dtype), -math.inf, logprobs)


# ---- the options and the history as arrays -----------------------------------------

def window_of(prompt: Sequence[int], size: int = REPETITION_CONTEXT) -> list[int]:
    """The window a stream starts with: position p of the prompt's last `size` tokens in
    slot p % size; slots the prompt does not reach repeat its last token (a token
    already in the window: the penalty is once per token), and are overwritten first."""
    if not prompt:
        raise InvalidArgument("penalties need a prompt of at least one token")
    window = [prompt[-1]] * size
    for position in range(max(0, len(prompt) - size), len(prompt)):
        window[position % size] = prompt[position]
    return window


def bias_row(penalties: Penalties, vocab: int, banned: bool = False) -> mx.array:
    """The logit bias as a dense {1, vocab} float32 row (`vocab`: the logits' width);
    `banned`: with the banned ids at -inf (min_tokens not reached)."""
    row = mx.zeros((1, vocab), dtype=mx.float32)
    if penalties.logit_bias:
        ids, values = zip(*penalties.logit_bias)
        if ids[-1] >= vocab:  # the ids were checked against the embedding; a scatter past the row would not be
            raise InvalidOption("logit_bias", f"logit_bias: token id {ids[-1]} is outside the model's "
                                f"{vocab} logits")
        row[0, mx.array(ids)] = mx.array(values, dtype=mx.float32)
    if banned:
        ids = [i for i in penalties.banned if i < vocab]  # an id past the logits is never sampled anyway
        if ids:
            row[0, mx.array(ids)] = -math.inf
    return row


_ROW_DTYPES = (mx.float32, mx.float32, mx.float32, mx.float32)


def _row_values(penalties: Penalties | None) -> tuple[float, float, float, float]:
    p = penalties or NEUTRAL
    return p.presence, p.frequency, p.repetition, p.log_min_p


def penalty_inputs(penalties: Penalties | None) -> list[mx.array]:
    """One stream's per-step options: presence, frequency, repetition, log(min_p) (scalars)."""
    return [mx.array(v, dtype=d) for v, d in zip(_row_values(penalties), _ROW_DTYPES)]


def penalty_rows(rows: Sequence[Penalties | None]) -> list[mx.array]:
    """``penalty_inputs`` for a batch: each option {B}, neutral for rows without penalties."""
    columns = zip(*(_row_values(p) for p in rows))
    return [mx.array(list(column), dtype=d) for column, d in zip(columns, _ROW_DTYPES)]


class TokenHistory:
    """One request's tokens as the penalties see them, on its worker: the counts of the
    generated tokens {1, V} (none yet), the window of the last tokens {1, W} (the
    prompt's) and the bias row, `vocab` the logits' width.

    Made at the first token from the prompt; then ``record`` (each token fed
    back) and ``adjust`` (each step's logits): the Python steps' side of the
    replayed step's chained counts and window, with the same functions.
    """

    def __init__(self, penalties: Penalties, prompt: Sequence[int], vocab: int):
        self.penalties = penalties
        self.options = penalty_inputs(penalties)[:3]
        self.counts = mx.zeros((1, vocab), dtype=mx.int32)
        self.window = mx.array([window_of(prompt)], dtype=mx.int32)
        self.bias = bias_row(penalties, vocab)
        # The bias row while min_tokens are not generated (None: nothing is banned).
        self.banned_bias = bias_row(penalties, vocab, banned=True) \
            if penalties.min_tokens > 0 and penalties.banned else None
        self.position = len(prompt)  # where the next recorded token sits
        self.generated = 0  # tokens recorded: those generated before the next one

    def bias_for(self, generated: int) -> mx.array:
        """The bias row of the step that samples after `generated` tokens."""
        if self.banned_bias is not None and generated < self.penalties.min_tokens:
            return self.banned_bias
        return self.bias

    def record(self, token: int | mx.array) -> None:
        token = mx.array([[token]], dtype=mx.int32) if isinstance(token, int) else token
        self.counts, self.window = record(self.counts, self.window, token, mx.array(self.position, dtype=mx.int32))
        self.position += 1
        self.generated += 1

    def adjust(self, logits: mx.array) -> mx.array:
        return adjust(logits, self.counts, self.window, self.bias_for(self.generated), *self.options)


class PenaltyProcessor:
    """The penalties as mlx-lm's logits processor, ``processor(tokens, logits)``, for a
    ``BatchGenerator`` row: the first call sees the prompt, each later one a new token
    (read lazily: no wait for the step that made it)."""

    def __init__(self, penalties: Penalties):
        self.penalties = penalties
        self.history: TokenHistory | None = None

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self.history is None:
            self.history = TokenHistory(self.penalties, np.asarray(tokens).tolist(), logits.shape[-1])
        else:
            self.history.record(mx.reshape(tokens[-1:], (1, 1)))
        return self.history.adjust(logits)


__all__ = ["InvalidOption", "MAX_BIAS", "MAX_PENALTY", "MAX_REPETITION", "MIN_REPETITION", "NEUTRAL", "OPTIONS", "PenaltyProcessor", "Penalties",
           "REPETITION_CONTEXT", "TokenHistory", "adjust", "bias_row", "check_penalties", "filter_min_p",
           "penalty_inputs", "penalty_rows", "record", "window_of"]
