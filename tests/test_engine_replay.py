"""The engine's replayed decode step (a traced graph per cache size, sampling inside).

Tiny mlx-lm models built here (random weights, no download) cover the step
choice and the fallback on every loop; SmolLM2 checks the tokens.
"""

from __future__ import annotations

import asyncio
import json
import time

import anyio
import mlx.core as mx
import pytest

import emlx_async as ea
from helpers import needs_model, on_every_loop

SAMPLED = dict(temperature=0.9, top_p=0.9, top_k=20)


class IdsTokenizer:
    """Decodes token ids as their numbers: enough for the engine's detokenizer."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)


def tiny_model(kind: str):
    from mlx_lm.models import gpt2, llama

    class OddLlama(llama.Model):
        def __call__(self, *args, **kwargs):
            return 2 * super().__call__(*args, **kwargs)

    mx.random.seed(3)
    if kind in ("llama", "odd llama"):
        model = (llama.Model if kind == "llama" else OddLlama)(llama.ModelArgs(
            model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=97,
            max_position_embeddings=128))
    else:
        model = gpt2.Model(gpt2.ModelArgs(model_type="gpt2", n_ctx=64, n_embd=32, n_head=2, n_layer=1,
                                          n_positions=64, layer_norm_epsilon=1e-5, vocab_size=97))
    mx.eval(model.parameters())  # evaluated weights are usable from any thread
    return model


async def tokens_of(engine, prompt, **options) -> list[int]:
    return [d.token async for d in engine.generate(prompt, **options) if d.token is not None]


async def concurrently(engine, prompts, **options) -> list[list[int]]:
    results: list[list[int]] = [[] for _ in prompts]

    async def one(i):
        results[i] = await tokens_of(engine, prompts[i], **options)

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    return results


@on_every_loop
async def test_a_llama_model_replays_the_python_steps_tokens():
    from emlx_async.llm import Engine

    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(tiny_model("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt)
        assert engine.step_kind == "python"  # not prepared yet
        assert await engine.prepare_step(cache_sizes=(16, 32)) == "replay"
        assert engine._replay.sizes == [16, 32]
        prompts = [[5, 9, 2], [7, 1, 4, 4, 8, 3]]
        greedy = [await tokens_of(engine, p, max_tokens=8) for p in prompts]
        sampled = [await tokens_of(engine, p, max_tokens=8, seed=5, **SAMPLED) for p in prompts]
        assert await concurrently(engine, prompts, max_tokens=8) == greedy
        assert await tokens_of(engine, prompts[1], max_tokens=8, seed=5, **SAMPLED) == sampled[1]  # seeded: repeatable
        long_prompt = list(range(1, 30))  # with max_tokens past the largest cache: the Python step
        long = await tokens_of(engine, long_prompt, max_tokens=8)
        assert await engine.prepare_step("python") == "python" and "asked" in engine.step_note
        assert [await tokens_of(engine, p, max_tokens=8) for p in prompts] == greedy
        # Same math, same key: the Python sampler draws the same tokens.
        assert [await tokens_of(engine, p, max_tokens=8, seed=5, **SAMPLED) for p in prompts] == sampled
        assert await tokens_of(engine, long_prompt, max_tokens=8) == long


@on_every_loop
async def test_a_model_that_cannot_be_traced_falls_back_to_the_python_step():
    from emlx_async.llm import Engine

    async with ea.Runtime(pool_size=1) as rt:
        engine = Engine(tiny_model("gpt2"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt)
        assert await engine.prepare_step() == "python"
        assert "gpt2" in engine.step_note
        with pytest.raises(ValueError, match="not available.*gpt2"):
            await engine.prepare_step("replay")
        assert len(await tokens_of(engine, [3, 4], max_tokens=3)) == 3  # the Python step runs
        # A "llama" whose forward pass is not traced.forward's: refused, not traced wrong.
        odd = Engine(tiny_model("odd llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt)
        assert await odd.prepare_step(cache_sizes=(16,)) == "python"
        assert "disagrees" in odd.step_note
        with pytest.raises(ValueError, match="step must be one of"):
            await engine.prepare_step("fast")
        with pytest.raises(ValueError, match="cache_sizes"):
            await engine.prepare_step(cache_sizes=(0,))


# ---- SmolLM2 ----------------------------------------------------------------------

PROMPTS = ["The capital of France is", "Name a colour:", "Say hi"]


@pytest.mark.model
@needs_model
@pytest.mark.asyncio(loop_factories=["asyncio"])
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
    # Batch mode keeps mlx-lm's batched Python step, and says so; same greedy tokens.
    batch = Engine(engine.model, engine.tokenizer, eos_ids=engine.eos_ids, chat_template=None, runtime=rt,
                   mode="batch", max_concurrent=3)
    assert await batch.prepare_step() == "python" and "batch" in batch.step_note
    assert list(await asyncio.gather(*(tokens_of(batch, p, max_tokens=6) for p in PROMPTS))) == python_alone
    await batch._batcher.wait_idle()


PAYLOAD = {"items": [{"id": i, "name": f"item-{i}", "tags": ["a", "b"]} for i in range(100)]}


@pytest.mark.model
@needs_model
@pytest.mark.asyncio(loop_factories=["asyncio"])
async def test_smollm2_replayed_steps_progress_while_the_loop_is_busy(rt):
    from emlx_async.llm import Engine

    engine = await Engine.load(runtime=rt, cache_sizes=(64,))
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
