"""Batch mode's joining prompts prefilled together (llm/batch_prefill.py): one padded
model call per chunk, and each prompt's tokens as it gives them alone.

Tiny random models of several architectures (tests/support/tiny_models.py, no
download); the model is wrapped to count its calls, which only prefills make
(the decode steps are replayed natively).
"""

from __future__ import annotations

import functools

import anyio
import pytest

import emlx_async as ea
from emlx_async.llm import Engine, PrefixCache
from support.engine import Counting, concurrently, tokens_into, tokens_of
from support.helpers import on_loops
from support.tiny_models import IdsTokenizer, mlx_lm_tokens, tiny

SAMPLED = dict(temperature=0.9, top_p=0.9, top_k=20)
# 6, 3, 9 and 1 tokens: in chunks of 4 the second and fourth end in the first chunk,
# the first in the second, the third in the third.
PROMPTS = [[3, 17, 5, 9, 100, 42], [7, 1, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19], [2]]
N = 10


@functools.cache
def model_of(kind: str):
    return tiny(kind)


@functools.cache
def alone(kind: str, prompt: tuple[int, ...], seed: int | None = None, n: int = N) -> list[int]:
    """mlx-lm's own tokens for one prompt alone."""
    return mlx_lm_tokens(model_of(kind), list(prompt), n, seed=seed, **(SAMPLED if seed is not None else {}))


async def batch_engine(rt, kind: str, **options) -> tuple[Engine, Counting]:
    engine = Engine(model_of(kind), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode="batch",
                    max_concurrent=4, prefill_chunk=4, **options)
    assert await engine.prepare_step(cache_sizes=(16, 32, 64)) == "replay", engine.step_note
    counting = engine.model = Counting(engine.model)
    return engine, counting


def requests(seeds=(None, None, None, None)) -> list[dict]:
    return [dict(prompt=p, max_tokens=N, **({} if s is None else dict(seed=s, **SAMPLED)))
            for p, s in zip(PROMPTS, seeds)]


@pytest.mark.parametrize("kind", ["llama", "qwen3", "starcoder2"])
@on_loops("asyncio", "uvloop")
async def test_prompts_of_different_lengths_joining_at_once_are_prefilled_together(kind):
    async with ea.Runtime(pool_size=2) as rt:
        engine, counting = await batch_engine(rt, kind)
        with anyio.fail_after(60):
            got = await concurrently(engine, requests())
        assert got == [alone(kind, tuple(p)) for p in PROMPTS]
        # A padded call per chunk over the rows still prefilling (widths 4, 4, then nothing
        # left but a last token), each followed by one over the last tokens of the prompts
        # ending in it, not one call per prompt and chunk.
        assert counting.calls == [(4, 4), (2, 1), (2, 4), (1, 1), (1, 1)], counting.calls
        counting.calls.clear()
        seeds = (5, None, 6, 7)
        with anyio.fail_after(60):
            got = await concurrently(engine, requests(seeds))
        assert got == [alone(kind, tuple(p), s) for p, s in zip(PROMPTS, seeds)]
        assert counting.calls[0] == (4, 4)
        await engine.wait_idle()


@on_loops("asyncio", "uvloop")
async def test_prompts_joining_a_running_batch_are_prefilled_together_and_decode_with_it():
    async with ea.Runtime(pool_size=2) as rt:
        engine, counting = await batch_engine(rt, "llama")
        results: dict[int, list[int]] = {0: [], 1: [], 2: []}

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                started = anyio.Event()
                tg.start_soon(functools.partial(tokens_into, results[0], engine, prompt=PROMPTS[1], max_tokens=20,
                                      started=started, after=3))
                await started.wait()  # decoding: the next two join a running batch
                calls = len(counting.calls)
                tg.start_soon(functools.partial(tokens_into, results[1], engine, prompt=PROMPTS[0], max_tokens=N))
                tg.start_soon(functools.partial(tokens_into, results[2], engine, prompt=PROMPTS[2], max_tokens=N))
        assert results == {0: alone("llama", tuple(PROMPTS[1]), n=20), 1: alone("llama", tuple(PROMPTS[0])),
                           2: alone("llama", tuple(PROMPTS[2]))}
        assert counting.calls[calls] == (2, 4), counting.calls  # the two joiners' first chunk, together
        await engine.wait_idle()


@on_loops("asyncio", "uvloop")
async def test_a_joiner_that_leaves_mid_prompt_is_dropped_from_the_batched_prefill():
    async with ea.Runtime(pool_size=2) as rt:
        engine, counting = await batch_engine(rt, "llama")
        batcher = engine._replay_batcher
        rows, groups = [], []  # the rows prefilling together after each chunk (recorded on the worker)
        real_prefill = batcher.jobs.prefill

        def prefill(group, joining):
            groups.append(group)
            tokens = real_prefill(group, joining)
            rows.append(len(group.rows))
            return tokens

        batcher.jobs.prefill = prefill
        long_prompt = list(range(1, 40))  # ten chunks of 4 (replayed: 64 positions hold it)
        got = []
        leaver = anyio.CancelScope()

        async def short():
            got.extend(await tokens_of(engine, PROMPTS[2], max_tokens=N))

        async def long():
            with leaver:
                await tokens_of(engine, long_prompt, max_tokens=N)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(short)
                tg.start_soon(long)
                while len(rows) < 2:  # both prefilled together for two chunks
                    await anyio.sleep(0.001)
                leaver.cancel()  # the long prompt's reader leaves mid-prompt
        assert got == alone("llama", tuple(PROMPTS[2]))
        assert rows[0] == 2 and len(rows) < 10, rows
        await engine.wait_idle()
        group = groups[-1]
        assert not group.rows and group.cache is None  # nothing kept of the one that left
        # The next prompts prefill on a batch that kept nothing of the one that left.
        with anyio.fail_after(60):
            assert await concurrently(engine, requests()) == [alone("llama", tuple(p)) for p in PROMPTS]
        await engine.wait_idle()
        assert engine.active_requests == 0 and not batcher.joining and not batcher.running


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@on_loops("asyncio", "uvloop")
async def test_prompt_cache_hits_prefill_only_their_tails_while_batched(kind):
    async with ea.Runtime(pool_size=2) as rt:
        cache = PrefixCache(1000)
        engine, counting = await batch_engine(rt, kind, prompt_cache=cache)
        base = [21, 22, 23, 24, 25, 26, 27, 28, 29]
        assert await tokens_of(engine, base, max_tokens=3) == alone(kind, tuple(base), n=3)
        await engine.wait_idle()
        counting.calls.clear()
        # Two prompts extending the kept one (tails of 2 and 5 tokens) and a fresh one of 3.
        prompts = [base + [30, 31], base + [40, 41, 42, 43, 44], [50, 51, 52]]
        with anyio.fail_after(60):
            got = await concurrently(engine, [dict(prompt=p, max_tokens=N) for p in prompts])
        assert got == [alone(kind, tuple(p)) for p in prompts]
        assert cache.hits >= 2 and cache.reused_tokens >= 2 * len(base)
        # Only the tails are fed: 4 columns (2, 4 and 3 tokens, the ending ones' last apart),
        # then the last token of the longest.
        assert counting.calls == [(3, 4), (2, 1), (1, 1)], counting.calls
        await engine.wait_idle()


@on_loops("asyncio", "uvloop")
async def test_prompts_sharing_a_prefix_with_one_prefilling_wait_to_restore_it_from_the_prompt_cache():
    async with ea.Runtime(pool_size=2) as rt:
        cache = PrefixCache(1000)
        engine, counting = await batch_engine(rt, "llama", prompt_cache=cache)
        system = list(range(70, 82))  # 12 tokens every chat prompt but the last starts with
        prompts = [system + [30], system + [40, 41], system + [50, 51, 52], [60, 61]]
        with anyio.fail_after(60):
            got = await concurrently(engine, [dict(prompt=p, max_tokens=N) for p in prompts])
        assert got == [alone("llama", tuple(p)) for p in prompts]
        # The first and the unrelated one prefill together; the two others wait for the
        # first's prompt to be kept, then restore its 12 tokens and feed only their tails.
        assert counting.calls == [(2, 4), (1, 1), (1, 4), (1, 4), (1, 1), (2, 2), (2, 1)], counting.calls
        assert cache.hits == 2 and cache.reused_tokens == 2 * len(system)
        await engine.wait_idle()


@on_loops("asyncio", "uvloop")
async def test_rotating_caches_prefill_one_prompt_after_another_with_the_same_tokens():
    # gemma3's sliding-window layer is a RotatingKVCache: the padding would evict its own tokens.
    async with ea.Runtime(pool_size=2) as rt:
        engine, counting = await batch_engine(rt, "gemma3_text")
        with anyio.fail_after(60):
            assert await concurrently(engine, requests()) == [alone("gemma3_text", tuple(p)) for p in PROMPTS]
        assert {rows for rows, _ in counting.calls} == {1}, counting.calls
        await engine.wait_idle()


@pytest.mark.parametrize("free", [True, False])
@on_loops("asyncio", "uvloop")
async def test_the_running_rows_chain_on_while_a_joiner_prefills_on_a_queue_aside(free):
    import threading
    import time

    async with ea.Runtime(pool_size=2) as rt:
        engine, counting = await batch_engine(rt, "llama")
        held = None if free else await rt.acquire_queue()  # the batch's queue is then the last free one
        batcher, replay = engine._replay_batcher, engine.decoding.replay
        events = []  # ("chunk", thread) on the worker, ("step", rows) as a chained step is queued
        real_prefill, real_chained = batcher.jobs.prefill, replay.chained
        # Set as the joiner starts. Under load the running row could otherwise end before the
        # joiner prefills (then nothing steps beside its chunks), or the loop reach its chain
        # only once a 4-token chunk is done (then it queues no step beside it).
        hold = {"row": False, "chunk": False}

        def prefill(group, joining):
            events.append(("chunk", threading.get_ident()))
            if hold["chunk"]:  # the first chunk aside waits (bounded) for a step queued beside it
                hold["chunk"], mine, deadline = False, len(events) - 1, time.monotonic() + 10
                while not any(e[0] == "step" for e in events[mine:]) and time.monotonic() < deadline:
                    time.sleep(0.001)
            return real_prefill(group, joining)

        async def chained(queue, **shape):
            with anyio.move_on_after(10):  # the row waits (bounded) for the joiner
                while hold["row"] and not (batcher.waiting or batcher.joining):
                    await anyio.sleep(0.001)
            hold["row"] = False
            function = await real_chained(queue, **shape)

            def step(*arrays, **options):
                events.append(("step", shape["rows"]))
                return function(*arrays, **options)
            return step

        batcher.jobs.prefill, replay.chained = prefill, chained
        long_prompt = list(range(1, 40))  # ten chunks of 4
        got: dict[int, list[int]] = {0: [], 1: []}

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                started = anyio.Event()
                tg.start_soon(functools.partial(tokens_into, got[0], engine, prompt=PROMPTS[1], max_tokens=24,
                                      started=started, after=2))
                await started.wait()
                events.clear()
                # Only with a queue aside: on the batch queue, the joiner waits for the row's chain.
                hold.update(row=free, chunk=free)
                tg.start_soon(functools.partial(tokens_into, got[1], engine, prompt=long_prompt, max_tokens=N))
        assert got == {0: alone("llama", tuple(PROMPTS[1]), n=24), 1: alone("llama", tuple(long_prompt))}
        chunks = [i for i, e in enumerate(events) if e[0] == "chunk"]
        assert len(chunks) == 10, events
        stepped = [e for e in events[chunks[0]:chunks[-1]] if e[0] == "step"]
        if free:
            # A queue of its own for the prefill: the running row's steps chain on meanwhile.
            assert stepped and len({e[1] for e in events if e[0] == "chunk"}) == 1, events
        else:  # no queue free: the chunks run on the batch queue between unchained steps
            assert not stepped, events
        await engine.wait_idle()
        assert not batcher.joining and batcher._aside is None  # the queue aside is given back
        if held is not None:
            rt.release_queue(held)


@on_loops("asyncio", "uvloop")
async def test_a_prefill_failing_aside_fails_the_batchs_requests_and_gives_its_queue_back():
    from emlx_async.llm import BatchDriverError

    async with ea.Runtime(pool_size=2) as rt:
        engine, counting = await batch_engine(rt, "llama")
        batcher = engine._replay_batcher
        reference = await tokens_of(engine, PROMPTS[0], max_tokens=6)
        boom = RuntimeError("injected prefill failure")
        real_prefill = batcher.jobs.prefill

        def failing(group, joining):
            if len(joining) == 2:  # two prompts joining at once
                raise boom
            return real_prefill(group, joining)

        batcher.jobs.prefill = failing
        errors = []

        async def one(prompt):
            try:
                await tokens_of(engine, prompt, max_tokens=N)
            except BatchDriverError as exc:
                errors.append(exc)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, PROMPTS[0])
                tg.start_soon(one, PROMPTS[1])
        assert len(errors) == 2 and all(e.__cause__ is boom for e in errors)
        await engine.wait_idle()
        assert batcher._aside is None and batcher._prefilling is None
        batcher.jobs.prefill = real_prefill
        assert await tokens_of(engine, PROMPTS[0], max_tokens=6) == reference
        await engine.wait_idle()
