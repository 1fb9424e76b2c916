"""Sampling options (llm/sampling.py): near-zero temperatures decode greedily in every step,
and a near-zero top_p keeps the most likely token alone.

Tiny random llama models built here (no download) run the replayed and the
Python step in both modes.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

import emlx_async as ea
from support.helpers import on_every_loop, on_loops

pytest.importorskip("mlx_lm")

# Below the float32 bound on 1/t, and the 1e-39 a user once sent.
TINY = (1e-45, 1e-39, 2e-38, 1e-35)


class IdsTokenizer:
    """Decodes token ids as their numbers: enough for the engine's detokenizer."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)


def tiny_llama():
    from mlx_lm.models import llama

    mx.random.seed(3)
    model = llama.Model(llama.ModelArgs(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=97,
        max_position_embeddings=128))
    mx.eval(model.parameters())
    return model


def test_a_temperature_below_the_bound_is_greedy_and_one_at_it_is_kept():
    from emlx_async.llm.sampling import MIN_TEMPERATURE, check_sampling

    for t in TINY:
        assert check_sampling(temperature=t) == (0.0, 1.0, 0)
    assert check_sampling(temperature=MIN_TEMPERATURE)[0] == MIN_TEMPERATURE
    assert check_sampling(temperature=0.7, top_p=0.5, top_k=3) == (0.7, 0.5, 3)


def test_a_top_p_below_the_bound_is_raised_to_it_and_one_above_is_kept():
    from emlx_async.llm.sampling import MIN_TOP_P, check_sampling

    for p in (5e-324, 1e-300, 1e-46):  # 0 in float32: the filter was off
        assert check_sampling(temperature=1.0, top_p=p) == (1.0, MIN_TOP_P, 0)
    assert np.float32(MIN_TOP_P) == MIN_TOP_P
    assert check_sampling(temperature=1.0, top_p=1e-20)[1] == 1e-20


def test_at_the_bound_every_scaled_logprob_stays_finite_in_float32():
    from emlx_async.llm.sampling import MIN_TEMPERATURE

    # What both steps compute: the log-probabilities times 1/t, in float32.
    inverse = np.float32(1 / MIN_TEMPERATURE)
    assert math.isfinite(inverse)
    worst = np.float32(-1e6)  # far below any log-probability a float32 softmax gives a token it can draw
    assert np.isfinite(worst * inverse)
    # At 1e-38 a flat vocabulary's logprobs (-log V) times 1/t overflow: the bug.
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.float32(-math.log(2**17)) * np.float32(1 / 1e-38))


@pytest.mark.parametrize("mode", ["parallel", "batch"])
@pytest.mark.parametrize("step", ["replay", "python"])
@on_every_loop
async def test_a_near_zero_temperature_gives_the_greedy_tokens(mode, step):
    from emlx_async.llm import Engine

    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(tiny_llama(), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt,
                        mode=mode, max_concurrent=2)
        assert await engine.prepare_step(step, cache_sizes=(16, 32)) == step
        prompt = [5, 9, 2, 7]

        async def tokens(**options):
            return [d.token async for d in engine.generate(prompt, max_tokens=10, **options) if d.token is not None]

        greedy = await tokens()
        for p in (1e-300, 1e-46, 1e-39):  # a tiny top_p keeps the most likely token alone
            assert await tokens(temperature=1.0, top_p=p, seed=3) == greedy, f"top_p {p}"
        for t in TINY:
            assert await tokens(temperature=t, seed=1) == greedy, f"temperature {t}"
            assert await tokens(temperature=t, top_p=0.5, top_k=5, seed=2) == greedy, f"temperature {t}"
        await engine.wait_idle()


@on_loops("asyncio", "uvloop")
@pytest.mark.parametrize("step", ["replay", "python"])
async def test_a_float16_model_at_a_small_temperature_samples_the_argmax(step):
    # 1/t = 1e6 times a flat vocabulary's logprobs overflows float16: both steps scale in float32.
    from emlx_async.llm import Engine

    model = tiny_llama()
    model.set_dtype(mx.float16)
    mx.eval(model.parameters())  # evaluated weights are usable from any thread
    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, max_concurrent=2)
        assert await engine.prepare_step(step, cache_sizes=(16, 32)) == step
        prompt = [5, 9, 2, 7]

        async def tokens(**options):
            return [d.token async for d in engine.generate(prompt, max_tokens=10, **options) if d.token is not None]

        assert await tokens(temperature=1e-6, seed=1) == await tokens()
