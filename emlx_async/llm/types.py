"""The LLM layer's public types: what a generation streams and the errors it raises."""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field
from typing import Any

from .. import BatchDriverError as BatchDriverError
from .. import BatchingRefused as BatchingRefused
from .. import EngineBusy as EngineBusy

# OpenAI's bound on top_logprobs.
MAX_TOP_LOGPROBS = 20
# The most choices one request may ask for (Engine.generate_choices, the service's `n`):
# each takes a request slot, so n is also bounded by the engine's max_concurrent.
MAX_CHOICES = 16


@dataclass(frozen=True)
class Delta:
    """One streamed piece of a generation."""

    text: str                 # new text since the previous delta (may be "")
    token: int | None         # the token that produced it (None for the final delta)
    finish_reason: str | None = None  # "stop", "length" or None while running
    # With generate(logprobs=True): the token's log-probability under the
    # model (after the logit bias and penalties, before the sampling
    # filters), and the `top_logprobs` most likely
    # tokens of that step as (id, logprob), most likely first.
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started

    @property
    def tokens_per_second(self) -> float:
        """Decode rate after the first token (prefill is in time_to_first_token)."""
        if self.first_token_at is None or self.generated_tokens < 2:
            return 0.0
        end = self.finished_at or time.perf_counter()
        return (self.generated_tokens - 1) / max(end - self.first_token_at, 1e-9)


def is_int(value: Any) -> bool:
    """An integer option (bool excluded: ``True`` is no token count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def brief(value: Any) -> str:
    """A caller's value as an error message may name it: an integer of more than 64 bits by its
    size (str() of one is slow, and past 4300 digits refused), anything else as its repr, cut."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"<an integer of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = ["BatchDriverError", "BatchingRefused", "Delta", "EngineBusy", "MAX_CHOICES", "MAX_TOP_LOGPROBS",
           "RequestStats", "brief", "is_int"]
