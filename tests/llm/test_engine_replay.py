"""The engine's replayed decode step (a traced graph per cache size, sampling inside).

Tiny mlx-lm models built here (random weights, no download) cover the step
choice and the fallback on every loop; SmolLM2 checks the tokens.
"""

from __future__ import annotations

import asyncio
import json
import time
from functools import partial

import anyio
import mlx.core as mx
import mlx.nn as nn
import pytest

import emlx_async as ea
from support.engine import concurrently, tokens_into, tokens_of
from support.helpers import buffer_address, needs_model, on_every_loop, on_loops

SAMPLED = dict(temperature=0.9, top_p=0.9, top_k=20)


class IdsTokenizer:
    """Decodes token ids as their numbers: enough for the engine's detokenizer."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)


def tiny_model(kind: str):
    """A random llama ("llama"), one that doubles its logits ("odd llama": the replayed
    step is the model's own call, so it replays too), one whose ChunkedKVCaches its
    own code does not chunk ("chunked llama": it asks them for a mask, mlx-lm's have none,
    so it attends to all they hold; the stand-ins refuse) and one whose attention drops the mask it
    asks for ("unmasked llama": fine on mlx-lm's growing cache, wrong on fixed buffers)."""
    from mlx_lm.models import llama
    from mlx_lm.models.cache import ChunkedKVCache

    class OddLlama(llama.Model):
        def __call__(self, *args, **kwargs):
            return 2 * super().__call__(*args, **kwargs)

    class ChunkedLlama(llama.Model):
        def make_cache(self):
            return [ChunkedKVCache(4) for _ in self.layers]

    class Unmasked(nn.Module):
        def __init__(self, attention):
            super().__init__()
            self.attention = attention

        def __call__(self, x, mask=None, cache=None):
            return self.attention(x, None, cache)

    class UnmaskedLlama(llama.Model):
        def __init__(self, args):
            super().__init__(args)
            for layer in self.model.layers:
                layer.self_attn = Unmasked(layer.self_attn)

    mx.random.seed(3)
    kinds = {"llama": llama.Model, "odd llama": OddLlama, "chunked llama": ChunkedLlama,
             "unmasked llama": UnmaskedLlama}
    model = kinds[kind](llama.ModelArgs(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=97,
        max_position_embeddings=128))
    mx.eval(model.parameters())  # evaluated weights are usable from any thread
    return model


@on_every_loop
async def test_a_llama_model_replays_the_python_steps_tokens():
    from emlx_async.llm import Engine

    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(tiny_model("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt)
        assert engine.step_kind == "python"  # not prepared yet
        assert await engine.prepare_step(cache_sizes=(8, 16, 32)) == "replay"
        assert engine.decoding.replay.sizes == [8, 16, 32]
        prompts = [[5, 9, 2], [7, 1, 4, 4, 8, 3]]
        # 12 tokens: each stream outgrows the 8-position cache (a copy mid-stream), the longer one the 16.
        greedy = [await tokens_of(engine, p, max_tokens=12) for p in prompts]
        sampled = [await tokens_of(engine, p, max_tokens=12, seed=5, **SAMPLED) for p in prompts]
        assert {(kind, size) for kind, _, size in engine.decoding.replay.traced} == {(True, 8), (True, 16), (True, 32),
                                                                              (False, 8), (False, 16), (False, 32)}
        assert await concurrently(engine, [dict(prompt=p, max_tokens=12) for p in prompts]) == greedy
        assert await tokens_of(engine, prompts[1], max_tokens=12, seed=5, **SAMPLED) == sampled[1]  # repeatable
        long_prompt = list(range(1, 30))  # with max_tokens past the largest cache: the Python step
        long = await tokens_of(engine, long_prompt, max_tokens=8)
        assert await engine.prepare_step("python") == "python" and "asked" in engine.step_note
        assert [await tokens_of(engine, p, max_tokens=12) for p in prompts] == greedy
        # Same math, same key: the Python sampler draws the same tokens.
        assert [await tokens_of(engine, p, max_tokens=12, seed=5, **SAMPLED) for p in prompts] == sampled
        assert await tokens_of(engine, long_prompt, max_tokens=8) == long


@on_every_loop
async def test_a_model_whose_step_cannot_be_traced_falls_back_to_the_python_step():
    from emlx_async.llm import Engine

    async with ea.Runtime(pool_size=1) as rt:
        engine = Engine(tiny_model("chunked llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt)
        assert await engine.prepare_step(cache_sizes=(16,)) == "python"
        assert "'llama'" in engine.step_note and "asks its ChunkedKVCache for a mask" in engine.step_note
        with pytest.raises(ValueError, match="not available.*ChunkedKVCache"):
            await engine.prepare_step("replay", cache_sizes=(16,))
        assert len(await tokens_of(engine, [3, 4], max_tokens=3)) == 3  # the Python step runs
        # A model whose attention ignores the mask: checked at load against its own forward, refused.
        unmasked = Engine(tiny_model("unmasked llama"), IdsTokenizer(), eos_ids=set(), chat_template=None,
                          runtime=rt)
        assert await unmasked.prepare_step(cache_sizes=(16,)) == "python"
        assert "disagrees" in unmasked.step_note
        # The replayed step is the model's own call: a llama computing something else replays it.
        odd = Engine(tiny_model("odd llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt)
        assert await odd.prepare_step(cache_sizes=(16,)) == "replay"
        replayed = await tokens_of(odd, [3, 4], max_tokens=6)
        assert await odd.prepare_step("python") == "python"
        assert await tokens_of(odd, [3, 4], max_tokens=6) == replayed
        with pytest.raises(ValueError, match="step must be one of"):
            await engine.prepare_step("fast")
        with pytest.raises(ValueError, match="cache_sizes"):
            await engine.prepare_step(cache_sizes=(0,))


# ---- batch mode ------------------------------------------------------------------

BATCH_PROMPTS = [[5, 9, 2], [7, 1, 4, 4, 8, 3], [11], [2, 3, 5, 7, 11, 13, 17]]
# Rows finish at different steps, so the batch shrinks (and compacts) as it
# goes; the last needs more than 16 positions, so the batch's cache grows.
BATCH_LENGTHS = [8, 3, 5, 12]


async def batch_pair(rt, **kwargs):
    """A replayed batch engine and a Python-step one over the same tiny llama."""
    from emlx_async.llm import Engine

    model = tiny_model("llama")
    engines = [Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode="batch",
                      **kwargs) for _ in range(2)]
    assert await engines[0].prepare_step(cache_sizes=(16, 32)) == "replay", engines[0].step_note
    assert "batches of" in engines[0].step_note
    assert await engines[1].prepare_step("python") == "python"
    return engines


def batch_requests(**options) -> list[dict]:
    return [dict(prompt=p, max_tokens=n, **options) for p, n in zip(BATCH_PROMPTS, BATCH_LENGTHS)]


@on_every_loop
async def test_batch_mode_replays_each_row_at_its_own_position_with_its_own_key():
    async with ea.Runtime(pool_size=2) as rt:
        replayed, python = await batch_pair(rt, max_concurrent=4)
        want = [await tokens_of(python, **r) for r in batch_requests()]
        assert await concurrently(replayed, batch_requests()) == want
        shapes = {(rows, size) for _, rows, size in replayed.decoding.replay.traced}
        # Four rows at first, fewer as they finish; the longest row outgrew 16 positions.
        assert {1, 4} <= {rows for rows, _ in shapes} and {16, 32} <= {size for _, size in shapes}, shapes
        seeded = [dict(r, seed=5 + i) for i, r in enumerate(batch_requests(**SAMPLED))]
        assert await concurrently(replayed, seeded) == [await tokens_of(python, **r) for r in seeded]
        # Past the largest traced cache: mlx-lm's BatchGenerator takes it, with the same tokens.
        long_prompt = list(range(1, 30))
        assert await tokens_of(replayed, long_prompt, max_tokens=8) == await tokens_of(python, long_prompt,
                                                                                       max_tokens=8)
        for engine in (replayed, python):
            await engine.wait_idle()
            assert not engine._replay_batcher.running and not engine._batcher.running


@on_every_loop
async def test_a_round_prefills_one_chunk_of_every_joining_prompt_together():
    from emlx_async.llm.batch_prefill import BatchPrefill
    from emlx_async.llm.sampling import Sampler
    from emlx_async.llm.state import PromptState

    async with ea.Runtime(pool_size=2) as rt:
        # Chunks of 4 tokens over prompts of 3, 6, 1 and 7 tokens.
        replayed, python = await batch_pair(rt, max_concurrent=4, prefill_chunk=4)
        group = BatchPrefill(replayed.decoding)
        joining = [(PromptState(), prompt, Sampler(0.0, 1.0, 0, 0)) for prompt in BATCH_PROMPTS]
        rounds = []
        async with rt.queue() as q:
            while joining:
                tokens = await q.run(replayed._replay_batcher.jobs.prefill, group, joining)
                rounds.append(tokens)
                joining = [j for j, token in zip(joining, tokens) if token is None]
        # The first round feeds every prompt its first 4 tokens: the prompts of 3 and 1
        # end there; the second feeds the other two the rest (2 and 3 tokens).
        firsts = [(await tokens_of(python, p, max_tokens=1))[0] for p in BATCH_PROMPTS]
        assert rounds == [[firsts[0], None, firsts[2], None], [firsts[1], firsts[3]]]
        assert not group.rows and group.cache is None
        # End to end, joiners arriving together or apart get the Python step's tokens.
        assert await concurrently(replayed, batch_requests()) == [await tokens_of(python, **r)
                                                                  for r in batch_requests()]
        await replayed.wait_idle()


@on_every_loop
async def test_a_chained_batch_queues_the_next_step_before_reading_a_token_and_keeps_the_tokens():
    async with ea.Runtime(pool_size=2) as rt:
        replayed, python = await batch_pair(rt, max_concurrent=4)
        batcher, replay = replayed._replay_batcher, replayed.decoding.replay
        events = []  # ("step", rows, size) as a chained step is queued, ("read",) as the loop reads one
        real_chained, real_read = replay.chained, batcher._read

        async def chained(queue, **shape):
            function = await real_chained(queue, **shape)

            def step(*arrays, **options):
                events.append(("step", shape["rows"], shape["size"]))
                return function(*arrays, **options)
            return step

        def read(*args):
            events.append(("read",))
            return real_read(*args)

        replay.chained, batcher._read = chained, read
        # Two rows chain; a third joins (4 rows), rows finish (fewer rows), and the
        # longest outgrows 16 positions inside a chain (its caches padded on the worker).
        # (The second runs on while the third prefills: long enough that the third finds it.)
        requests = [dict(prompt=BATCH_PROMPTS[0], max_tokens=22), dict(prompt=BATCH_PROMPTS[1], max_tokens=18)]
        late = dict(prompt=BATCH_PROMPTS[3], max_tokens=6)
        for options in ({}, SAMPLED):
            events.clear()
            run = [dict(r, seed=3 + i, **options) for i, r in enumerate([*requests, late])]
            want = [await tokens_of(python, **r) for r in run]
            got: list[list[int]] = [[] for _ in run]

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    started = anyio.Event()
                    tg.start_soon(partial(tokens_into, got[0], replayed, started=started, after=3, **run[0]))
                    tg.start_soon(partial(tokens_into, got[1], replayed, **run[1]))
                    await started.wait()  # the first two decode: the third joins a running batch
                    tg.start_soon(partial(tokens_into, got[2], replayed, **run[2]))
            assert got == want
            steps = [e for e in events if e[0] == "step"]
            assert {rows for _, rows, _ in steps} >= {1, 2, 4} and {16, 32} <= {size for *_, size in steps}, steps
            # The chain: a step is queued before the loop reads the one before it.
            assert any(a[0] == b[0] == "step" and c == ("read",) for a, b, c in zip(events, events[1:], events[2:]))
        # Four rows finishing one after another: a finished row decodes on as a free slot
        # while the rest still need four rows, so fewer chains end than rows finish.
        takes, real_take = [], replay.take

        async def take(queue, **shape):
            takes.append(shape)
            return await real_take(queue, **shape)

        replay.take = take
        four = [dict(prompt=p, max_tokens=n) for p, n in zip(BATCH_PROMPTS, (9, 10, 11, 12))]
        with anyio.fail_after(60):
            assert await concurrently(replayed, four) == [await tokens_of(python, **r) for r in four]
        assert 0 < len(takes) < 4, takes
        await replayed.wait_idle()
        assert not batcher.running


@on_loops("asyncio", "uvloop")
async def test_a_batched_step_updates_its_donated_caches_and_keys_in_place():
    from emlx_async.llm import traced
    from emlx_async.llm.replay_step import CacheSpec, make_step, model_weights

    model = tiny_model("llama")
    weights = model_weights(model)
    spec = CacheSpec.of(model)
    rows = 3
    caches = spec.zeros(rows, 16)
    keys = mx.stack([mx.random.key(i) for i in range(rows)])
    mx.eval(caches, keys)
    async with ea.Runtime(pool_size=1) as rt:
        q = rt.default_queue()
        per_step = [mx.zeros((rows, 1), dtype=mx.int32), mx.zeros((rows,), dtype=mx.int32),
                    *traced.sampling_rows([(0.9, 0.9, 20)] * rows, 97)]
        step = (await ea.trace(make_step(model, spec, weights_as_inputs=True), *caches, keys, *per_step,
                               *weights, queue=q)).bind(*weights)
        addresses = [buffer_address(x) for x in (*caches, keys)]
        for position in range(4):
            tokens = mx.array([[1], [2], [3]], dtype=mx.int32)
            positions = mx.array([position, position + 2, 2 * position], dtype=mx.int32)
            out = await step(*caches, keys, tokens, positions, *per_step[2:], queue=q,
                             donate={**{i: 2 + i for i in range(spec.n_buffers)}, spec.n_buffers: 1})
            assert out.shape == (rows, 1)
            assert [buffer_address(x) for x in (*caches, keys)] == addresses, f"step {position} copied"
            for row, at in enumerate(positions.tolist()):  # each row's keys went to its own position
                assert mx.any(caches[0][row, :, at] != 0).item() and not mx.any(caches[0][row, :, 12:] != 0).item()
        step.release()


@on_every_loop
async def test_replayed_batch_late_joiner_and_a_reader_that_leaves():
    async with ea.Runtime(pool_size=2) as rt:
        replayed, python = await batch_pair(rt, max_concurrent=3)
        alone = await tokens_of(python, BATCH_PROMPTS[1], max_tokens=10)
        first = replayed.generate(BATCH_PROMPTS[1], max_tokens=10)
        first_tokens = [(await first.__anext__()).token]  # decoding now
        leaver = replayed.generate(BATCH_PROMPTS[0], max_tokens=50)
        await leaver.__anext__()
        await leaver.__anext__()
        await leaver.aclose()  # its row is freed at the next step
        late = await tokens_of(replayed, BATCH_PROMPTS[1], max_tokens=10)
        first_tokens += [d.token async for d in first if d.token is not None]
        assert first_tokens == alone and late == alone
        await replayed.wait_idle()
        assert replayed.active_requests == 0 and not replayed._replay_batcher.running


@pytest.mark.parametrize("step", ["replay", "python"])
@on_every_loop
async def test_a_finished_request_read_late_does_not_drop_a_new_drivers_row(step):
    async with ea.Runtime(pool_size=2) as rt:
        replayed, python = await batch_pair(rt, max_concurrent=4)
        engine = replayed if step == "replay" else python
        want = await tokens_of(engine, BATCH_PROMPTS[1], max_tokens=12)
        first = engine.generate(BATCH_PROMPTS[0], max_tokens=3)
        await first.__anext__()  # the driver finishes it while nobody reads
        await engine.wait_idle()  # ... and exits: the next driver numbers rows from 0 again
        second = engine.generate(BATCH_PROMPTS[1], max_tokens=12)
        got = [(await second.__anext__()).token]
        assert len([d async for d in first if d.token is not None]) == 2  # the first reader ends: forgets its row
        with anyio.fail_after(30):
            got += [d.token async for d in second if d.token is not None]
        assert got == want
        await engine.wait_idle()


@on_every_loop
async def test_a_failing_replayed_batch_fails_its_requests_and_the_next_one_starts_a_new_driver():
    from emlx_async.llm import BatchDriverError

    async with ea.Runtime(pool_size=2) as rt:
        replayed, _ = await batch_pair(rt, max_concurrent=3)
        reference = await tokens_of(replayed, BATCH_PROMPTS[0], max_tokens=6)
        boom = RuntimeError("injected layout failure")
        real_layout = replayed._replay_batcher.jobs.layout
        calls = []

        def failing_layout(state, saves, keep, joined, *rest):
            calls.append(joined)
            if sum(map(len, calls)) >= 2:  # the second request joining the batch
                raise boom
            return real_layout(state, saves, keep, joined, *rest)

        replayed._replay_batcher.jobs.layout = failing_layout
        errors = []

        async def one(prompt):
            try:
                await tokens_of(replayed, prompt, max_tokens=20)
            except BatchDriverError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, BATCH_PROMPTS[0])
            tg.start_soon(one, BATCH_PROMPTS[1])
        assert len(errors) == 2 and all(e.__cause__ is boom for e in errors)
        replayed._replay_batcher.jobs.layout = real_layout
        assert await tokens_of(replayed, BATCH_PROMPTS[0], max_tokens=6) == reference
        await replayed.wait_idle()
        assert not replayed._replay_batcher.running and not replayed._replay_batcher.joining


# ---- SmolLM2 ----------------------------------------------------------------------

PROMPTS = ["The capital of France is", "Name a colour:", "Say hi"]


@pytest.mark.model
@needs_model
@on_loops("asyncio")
async def test_smollm2_replayed_steps_give_the_python_steps_tokens(rt):
    from emlx_async.llm import Engine

    engine = await Engine.load(runtime=rt, max_concurrent=3, cache_sizes=(64,))
    assert engine.step_kind == "replay", engine.step_note
    alone = [await tokens_of(engine, p, max_tokens=6) for p in PROMPTS]
    together = await asyncio.gather(*(tokens_of(engine, p, max_tokens=6) for p in PROMPTS))
    sampled = await tokens_of(engine, PROMPTS[0], max_tokens=6, seed=11, **SAMPLED)
    assert await tokens_of(engine, PROMPTS[0], max_tokens=6, seed=11, **SAMPLED) == sampled
    await engine.prepare_step("python")
    python_alone = [await tokens_of(engine, p, max_tokens=6) for p in PROMPTS]
    assert alone == python_alone and list(together) == python_alone
    assert await tokens_of(engine, PROMPTS[0], max_tokens=6, seed=11, **SAMPLED) == sampled
    # Batch mode: the replayed batch step and mlx-lm's BatchGenerator give the same tokens.
    batch = Engine(engine.model, engine.tokenizer, eos_ids=engine.eos_ids, chat_template=None, runtime=rt,
                   mode="batch", max_concurrent=3)
    for step in ("replay", "python"):
        assert await batch.prepare_step(step, cache_sizes=(64,)) == step
        assert list(await asyncio.gather(*(tokens_of(batch, p, max_tokens=6) for p in PROMPTS))) == python_alone
        assert await tokens_of(batch, PROMPTS[0], max_tokens=6, seed=11, **SAMPLED) == sampled
        await batch.wait_idle()


@pytest.mark.model
@needs_model
@on_loops("asyncio")
async def test_smollm2_kv_options_on_load(rt):
    """Engine.load's kv_bits: SmolLM2 replays mlx-lm's 8-bit tokens; options mlx or mlx-lm
    refuse raise their error at load."""
    from emlx_async.llm import Engine
    from support.tiny_models import mlx_lm_tokens

    with pytest.raises(ValueError, match="max_kv_size must be more than 4"):
        await Engine.load(runtime=rt, max_kv_size=4)
    with pytest.raises(ValueError, match="number of bits 7 is not supported"):
        await Engine.load(runtime=rt, kv_bits=7, step="python")
    engine = await Engine.load(runtime=rt, kv_bits=8, cache_sizes=(64,))
    assert engine.step_kind == "replay" and "8-bit keys and values (group size 64)" in engine.step_note
    prompt = engine.encode(PROMPTS[0])
    want = await rt.default_queue().run(mlx_lm_tokens, engine.model, prompt, 6, kv_bits=8)
    assert await tokens_of(engine, prompt, max_tokens=6) == want


PAYLOAD = {"items": [{"id": i, "name": f"item-{i}", "tags": ["a", "b"]} for i in range(100)]}


@pytest.mark.model
@needs_model
@on_loops("asyncio")
@pytest.mark.parametrize("mode", ["parallel", "batch"])
async def test_smollm2_replayed_steps_progress_while_the_loop_is_busy(rt, mode):
    from emlx_async.llm import Engine

    engine = await Engine.load(runtime=rt, cache_sizes=(64,), mode=mode)
    assert engine.step_kind == "replay", engine.step_note
    busy_slices = 0
    stop = asyncio.Event()

    async def hold_the_loop():  # Python work on the loop, yielding only with sleep(0)
        nonlocal busy_slices
        while not stop.is_set():
            end = time.perf_counter() + 0.005
            while time.perf_counter() < end:
                json.loads(json.dumps(PAYLOAD))
            busy_slices += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(hold_the_loop())
    try:
        tokens = await tokens_of(engine, PROMPTS[0], max_tokens=6)
    finally:
        stop.set()
        await task
    assert len(tokens) == 6 and busy_slices > 0
    await engine.wait_idle()
