"""Decoding's prefill: what it gives against mlx-lm's generate_step."""

from __future__ import annotations

import inspect

import pytest

from support.engine import tokens_of
from support.helpers import on_loops
from support.tiny_models import QUANTIZABLE, IdsTokenizer, mlx_lm_tokens, tiny


@pytest.mark.parametrize("mode,step", [("parallel", "replay"), ("parallel", "python"), ("batch", "replay")])
@on_loops("asyncio")
async def test_kv_bits_prefill_quantizes_where_mlx_lm_does(rt, mode, step):
    """generate_step prefills all but the last token in calls of 2048, quantizing after each:
    quantized after every prefill chunk instead, 2-bit keys gave other greedy tokens."""
    from mlx_lm.generate import generate_step

    from emlx_async.llm import Engine
    from emlx_async.llm.cache_options import CacheOptions

    step_size = inspect.signature(generate_step).parameters["prefill_step_size"].default

    model = tiny("llama", **QUANTIZABLE)
    options = dict(kv_bits=2, kv_group_size=32)
    for chunk in (32, 100):  # 100: chunks that do not end where mlx-lm's steps do
        engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode=mode,
                        max_concurrent=2, prefill_chunk=chunk, cache_options=CacheOptions(**options),
                        context_length=4096)
        await engine.prepare_step(step, cache_sizes=(128, 4096))
        # chunk + 1: the chunk leaves only the last token, and generate_step quantizes before it
        for length in (71, chunk + 1, step_size + 60):
            prompt = [1] + [(i * 37) % 250 + 3 for i in range(length - 1)]
            want = await rt.default_queue().run(mlx_lm_tokens, model, prompt, 8, **options)
            assert await tokens_of(engine, prompt, max_tokens=8) == want, (chunk, length)
        await engine.wait_idle()


@pytest.mark.parametrize("mode,step", [("parallel", "replay"), ("parallel", "python"), ("batch", "replay")])
@on_loops("asyncio")
async def test_a_prompt_past_max_kv_size_is_fed_in_mlx_lms_calls(rt, mode, step):
    """max_kv_size's ring keeps its first 4 tokens: a later call's queries attend to them, one
    call's (past the window) do not, so a prompt past the ring fed in chunks of 32 or 8 gave other
    greedy tokens than generate_step's one call."""
    from emlx_async.llm import Engine
    from emlx_async.llm.cache_options import CacheOptions

    model = tiny("qwen2")  # no cache layout of its own: max_kv_size makes rotating caches
    for chunk, length in ((32, 200), (8, 30)):
        engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode=mode,
                        max_concurrent=2, prefill_chunk=chunk, cache_options=CacheOptions(max_kv_size=20),
                        context_length=4096)
        await engine.prepare_step(step, cache_sizes=(128, 512))
        prompt = [1] + [(i * 37) % 250 + 3 for i in range(length - 1)]
        want = await rt.default_queue().run(mlx_lm_tokens, model, prompt, 8, max_kv_size=20)
        assert await tokens_of(engine, prompt, max_tokens=8) == want, (chunk, length)
        await engine.wait_idle()


@on_loops("asyncio")
async def test_a_prompt_within_max_kv_size_keeps_its_chunks(rt):
    """Within the ring any split gives the same keys: the prefill stays bounded by its chunk
    (a cancelled prompt frees its queue, a batch stalls, within one chunk)."""
    from emlx_async.llm import Engine
    from emlx_async.llm.cache_options import CacheOptions
    from emlx_async.llm.sampling import Sampler
    from emlx_async.llm.state import PromptState

    model = tiny("qwen2")
    engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode="parallel",
                    max_concurrent=1, prefill_chunk=8, cache_options=CacheOptions(max_kv_size=100))
    decoding = engine.decoding

    def fed_by_one_chunk(length: int) -> int:
        state = PromptState()
        decoding.begin_prefill(state, list(range(3, 3 + length)))
        decoding.feed_chunk(state, list(range(3, 3 + length)), Sampler(0.0, 1.0, 0, 0, None), 5)
        return length - (state.unread.size if state.unread is not None else 0)

    assert await rt.default_queue().run(fed_by_one_chunk, 60) == 5  # within the ring: the limit given
    assert await rt.default_queue().run(fed_by_one_chunk, 150) == 150  # past it: generate_step's calls
