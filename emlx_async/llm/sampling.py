"""The Python step's sampler and the checking of sampling options.

The replayed step samples inside its graph (llm/traced.py) from the same
options; both take them from ``check_sampling`` (and the penalties, logit
bias and min-p from ``penalties.check_penalties``).
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_k, apply_top_p

from .. import InvalidArgument
from .penalties import Penalties, TokenHistory, filter_min_p
from .types import brief, is_int

if TYPE_CHECKING:
    from .grammar import GrammarMatcher

SAMPLER_OPTIONS = frozenset({"temperature", "top_p", "top_k"})
# Seeds of any size are folded into the range mx.random.key takes.
SEED_RANGE = 2**64
# The options of greedy decoding (an empty batch row's too).
GREEDY = (0.0, 1.0, 0)
# Temperatures below this decode greedily: check_sampling returns 0.0, so
# neither step ever sees one. Both steps sample from the log-probabilities
# times 1/t in float32. 1/t overflows below 2.9e-39, and the product far
# above that: a flat 49k vocabulary's logprobs (about -11) times 1/t pass
# float32's 3.4e38 below 3.2e-38, every token is then -inf and the draw is
# noise (1e-39 answered random words). At 2**-100, 1/t = 2**100 (1.3e30,
# exact in float32) keeps every logprob down to -2.6e8 finite, and a
# temperature this small samples the argmax anyway (logit gaps times 1e30
# dwarf the Gumbel noise): the bound changes no sample.
MIN_TEMPERATURE = 2.0**-100
# A top_p below this comes back as this: both steps compare the probability mass
# with top_p in float32, where one below 1.4e-45 is 0, which turned the filter off
# (1e-300 sampled from the whole vocabulary). At 2**-100 (exact in float32) only
# the most likely token is kept, as any tiny top_p keeps in exact arithmetic: the
# top token's probability is at least 1/V, far above it.
MIN_TOP_P = 2.0**-100


class Sampler:
    """Greedy, or top-p then min-p then top-k then temperature (mlx-lm's order), with a
    private random key.

    mlx-lm's make_sampler draws from the global random state, so the filters
    are applied here with a key of the request's own. `penalties` (or None):
    the request's penalties, logit bias and min-p; the Python steps keep its
    token history in ``history`` and adjust the logits before sampling.
    """

    def __init__(self, temperature: float, top_p: float, top_k: int, seed: int,
                 penalties: Penalties | None = None):
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.penalties = penalties
        self.history: TokenHistory | None = None  # made on the worker, at the first token
        self.seed = seed % SEED_RANGE
        self.key: mx.array | None = None  # made on the worker: arrays built on the loop are lazy
        self.logprobs: int | None = None  # None: none asked; else how many top alternatives
        # The request's grammar state (llm/grammar.py), or None: the Python steps mask the
        # logits with it before sampling and feed it each token they take.
        self.grammar: GrammarMatcher | None = None
        # End-of-sequence does not end the request (vLLM's ignore_eos): every path asks Decoding.ends.
        self.ignore_eos = False

    @property
    def options(self) -> tuple[float, float, int]:
        return self.temperature, self.top_p, self.top_k

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def filter(self, logprobs: mx.array) -> mx.array:
        """The log-probabilities left to sample from (the rest are -inf)."""
        if 0 < self.top_p < 1:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.penalties is not None and self.penalties.min_p > 0:
            # The replayed step's math (log(min_p) an input, in float32 like its input).
            logprobs = filter_min_p(logprobs, mx.array(self.penalties.log_min_p, dtype=mx.float32))
        if 0 < self.top_k < logprobs.shape[-1]:  # k >= vocabulary keeps everything
            logprobs = apply_top_k(logprobs, self.top_k)
        return logprobs

    def first_key(self) -> mx.array:
        """The key after the first token (the replayed step continues this stream of numbers)."""
        return self.key if self.key is not None else mx.random.key(self.seed)

    def __call__(self, logits: mx.array) -> mx.array:
        if self.temperature == 0:
            return mx.argmax(logits, axis=-1)
        logprobs = self.filter(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        # Split per step: each request's stream of numbers is its own.
        if self.key is None:
            self.key = mx.random.key(self.seed)
        self.key, step_key = mx.random.split(self.key)
        # In float32, as the replayed step scales (a float16 model's logprobs times
        # 1/t would overflow float16 at temperatures the float32 bound allows).
        return mx.random.categorical(logprobs.astype(mx.float32) * (1 / self.temperature), key=step_key)


def check_sampling(temperature: Any = 0.0, top_p: Any = 1.0, top_k: Any = 0) -> tuple[float, float, int]:
    """(temperature, top_p, top_k) as floats and an int, or ValueError naming the bad one.

    A temperature below MIN_TEMPERATURE comes back as 0.0 (greedy), a top_p below
    MIN_TOP_P as MIN_TOP_P (the most likely token alone).
    """
    def real(value: Any) -> float | None:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return None
        try:
            number = float(value)
        except OverflowError:  # an int past float's range
            return None
        return number if math.isfinite(number) else None

    t, p = real(temperature), real(top_p)
    if t is None or t < 0 or p is None or not 0 < p <= 1 or not is_int(top_k) or top_k < 0:
        raise InvalidArgument(f"invalid sampling: temperature={brief(temperature)} (finite, >= 0), "
                              f"top_p={brief(top_p)} (in (0, 1]), top_k={brief(top_k)} (an int >= 0)")
    return (0.0 if t < MIN_TEMPERATURE else t), max(p, MIN_TOP_P), int(top_k)


def token_logprobs(logits: mx.array, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The chosen token's log-probability and the `top` most likely (id, logprob), from one row of logits."""
    logprobs = logits.astype(mx.float32)
    logprobs = logprobs - mx.logsumexp(logprobs)
    chosen = logprobs[token]
    top = min(top, logprobs.shape[-1])  # a vocabulary under 20 has fewer (MLX refused the kth)
    if top == 0:
        return chosen.item(), ()
    ids = mx.argpartition(-logprobs, kth=top - 1)[:top]
    values = logprobs[ids]
    mx.eval(chosen, ids, values)
    return chosen.item(), ranked(ids.tolist(), values.tolist())


def ranked(ids: list[int], values: list[float]) -> tuple[tuple[int, float], ...]:
    """Alternatives (argpartition's, unordered) as (id, logprob), most likely first. A token
    the step could not sample (a grammar's mask made it -inf) is no alternative: fewer are
    listed then (and -inf is no JSON number)."""
    return tuple(sorted(((i, v) for i, v in zip(ids, values) if v != -math.inf), key=lambda pair: -pair[1]))


__all__ = ["GREEDY", "MIN_TEMPERATURE", "MIN_TOP_P", "SAMPLER_OPTIONS", "SEED_RANGE", "Sampler", "check_sampling", "token_logprobs"]
