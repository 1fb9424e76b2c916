"""Grammar-constrained rows on the replayed step: each step's token mask, computed
off the loop and off the worker.

The masked step (llm/replay_step.py, ``masked=True``) takes every row's allowed
tokens as an input ({B, V} bool, a free row all True), so a constrained step
stays one native job and constrained and free rows share a batch. Step t + 1's
mask needs token t: as soon as token t reaches the loop, a thread
(``anyio.to_thread``; llguidance releases the GIL) feeds it to the grammar and
computes the next mask, and the next step is queued. Where a mask allows one
token only (a forced token: a JSON key, a bracket, a separator), that token is
known before its step runs: the grammar takes it at once and the mask after it
is computed while the step runs, so such steps are queued ahead as a free
stream's are.

The masks are the grammar's own (``GrammarMatcher.mask``, unpacked with
``unpack_token_mask``), applied by the same ``apply_token_mask`` as the Python
step applies them, so both steps give the same tokens for the same seed.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import anyio
import mlx.core as mx
import numpy as np

from .grammar import GrammarMatcher, GrammarStateError, unpack_token_mask


def only_token(allowed: np.ndarray) -> int | None:
    """The one token a {V} bool mask allows, or None when it allows several (or none)."""
    return int(np.argmax(allowed)) if np.count_nonzero(allowed) == 1 else None


def plan_masks(matcher: GrammarMatcher, token: int | None, wanted: int, vocab: int,
               eos_ids: frozenset[int]) -> tuple[list[tuple[np.ndarray, int | None]], bool]:
    """In a thread: the grammar takes `token` (None: it has every token already), then up to
    `wanted` next masks ({V} bool, with the token each forces or None), through forced
    tokens (the grammar takes each at once); and whether only end-of-sequence may follow
    the tokens known now (the stream stops there). Raises ``GrammarStateError``."""
    if token is not None:
        matcher.advance(token)
    planned: list[tuple[np.ndarray, int | None]] = []
    while len(planned) < wanted:
        if matcher.is_finished:
            return planned, True
        allowed = unpack_token_mask(matcher.mask(), vocab)
        forced = only_token(allowed)
        planned.append((allowed, forced))
        if forced is None or forced in eos_ids:  # end-of-sequence ends the stream: nothing after it
            break
        matcher.advance(forced)
    return planned, False


class StreamMasks:
    """One constrained stream's masks on the replayed step (parallel mode).

    ``after(token, wanted)`` feeds the stream's latest token to its grammar and
    plans the next masks in ``ready``: (mask {1, V} bool, the token it forces or
    None). A step may be queued only with a mask from ``ready``; a mask that
    forces no token is the last one until that step's token arrives.
    ``finished``: only end-of-sequence may follow the tokens known so far.
    """

    def __init__(self, matcher: GrammarMatcher, vocab: int, eos_ids: Sequence[int] | set[int]):
        self.matcher, self.vocab, self.eos_ids = matcher, vocab, frozenset(eos_ids)
        self.ready: collections.deque[tuple[mx.array, int | None]] = collections.deque()
        self.finished = False

    async def after(self, token: int | None, wanted: int) -> None:
        """The grammar takes `token` and plans up to `wanted` masks, in a thread (GrammarStateError)."""
        planned, self.finished = await anyio.to_thread.run_sync(plan_masks, self.matcher, token, wanted, self.vocab,
                                                                self.eos_ids)
        # Made on the loop (an array from host memory, evaluated): any worker reads it.
        self.ready.extend((mx.array(allowed[None]), forced) for allowed, forced in planned)

    def check(self, token: int, forced: int | None) -> None:
        """A step's token against the one its mask forced (the grammar has taken that one)."""
        if forced is not None and token != forced:
            raise GrammarStateError(f"{self.matcher.grammar.kind} grammar: the step sampled token {token} where "
                                    f"its mask allowed only {forced}")


def batch_masks(rows: Sequence[tuple[GrammarMatcher, Sequence[int]] | None],
                vocab: int) -> tuple[np.ndarray | None, dict[int, GrammarStateError | None]]:
    """In a thread, for one round of a batch: each constrained row (its matcher and its
    answer so far; None for free rows) feeds its grammar the tokens it has not taken, then
    every row's next mask at once (llguidance's threads): ({B, V} bool, all True for free
    rows; None when no row is constrained any more) and the rows that end here, each
    with its ``GrammarStateError`` (that request fails) or None (only end-of-sequence may
    follow: it stops)."""
    ended: dict[int, GrammarStateError | None] = {}
    matchers: list[GrammarMatcher | None] = []
    for i, entry in enumerate(rows):
        matcher = None
        if entry is not None:
            matcher, answer = entry
            try:
                for token in answer[len(matcher.tokens):]:
                    matcher.advance(token)
                if matcher.is_finished:
                    ended[i], matcher = None, None
            except GrammarStateError as error:
                ended[i], matcher = error, None
        matchers.append(matcher)
    tokenizer = next((m.tokenizer for m in matchers if m is not None), None)
    if tokenizer is None:
        return None, ended
    packed, errors = tokenizer.fill_masks(matchers)
    for i, failure in enumerate(errors):
        if failure is not None:
            ended[i] = failure
    return np.ascontiguousarray(unpack_token_mask(packed, vocab)), ended


__all__ = ["StreamMasks", "batch_masks", "only_token", "plan_masks"]
