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

Lookup walks a token trie (the structure of mlx-lm's ``LRUPromptCache``):
the deepest node a prompt reaches is its longest common prefix with any kept
sequence, found in time proportional to that prefix, not to the number of
entries. A kept sequence that is a prefix of a new one is dropped (the new
one serves every prompt it served), and a sequence that is a prefix of a
kept one is not kept again.

The bound holds in tokens and in bytes of keys and values: in "batch" mode
every finished request offers its whole sequence, so a busy server fills
the cache to its bound (SmolLM2 in float32: ~46 KB a token, 4096 tokens
~190 MB), which is growth up to the bound, not a leak.

The kept arrays are never written: a restored KVCache's first update
reallocates (it grows by concatenation when full, and a restored one is
exactly full), and the batch generator copies restored caches into its
batch, so requests never share a buffer they write to.

``HeldPrefills`` is the other tier: a prompt prefilled once for the n
choices of one request (``Engine.generate_choices``), with the logits of its
last position, held (not evicted) while its request runs.
"""

from __future__ import annotations

import collections
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from .. import InvalidArgument


def _copy(x: mx.array) -> mx.array:
    """`x` in a buffer of its own (a slice would share its source's)."""
    return x + mx.zeros((), dtype=x.dtype)


def restorable(cache: list) -> bool:
    """Only plain KVCache layers can be sliced and restored (not rotating or quantized ones)."""
    from mlx_lm.models.cache import KVCache

    return bool(cache) and all(type(layer) is KVCache for layer in cache)


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    layers: list[tuple[mx.array, mx.array]]
    nbytes: int


@dataclass(eq=False)
class _Node:
    """One token of the trie. `through` is the key of some kept sequence that
    passes through (or ends at) this node: the one a prompt reaching this deep reuses."""

    children: dict[int, _Node] = field(default_factory=dict)
    entry: _Entry | None = None
    through: tuple[int, ...] | None = None


class PrefixCache:
    """LRU of token sequences' keys and values, bounded by the tokens kept and
    (if `max_bytes` is given) by the bytes of their keys and values.

    Thread-safe: prefills on several worker threads restore and save at once.
    """

    def __init__(self, max_tokens: int, max_bytes: int | None = None):
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise InvalidArgument(f"max_tokens must be a positive int, got {max_tokens!r}")
        if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool)
                                      or max_bytes < 1):
            raise InvalidArgument(f"max_bytes must be a positive int or None, got {max_bytes!r}")
        self.max_tokens = max_tokens
        self.max_bytes = max_bytes
        self._root = _Node()
        self._entries: collections.OrderedDict[tuple[int, ...], _Entry] = collections.OrderedDict()  # LRU first
        self._tokens = 0
        self._nbytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.reused_tokens = 0
        # Bytes of keys and values per token, from the last sequence offered (None: none yet).
        self._token_bytes: float | None = None
        self._model: weakref.ref | None = None  # the model whose keys and values these are (bind)

    @property
    def tokens(self) -> int:
        """Tokens whose keys and values are kept now (at most ``max_tokens``)."""
        return self._tokens

    @property
    def nbytes(self) -> int:
        """Bytes of the kept keys and values (at most ``max_bytes``)."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def bind(self, model: Any) -> None:
        """Keep the keys and values of `model` alone (an Engine binds its prompt cache to its model).

        Another model's prompt would restore them without an error and decode
        wrong tokens, so a second model raises ValueError while the first is
        alive; once it is gone, the cache is emptied and binds to the new one.
        """
        with self._lock:
            bound = self._model() if self._model is not None else None
            if bound is model:
                return
            if bound is not None:
                raise InvalidArgument(f"this PrefixCache keeps the keys and values of another model "
                                      f"({type(bound).__name__}); give each engine's model a PrefixCache of its own")
            for key in list(self._entries):  # a collected model's: of no use to any other
                self._remove(key)
            self._model = weakref.ref(model)

    def fits(self, tokens: int) -> bool:
        """Whether a sequence of `tokens` tokens is within the bounds, so that ``save`` would keep it
        (the bytes judged by the last sequence offered; none offered yet: by the tokens alone)."""
        if tokens > self.max_tokens:
            return False
        per_token = self._token_bytes
        return self.max_bytes is None or per_token is None or tokens * per_token <= self.max_bytes

    def restore(self, prompt: list[int], cache: list) -> int:
        """Loads the longest usable prefix of `prompt` into the fresh `cache`; returns its length (0: none)."""
        if not restorable(cache):
            return 0
        with self._lock:
            node, reuse = self._deepest(prompt)
            if reuse < 1:
                return 0
            assert node.through is not None  # a node is kept only while some sequence passes through
            entry = self._entries[node.through]  # every sequence through `node` shares the `depth` tokens
            self._entries.move_to_end(entry.tokens)
            self.hits += 1
            self.reused_tokens += reuse
        for layer, (keys, values) in zip(cache, entry.layers):
            layer.keys, layer.values, layer.offset = keys[..., :reuse, :], values[..., :reuse, :], reuse
        return reuse

    def reusable(self, prompt: list[int]) -> int:
        """How many tokens of `prompt` a restore would give now (into plain KVCache layers),
        without restoring them: no hit is counted, no entry made more recent."""
        with self._lock:
            return max(self._deepest(prompt)[1], 0)

    def save(self, tokens: list[int], cache: list) -> None:
        """Keep `cache`, which holds the keys and values of exactly `tokens`, evaluating it here."""
        key = tuple(tokens)
        if not key or len(key) > self.max_tokens or not restorable(cache) \
                or any(layer.offset != len(key) for layer in cache):
            return
        with self._lock:
            if self._covered(key):
                return
        # Copies: an evaluated slice shares its source's buffer, which would keep
        # a whole batch's (or a grown cache's) keys and values alive per entry.
        layers = [(_copy(layer.keys[..., :layer.offset, :]), _copy(layer.values[..., :layer.offset, :]))
                  for layer in cache]
        nbytes = sum(keys.nbytes + values.nbytes for keys, values in layers)
        self._token_bytes = nbytes / len(key)
        if self.max_bytes is not None and nbytes > self.max_bytes:
            return
        mx.eval(layers)  # evaluated on this worker: readable from any thread
        with self._lock:
            if self._covered(key):  # saved by another thread meanwhile
                return
            self._insert(_Entry(key, layers, nbytes))
            while self._tokens > self.max_tokens or (self.max_bytes is not None and self._nbytes > self.max_bytes):
                self._remove(next(iter(self._entries)))

    # ---- the trie (under the lock) ------------------------------------------------

    def _deepest(self, prompt: list[int]) -> tuple[_Node, int]:
        """The deepest node `prompt` reaches, and how many of its tokens may be restored from it:
        its depth, leaving the last token to run (it gives the logits)."""
        node, depth = self._root, 0
        for token in prompt:
            child = node.children.get(token)
            if child is None:
                break
            node, depth = child, depth + 1
        return node, min(depth, len(prompt) - 1)

    def _covered(self, key: tuple[int, ...]) -> bool:
        """True (and the covering entry made most recent) if a kept sequence starts with `key`."""
        node = self._root
        for token in key:
            child = node.children.get(token)
            if child is None:
                return False
            node = child
        assert node.through is not None
        self._entries.move_to_end(node.through)
        return True

    def _insert(self, entry: _Entry) -> None:
        node, prefixes = self._root, []
        for token in entry.tokens:
            node.through = entry.tokens
            node = node.children.setdefault(token, _Node())
            if node.entry is not None:
                prefixes.append(node.entry.tokens)
        node.entry, node.through = entry, entry.tokens
        self._entries[entry.tokens] = entry
        self._tokens += len(entry.tokens)
        self._nbytes += entry.nbytes
        for prefix in prefixes:  # kept prefixes of the new sequence: it serves their prompts now
            self._remove(prefix)

    def _remove(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key)
        self._tokens -= len(key)
        self._nbytes -= entry.nbytes
        path = [self._root]
        for token in key:
            path.append(path[-1].children[token])
        path[-1].entry = None
        # Bottom up: drop nodes nothing passes through any more, and point the
        # others that named this sequence at one that is still kept.
        for depth in range(len(key), -1, -1):
            node = path[depth]
            if depth and node.entry is None and not node.children:
                del path[depth - 1].children[key[depth - 1]]
            elif node.through == key:
                if node.entry is not None:
                    node.through = node.entry.tokens
                else:  # the root of an empty cache has no children
                    node.through = next(iter(node.children.values())).through if node.children else None


@dataclass(eq=False)
class HeldPrefill:
    """One prompt prefilled once for the several choices of a request
    (``Engine.generate_choices``): its keys and values, and the logits of its
    last position, from which each choice samples its first token with its own key.

    Evaluated, so any worker can read it; never written (a restored KVCache is
    exactly full, so its first update reallocates, as with ``PrefixCache``).
    """

    tokens: tuple[int, ...]
    layers: list[tuple[mx.array, mx.array]]
    logits: mx.array  # {1, V}: the last prompt position's

    def restore(self, cache: list, length: int) -> None:
        """The first `length` tokens' keys and values into the fresh plain-KV `cache`."""
        for layer, (keys, values) in zip(cache, self.layers):
            layer.keys, layer.values, layer.offset = keys[..., :length, :], values[..., :length, :], length


class HeldPrefills:
    """The prompts prefilled for choices now running, by their tokens.

    Every decode path asks ``get`` before prefilling a prompt: a prompt held
    here is restored whole (or, where the step must run its last token itself,
    all but that token) instead of prefilled. Held while its request runs
    (``hold``/``release`` count), so n choices cost one prefill. Thread-safe:
    prefills on worker threads read it while the loop holds and releases.
    """

    def __init__(self) -> None:
        self._held: dict[tuple[int, ...], list] = {}  # tokens -> [HeldPrefill, holders]
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, prefill: HeldPrefill) -> HeldPrefill:
        """Keep `prefill` (or the one already held for the same tokens) until a matching release."""
        with self._lock:
            entry = self._held.setdefault(prefill.tokens, [prefill, 0])
            entry[1] += 1
            return entry[0]

    def release(self, prefill: HeldPrefill) -> None:
        with self._lock:
            entry = self._held[prefill.tokens]
            entry[1] -= 1
            if entry[1] == 0:
                del self._held[prefill.tokens]

    def holds(self, prompt: list[int]) -> bool:
        """Whether a prefill is held for exactly `prompt`."""
        with self._lock:
            return tuple(prompt) in self._held

    def get(self, prompt: list[int], cache: list) -> HeldPrefill | None:
        """The prefill held for exactly `prompt`, if `cache` (fresh) can take it."""
        if not self._held or not restorable(cache):
            return None
        with self._lock:
            entry = self._held.get(tuple(prompt))
        return None if entry is None else entry[0]


def held_prefill(tokens: list[int], cache: list, logits: mx.array) -> HeldPrefill | None:
    """A HeldPrefill of `cache` (the keys and values of exactly `tokens`), None where it cannot be
    restored (not plain KVCache layers); evaluated here."""
    if not restorable(cache) or any(layer.offset != len(tokens) for layer in cache):
        return None
    layers = [(layer.keys[..., :layer.offset, :], layer.values[..., :layer.offset, :]) for layer in cache]
    mx.eval(layers, logits)
    return HeldPrefill(tuple(tokens), layers, logits)
