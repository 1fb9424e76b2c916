"""What a decode path keeps on its worker between jobs, one dataclass per path.

Each is made on the loop, filled and read by jobs on the worker thread that
owns it, and cleared (dropping its KV cache) when the stream or batch ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx


@dataclass
class PromptState:
    """A prompt going through mlx-lm's model chunk by chunk, then (parallel mode,
    Python step) the stream's steps on the same cache."""

    cache: list[Any] | None = None   # mlx-lm's per-layer caches (make_prompt_cache)
    unread: mx.array | None = None   # prompt tokens not fed yet
    fed: int = 0                     # prompt tokens fed so far (kv_bits: where mlx-lm quantizes)
    token: int | None = None         # the last sampled token: the next step's input
    key: mx.array | None = None      # the sampler's key after the first token (replayed paths continue it)
    history: Any = None              # the sampler's TokenHistory after the first token (penalized requests)
    logits: mx.array | None = None   # a held prefill's last logits: the first token is sampled from them

    @property
    def started(self) -> bool:
        return self.cache is not None

    def clear(self) -> None:
        self.cache = self.unread = self.token = self.key = self.history = self.logits = None
        self.fed = 0


@dataclass
class ReplayStreamState:
    """A replayed stream in parallel mode: its prefill, then the fixed-size caches,
    key and token that its first chained step takes over."""

    prompt: PromptState = field(default_factory=PromptState)
    caches: list[mx.array] = field(default_factory=list)
    key: mx.array | None = None
    token: mx.array | None = None    # [[id]], int32: the first step's input
    # A penalized stream's token history (llm/penalties.py): counts and window go
    # into the chain; the bias row is every step's input.
    counts: mx.array | None = None
    window: mx.array | None = None
    bias: mx.array | None = None
    banned_bias: mx.array | None = None  # the bias row until min_tokens are generated (None: none banned)

    def clear(self) -> None:
        self.prompt.clear()
        self.caches, self.key, self.token = [], None, None
        self.counts = self.window = self.bias = self.banned_bias = None


@dataclass
class GeneratorState:
    """The batch queue's mlx-lm BatchGenerator (batch mode, Python step)."""

    generator: Any = None
    logprobs: dict[int, int] = field(default_factory=dict)  # uid -> top alternatives, rows that asked
    grammars: dict[int, Any] = field(default_factory=dict)  # uid -> GrammarLogitsProcessor, constrained rows
    # mlx-lm's StopSequences a row ends on: the engine's end-of-sequence ids, or none (ignore_eos).
    stops: dict[bool, Any] = field(default_factory=dict)

    def clear(self) -> None:
        self.generator = None
        self.stops = {}
        self.logprobs.clear()
        self.grammars.clear()


@dataclass
class ReplayBatchState:
    """The replayed batch's cache buffers (ReplayTraces.spec: keys and values, or
    states, per layer; a row per stream), one random key per row and the
    penalties' per-row arrays (batch mode, replayed step)."""

    caches: list[mx.array] | None = None
    keys: mx.array | None = None
    # The penalized rows' token histories and bias rows ({rows, V}, {rows, W}, {rows, V}),
    # made when the first penalized row joins. The penalized step reads every row's: the
    # others' must be neutral (zeros; a row joining a slot a penalized row left zeroes them).
    counts: mx.array | None = None
    window: mx.array | None = None
    bias: mx.array | None = None

    def clear(self) -> None:
        self.caches = self.keys = None
        self.counts = self.window = self.bias = None


__all__ = ["GeneratorState", "PromptState", "ReplayBatchState", "ReplayStreamState"]
