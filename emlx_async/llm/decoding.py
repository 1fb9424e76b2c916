"""What every decode path reads (``Decoding``: the model, its stop ids, the
prefill options, the prompt cache and the replayed step) and the Python pieces
they share: mlx-lm's chunked prefill and the Python step.

The prefill and step methods run on a worker thread, on the state the path
keeps there (llm/state.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from .. import Runtime, cancelled
from .cache_options import CacheOptions
from .prompt_cache import PrefixCache
from .grammar import apply_token_mask, unpack_token_mask
from .penalties import TokenHistory
from .sampling import Sampler, token_logprobs
from .state import PromptState

if TYPE_CHECKING:
    from .traces import ReplayTraces


@dataclass
class Decoding:
    """The engine as its decode paths see it; the engine owns it and keeps it current."""

    model: Any
    runtime: Runtime
    eos_ids: set[int]
    prefill_chunk: int  # tokens per prefill pass (see Engine)
    max_concurrent: int
    prompt_cache: PrefixCache | None = None
    replay: ReplayTraces | None = None  # the replayed step, once prepared
    cache_options: CacheOptions = CacheOptions()  # mlx-lm's max_kv_size, kv_bits, kv_group_size

    def prefill(self, state: PromptState, prompt: list[int], sampler: Sampler) -> int | tuple | None:
        """The whole prompt, chunk by chunk: the first token (None: cancelled, nobody reads it)."""
        self.begin_prefill(state, prompt)
        while True:
            item = self.feed_chunk(state, prompt, sampler)
            if item is not None:
                return item
            if cancelled():
                return None

    def begin_prefill(self, state: PromptState, prompt: list[int]) -> None:
        """A fresh mlx-lm cache holding what the prompt cache has of `prompt`; the rest is left to prefill."""
        cache = state.cache = self.cache_options.prompt_cache(self.model)
        state.token = None
        reused = self.prompt_cache.restore(prompt, cache) if self.prompt_cache is not None else 0
        state.unread = mx.array(prompt[reused:])

    def feed_chunk(self, state: PromptState, prompt: list[int], sampler: Sampler,
                         limit: int | None = None) -> int | tuple | None:
        """One chunk (at most `limit` tokens, default prefill_chunk) of the prompt through
        the model; the last one also samples the first token, which is returned (None:
        more chunks to go)."""
        # Chunked prefill bounds the memory of one forward pass, and a request
        # cancelled mid-prompt frees its queue (or stops stalling the batch) within one chunk.
        tokens, cache = state.unread, state.cache
        limit = limit or self.prefill_chunk
        if tokens.size > limit:
            self._forward(tokens[None, :limit], cache)
            mx.eval([c.state for c in cache])
            state.unread = tokens[limit:]
            return None
        state.unread = None
        if self.cache_options.kv_bits is not None and tokens.size > 1:
            # generate_step's order: the last token alone, after the rest is quantized.
            self._forward(tokens[None, :-1], cache)
            tokens = tokens[-1:]
        item = self._sample(state, tokens, sampler, prompt)
        if self.prompt_cache is not None:
            self.prompt_cache.save(prompt, cache)  # the prompt's keys and values, for later prompts
        return item

    def python_step(self, state: PromptState, sampler: Sampler) -> int | tuple:
        """The next token after state.token (parallel mode's Python step).

        A finished grammar allows only end-of-sequence: it is returned without a model call.
        """
        if sampler.grammar is not None and sampler.grammar.is_finished:
            return min(self.eos_ids)  # a grammar needs them (Engine checks)
        return self._sample(state, mx.array([state.token]), sampler)

    def _forward(self, tokens: mx.array, cache: list) -> mx.array:
        """mlx-lm's model call, then what generate_step does to the cache after it (kv_bits)."""
        logits = self.model(tokens, cache=cache)
        self.cache_options.quantize(cache)
        return logits

    def _sample(self, state: PromptState, tokens: mx.array, sampler: Sampler,
                prompt: list[int] | None = None) -> int | tuple:
        """The next token after `tokens`; `prompt` is given at the prompt's last chunk (the first token)."""
        logits = self._forward(tokens[None], state.cache)[:, -1, :]
        if sampler.penalties is not None:
            # Before the sampler's filters, as mlx-lm runs its logits processors; the
            # history starts from the prompt, then takes each token fed back.
            if prompt is not None:
                sampler.history = TokenHistory(sampler.penalties, prompt, logits.shape[-1])
            else:
                sampler.history.record(state.token)
            logits = sampler.history.adjust(logits)
        grammar = sampler.grammar
        if grammar is not None:
            # The mask is computed while the model's graph is still lazy, then applied before
            # sampling; the token feeds the grammar (GrammarStateError fails this request).
            logits = apply_token_mask(logits, mx.array(unpack_token_mask(grammar.mask(), logits.shape[-1]))[None])
        token = state.token = sampler(logits).item()  # .item() evaluates, releasing the GIL
        if grammar is not None:
            grammar.advance(token)
        if sampler.logprobs is None:
            return token
        # Logprobs come from this Python step's logits: a request asking for
        # them takes this step even where a faster one exists.
        return (token, *token_logprobs(logits[0], token, sampler.logprobs))

    def finish(self, token: int, left: int) -> str | None:
        """The finish reason after `token` with `left` tokens still allowed (None: go on)."""
        return "stop" if token in self.eos_ids else "length" if left == 0 else None


__all__ = ["Decoding"]
