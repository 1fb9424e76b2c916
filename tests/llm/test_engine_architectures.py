"""Every architecture through the engine, both modes: mlx-lm's own tokens, replayed natively.

Tiny random models (tests/support/tiny_models.py, no download) of the architectures
users serve most (and gpt2, and the state-space mamba2, qwen3_next, qwen3_5 and falcon_h1), each in "parallel" and "batch" mode: greedy and seeded
tokens, alone and four at once, must be mlx-lm's ``generate_step``'s, and
the step must be the replayed one.
"""

from __future__ import annotations

import functools
import gc

import anyio
import pytest

import emlx_async as ea
from emlx_async.llm import Engine
from emlx_async.llm.cache_options import CacheOptions
from support.helpers import on_loops
from support.tiny_models import ARCHITECTURES, QUANTIZABLE, STATE_ARCHITECTURES, IdsTokenizer, mlx_lm_tokens, tiny

PROMPTS = [[3, 17, 5, 9, 100, 42], [7, 1, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19], [2]]
N = 14  # past gemma3's window of 8, and the longest prompt past the 16-position trace
SAMPLED = dict(temperature=0.9, top_p=0.9, top_k=20)
# Two seeded requests among the four at once.
AT_ONCE = [dict(), dict(seed=6, **SAMPLED), dict(), dict(seed=7, **SAMPLED)]


@functools.cache
def model_of(kind: str, options: tuple = ()):
    return tiny(kind, **dict(options))


@functools.cache
def reference(kind: str, prompt: tuple[int, ...], seed: int | None, options: tuple = (), cache: tuple = ()) -> list:
    return mlx_lm_tokens(model_of(kind, options), list(prompt), N, seed=seed,
                         **(SAMPLED if seed is not None else {}), **dict(cache))


async def tokens_of(engine, prompt, **options) -> list[int]:
    return [d.token async for d in engine.generate(prompt, max_tokens=N, **options) if d.token is not None]


async def concurrently(engine, prompts, options) -> list[list[int]]:
    results: list[list[int]] = [[] for _ in prompts]

    async def one(i):
        results[i] = await tokens_of(engine, prompts[i], **options[i])

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    return results


async def check_engine(kind: str, mode: str, model_options: tuple = (), cache: tuple = (), step: str = "auto") -> Engine:
    async with ea.Runtime(pool_size=4) as rt:
        engine = Engine(model_of(kind, model_options), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt,
                        mode=mode, max_concurrent=4, cache_options=CacheOptions(**dict(cache)))
        step_kind = await engine.prepare_step(step, cache_sizes=(16, 32))
        if step == "python":
            assert step_kind == "python"
        else:
            assert step_kind == "replay", engine.step_note
        want = functools.partial(reference, kind, options=model_options, cache=cache)
        assert [await tokens_of(engine, p) for p in PROMPTS[:2]] == [want(tuple(p), None) for p in PROMPTS[:2]]
        assert await tokens_of(engine, PROMPTS[2], seed=5, **SAMPLED) == want(tuple(PROMPTS[2]), 5)
        assert await concurrently(engine, PROMPTS, AT_ONCE) == \
            [want(tuple(p), o.get("seed")) for p, o in zip(PROMPTS, AT_ONCE)]
        await engine.wait_idle()
    return engine


@on_loops("asyncio", "uvloop")
@pytest.mark.parametrize("mode", ["parallel", "batch"])
@pytest.mark.parametrize("kind", [*ARCHITECTURES, "gpt2", *STATE_ARCHITECTURES])
async def test_every_architecture_gives_mlx_lms_tokens(kind, mode):
    await check_engine(kind, mode)


@on_loops("asyncio", "uvloop")
@pytest.mark.parametrize("step", ["auto", "python"])
@pytest.mark.parametrize("mode", ["parallel", "batch"])
async def test_a_quantized_kv_cache_gives_mlx_lms_quantized_tokens(mode, step):
    """kv_bits 4: mlx-lm's quantized tokens, replayed or on the Python step (in batch mode
    each request alone: mlx-lm's BatchGenerator has no quantized cache)."""
    model, quantized = tuple(QUANTIZABLE.items()), (("kv_bits", 4), ("kv_group_size", 32))
    assert reference("qwen3", tuple(PROMPTS[0]), None, model, quantized) != \
        reference("qwen3", tuple(PROMPTS[0]), None, model)  # the quantization shows in the tokens
    engine = await check_engine("qwen3", mode, model, quantized, step)
    assert "4-bit" in engine.step_note


# Not batch mode's Python step: mlx-lm's BatchGenerator rotates its BatchRotatingKVCache without
# the 4 tokens make_prompt_cache keeps, so its tokens are not generate_step's past the bound.
@on_loops("asyncio", "uvloop")
@pytest.mark.parametrize("mode, step", [("parallel", "auto"), ("batch", "auto"), ("parallel", "python")])
async def test_a_bounded_kv_cache_gives_mlx_lms_rotating_tokens(mode, step):
    # max_kv_size 12: the longer prompts' answers wrap the ring (mlx-lm keeps the first 4 tokens).
    bounded = (("max_kv_size", 12),)
    assert reference("qwen3", tuple(PROMPTS[2]), None, cache=bounded) != reference("qwen3", tuple(PROMPTS[2]), None)
    engine = await check_engine("qwen3", mode, cache=bounded, step=step)
    assert "max_kv_size 12" in engine.step_note


@on_loops("asyncio", "uvloop")
async def test_a_stream_left_just_before_close_leaves_no_unretrieved_failure():
    """Leaving a replayed stream queues the job that frees its chain; a runtime
    closed right after drops that job, and nobody awaits it: its QueueClosed
    must not reach the loop as "exception was never retrieved"."""
    rt = ea.Runtime(pool_size=2)
    engine = Engine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt,
                    mode="parallel", max_concurrent=2)
    assert await engine.prepare_step("replay", cache_sizes=(16, 32)) == "replay"
    stream = engine.generate(PROMPTS[0], max_tokens=8)
    async for _ in stream:
        break
    await stream.aclose()
    await rt.close(cancel_pending=True)
    gc.collect()
    await anyio.sleep(0)
