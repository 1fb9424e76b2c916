"""Joining prompts prefilled together (batch mode, replayed step): one padded model call per chunk.

The prompts joining a replayed batch go through mlx-lm's model as one batch,
in mlx-lm's own batch caches (``BatchKVCache``: rows left-padded to a common
end, each at its own offset, the padding masked): a row joins with what the
prompt cache (or a held prefill) gives it, merged in with ``merge`` and
``extend``, and leaves with ``extract`` once its prompt is through (or at
once, when its request left), the rest compacted with ``filter``. Each chunk
feeds every row the next ``prefill_chunk`` tokens of its prompt (fewer for
the rows that end in it, whose last token's logits give their first token);
so n prompts cost one model call per chunk, not one each, as in mlx-lm's
``BatchGenerator``.

With a prompt cache, a prompt that shares most of what it has left with a row
still prefilling (a chat's system prompt) waits for that row: once through,
the row's prompt is kept, and the waiting prompt restores the shared part
instead of computing the same keys and values in the same call.

Rows never carry padding inside: a row takes a whole chunk's width or ends
in the chunk, and the padding after its end is cut off by its extraction.
The last tokens of the prompts that end in a chunk then run in a call of
their own (one column), so that the vocabulary projection, which mlx-lm's
models apply to every position they are given, runs for those positions
alone.
Only plain KVCache layers batch this way (``batchable``): rotating layers
(sliding windows, ``max_kv_size``) would evict their own tokens for the
padding, quantized ones (``kv_bits``) quantize after every call, and state
layers (SSMs) take no padding at all; those prompts are prefilled one after
another, a chunk's worth per round, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from .decoding import Decoding
from .grammar import GrammarStateError
from .prompt_cache import restorable
from .sampling import Sampler
from .state import PromptState

Joining = Sequence[tuple[PromptState, list[int], Sampler]]


@dataclass(eq=False)
class _Row:
    """A prompt in the batch cache: its state, and the tokens it has still to feed."""

    state: PromptState
    prompt: list[int]
    sampler: Sampler
    left: list[int]


class BatchPrefill:
    """The prompts being prefilled together, on the worker that runs ``chunk``.

    One per batch driver; its jobs run one at a time (one queue), each
    leaving the batch caches evaluated, so a later chunk may run on another
    worker.
    """

    def __init__(self, decoding: Decoding):
        self.decoding = decoding
        self.rows: list[_Row] = []  # the batch caches' rows, in order
        self.cache: list | None = None  # mlx-lm's BatchKVCache per layer, while rows are in

    def batchable(self, cache: list) -> bool:
        """Whether a prompt's fresh mlx-lm cache can join the padded batch (see the module)."""
        return restorable(cache) and self.decoding.cache_options.kv_bits is None

    def chunk(self, joining: Joining) -> list[int | tuple | GrammarStateError | None]:
        """One chunk of the joining prompts: each one's first token (None while it has more
        to go, or got no budget; the GrammarStateError of one whose grammar failed taking
        it); a finished one leaves its mlx-lm cache in its state.

        The prompts that can batch take one model call together; the others (see
        the module) share one chunk's worth of tokens, the rest of the first, then
        the next. A row whose prompt is not in `joining` any more (its request
        left) is dropped."""
        d = self.decoding
        present = {id(state) for state, _, _ in joining}
        gone = [i for i, row in enumerate(self.rows) if id(row.state) not in present]
        if gone:
            self._drop(gone)
        tokens: dict[int, int | tuple | GrammarStateError | None] = {}
        batched = {id(row.state) for row in self.rows}
        fresh: list[_Row] = []
        serial = []
        for state, prompt, sampler in joining:
            if id(state) in batched:
                continue
            if not state.started:
                if self._waits(prompt, self.rows + fresh):
                    continue  # it begins at a later chunk
                d.begin_prefill(state, prompt)
                if state.logits is None and self.batchable(state.cache):
                    fresh.append(_Row(state, prompt, sampler, state.unread.tolist()))
                    state.unread = None
                    continue
            serial.append((state, prompt, sampler))
        budget = d.prefill_chunk
        for state, prompt, sampler in serial:
            if state.logits is not None:  # a held prefill: its first token needs no model call
                tokens[id(state)] = _or_grammar_error(d.feed_chunk, state, prompt, sampler)
                continue
            if budget <= 0:
                tokens[id(state)] = None
                continue
            left = state.unread.size
            tokens[id(state)] = _or_grammar_error(d.feed_chunk, state, prompt, sampler, min(left, budget))
            # What it took: a max_kv_size ring past its size takes generate_step's whole call.
            budget -= left - (state.unread.size if state.unread is not None else 0)
        if fresh:
            self._join(fresh)
        if self.rows:
            tokens.update(self._feed())
        return [tokens.get(id(state)) for state, _, _ in joining]

    def _waits(self, prompt: list[int], prefilling: list[_Row]) -> bool:
        """Whether a prompt not started yet waits for a row still prefilling that shares most of
        what it has left (with a prompt cache, which keeps that row's prompt once through: the
        prompt then restores the shared part instead of computing the same keys and values
        again). A chat's system prompt is the usual case. Judged before the prompt restores
        anything, so a prompt counts one hit in the prompt cache however long it waits; a
        prompt held for its choices never waits (it restores whole).

        Only for a row whose prompt the cache will keep (within its bounds), and
        whose own part past the shared one is no longer than the shared part: the
        wait delays the prompt's first token by that much, and saves computing
        the shared part (a short chat must not wait for a long document that
        starts with the same system prompt)."""
        cache = self.decoding.prompt_cache
        if cache is None or not prefilling or self.decoding.held.holds(prompt):
            return False
        reused = cache.reusable(prompt)  # rows prefill together: the model's caches are plain ones
        left = len(prompt) - reused
        for row in prefilling:
            saved = _shared(prompt, row.prompt) - reused  # what restoring gives it over its own prefill
            if saved > left // 2 and len(row.left) - saved <= saved and cache.fits(len(row.prompt)):
                return True
        return False

    def _join(self, fresh: list[_Row]) -> None:
        """New rows into the batch caches: their restored prefixes merged (left-padded to a
        common end), then right-aligned with the rows already in."""
        from mlx_lm.models.cache import BatchKVCache

        merged = [BatchKVCache.merge([row.state.cache[layer] for row in fresh])
                  for layer in range(len(fresh[0].state.cache))]
        for row in fresh:
            row.state.cache = None  # the batch caches hold it now
        if self.cache is None:
            self.cache = merged
        else:
            for mine, theirs in zip(self.cache, merged):
                mine.extend(theirs)
        self.rows += fresh

    def _feed(self) -> dict[int, int | tuple | GrammarStateError]:
        """One padded model call over every row: up to prefill_chunk tokens each. The rows
        whose prompt ends in it are extracted and sample their first token."""
        d, rows = self.decoding, self.rows
        width = min(d.prefill_chunk, max(len(row.left) for row in rows))
        ending = [i for i, row in enumerate(rows) if len(row.left) <= width]
        # The ending rows' last tokens run apart, after (``_first_tokens``): mlx-lm's model ends in
        # the vocabulary projection of every position it is given, and only theirs are wanted
        # (unread logits are never computed).
        fed = [row.left[:len(row.left) - 1] if i in ending else row.left[:width] for i, row in enumerate(rows)]
        body = max(map(len, fed))
        if body:
            d.model(mx.array([part + [0] * (body - len(part)) for part in fed], dtype=mx.int32), cache=self.cache)
            mx.eval([c.state for c in self.cache])
        out = {}
        if ending:
            # Each ending row's cache, the padding after its end cut off.
            caches = [self._extract(i, body - len(fed[i])) for i in ending]
            out = self._first_tokens([rows[i] for i in ending], caches)
        for row, part in zip(rows, fed):
            row.left = row.left[len(part):]
        if ending:
            self._drop(ending)
        return out

    def _extract(self, index: int, padding: int) -> list:
        """Row `index`'s mlx-lm caches (KVCache per layer), without the `padding` positions after its end."""
        from mlx_lm.models.cache import KVCache

        cache = []
        for layer in self.cache:
            if layer.keys is None:  # nothing fed yet (one-token prompts): empty
                cache.append(KVCache())
                continue
            one = layer.extract(index)
            one.trim(padding)
            cache.append(one)
        return cache

    def _first_tokens(self, rows: list[_Row], caches: list[list]) -> dict[int, int | tuple | GrammarStateError]:
        """The last prompt token of each row, together (their caches merged again), and from
        their logits each row's first token; each row's cache (evaluated: any worker may read
        it) goes to its state."""
        from mlx_lm.models.cache import BatchKVCache

        d = self.decoding
        merged = [BatchKVCache.merge([cache[layer] for cache in caches]) for layer in range(len(caches[0]))]
        logits = d.model(mx.array([row.left[-1:] for row in rows], dtype=mx.int32), cache=merged)[:, -1, :]
        mx.eval(logits, [c.state for c in merged])
        out = {}
        for k, row in enumerate(rows):
            row.state.cache = [layer.extract(k) for layer in merged]
            mx.eval([c.state for c in row.state.cache])
            out[id(row.state)] = _or_grammar_error(d.first_token, row.state, logits[k:k + 1], row.sampler,
                                                   row.prompt)
        return out

    def _drop(self, indices: list[int]) -> None:
        """Rows out of the batch caches (prompts through, or requests gone): the rest compacted."""
        dropped = set(indices)
        keep = [i for i in range(len(self.rows)) if i not in dropped]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = None
            return
        for layer in self.cache:
            layer.filter(keep)
        mx.eval([c.state for c in self.cache])

    def clear(self) -> None:
        self.rows, self.cache = [], None


def _or_grammar_error(first_token, *args):
    """A prompt's first token, or the GrammarStateError its grammar raised taking it: that
    request fails alone, the chunk's other prompts go on."""
    try:
        return first_token(*args)
    except GrammarStateError as error:
        return error


def _shared(a: list[int], b: list[int]) -> int:
    """The length of the common prefix of two prompts."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


__all__ = ["BatchPrefill"]
