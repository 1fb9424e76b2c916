"""Hostile cases of batch mode's newest paths: the joining prompts' batched prefill
(llm/batch_prefill.py) with the prompt cache, the queue aside it prefills on
(llm/batch_replay.py), and token logprobs under a grammar's mask.

Each prompt's tokens must stay mlx-lm's own for it alone; the model is wrapped
to count its calls (only prefills make them: the decode steps are replayed).
"""

from __future__ import annotations

import functools
import json
import math

import anyio
import mlx.core as mx
import pytest

import emlx_async as ea
from emlx_async.llm import Engine, PrefixCache
from support.engine import Counting, concurrently, tokens_into, tokens_of
from support.helpers import needs_model, on_loops
from support.tiny_models import IdsTokenizer, mlx_lm_tokens, smollm2_vocab_llama, tiny

N = 8
SYSTEM = list(range(70, 94))  # 24 tokens: six chunks of 4


@functools.cache
def llama():
    return tiny("llama")


@functools.cache
def alone(prompt: tuple[int, ...], n: int = N) -> list[int]:
    """mlx-lm's own greedy tokens for one prompt alone."""
    return mlx_lm_tokens(llama(), list(prompt), n)


async def batch_engine(rt, **options) -> tuple[Engine, Counting]:
    engine = Engine(llama(), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode="batch",
                    max_concurrent=4, prefill_chunk=4, **options)
    assert await engine.prepare_step(cache_sizes=(16, 32, 64)) == "replay", engine.step_note
    counting = engine.model = Counting(engine.model)
    return engine, counting


@pytest.mark.parametrize("bound", ["tokens", "bytes"])
@on_loops("asyncio", "uvloop")
async def test_a_prompt_does_not_wait_for_a_row_whose_prompt_the_cache_will_not_keep(bound):
    """Waiting for a row sharing the prompt's start pays only if the prompt cache keeps that row's
    prompt: past its bounds (in tokens, or in bytes as the last sequence offered measured them),
    the waiter would wait the row's whole prefill and then compute the shared part anyway."""
    async with ea.Runtime(pool_size=2) as rt:
        cache = PrefixCache(10) if bound == "tokens" else PrefixCache(1000, max_bytes=1000)
        engine, counting = await batch_engine(rt, prompt_cache=cache)
        if bound == "bytes":  # one sequence offered: the cache learns its bytes per token (too many)
            assert await tokens_of(engine, [5, 6, 7], max_tokens=2) == alone((5, 6, 7), 2)
            await engine.wait_idle()
            assert len(cache) == 0
            counting.calls.clear()
        prompts = [SYSTEM + [9], SYSTEM + [8, 7]]
        with anyio.fail_after(60):
            got = await concurrently(engine, [dict(prompt=p, max_tokens=N) for p in prompts])
        assert got == [alone(tuple(p)) for p in prompts]
        # Prefilled together from the first chunk, not one after the other.
        assert counting.calls[:6] == [(2, 4)] * 6, counting.calls
        await engine.wait_idle()


@on_loops("asyncio", "uvloop")
async def test_a_short_prompt_does_not_wait_for_a_long_one_that_only_starts_the_same():
    """A short chat sharing its system prompt with a long document still prefilling: waiting for the
    document would delay its first token by the document's whole length, to save the system
    prompt's few chunks. It prefills beside it instead; a prompt whose wait is short still waits."""
    async with ea.Runtime(pool_size=2) as rt:
        cache = PrefixCache(1000)
        engine, counting = await batch_engine(rt, prompt_cache=cache)
        system = SYSTEM[:8]
        document = system + list(range(100, 140))  # 48 tokens: twelve chunks
        short = system + [9]
        first: dict[str, int] = {}

        async def one(name, prompt):
            async for d in engine.generate(prompt, max_tokens=N):
                first.setdefault(name, len(counting.calls))  # model calls made before its first token

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, "document", document)
                tg.start_soon(one, "short", short)
        assert counting.calls[0] == (2, 4), counting.calls  # side by side from the first chunk
        assert first["short"] <= 6 < first["document"], (first, counting.calls)
        counting.calls.clear()
        # Its tokens, and the document's, are each prompt's own.
        with anyio.fail_after(60):
            assert await concurrently(engine, [dict(prompt=document, max_tokens=N), dict(prompt=short, max_tokens=N)]) \
                == [alone(tuple(document)), alone(tuple(short))]
        await engine.wait_idle()


@on_loops("asyncio", "uvloop")
async def test_a_prompt_waiting_for_a_prefix_whose_request_leaves_prefills_on_its_own():
    async with ea.Runtime(pool_size=2) as rt:
        cache = PrefixCache(1000)
        engine, counting = await batch_engine(rt, prompt_cache=cache)
        batcher = engine._replay_batcher
        chunks = []  # the number of joining prompts of each chunk
        real_prefill = batcher.jobs.prefill

        def prefill(group, joining):
            chunks.append(len(joining))
            return real_prefill(group, joining)

        batcher.jobs.prefill = prefill
        leaver, waiter = SYSTEM + [1], SYSTEM + [2, 3]  # the second waits for the first's prompt
        got = []
        scope = anyio.CancelScope()

        async def leaving():
            with scope:
                await tokens_of(engine, leaver, max_tokens=N)

        async def waiting():
            got.extend(await tokens_of(engine, waiter, max_tokens=N))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(leaving)
                tg.start_soon(waiting)
                while len(chunks) < 2:
                    await anyio.sleep(0.001)
                assert counting.calls[0] == (1, 4), counting.calls  # it waits: the first alone
                scope.cancel()  # the prompt it waits for leaves mid-prompt
        assert got == alone(tuple(waiter))
        assert cache.hits == 0  # nothing of the one that left was kept to restore
        await engine.wait_idle()
        assert not batcher.joining and not batcher.running and batcher._aside is None


@on_loops("asyncio", "uvloop")
async def test_a_prompt_waiting_for_a_prefix_counts_one_hit_in_the_prompt_cache():
    """The prompt cache's hits and reused tokens (the service's metrics) count what prompts did not
    prefill: a prompt that waits for a row sharing its start restores once, when it starts, not
    once per chunk it waits (each such restore was thrown away)."""
    async with ea.Runtime(pool_size=2) as rt:
        cache = PrefixCache(1000)
        engine, counting = await batch_engine(rt, prompt_cache=cache)
        older = SYSTEM[:8] + [1]
        assert await tokens_of(engine, older, max_tokens=2) == alone(tuple(older), 2)
        await engine.wait_idle()
        hits, reused = cache.hits, cache.reused_tokens
        # Both restore the older prompt's 8 tokens; the second then waits for the first's 24.
        prompts = [SYSTEM + [9], SYSTEM + [8, 7]]
        with anyio.fail_after(60):
            got = await concurrently(engine, [dict(prompt=p, max_tokens=N) for p in prompts])
        assert got == [alone(tuple(p)) for p in prompts]
        assert counting.calls[0] == (1, 4), counting.calls  # it waited
        assert (cache.hits - hits, cache.reused_tokens - reused) == (2, 8 + len(SYSTEM))
        await engine.wait_idle()


@on_loops("asyncio", "uvloop")
async def test_a_queue_aside_that_cannot_start_leaves_the_chunks_to_the_batch_queue():
    """A second queue is a speed-up for the joining prompts' chunks: a worker that cannot start
    (try_acquire_queue raising) must not fail the batch's requests."""
    async with ea.Runtime(pool_size=2) as rt:
        engine, counting = await batch_engine(rt)  # its queue (made by the tracing) is idle in the pool
        batcher, real_new_queue = engine._replay_batcher, rt._new_queue

        def cannot_start(kind, *, role):
            raise RuntimeError("cannot start a CPU worker (for the test)")

        rt._new_queue = cannot_start
        long_prompt = list(range(5, 30))
        got: dict[int, list[int]] = {0: [], 1: []}

        try:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    started = anyio.Event()
                    tg.start_soon(functools.partial(tokens_into, got[0], engine, prompt=[1, 2, 3], max_tokens=20,
                                          started=started, after=2))
                    await started.wait()  # decoding: the next one joins a running batch
                    tg.start_soon(functools.partial(tokens_into, got[1], engine, prompt=long_prompt, max_tokens=N))
        finally:
            rt._new_queue = real_new_queue
        assert got == {0: alone((1, 2, 3), 20), 1: alone(tuple(long_prompt))}
        await engine.wait_idle()
        assert batcher._aside is None and not batcher.driving


@pytest.fixture(scope="module")
def gguf():
    """(tokenizers.Tokenizer, eos ids) from the SmolLM2 GGUF, as the engine builds them."""
    from emlx_async.llm import _gguf

    _, meta = mx.load(_gguf.smollm2_path(), return_metadata=True)
    _, eos = _gguf.gguf_special_ids(meta)
    return _gguf.gguf_tokenizer(meta), eos


@needs_model
@pytest.mark.parametrize("mode", ["parallel", "batch"])
@on_loops("asyncio")
async def test_top_logprobs_under_a_grammar_list_only_tokens_it_allows(gguf, mode):
    """A forced token's mask leaves one token: the alternatives are that one, not tokens at -inf
    (which is no JSON number: a service answer holding it would not parse)."""
    pytest.importorskip("llguidance")
    from emlx_async.llm import Grammar

    tokenizer, eos = gguf
    forced = Grammar.json_schema({"const": {"answer": "yes"}})
    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(smollm2_vocab_llama(), tokenizer, eos_ids=eos, chat_template=None, runtime=rt, mode=mode,
                        context_length=512)
        await engine.prepare_step(cache_sizes=(128,))
        deltas = []
        with anyio.fail_after(60):
            async for d in engine.generate("Hello", grammar=forced, max_tokens=20, logprobs=True, top_logprobs=5):
                deltas.append(d)
        text = "".join(d.text for d in deltas)
        assert json.loads(text) == {"answer": "yes"} and deltas[-1].finish_reason == "stop"
        tops = [d.top_logprobs for d in deltas if d.token is not None]
        # Forced text leaves few tokens (any that starts it): fewer than five alternatives, all finite.
        assert tops and all(math.isfinite(value) for top in tops for _, value in top), tops
        assert any(len(top) < 5 for top in tops), tops
        assert all(math.isfinite(d.logprob) for d in deltas if d.token is not None)
        json.dumps([list(top) for top in tops], allow_nan=False)
        await engine.wait_idle()


@on_loops("asyncio")
async def test_a_prompt_cache_keeps_one_models_keys_and_values():
    """Two models sharing one PrefixCache: the second restored the first's keys and values without
    an error and decoded other tokens than its own. The second engine is refused; once the first
    model is gone, the cache (emptied) serves another."""
    import gc

    from mlx.utils import tree_map

    other = tiny("llama")
    other.update(tree_map(lambda w: w * 1.5, other.parameters()))  # the same shapes, other weights
    mx.eval(other.parameters())
    prompt = list(range(10, 30))
    async with ea.Runtime(pool_size=2) as rt:
        cache = PrefixCache(1000)
        first = tiny("llama")
        engine = Engine(first, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, prompt_cache=cache)
        again = Engine(first, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, prompt_cache=cache)
        assert await tokens_of(engine, prompt, max_tokens=4) == await tokens_of(again, prompt, max_tokens=4)
        assert len(cache) == 1 and cache.hits == 1  # the same model: shared
        with pytest.raises(ValueError, match="another model"):
            Engine(other, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, prompt_cache=cache)
        await engine.close()
        await again.close()
        del engine, again, first
        gc.collect()
        engine = Engine(other, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, prompt_cache=cache)
        assert len(cache) == 0  # nothing of the collected model's is restored into this one
        assert await tokens_of(engine, prompt, max_tokens=4) == mlx_lm_tokens(other, prompt, 4)
        await engine.close()


@needs_model
@on_loops("asyncio", "uvloop")
async def test_a_constrained_row_steps_on_while_a_joiner_prefills_on_a_queue_aside(gguf):
    """Constrained rows take a round at a time (each mask needs the last token), but a joining
    prompt's chunk on the queue aside must not hold them: a round waited for the chunk, so the
    constrained row made one token per chunk of the joiner's, as if no queue were aside."""
    pytest.importorskip("llguidance")
    import threading
    import time

    from emlx_async.llm import Grammar
    from support.engine import answer_of

    tokenizer, eos = gguf
    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(smollm2_vocab_llama(), tokenizer, eos_ids=eos, chat_template=None, runtime=rt, mode="batch",
                        max_concurrent=4, prefill_chunk=4, context_length=512)
        assert await engine.prepare_step(cache_sizes=(128,)) == "replay"
        batcher, replay = engine._replay_batcher, engine.decoding.replay
        constrained_row = dict(prompt="Letters:", grammar=Grammar.regex("[a-z]{80}"), max_tokens=30)
        long_prompt = list(range(100, 139))  # ten chunks of 4
        alone = await answer_of(engine, **constrained_row)
        joiner_alone = await answer_of(engine, long_prompt, max_tokens=4)
        events = []  # "start" and "chunk" (a chunk's job on the worker aside), "masked" (a masked step submitted)
        real_prefill, real_function = batcher.jobs.prefill, replay.function

        def prefill(group, joining):
            events.append(("start", None))
            time.sleep(0.05)  # a chunk that takes a while, as a real model's does
            tokens = real_prefill(group, joining)
            events.append(("chunk", threading.get_ident()))
            return tokens

        async def function(queue, **shape):
            step = await real_function(queue, **shape)
            if not shape.get("masked"):
                return step

            def masked(*arrays, **options):
                events.append(("masked", None))
                return step(*arrays, **options)
            return masked

        batcher.jobs.prefill, replay.function = prefill, function
        got = {}
        started = anyio.Event()

        async def constrained():
            text, tokens, finish = "", [], None
            async for d in engine.generate(**constrained_row):
                text, finish = text + d.text, d.finish_reason
                if d.token is not None:
                    tokens.append(d.token)
                    if len(tokens) == 2:
                        started.set()
            got["constrained"] = (text, tokens, finish)

        async def joiner():
            got["joiner"] = await answer_of(engine, long_prompt, max_tokens=4)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(constrained)
                await started.wait()
                events.clear()
                tg.start_soon(joiner)
        assert got == {"constrained": alone, "joiner": joiner_alone}
        chunks = [i for i, (kind, _) in enumerate(events) if kind == "chunk"]
        assert len(chunks) == 10 and len({events[i][1] for i in chunks}) == 1, events
        # Several constrained rounds while the first chunk ran (waiting for it: one at most).
        first = events.index(("start", None))
        assert sum(kind == "masked" for kind, _ in events[first:chunks[0]]) >= 2, events
        await engine.wait_idle()
        assert batcher._aside is None and batcher._prefilling is None


@pytest.mark.parametrize("cached", [False, True], ids=["no prompt cache", "prompt cache"])
@on_loops("asyncio", "uvloop")
async def test_choices_left_after_their_first_tokens_hand_back_the_held_prefill_and_every_row(cached):
    """n choices from one held prefill join the batch beside a running row; the reader leaves after
    the first deltas: nothing is held any more, the running row keeps its own tokens, and the
    same choices again give the tokens they gave."""
    async with ea.Runtime(pool_size=2) as rt:
        engine, counting = await batch_engine(rt, prompt_cache=PrefixCache(1000) if cached else None)
        batcher = engine._replay_batcher
        prompt = list(range(40, 51))  # three chunks of 4
        options = dict(max_tokens=N, temperature=0.9, top_p=0.9, top_k=20, seed=3)

        async def choices(leave_after=None):
            out: dict[int, list[int]] = {}
            async for i, d in engine.generate_choices(prompt, n=3, **options):
                if d.token is not None:
                    out.setdefault(i, []).append(d.token)
                if leave_after is not None and sum(map(len, out.values())) >= leave_after:
                    break
            return out

        with anyio.fail_after(60):
            whole = await choices()
        assert sorted(whole) == [0, 1, 2] and all(len(t) == N for t in whole.values())
        assert whole[0] == await tokens_of(engine, prompt, **options)  # choice 0 is the plain request
        running: list[int] = []
        started = anyio.Event()

        async def run():
            async for d in engine.generate([1, 2, 3], max_tokens=20):
                if d.token is not None:
                    running.append(d.token)
                    started.set()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await started.wait()
                part = await choices(leave_after=4)
        assert running == alone((1, 2, 3), 20)
        assert all(whole[i][:len(t)] == t for i, t in part.items()), (part, whole)
        await engine.wait_idle()
        assert len(engine.decoding.held) == 0 and engine.active_requests == 0
        assert not batcher.joining and not batcher.running and batcher._aside is None
        with anyio.fail_after(60):
            assert await choices() == whole
        await engine.wait_idle()


@pytest.mark.parametrize("cached", [False, True], ids=["no prompt cache", "prompt cache"])
@on_loops("asyncio", "uvloop")
async def test_joins_during_a_chunk_aside_and_at_the_slot_bound_keep_every_rows_tokens(cached):
    """A running row; a long prompt prefilling aside; a short one arriving while that chunk is in
    flight (it joins the next chunk); two more waiting for a slot (max_concurrent 3) and joining
    as rows finish: each its own tokens alone."""
    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(llama(), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode="batch",
                        max_concurrent=3, prefill_chunk=4, prompt_cache=PrefixCache(1000) if cached else None)
        assert await engine.prepare_step(cache_sizes=(16, 32, 64)) == "replay"
        batcher = engine._replay_batcher
        chunks: list[list[int]] = []  # the joining prompts' lengths of each chunk
        real_prefill = batcher.jobs.prefill

        def prefill(group, joining):
            chunks.append([len(prompt) for _, prompt, _ in joining])
            return real_prefill(group, joining)

        batcher.jobs.prefill = prefill
        requests = [([1, 2, 3], 30), (list(range(5, 44)), 8), ([9, 8, 7, 6, 5], 12), ([50, 51], 6),
                    (list(range(60, 66)), 5)]
        got: dict[int, list[int]] = {}
        first = anyio.Event()

        async def one(i):
            prompt, n = requests[i]
            got[i] = []
            async for d in engine.generate(prompt, max_tokens=n):
                if d.token is not None:
                    got[i].append(d.token)
                    first.set()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 0)
                await first.wait()
                tg.start_soon(one, 1)
                while len(chunks) < 2:  # the long prompt's first chunk is done, the next in flight
                    await anyio.sleep(0.001)
                for i in (2, 3, 4):
                    tg.start_soon(one, i)
        assert got == {i: alone(tuple(p), n) for i, (p, n) in enumerate(requests)}
        assert [39, 5] in chunks, chunks  # the short one prefilled beside the long one
        await engine.wait_idle()
        assert not batcher.joining and not batcher.running and batcher._aside is None
