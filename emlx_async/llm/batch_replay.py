"""Mode "batch", replayed step: B streams decode in one native job.

The batcher (``ReplayBatcher``) runs on the loop; its Python jobs
(``ReplayBatchJobs``) prefill joining prompts (on a second queue while the
batch steps, when one is free) and move rows between layouts of the batch
caches (on the batch queue).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
import mlx.core as mx

from .. import replay as _replay
from . import penalties as _penalties
from . import traced as _traced
from .batch_prefill import BatchPrefill
from .batching import Batcher, BatchRequest
from .constrained import batch_masks
from .decoding import Decoding
from .grammar import GrammarStateError
from .parallel import STEPS_AHEAD
from .sampling import GREEDY, Sampler
from .state import PromptState, ReplayBatchState
from .traces import STAND_IN


@dataclass
class Row:
    """A stream in the replayed batch: its cache row holds `position` tokens; the
    next step feeds `token` at `position`."""
    request: BatchRequest
    position: int
    token: int
    left: int  # tokens it may still generate
    answer: list[int] = field(default_factory=list)  # generated so far
    # The plain bias row its slot takes once min_tokens are generated (its slot has the
    # banned one until then; None: nothing left to lift).
    unban: mx.array | None = None

    @classmethod
    def first(cls, request: BatchRequest, token: int, prefilled: PromptState) -> Row:
        """A request's row once its prompt is through, `token` its first generated."""
        row = cls(request, len(request.prompt), token, request.max_tokens - 1, [token])
        history = prefilled.history
        if history is not None and history.banned_bias is not None:
            row.unban = history.bias  # lifted once it has generated min_tokens
        return row

    @property
    def banned_steps(self) -> int:
        """How many more steps sample with its banned ids at -inf (0 when none are banned)."""
        return 0 if self.unban is None else max(0, self.request.sampler.penalties.min_tokens - len(self.answer))


class ReplayBatchJobs:
    """The replayed batch's Python jobs, run on the batch queue."""

    def __init__(self, decoding: Decoding):
        self.decoding = decoding

    def prefill(self, group: BatchPrefill, joining: Sequence[tuple[PromptState, list[int], Sampler]]
                ) -> list[int | GrammarStateError | None]:
        """One chunk of the joining prompts, prefilled together (``BatchPrefill.chunk``).
        Returns each prompt's first token, or None while it has more to go (or the
        GrammarStateError of one whose grammar failed taking it); a finished
        one leaves its mlx-lm cache and random key (evaluated) in its state."""
        tokens = group.chunk(joining)
        for (state, _, sampler), token in zip(joining, tokens):
            if token is not None and not isinstance(token, GrammarStateError):
                # The Python sampler's key (and token history) after the first token: the graph continues them.
                state.key, state.history, sampler.history = sampler.first_key(), sampler.history, None
                # Evaluated: the layout job that moves them into the batch may run on another worker.
                history = state.history
                mx.eval(state.key, [c.state for c in state.cache],
                        *([history.counts, history.window, history.bias] if history is not None else []))
        return tokens  # type: ignore[return-value] - no logprobs on this path: ints

    def layout(self, state: ReplayBatchState, saves: list[tuple[int, list[int]]], keep: list[int] | None,
               joined: list[tuple[int, PromptState]], rows: int, size: int,
               unbans: Sequence[tuple[int, mx.array]] = ()) -> None:
        """Move rows between layouts of the batch caches.

        `saves` (slot, tokens): finished rows whose keys and values go to the
        prompt cache first. `keep` None: the layout stays; else a new one of
        `rows` rows and `size` positions holds old rows `keep` in slots 0, 1,
        ... (0 rows drops the caches). `joined` (slot, prefill state): new
        rows' prompts and keys, each written into its slot (a bias row with the
        banned ids of one that has not generated min_tokens). `unbans` (slot,
        bias row), in the new layout's slots: rows that reached min_tokens take
        their plain bias rows.
        """
        spec = self.decoding.replay.spec
        caches, keys = state.caches, state.keys
        for slot, tokens in saves:
            self.decoding.prompt_cache.save(tokens, spec.to_prompt_cache(caches, slot, len(tokens)))
        if keep is not None:
            if rows == 0:
                state.clear()
                return
            caches, keys = state.caches, state.keys = spec.relayout(caches, keep, rows, size), \
                _moved(keys, keep, rows, (2,), mx.uint32)
            if state.counts is not None:
                state.counts, state.window, state.bias = (_moved(a, keep, rows) for a in
                                                          (state.counts, state.window, state.bias))
        for slot, prefilled in joined:
            spec.write_row(caches, slot, spec.from_prompt_cache(prefilled.cache, size))
            keys[slot] = prefilled.key
            history = prefilled.history
            if history is not None:
                if state.counts is None:  # the first penalized row: every row gets its entries
                    state.counts, state.window, state.bias = (_moved(a, [], keys.shape[0]) for a in
                                                              (history.counts, history.window, history.bias))
                # It joins with its first token generated.
                state.counts[slot], state.window[slot], state.bias[slot] = \
                    history.counts[0], history.window[0], history.bias_for(1)[0]
            elif state.counts is not None:
                # A slot a penalized row left keeps its entries: its logit bias would apply to this row.
                state.counts[slot], state.window[slot], state.bias[slot] = 0, 0, 0
        for slot, bias in unbans:
            state.bias[slot] = bias[0]
        mx.eval(caches, keys, *(a for a in (state.counts, state.window, state.bias) if a is not None))


class ReplayBatcher(Batcher):
    """The replayed step: B streams decode in one native job.

    The batch is ``slots`` rows (the smallest traced row count that holds the
    live streams) over caches of ``size`` positions (the smallest traced size
    that holds every row's next position: it grows with the longest row).
    The joining prompts are prefilled together, a chunk (`prefill_chunk`
    tokens of each) per Python job, in one padded model call
    (llm/batch_prefill.py, with the prompt cache). That job runs on a second
    pooled queue when one is free, while the running rows' steps chain on
    the batch queue (the chain stops when the chunk is done, and the rows
    whose prompt is through join); with no queue free a round submits one
    replayed step for every row and then the chunk, so running streams stall
    for at most one chunk. Only when
    a stream joins, finishes with a prompt cache to fill, or the batch's shape
    changes does a Python job move rows (``ReplayBatchJobs.layout``).
    Free rows decode greedily at position 0 and their tokens are dropped.
    Constrained rows (a grammar) make their rounds take the masked step, one
    round at a time (a row's next mask needs its last token, computed in a
    thread meanwhile), beside free rows whose masks allow every token.
    """

    def __init__(self, decoding: Decoding):
        super().__init__(decoding)
        self.jobs = ReplayBatchJobs(decoding)
        # A second pooled queue the joining prompts prefill on while the batch chains its steps
        # (None: none was free, they prefill on the batch queue between steps), and its chunk in flight.
        self._aside = None
        self._prefilling = None

    def _new_state(self) -> ReplayBatchState:
        return ReplayBatchState()

    async def _close(self, queue, state: ReplayBatchState) -> None:
        if self._prefilling is not None:  # the driver failed mid-chunk: its result is dropped
            self._prefilling.cancel()
            self._prefilling = None
        self._give_back_aside()
        state.clear()
        await queue.run(_replay.end_chain_here)  # a chain the driver left mid-way

    async def _serve(self, queue, state: ReplayBatchState) -> None:
        decoding, replay = self.decoding, self.decoding.replay
        assert replay is not None
        slots: list[Row | None] = []
        size = 0
        prefills: dict[int, PromptState] = {}  # id(joining request) -> its prefill state (on the worker)
        group = BatchPrefill(decoding)  # the joining prompts' batch caches (on the worker that prefills)
        prefilling: list[BatchRequest] = []  # the requests of the chunk in flight
        next_uid = 0
        while self.waiting or self.joining or self.running or self.leaving:
            if self.leaving:
                gone, self.leaving = set(self.leaving), []
                slots = [None if row is not None and row.request.uid in gone else row for row in slots]
            for request in [r for r in self.joining if r.done]:  # left mid-prompt
                self.joining.remove(request)
                prefills.pop(id(request), None)
            self.joining += self.waiting
            self.waiting = []
            if not self.joining and self._prefilling is None:
                group.clear()  # rows left of requests that left mid-prompt
                self._give_back_aside()
            if self.joining and self._prefilling is None:
                self._aside = self._aside or self._free_queue()
                if self._aside is not None:  # the chunk runs there; the batch chains on meanwhile
                    prefilling = list(self.joining)
                    self._prefilling = self._aside.run(self.jobs.prefill, group,
                                                       _joining_states(prefilling, prefills))
            if any(slots) and (not self.joining or self._prefilling is not None):
                # The batch keeps its rows: a chain of steps (until the chunk aside is done).
                chained = await self._chain(queue, state, slots, size)
                if chained is not None:
                    slots, size = chained
                    if self._prefilling is None or not self._prefilling.done():
                        continue
            step = chunk = None
            # The chunk aside joins the round once done (or when no row is left to step); until
            # then rounds go on without it: a constrained row steps a round at a time, unchained.
            if self._prefilling is not None and (self._prefilling.done() or not any(slots)):
                chunk, self._prefilling = self._prefilling, None
            saves: list[tuple[int, list[int]]] = []
            try:
                # Constrained rows: their grammars take the last tokens and give this round's
                # masks (a thread); a row whose grammar is done or failed ends here.
                mask = await self._grammar_round(slots, saves)
                # A row it ended with a save goes to the prompt cache first (the layout below):
                # a step now would write its slot's position 0, a free row's, over what the save reads.
                if any(slots) and not saves:
                    greedy = all(row is None or row.request.sampler.greedy for row in slots)
                    # One penalized row makes the round take the penalized step (neutral
                    # options leave the other rows' logits as they are); one constrained
                    # row the masked step (free rows' masks allow every token).
                    penalties = [row.request.sampler.penalties if row else None for row in slots]
                    penalized = any(p is not None for p in penalties)
                    function = await replay.function(queue, greedy=greedy, rows=len(slots), size=size,
                                                     penalized=penalized, masked=mask is not None)
                    extra = [state.counts, state.window, state.bias,
                             *_penalties.penalty_rows(penalties)] if penalized else []
                    if mask is not None:
                        extra.append(mask)
                    step = function(*state.caches, state.keys,
                                    mx.array([[row.token if row else 0] for row in slots], dtype=mx.int32),
                                    mx.array([row.position if row else 0 for row in slots], dtype=mx.int32),
                                    *_traced.sampling_rows([row.request.sampler.options if row else GREEDY
                                                            for row in slots], replay.vocab), *extra,
                                    queue=queue, donate=replay.donate_penalized if penalized else replay.donate)
                if chunk is None and self.joining and self._prefilling is None:
                    # No queue aside: the chunk runs after the step.
                    prefilling = list(self.joining)
                    chunk = queue.run(self.jobs.prefill, group, _joining_states(prefilling, prefills))
                if step is not None:
                    out, step = await step, None
                    self._read(out, slots, saves)
                joined: list[tuple[Row, PromptState]] = []
                if chunk is not None:
                    tokens, chunk = await chunk, None
                    for request, token in zip(prefilling, tokens):
                        if token is None:
                            continue  # more of its prompt to go
                        prefilled = prefills.pop(id(request), None)
                        if request.done or request not in self.joining:
                            continue  # it left during its last chunk
                        self.joining.remove(request)
                        request.uid, next_uid = next_uid, next_uid + 1
                        self.running[request.uid] = request
                        if isinstance(token, GrammarStateError):  # its grammar failed: it fails alone
                            self._deliver(request.uid, min(decoding.eos_ids), "stop", token)
                            continue
                        finish = decoding.finish(token, request.max_tokens - 1, request.sampler)
                        self._deliver(request.uid, token, finish)
                        if finish is None:
                            joined.append((Row.first(request, token, prefilled), prefilled))
                slots, size = await self._relayout(queue, state, slots, size, saves, joined)
            finally:
                for pending in (step, chunk):
                    if pending is not None:
                        pending.cancel()

    async def _grammar_round(self, slots: list[Row | None], saves: list[tuple[int, list[int]]]) -> mx.array | None:
        """This round's masks {rows, V} bool for the masked step (None: no row is constrained).

        In a thread (llm/constrained.py): each constrained row's grammar takes
        the tokens it has not seen, then every row's mask is computed at once.
        A row whose grammar allows only end-of-sequence now stops (as the Python
        step's end-of-sequence does) and one whose grammar failed gets its
        ``GrammarStateError``: either frees its slot (listed in `saves` with a
        prompt cache), and the other rows go on."""
        grammars = [(row.request.sampler.grammar, row.answer)
                    if row is not None and row.request.sampler.grammar is not None else None for row in slots]
        if not any(grammars):
            return None
        allowed, ended = await anyio.to_thread.run_sync(batch_masks, grammars, self.decoding.replay.vocab)
        eos = min(self.decoding.eos_ids)  # a grammar needs them (Engine checks)
        for slot, error in ended.items():
            row = slots[slot]
            self._deliver(row.request.uid, eos, "stop", error)
            slots[slot] = None
            if self.decoding.prompt_cache is not None:  # the prompt and the answer its cache holds
                saves.append((slot, row.request.prompt + row.answer[:-1]))
        return None if allowed is None else mx.array(allowed)

    def _interrupted(self) -> bool:
        """What stops a chain besides its rows: a row leaving, or a prompt to join (one waiting
        while no chunk prefills aside, or the chunk aside done)."""
        if self.leaving:
            return True
        return bool(self.waiting) if self._prefilling is None else self._prefilling.done()

    def _free_queue(self):
        """A second pooled queue for the joining prompts' chunks, if one is free and starts (None:
        they prefill on the batch queue; a worker that cannot start must not fail the batch)."""
        try:
            return self.decoding.runtime.try_acquire_queue()
        except Exception:  # noqa: BLE001 - e.g. "cannot start a CPU worker": the batch queue does it
            return None

    def _give_back_aside(self) -> None:
        if self._aside is not None:
            self.decoding.runtime.release_queue(self._aside)
            self._aside = None

    def _read(self, out: mx.array, slots: list[Row | None], saves: list[tuple[int, list[int]]]) -> bool:
        """One step's tokens {rows, 1} to their rows' consumers (free and finished rows' are
        dropped); a row that finishes frees its slot and, with a prompt cache, is listed in
        `saves`. Returns whether one finished."""
        decoding, finished = self.decoding, False
        for slot, (token,) in enumerate(out.tolist()):
            row = slots[slot]
            if row is None:
                continue
            row.answer.append(token)
            row.position, row.token, row.left = row.position + 1, token, row.left - 1
            finish = decoding.finish(token, row.left, row.request.sampler)
            self._deliver(row.request.uid, token, finish)
            if finish is not None:
                slots[slot], finished = None, True
                if decoding.prompt_cache is not None:  # the prompt and answer, for a next turn
                    saves.append((slot, row.request.prompt + row.answer[:-1]))
        return finished

    async def _chain(self, queue, state: ReplayBatchState, slots: list[Row | None],
                     size: int) -> tuple[list[Row | None], int] | None:
        """Steps of the same rows as a chain on the worker (``TracedFunction.chain``): each
        takes its tokens, keys and caches (and penalized rows' counts and window) from the
        step before it, so the next step is queued before this one's tokens reach the loop,
        and the worker never waits for it. A finished row's slot decodes on as a free one
        until the live rows fit fewer rows; with a prompt cache, whose saves read finished
        rows, the chain stops when one finishes (or will have by length). It also stops
        when one leaves, a request waits to join, or no cache holds the rows; steps
        already queued then still run (a finished row's extra token is dropped, written
        past what its prompt-cache save reads), their arrays come back to `state`
        (``ReplayTraces.take``) and the rows move as after any round. The cache grows
        within the chain (padded natively); it shrinks at the move. None: no step could
        be queued (no traced cache holds the next one), the batch is as it was."""
        replay = self.decoding.replay
        rows = len(slots)
        if any(row is not None and row.request.sampler.grammar is not None for row in slots):
            return None  # a constrained row's next mask needs its last token: a round at a time
        # Finished rows' caches go to the prompt cache: no step may write over them.
        keep_finished = self.decoding.prompt_cache is not None
        greedy, penalized, options, extra = chain_inputs(slots, state, replay.vocab)
        ahead: collections.deque = collections.deque()  # the steps queued, oldest first
        saves: list[tuple[int, list[int]]] = []
        chained = stop = stepped = False
        try:
            while True:
                while not stop and len(ahead) < STEPS_AHEAD:
                    # The rows still decoding once the queued steps are read; the others (finished,
                    # or done by length) decode at position 0 like free rows, their tokens dropped.
                    going = [row is not None and row.left > len(ahead) for row in slots]
                    positions = [row.position + len(ahead) if on else 0 for row, on in zip(slots, going)]
                    next_size = replay.size_for(max(positions) + 1)
                    done = [row is not None and not on for row, on in zip(slots, going)]
                    # A row that reaches min_tokens takes its plain bias row between chains.
                    unbanned = any(row is not None and row.unban is not None and row.banned_steps <= len(ahead)
                                   for row in slots)
                    stop = self._interrupted() or next_size is None or unbanned or \
                        (any(done) if keep_finished else replay.rows_for(sum(going)) < rows)
                    if stop:
                        break
                    size = max(size, next_size)  # a chained cache only grows
                    function = await replay.chained(queue, greedy=greedy, rows=rows, size=size, penalized=penalized)
                    if chained:  # stand-ins: the chain carries the real ones
                        carried, history = [STAND_IN] * (replay.n_caches + 2), [STAND_IN] * 2
                    else:
                        tokens = mx.array([[row.token if row else 0] for row in slots], dtype=mx.int32)
                        carried, history = [*state.caches, state.keys, tokens], [state.counts, state.window]
                        # The first step's job holds them now (updated in place along the chain).
                        state.caches = state.keys = None
                        if penalized:
                            state.counts = state.window = None
                    ahead.append(function(*carried, mx.array(positions, dtype=mx.int32), *options,
                                          *(history + extra if penalized else []), queue=queue, fed=chained))
                    del carried, history
                    chained = True
                if not ahead:
                    break
                stepped = True
                out = await ahead.popleft()
                stop = self._read(out, slots, saves) and keep_finished or stop
            if chained:
                take = await replay.take(queue, rows=rows, size=size, penalized=penalized)
                arrays = await take(*[STAND_IN] * (replay.n_caches + (4 if penalized else 2)), queue=queue,
                                    fed=True)
                n = replay.n_caches
                state.keys, state.caches = arrays[1], list(arrays[2:2 + n])
                if penalized:
                    state.counts, state.window = arrays[2 + n], arrays[3 + n]
                chained = False
                await queue.run(_replay.end_chain_here)
        finally:
            for future in ahead:
                future.cancel()
            if chained:  # failed or cancelled mid-chain: the driver drops the batch (_close ends the chain)
                state.clear()
        if not stepped:
            return None
        if self.leaving:
            gone, self.leaving = set(self.leaving), []
            slots = [None if row is not None and row.request.uid in gone else row for row in slots]
        return await self._relayout(queue, state, slots, size, saves, [])

    async def _relayout(self, queue, state: ReplayBatchState, slots: list[Row | None], size: int, saves: list,
                        joined: list[tuple[Row, PromptState]]) -> tuple[list[Row | None], int]:
        """The batch after this round (``plan_layout``), its rows moved by one layout job if they move."""
        new_slots, new_size, layout = plan_layout(self.decoding.replay, slots, size, saves, joined)
        if layout is not None:
            await queue.run(self.jobs.layout, state, *layout)
        return new_slots, new_size


def chain_inputs(slots: list[Row | None], state: ReplayBatchState, vocab: int
                 ) -> tuple[bool, bool, list[mx.array], list[mx.array]]:
    """What a chain of the batch's steps takes from its rows, besides positions: whether every
    row is greedy and whether one is penalized (the step's variant), the rows' sampling
    options, and the penalized step's bias and penalty rows."""
    greedy = all(row is None or row.request.sampler.greedy for row in slots)
    penalties = [row.request.sampler.penalties if row else None for row in slots]
    penalized = any(p is not None for p in penalties)
    options = _traced.sampling_rows([row.request.sampler.options if row else GREEDY for row in slots], vocab)
    extra = [state.bias, *_penalties.penalty_rows(penalties)] if penalized else []
    return greedy, penalized, options, extra


def plan_layout(replay, slots: list[Row | None], size: int, saves: list, joined: list[tuple[Row, PromptState]],
                steps: int = 1) -> tuple[list[Row | None], int, tuple | None]:
    """The batch after a round: same shape unless the live rows need fewer or more rows, or
    other cache positions (the cache holds every row's writes of the next `steps` steps: it
    grows and shrinks with the longest row). Returns the new slots and size, and the rest of
    ``ReplayBatchJobs.layout``'s arguments (None: nothing moves)."""
    live = [row for row in slots if row is not None] + [row for row, _ in joined]
    rows = replay.rows_for(len(live))
    new_size = replay.size_for(max(row.position + max(1, min(steps, row.left)) for row in live)) if live else 0
    if rows == len(slots) and new_size == size:
        unbans = _unbans(slots)
        if not saves and not joined and not unbans:
            return slots, size, None
        free = [slot for slot, row in enumerate(slots) if row is None]
        placed = list(zip(free, joined))
        for slot, (row, _) in placed:
            slots[slot] = row
        return slots, size, (saves, None, [(slot, prefilled) for slot, (_, prefilled) in placed], rows, size,
                             unbans)
    keep = [slot for slot, row in enumerate(slots) if row is not None]
    new_slots: list[Row | None] = [slots[slot] for slot in keep]
    placed = [(len(new_slots) + k, prefilled) for k, (_, prefilled) in enumerate(joined)]
    new_slots += [row for row, _ in joined]
    new_slots += [None] * (rows - len(new_slots))
    return new_slots, new_size, (saves, keep, placed, rows, new_size, _unbans(new_slots))


def _unbans(slots: list[Row | None]) -> list[tuple[int, mx.array]]:
    """(slot, plain bias row) of the rows that have generated min_tokens and still hold their
    banned bias rows; each is lifted once (the layout job writes it)."""
    out = []
    for slot, row in enumerate(slots):
        if row is not None and row.unban is not None and row.banned_steps == 0:
            out.append((slot, row.unban))
            row.unban = None
    return out


def _joining_states(requests: list[BatchRequest], prefills: dict[int, PromptState]
                    ) -> list[tuple[PromptState, list[int], Sampler]]:
    """A prefill job's joining prompts: each request's prefill state (made at its first chunk)."""
    return [(prefills.setdefault(id(r), PromptState()), r.prompt, r.sampler) for r in requests]


def _moved(old: mx.array, keep: Sequence[int], rows: int, dims: tuple[int, ...] | None = None,
           dtype: mx.Dtype | None = None) -> mx.array:
    """A per-row array of `rows` rows holding old rows `keep` in rows 0, 1, ... (the rest zeros)."""
    new = mx.zeros((rows, *(old.shape[1:] if dims is None else dims)), dtype=old.dtype if dtype is None else dtype)
    if keep:
        new[:len(keep)] = old[mx.array(list(keep))]
    return new


__all__ = ["ReplayBatchJobs", "ReplayBatcher", "Row", "chain_inputs", "plan_layout"]
