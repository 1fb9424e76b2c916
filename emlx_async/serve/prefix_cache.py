"""Prompt prefix cache for the engine's "parallel" mode.

Requests that share a prefix (a chat's system prompt, an earlier turn of the
same conversation) reuse its keys and values instead of prefilling it again.
After a prefill, the prompt's per-layer keys and values are kept (evaluated,
so any worker thread can read them); a later prompt starts from the longest
common prefix with any kept prompt, leaving at least its last token to run
through the model. The keys and values of the first m tokens depend only on
those m tokens, so any common prefix is valid.

The kept arrays are never written: a restored cache's first update
reallocates (KVCache grows by concatenation when it is full), so requests
never share a buffer they write to.
"""

from __future__ import annotations

import collections
import threading

import mlx.core as mx

from emlx_async.llm import Engine


def _common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    """LRU of prompts' keys and values, bounded by the number of tokens kept."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: collections.OrderedDict[tuple[int, ...], list[tuple[mx.array, mx.array]]] = \
            collections.OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()  # prefills run on several worker threads at once
        self.hits = 0
        self.reused_tokens = 0

    def restore(self, prompt: list[int], cache: list) -> int:
        """Loads the longest usable prefix into `cache`; returns its length (0: none)."""
        with self._lock:
            best, best_len = None, 0
            for tokens, layers in self._entries.items():
                n = _common_prefix(tokens, prompt)
                if n > best_len:
                    best, best_len = tokens, n
            reuse = min(best_len, len(prompt) - 1)  # the last token must run to give logits
            if reuse < 1:
                return 0
            self._entries.move_to_end(best)
            layers = self._entries[best]
            self.hits += 1
            self.reused_tokens += reuse
        for layer, (keys, values) in zip(cache, layers):
            layer.keys, layer.values, layer.offset = keys[..., :reuse, :], values[..., :reuse, :], reuse
        return reuse

    def save(self, prompt: list[int], cache: list) -> None:
        key = tuple(prompt)
        if len(key) > self.max_tokens:
            return
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return
        layers = [(layer.keys[..., :layer.offset, :], layer.values[..., :layer.offset, :]) for layer in cache]
        mx.eval(layers)  # evaluated on this worker: readable from any thread
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = layers
            self._tokens += len(key)
            while self._tokens > self.max_tokens:
                old, _ = self._entries.popitem(last=False)
                self._tokens -= len(old)


class PrefixCachingEngine(Engine):
    """The engine with a PrefixCache in front of its prefill ("parallel" mode only)."""

    prefix_cache: PrefixCache | None = None

    def _prefill(self, state: dict, prompt: list[int], sampler):
        from mlx_lm.models.cache import KVCache, make_prompt_cache

        from emlx_async import cancelled

        store = self.prefix_cache
        cache = make_prompt_cache(self.model)
        if store is None or not all(type(layer) is KVCache for layer in cache):
            return super()._prefill(state, prompt, sampler)
        state["cache"] = cache
        state["token"] = None
        reused = store.restore(prompt, cache)
        tokens = mx.array(prompt[reused:])
        # As Engine._prefill: chunks bound memory and how long a cancelled prompt holds the queue.
        while tokens.size > self.prefill_chunk:
            self.model(tokens[None, : self.prefill_chunk], cache=cache)
            mx.eval([c.state[:2] for c in cache])
            tokens = tokens[self.prefill_chunk:]
            if cancelled():
                return None
        token = self._sample(state, tokens, sampler)
        store.save(prompt, cache)
        return token
