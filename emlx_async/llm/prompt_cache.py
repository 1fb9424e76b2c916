"""Prompt prefix cache: the engine's hook for reusing evaluated keys and values.

Requests that share a prefix (a chat's system prompt, an earlier turn of the
same conversation) reuse its keys and values instead of prefilling it again,
in both engine modes (``Engine(prompt_cache=PrefixCache(...))``). A kept
entry is a token sequence and its per-layer keys and values, evaluated so any
worker thread can read them: in "parallel" mode the prompt after its
prefill, in "batch" mode the whole sequence (prompt and answer) when the
request finishes. A later prompt starts from the longest common prefix with
any kept sequence, leaving at least its last token to run through the model.
The keys and values of the first m tokens depend only on those m tokens, so
any common prefix is valid.

The kept arrays are never written: a restored KVCache's first update
reallocates (it grows by concatenation when full, and a restored one is
exactly full), and the batch generator copies restored caches into its
batch, so requests never share a buffer they write to.
"""

from __future__ import annotations

import collections
import threading

import mlx.core as mx


def _common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _copy(x: mx.array) -> mx.array:
    """`x` in a buffer of its own (a slice would share its source's)."""
    return x + mx.zeros((), dtype=x.dtype)


def _plain_kv(cache: list) -> bool:
    """Only plain KVCache layers can be sliced and restored (not rotating or quantized ones)."""
    from mlx_lm.models.cache import KVCache

    return bool(cache) and all(type(layer) is KVCache for layer in cache)


class PrefixCache:
    """LRU of token sequences' keys and values, bounded by the number of tokens kept.

    Thread-safe: prefills on several worker threads restore and save at once.
    """

    def __init__(self, max_tokens: int):
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self._entries: collections.OrderedDict[tuple[int, ...], list[tuple[mx.array, mx.array]]] = \
            collections.OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.reused_tokens = 0

    @property
    def tokens(self) -> int:
        """Tokens whose keys and values are kept now (at most ``max_tokens``)."""
        return self._tokens

    def restore(self, prompt: list[int], cache: list) -> int:
        """Loads the longest usable prefix of `prompt` into the fresh `cache`; returns its length (0: none)."""
        if not _plain_kv(cache):
            return 0
        with self._lock:
            best, best_len = None, 0
            for tokens in self._entries:
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

    def save(self, tokens: list[int], cache: list) -> None:
        """Keep `cache`, which holds the keys and values of exactly `tokens`, evaluating it here."""
        key = tuple(tokens)
        if len(key) > self.max_tokens or not _plain_kv(cache) or any(layer.offset != len(key) for layer in cache):
            return
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return
        # Copies: an evaluated slice shares its source's buffer, which would keep
        # a whole batch's (or a grown cache's) keys and values alive per entry.
        layers = [(_copy(layer.keys[..., :layer.offset, :]), _copy(layer.values[..., :layer.offset, :]))
                  for layer in cache]
        mx.eval(layers)  # evaluated on this worker: readable from any thread
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = layers
            self._tokens += len(key)
            while self._tokens > self.max_tokens:
                old, _ = self._entries.popitem(last=False)
                self._tokens -= len(old)
