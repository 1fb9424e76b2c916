"""What every decode path reads (``Decoding``: the model, its stop ids, the
prefill options, the prompt cache and the replayed step) and the Python pieces
they share: mlx-lm's chunked prefill and the Python step.

The prefill and step methods run on a worker thread, on the state the path
keeps there (llm/state.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from .. import Runtime, cancelled
from .cache_options import PREFILL_STEP, CacheOptions
from .prompt_cache import HeldPrefill, HeldPrefills, PrefixCache, held_prefill, restorable
from .grammar import apply_token_mask, unpack_token_mask
from .penalties import TokenHistory
from .sampling import Sampler, ranked, token_logprobs
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
    # Prompts prefilled once for the choices of a request (Engine.generate_choices).
    held: HeldPrefills = field(default_factory=HeldPrefills)

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
        """A fresh mlx-lm cache holding what is kept of `prompt`; the rest is left to prefill.

        A prompt held for its choices is restored whole, with its last logits
        (nothing left to prefill); else the prompt cache gives what it has.
        """
        cache = state.cache = self.cache_options.prompt_cache(self.model)
        state.token, state.fed = None, 0
        held = self.held.get(prompt, cache)
        if held is not None:
            held.restore(cache, len(prompt))
            state.unread, state.logits = mx.array([], dtype=mx.int32), held.logits
            return
        reused = self.prompt_cache.restore(prompt, cache) if self.prompt_cache is not None else 0
        state.unread = mx.array(prompt[reused:])

    def restore(self, prompt: list[int], cache: list) -> int:
        """Loads what is kept of `prompt` into the fresh `cache`, leaving at least its last
        token to run (for steps that prefill themselves: mlx-lm's BatchGenerator); returns its length."""
        held = self.held.get(prompt, cache)
        if held is not None:
            held.restore(cache, len(prompt) - 1)
            return len(prompt) - 1
        return self.prompt_cache.restore(prompt, cache) if self.prompt_cache is not None else 0

    def feed_chunk(self, state: PromptState, prompt: list[int], sampler: Sampler,
                         limit: int | None = None) -> int | tuple | None:
        """One chunk (at most `limit` tokens, default prefill_chunk) of the prompt through
        the model; the last one also samples the first token, which is returned (None:
        more chunks to go)."""
        logits = self._feed(state, limit)
        if logits is None:
            return None
        return self.first_token(state, logits, sampler, prompt)

    def first_token(self, state: PromptState, logits: mx.array, sampler: Sampler,
                    prompt: list[int]) -> int | tuple:
        """The first token from the prompt's last logits {1, V}, once state.cache holds the whole
        prompt, which the prompt cache keeps."""
        item = self._pick(state, logits, sampler, prompt)
        if self.prompt_cache is not None:
            self.prompt_cache.save(prompt, state.cache)  # the prompt's keys and values, for later prompts
        return item

    def hold_prefill(self, prompt: list[int], *, cancellable: bool = True) -> HeldPrefill | None:
        """The whole prompt, chunk by chunk, kept for several choices to sample from
        (None: cancelled, or a cache that cannot be restored, so each choice prefills).
        ``cancellable=False`` runs it to the end whatever happens to its awaiter (every
        rank of a sharded engine must hold the same prefills)."""
        state = PromptState()
        self.begin_prefill(state, prompt)
        # Rotating layers, or quantized ones (kv_bits: quantized after the first call): nothing to share.
        if not restorable(state.cache) or self.cache_options.kv_bits is not None:
            return None
        try:
            while (logits := self._feed(state)) is None:
                if cancellable and cancelled():
                    return None
            if self.prompt_cache is not None:
                self.prompt_cache.save(prompt, state.cache)
            return held_prefill(prompt, state.cache, logits)
        finally:
            state.clear()

    def prompt_logprobs(self, prompt: list[int], top: int) -> list[tuple[float, tuple]] | None:
        """Each prompt token after the first: its log-probability given the ones before it, and
        the `top` most likely (id, logprob) there (``token_logprobs``' shapes); None: cancelled.
        The model over the prompt but its last token, chunk by chunk, in a cache of its own, which
        the prompt cache keeps (an echo's generation follows it)."""
        cache = self.cache_options.prompt_cache(self.model)
        out: list[tuple[float, tuple]] = []
        inputs = len(prompt) - 1
        start = 0
        while start < inputs:
            if cancelled():
                return None
            # The prefill's calls (_feed), quantized where it quantizes: after each of generate_step's
            # prefill calls and after all but the last token (kv_bits quantized after every chunk
            # gave other scores than the prefill's keys, past the first chunk).
            limit = self._call_limit(self.prefill_chunk, start, inputs + 1 - start, cache)
            chunk = prompt[start:min(start + limit, inputs)]
            start += len(chunk)
            logits = self._forward(mx.array(chunk)[None], cache, quantize=start % PREFILL_STEP == 0 or start == inputs)
            logits = logits[0].astype(mx.float32)
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            following = mx.array(prompt[start + 1 - len(chunk):start + 1])[:, None]
            chosen = mx.take_along_axis(logprobs, following, axis=-1)[:, 0]
            top = min(top, logprobs.shape[-1])  # a vocabulary under 20 has fewer (MLX refused the kth)
            ids = mx.argpartition(-logprobs, kth=top - 1, axis=-1)[:, :top] if top else None
            values = None if ids is None else mx.take_along_axis(logprobs, ids, axis=-1)
            mx.eval(chosen, ids, values, [c.state for c in cache])
            tops = [()] * len(chunk) if ids is None else [
                ranked(row_ids, row_values) for row_ids, row_values in zip(ids.tolist(), values.tolist())]
            out += zip(chosen.tolist(), tops)
        if self.prompt_cache is not None and inputs > 0:  # its generation then prefills only the last token
            self.prompt_cache.save(prompt[:inputs], cache)
        return out

    def _feed(self, state: PromptState, limit: int | None = None) -> mx.array | None:
        """One chunk of the prompt through the model: the last position's logits {1, V}
        after the last chunk (None: more to go)."""
        # Chunked prefill bounds the memory of one forward pass, and a request
        # cancelled mid-prompt frees its queue (or stops stalling the batch) within one chunk.
        tokens, cache = state.unread, state.cache
        limit = self._call_limit(limit or self.prefill_chunk, state.fed, tokens.size, cache)
        quantized = self.cache_options.kv_bits is not None
        if tokens.size > limit:
            state.fed += limit
            # Quantized where generate_step quantizes: after each of its prefill calls, the
            # last of which ends just before the prompt's last token.
            self._forward(tokens[None, :limit], cache,
                          quantize=quantized and (state.fed % PREFILL_STEP == 0 or tokens.size - limit == 1))
            mx.eval([c.state for c in cache])
            state.unread = tokens[limit:]
            return None
        state.unread = None
        if state.logits is not None:  # a held prefill: the whole prompt is in the cache
            logits, state.logits = state.logits, None
            return logits
        if tokens.size > 1 and (self.cache_options.kv_bits is not None or not restorable(cache)):
            # generate_step's order: the last token alone, after the rest (quantized with
            # kv_bits). Rotating and state caches can depend on it: plamo3's sliding mask is
            # one wider than its ring, so a prompt past the window in one call gives other
            # logits than mlx-lm's.
            self._forward(tokens[None, :-1], cache)
            tokens = tokens[-1:]
        return self._forward(tokens[None], cache)[:, -1, :]

    def _call_limit(self, limit: int, fed: int, unread: int, cache: list) -> int:
        """The most tokens of a prompt's next model call, `fed` fed and `unread` (its last token
        included) to go: `limit`, cut where generate_step's prefill calls end where that matters."""
        room = PREFILL_STEP - fed % PREFILL_STEP  # to the end of generate_step's prefill call
        if self.cache_options.kv_bits is not None:
            # generate_step's prefill: the cache is quantized only after each PREFILL_STEP tokens
            # (quantized after every chunk, a long prompt's greedy tokens differed from mlx-lm's).
            return min(limit, room)
        if any(getattr(layer, "keep", 0) and layer.offset + unread > layer.max_size for layer in cache):
            # max_kv_size's ring keeps its first tokens, which a later call's queries attend to and
            # one call's do not: a prompt past the ring is fed in generate_step's calls (one
            # within it gives the same keys however it is split).
            return room
        return limit

    def python_step(self, state: PromptState, sampler: Sampler) -> int | tuple:
        """The next token after state.token (parallel mode's Python step).

        A finished grammar allows only end-of-sequence: it is returned without a model call.
        """
        if sampler.grammar is not None and sampler.grammar.is_finished:
            return min(self.eos_ids)  # a grammar needs them (Engine checks)
        return self._sample(state, mx.array([state.token]), sampler)

    def _forward(self, tokens: mx.array, cache: list, quantize: bool = True) -> mx.array:
        """mlx-lm's model call, then what generate_step does to the cache after it (kv_bits)."""
        logits = self.model(tokens, cache=cache)
        if quantize:
            self.cache_options.quantize(cache)
        return logits

    def _sample(self, state: PromptState, tokens: mx.array, sampler: Sampler) -> int | tuple:
        return self._pick(state, self._forward(tokens[None], state.cache)[:, -1, :], sampler)

    def _pick(self, state: PromptState, logits: mx.array, sampler: Sampler,
              prompt: list[int] | None = None) -> int | tuple:
        """The next token from `logits` {1, V} (penalties and the grammar's mask applied), with its
        logprobs where asked; `prompt` is given for the first token (the prompt's last chunk)."""
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

    def ends(self, token: int, sampler: Sampler) -> bool:
        """`token` ends the request: end-of-sequence, unless the request ignores it."""
        return token in self.eos_ids and not sampler.ignore_eos

    def finish(self, token: int, left: int, sampler: Sampler) -> str | None:
        """The finish reason after `token` with `left` tokens still allowed (None: go on)."""
        return "stop" if self.ends(token, sampler) else "length" if left == 0 else None


__all__ = ["Decoding"]
