"""Mode "parallel": each request borrows a pooled queue for its whole life; its KV
cache lives on that queue's thread and every decode step is one job there, so
streams run on separate OS threads and MLX streams and the loop is free
between steps.

Both paths yield token ids (or (id, logprob, top alternatives) where logprobs
were asked for), then a finish reason, "stop" or "length".
"""

from __future__ import annotations

import collections
from collections.abc import AsyncGenerator

import mlx.core as mx

from .. import replay as _replay
from . import penalties as _penalties
from . import traced as _traced
from .constrained import StreamMasks
from .decoding import Decoding
from .sampling import Sampler
from .state import PromptState, ReplayStreamState
from .traces import STAND_IN

# Decode steps queued ahead of the consumer.
STEPS_AHEAD = 2
# Masks a constrained stream plans at most per thread hop, through forced tokens (a few KiB each).
MASKS_AHEAD = 16


async def python_tokens(decoding: Decoding, prompt: list[int], max_tokens: int,
                        sampler: Sampler) -> AsyncGenerator[int | tuple | str, None]:
    """The Python step: mlx-lm's model call, one job per token.

    Steps read their input token from the request's state on the worker,
    so the next steps are queued before this token reaches the loop: the
    worker never waits for a round trip through the event loop. A step
    queued past an end-of-sequence token is dropped (or, if it already
    started, discarded).
    """
    runtime = decoding.runtime
    queue = await runtime.acquire_queue()
    state = PromptState()
    ahead: collections.deque = collections.deque()  # job futures of the steps queued ahead
    steps_left = max_tokens - 1  # the prefill produces the first token
    try:
        item = await queue.run(decoding.prefill, state, prompt, sampler)
        while True:
            if decoding.ends(item[0] if isinstance(item, tuple) else item, sampler):
                yield "stop"
                return
            while len(ahead) < STEPS_AHEAD and steps_left > 0:
                ahead.append(queue.run(decoding.python_step, state, sampler))
                steps_left -= 1
            yield item
            if not ahead:
                break
            item = await ahead.popleft()
        yield "length"
    finally:
        for future in ahead:
            future.cancel()  # dropped if queued; discarded if running
        state.clear()  # drops the KV cache
        runtime.release_queue(queue)


async def replayed_tokens(decoding: Decoding, prompt: list[int], max_tokens: int,
                          sampler: Sampler) -> AsyncGenerator[int | str, None]:
    """The Python prefill, then one replayed job per token.

    The steps are a chain on the worker (``TracedFunction.chain``): each
    takes its token, key and caches from the step before it there, so
    the next steps are queued before this token reaches the loop (as in
    python_tokens) and the caches, held by the chain alone, are
    updated in place. A cache that fills moves to the next length at the
    next step (padded natively); one whose layers are all bounded (rings,
    states) never fills.

    A constrained stream (``sampler.grammar``) takes the masked step: each
    step's mask is planned in a thread from the tokens known so far
    (llm/constrained.py), so a step is queued ahead only where the masks
    before it forced their tokens; a failure of the grammar raises
    ``GrammarStateError`` from this stream alone.
    """
    replay, runtime = decoding.replay, decoding.runtime
    assert replay is not None
    size = replay.size_for(len(prompt) + 1)  # it grows as the answer does
    queue = await runtime.acquire_queue()
    state = ReplayStreamState()
    # (job future, the token its mask forced or None) of the steps queued ahead
    ahead: collections.deque = collections.deque()
    chained = False
    try:
        token = await queue.run(replay_prefill, decoding, state, prompt, sampler, size)
        options = _traced.sampling_inputs(*sampler.options, replay.vocab)
        # Penalized streams take the step with the penalties' inputs: their counts and
        # window ride the chain, the bias row (made on the worker) goes with every step.
        penalized = sampler.penalties is not None
        # The banned row until min_tokens are generated (the step at `position` samples
        # after position - len(prompt) + 1 tokens), then the plain one.
        bias, banned_bias = state.bias, state.banned_bias
        banned_until = len(prompt) - 1 + (sampler.penalties.min_tokens if banned_bias is not None else 0)
        extra = _penalties.penalty_inputs(sampler.penalties) if penalized else []
        # The prefill's sampling fed the first token to the grammar.
        masks = None if sampler.grammar is None else StreamMasks(sampler.grammar, replay.vocab, decoding.eos_ids)
        if masks is not None and token not in decoding.eos_ids:
            await masks.after(None, min(MASKS_AHEAD, max_tokens - 1))
        position = len(prompt)
        steps_left = max_tokens - 1
        while True:
            if decoding.ends(token, sampler):
                yield "stop"
                return
            while len(ahead) < STEPS_AHEAD and steps_left > 0:
                forced = None
                if masks is not None:
                    if not masks.ready:
                        break  # the next mask waits for a step's token (or the grammar is done)
                    mask, forced = masks.ready.popleft()
                # Full: the next length, padded by the chain (a bounded cache never is).
                size = replay.size_for(position + 1)
                function = await replay.chained(queue, greedy=sampler.greedy, size=size, penalized=penalized,
                                                masked=masks is not None)
                if chained:  # stand-ins: the chain carries the real ones
                    carried, history = [STAND_IN] * (replay.n_caches + 2), [STAND_IN] * 2
                else:
                    carried, history = [*state.caches, state.key, state.token], [state.counts, state.window]
                    state.clear()  # the first step's job holds them now
                penalty_args = [*history, banned_bias if position < banned_until else bias, *extra] \
                    if penalized else []
                mask_arg = [mask] if masks is not None else []
                ahead.append((function(*carried, mx.array(position, dtype=mx.int32), *options, *penalty_args,
                                       *mask_arg, queue=queue, fed=chained), forced))
                chained = True
                position += 1
                steps_left -= 1
            yield token
            if not ahead:
                break
            future, forced = ahead.popleft()
            token = (await future).item()
            if masks is not None and token not in decoding.eos_ids:
                masks.check(token, forced)
                room = min(MASKS_AHEAD, steps_left)  # the steps not queued yet
                if forced is None:  # the grammar takes it now, and plans the next masks
                    await masks.after(token, room)
                elif not masks.ready and not masks.finished and not (ahead and ahead[-1][1] is None):
                    await masks.after(None, room)  # every token known (forced): plan on
        # A finished grammar allows only end-of-sequence: the Python step's answer too.
        yield "stop" if masks is not None and masks.finished and steps_left > 0 else "length"
    finally:
        for future, _ in ahead:
            future.cancel()  # dropped if queued; discarded if running
        state.clear()
        if chained:
            try:  # queued behind the steps: frees the chain's caches before the queue is reused
                freed = queue.run(_replay.end_chain_here)
            except Exception:  # noqa: BLE001 - a closed runtime frees its workers anyway
                pass
            else:
                # Nobody awaits it: a runtime closed meanwhile drops it (QueueClosed),
                # which frees the chain as well and is no failure to report.
                freed.add_done_callback(_outcome_not_needed)
        runtime.release_queue(queue)


def replay_prefill(decoding: Decoding, state: ReplayStreamState, prompt: list[int], sampler: Sampler,
                   size: int) -> int | None:
    """On the request's queue: mlx-lm's chunked prefill, copied into fixed caches of `size` tokens."""
    token = decoding.prefill(state.prompt, prompt, sampler)
    if token is None:
        return None  # cancelled
    caches = decoding.replay.spec.from_prompt_cache(state.prompt.cache, size)
    state.prompt.clear()
    # The Python sampler's key after the first token: the graph continues its stream.
    state.caches, state.key = caches, sampler.first_key()
    state.token = mx.array([[token]], dtype=mx.int32)
    history = sampler.history
    if history is not None:  # the prompt's window and no counts yet: the chain records from here
        state.counts, state.window, state.bias = history.counts, history.window, history.bias
        state.banned_bias = history.banned_bias
        sampler.history = None
    mx.eval(caches, state.key, state.token, state.counts, state.window, state.bias, state.banned_bias)
    return token


__all__ = ["MASKS_AHEAD", "STEPS_AHEAD", "python_tokens", "replay_prefill", "replayed_tokens"]


def _outcome_not_needed(future) -> None:
    if not future.cancelled():
        future.exception()  # marks it retrieved
