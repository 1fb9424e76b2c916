"""Batch mode with ``batches`` N > 1: N replayed batches at once, each on its own queue.

A tiny random llama (no download); every stream's tokens are checked against
the same request run alone on one batch.
"""

from __future__ import annotations

import anyio
import pytest

import emlx_async as ea
from support.engine import concurrently, tokens_of
from support.helpers import needs_model, on_every_loop, on_loops
from support.tiny_models import IdsTokenizer, smollm2_vocab_llama, tiny

PROMPTS = [[5, 9, 2], [7, 1, 4, 4, 8, 3], [11], [2, 3, 5, 7, 11, 13, 17]]
SAMPLED = dict(temperature=0.9, top_p=0.9, top_k=20)


async def engines(rt, batches: int = 2, sizes=(16, 32), **options):
    """(an engine running `batches` replayed batches, one running one) over the same tiny llama."""
    from emlx_async.llm import Engine

    model = tiny("llama")
    made = [Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode="batch",
                   batches=n, **options) for n in (batches, 1)]
    for engine in made:
        assert await engine.prepare_step("replay", cache_sizes=sizes) == "replay", engine.step_note
    return made


def rows_of(engine) -> list[int]:
    """Running rows per batch."""
    return [len(batcher.running) for batcher in engine._replay_batchers]


async def first_tokens_then_rest(engine, requests: list[dict]):
    """Start every request, wait until each has its first token (so each sits in its batch), and
    return ({batch -> rows} at that moment, each request's tokens)."""
    tokens: list[list[int]] = [[] for _ in requests]
    started = [anyio.Event() for _ in requests]
    rows: list[int] = []

    async def one(i):
        async for delta in engine.generate(**requests[i]):
            if delta.token is not None:
                tokens[i].append(delta.token)
                started[i].set()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(len(requests)):
                tg.start_soon(one, i)
            for event in started:
                await event.wait()
            rows = rows_of(engine)
    return rows, tokens


@on_every_loop
async def test_streams_spread_over_the_batches_and_each_gets_its_alone_tokens():
    async with ea.Runtime(pool_size=4) as rt:
        grouped, single = await engines(rt, max_concurrent=4)
        assert grouped.batches == 2 and single.batches == 1 and "2 batches at once" in grouped.step_note
        requests = [dict(prompt=p, max_tokens=10 + i) for i, p in enumerate(PROMPTS)]
        want = [await tokens_of(single, **r) for r in requests]
        rows, got = await first_tokens_then_rest(grouped, requests)
        assert rows == [2, 2]  # four streams, two batches: two rows each, not four in one
        assert got == want
        seeded = [dict(r, seed=3 + i, **SAMPLED) for i, r in enumerate(requests)]
        assert await concurrently(grouped, seeded) == [await tokens_of(single, **r) for r in seeded]
        # Penalized rows take the penalized step in their own batch.
        penalized = [dict(r, presence_penalty=1.5, frequency_penalty=0.5) for r in requests[:3]]
        assert await concurrently(grouped, penalized) == [await tokens_of(single, **r) for r in penalized]
        await grouped.wait_idle()
        assert rows_of(grouped) == [0, 0] and not grouped.batch_driving


@on_every_loop
async def test_one_batch_drains_and_restarts_while_the_other_runs():
    async with ea.Runtime(pool_size=4) as rt:
        # The driver does not wait for its readers: the long stream is long enough to outlast the others.
        grouped, single = await engines(rt, max_concurrent=4, sizes=(16, 32, 512))
        long = dict(prompt=PROMPTS[1], max_tokens=400)
        short = dict(prompt=PROMPTS[0], max_tokens=3)
        late = dict(prompt=PROMPTS[3], max_tokens=6)
        want = [await tokens_of(single, **r) for r in (long, short, late)]
        first, second = grouped._replay_batchers
        got: list[list[int]] = []
        with anyio.fail_after(60):
            stream = grouped.generate(**long)
            got.append([(await anext(stream)).token])  # the long one decodes in the first batch
            assert first.running and not second.streams
            for request in (short, late):
                # The batch with fewest streams, the second: it runs, ends ...
                other = grouped.generate(**request)
                got.append([(await anext(other)).token])
                assert len(first.running) == len(second.running) == 1
                got[-1] += [d.token async for d in other if d.token is not None]
                await second.wait_idle()  # ... and its driver exits, its queue handed back
                assert first.driving and first.running and not second.driving
            got[0] += [d.token async for d in stream if d.token is not None]
        assert got == want
        await grouped.wait_idle()


@pytest.mark.parametrize("leave", ["aclose", "cancel"])
@on_loops("asyncio", "uvloop")
async def test_a_stream_that_leaves_one_batch_leaves_the_other_batch_alone(leave):
    async with ea.Runtime(pool_size=4) as rt:
        grouped, single = await engines(rt, max_concurrent=4)
        stays = [dict(prompt=PROMPTS[1], max_tokens=20), dict(prompt=PROMPTS[2], max_tokens=20)]
        want = [await tokens_of(single, **r) for r in stays]
        got: list[list[int]] = [[], []]
        first, second = grouped._replay_batchers
        two_read = anyio.Event()

        async def stay(i):
            async for delta in grouped.generate(**stays[i]):
                if delta.token is not None:
                    got[i].append(delta.token)

        async def leaver(scope: anyio.CancelScope):
            with scope:
                stream = grouped.generate(PROMPTS[0], max_tokens=25)
                try:
                    read = 0
                    async for delta in stream:
                        read += delta.token is not None
                        if read == 2:
                            two_read.set()
                            if leave == "aclose":
                                break
                finally:
                    await stream.aclose()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(stay, 0)
                while not first.streams:
                    await anyio.sleep(0)
                scope = anyio.CancelScope()
                tg.start_soon(leaver, scope)  # the batch with fewest streams: the second
                while not second.streams:
                    await anyio.sleep(0)
                tg.start_soon(stay, 1)  # a tie: the first
                await two_read.wait()
                assert len(second.running) <= 1 and first.streams == 2
                scope.cancel()  # a no-op where it broke off (aclose) already
        assert got == want
        await grouped.wait_idle()
        assert rows_of(grouped) == [0, 0] and grouped.active_requests == 0
        assert grouped._slots.value == grouped.max_concurrent


@on_every_loop
async def test_choices_spread_over_the_batches_from_one_prefill():
    async with ea.Runtime(pool_size=4) as rt:
        grouped, single = await engines(rt, max_concurrent=4)

        async def choices(engine):
            tokens: list[list[int]] = [[], [], []]
            with anyio.fail_after(60):
                async for i, delta in engine.generate_choices(PROMPTS[3], n=3, max_tokens=8, seed=7, **SAMPLED):
                    if delta.token is not None:
                        tokens[i].append(delta.token)
            return tokens

        assert await choices(grouped) == await choices(single)
        await grouped.wait_idle()


@needs_model
@on_loops("asyncio", "uvloop")
async def test_a_constrained_row_in_one_batch_beside_free_rows_in_both():
    import mlx.core as mx

    from emlx_async.llm import Engine, Grammar, _gguf

    pytest.importorskip("llguidance")
    _, meta = mx.load(_gguf.smollm2_path(), return_metadata=True)
    _, eos = _gguf.gguf_special_ids(meta)
    tokenizer, model = _gguf.gguf_tokenizer(meta), smollm2_vocab_llama()
    async with ea.Runtime(pool_size=4) as rt:
        made = [Engine(model, tokenizer, eos_ids=eos, chat_template=None, runtime=rt, mode="batch", batches=n,
                       max_concurrent=4, context_length=512) for n in (2, 1)]
        for engine in made:
            assert await engine.prepare_step("replay", cache_sizes=(128,)) == "replay"
        grammar = Grammar.regex(r"[0-9]{3}-[a-z]{4}")
        requests = [dict(prompt=[1, 2, 3], max_tokens=12, grammar=grammar), dict(prompt=[4, 5], max_tokens=8),
                    dict(prompt=[6, 7, 8, 9], max_tokens=8, seed=2, **SAMPLED)]
        grouped, single = made
        with anyio.fail_after(120):
            got = await concurrently(grouped, requests)
            assert got == await concurrently(single, requests)
        assert len(got[0]) < 12  # the grammar ended it
        await grouped.wait_idle()


@on_loops("asyncio")
async def test_batches_is_checked():
    from emlx_async.llm import Engine

    model = tiny("llama")
    async with ea.Runtime(pool_size=2) as rt:
        for batches, options, match in ((0, {"mode": "batch"}, "positive int"),
                                        (1.5, {"mode": "batch"}, "positive int"),
                                        (2, {"mode": "parallel"}, "needs mode 'batch'"),
                                        (3, {"mode": "batch", "max_concurrent": 2}, "exceeds max_concurrent")):
            with pytest.raises(ValueError, match=match):
                Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, batches=batches,
                       **options)
        engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt)
        assert engine.batches == 1  # parallel mode: no batches of its own


@on_loops("asyncio")
async def test_max_concurrent_is_checked():
    from emlx_async.llm import Engine

    model = tiny("llama")
    async with ea.Runtime(pool_size=2) as rt:
        # 0 became the pool size, True a slot count of True, 1.5 anyio's TypeError, -1 a message about batches.
        for bad in (0, -1, True, 1.5, "4"):
            with pytest.raises(ValueError, match="max_concurrent must be a positive int or None"):
                Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, max_concurrent=bad)
        engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, max_concurrent=None)
        assert engine.max_concurrent == 2  # the runtime's pool


@on_loops("asyncio")
async def test_cache_sizes_past_the_context_are_refused():
    from emlx_async.llm import Engine

    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt,
                        context_length=512)
        # A size no request can fill was traced, and its whole buffer allocated by the first request
        # that picked it (SmolLM2 at 2**22 tokens: about 185 GB).
        with pytest.raises(ValueError, match="cache_sizes must be at most the model's context of 512 tokens, "
                                             "got 4194304"):
            await engine.prepare_step("replay", cache_sizes=(64, 2**22))
        assert await engine.prepare_step("replay", cache_sizes=(64, 512)) == "replay"
