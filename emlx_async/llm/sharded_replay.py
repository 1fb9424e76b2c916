"""The sharded engine's replayed batch: every rank runs the same rounds of native steps.

Rank 0's driver (``ShardedReplayBatcher``) sends one plan a round, the
requests that join (their tokens and sampling, seed included) and the rows
that leave; every rank then runs the round (``ShardedReplayBatch.round``)
from that plan alone. What a round does follows from the plan and the
tokens before it, and the tokens are the same on every rank (the logits are
summed over the ranks and each row's random key is seeded from the plan),
so no rank needs rank 0's decisions past the plan:

1. the joining prompts take one prefill chunk (mlx-lm's model call; a
   Python job on the group's queue);
2. rows move between layouts of the batch caches (``plan_layout``; a Python
   job), sized for the round's steps;
3. ``ROUND_STEPS`` native steps queue at once as a chain on the group's
   queue (the step traced by the group: ``Group.trace``, each all_sum MLX's
   own at every call), then the take that hands the batch's arrays back.

Each rank reads the tokens, and a row ends where its stop condition says on
every rank alike; rank 0 gives them to its consumers and drops those past a
row's end (its slot steps on to the round's end, its writes unread). A row
that leaves (its consumer went, or a stop string matched on rank 0) leaves
at the next plan. Rows stop at a round's end when they reach min_tokens, so
their bias rows change between rounds. One plan and a loop round trip per
round rather than per step: running rows stall for a round (at most
``ROUND_STEPS`` steps) before a new request's first chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from .. import DistributedError
from .. import replay as _replay
from .batch_prefill import BatchPrefill
from .batch_replay import ReplayBatchJobs, Row, chain_inputs, plan_layout
from .decoding import Decoding
from .sampling import Sampler
from .state import PromptState, ReplayBatchState
from .traces import STAND_IN

# Native steps a round queues at once: a new request waits at most this many before its first chunk.
ROUND_STEPS = 8


@dataclass
class Planned:
    """A joining request as a plan's jobs see it: rank 0's, or a follower's copy from the plan."""

    uid: int | None  # its row in a replayed round (None: the Python step's plan, which has no uids)
    prompt: list[int]
    max_tokens: int
    sampler: Sampler


# What rank 0 does with a row's token: deliver(uid, token, finish reason or None).
Deliver = Callable[[int, int, "str | None"], None]


class ShardedReplayBatch:
    """The replayed batch as every rank keeps it: the same rows, caches and jobs, on the group's queue."""

    def __init__(self, decoding: Decoding, group, deliver: Deliver | None = None,
                 started: Callable[[int], None] | None = None):
        self.decoding, self.group = decoding, group
        self.jobs = ReplayBatchJobs(decoding)
        self.deliver = deliver  # rank 0: a row's token to its consumer (None: a follower drops it)
        self.started = started  # rank 0: a joining request's prompt is through (it runs from now on)
        self.state = ReplayBatchState()
        self.slots: list[Row | None] = []
        self.size = 0
        self.joining: list[Planned] = []
        self.prefills: dict[int, PromptState] = {}  # uid -> its prefill state (on the group's worker)
        self.prefill = BatchPrefill(decoding)  # the joining prompts' batch caches

    @property
    def busy(self) -> bool:
        """Rows decode or prompts are prefilling."""
        return bool(self.joining) or any(self.slots)

    def clear(self) -> None:
        self.state.clear()
        self.prefill.clear()
        self.slots, self.size, self.joining = [], 0, []
        self.prefills.clear()

    async def round(self, joins: list[Planned], leaves: list[int]) -> None:
        """One round, the same on every rank (the plan is already everyone's)."""
        gone = set(leaves)
        self.slots = [None if row is not None and row.request.uid in gone else row for row in self.slots]
        self.joining = [r for r in self.joining if r.uid not in gone] + joins
        for uid in gone:
            self.prefills.pop(uid, None)
        joined = await self._prefill() if self.joining else []
        if not self.joining:
            self.prefill.clear()  # rows left of prompts whose requests left
        live = [row for row in self.slots if row is not None] + [row for row, _ in joined]
        steps = _round_steps(live)
        self.slots, self.size, layout = plan_layout(self.decoding.replay, self.slots, self.size, [], joined, steps)
        if layout is not None:
            await self.group.run(self.jobs.layout, self.state, *layout, what="sharded layout")
        if live:
            await self._steps(steps)

    async def _prefill(self) -> list[tuple[Row, PromptState]]:
        """A chunk of the joining prompts; the rows whose prompt is through, with their prefills."""
        prefilling = list(self.joining)
        states = [(self.prefills.setdefault(r.uid, PromptState()), r.prompt, r.sampler) for r in prefilling]
        tokens = await self.group.run(self.jobs.prefill, self.prefill, states, what="sharded prefill")
        joined = []
        for request, token in zip(prefilling, tokens):
            if token is None:
                continue  # more of its prompt to go
            prefilled = self.prefills.pop(request.uid)
            self.joining.remove(request)
            if self.started is not None:
                self.started(request.uid)
            finish = self.decoding.finish(token, request.max_tokens - 1, request.sampler)
            self._give(request.uid, token, finish)
            if finish is None:
                joined.append((Row.first(request, token, prefilled), prefilled))
        return joined

    async def _steps(self, count: int) -> None:
        """`count` chained steps of the batch, queued at once; every row's tokens read in order."""
        replay, state, slots = self.decoding.replay, self.state, self.slots
        rows = len(slots)
        greedy, penalized, options, extra = chain_inputs(slots, state, replay.vocab)
        step = await replay.chained(None, greedy=greedy, rows=rows, size=self.size, penalized=penalized)
        take = await replay.take(None, rows=rows, size=self.size, penalized=penalized)
        # Positions from the round's start: a row done by length steps on at position 0 as a free
        # row does; one that ends on a stop token writes past what it keeps.
        positions = [[row.position + i if row is not None and row.left > i else 0 for row in slots]
                     for i in range(count)]
        # Queued at once, each job's time counts from when the one before it is done (its
        # deadline at most k limits from the round's start, once nobody awaits it).
        limit = self.group.limit(None)
        issued = []
        try:
            carried = [*state.caches, state.keys, mx.array([[row.token if row else 0] for row in slots],
                                                           dtype=mx.int32)]
            history = [state.counts, state.window] if penalized else []
            # The first step's job holds them now (updated in place along the chain).
            state.caches = state.keys = None
            if penalized:
                state.counts = state.window = None
            for i in range(count):
                issued.append(step.submit(*carried, mx.array(positions[i], dtype=mx.int32), *options,
                                          *history, *extra, fed=i > 0,
                                          timeout=math.inf if limit is None else limit * (i + 1)))
                carried, history = [STAND_IN] * (replay.n_caches + 2), [STAND_IN] * len(history)
            issued.append(take.submit(*[STAND_IN] * (replay.n_caches + (4 if penalized else 2)), fed=True,
                                      timeout=math.inf if limit is None else limit * (count + 1)))
            for i in range(count):
                issued[i].within(limit)
                self._read(await issued[i])
            issued[count].within(limit)
            arrays = await issued[count]
            n = replay.n_caches
            state.keys, state.caches = arrays[1], list(arrays[2:2 + n])
            if penalized:
                state.counts, state.window = arrays[2 + n], arrays[3 + n]
        finally:
            for job in issued:
                job.leave()  # the ranks issue them all: one not awaited here still settles the group
        await self.group.run(_replay.end_chain_here, what="sharded chain end")

    def _read(self, out: mx.array) -> None:
        """One step's tokens {rows, 1}: each live row takes its own; a row at its end frees its slot."""
        for slot, (token,) in enumerate(out.tolist()):
            row = self.slots[slot]
            if row is None:
                continue
            row.answer.append(token)
            row.position, row.token, row.left = row.position + 1, token, row.left - 1
            finish = self.decoding.finish(token, row.left, row.request.sampler)
            self._give(row.request.uid, token, finish)
            if finish is not None:
                self.slots[slot] = None

    def _give(self, uid: int, token: int, finish: str | None) -> None:
        if self.deliver is not None:
            self.deliver(uid, token, finish)


def break_mid_round(group, exc: BaseException) -> DistributedError:
    """The group's break for a round that failed on this rank: the other ranks issue the
    round's jobs this one will not, so every later collective would pair wrong."""
    if group.broken is None:
        error = DistributedError(f"[sharded round] rank {group.rank()} of {group.size()} failed in a replayed "
                                 f"round ({exc!r}); the ranks are out of step, so the group is broken")
        error.__cause__ = exc
        group.declare_broken(error)
    return group.broken


def _round_steps(live: list[Row]) -> int:
    """The round's steps: ROUND_STEPS, fewer when no row has as many left, and none past
    a row's min_tokens (its bias row changes there, between rounds)."""
    if not live:
        return 0
    steps = min(ROUND_STEPS, max(row.left for row in live))
    for row in live:
        if row.banned_steps > 0:
            steps = min(steps, row.banned_steps)
    return max(1, steps)


__all__ = ["ROUND_STEPS", "Planned", "ShardedReplayBatch", "break_mid_round"]
