"""The long tail of mlx-lm's families replays natively and gives mlx-lm's own tokens.

Tiny random models (tests/support/tiny_models.py's FAMILIES: about fifty more
families than test_engine_architectures.py's deep checks, multimodal wrappers
and hybrids of state and key-value layers among them), each through the engine
in "parallel" and "batch" mode: the step must be the replayed one, and two
greedy requests at once must give mlx-lm's ``generate_step`` tokens. A family
whose own code batches wrongly (``BATCH_REFUSED``) is refused batch mode at load.
"""

from __future__ import annotations

import anyio
import pytest

import emlx_async as ea
from emlx_async.llm import Engine
from support.engine import tokens_of
from support.helpers import on_loops
from support.tiny_models import FAMILIES, IdsTokenizer, mlx_lm_tokens, tiny

PROMPTS = [[3, 17, 5, 9, 100, 42, 8, 1, 6, 2, 11, 19], [7, 1, 4]]
N = 10  # the first prompt crosses the 16-position trace into the 32
# mlx-lm's gemma2 adds a batch's mask along its key-value heads (its attention splits
# the query heads into groups by hand): a batch's rows get other logits than alone. The
# models here are mlx-lm's own, as a user may hand one to Engine; Engine.load fixes it
# (loading.fix_batch_masks, below).
BATCH_REFUSED = {"gemma2": "other logits than the same row alone"}


async def _prompts_at_once(engine) -> list:
    """PROMPTS' greedy tokens, decoded at once by `engine`, which is closed afterwards."""
    got = [None] * len(PROMPTS)

    async def one(i):
        got[i] = await tokens_of(engine, PROMPTS[i], max_tokens=N)

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for i in range(len(PROMPTS)):
                tg.start_soon(one, i)
    await engine.wait_idle()
    await engine.close()
    return got


@on_loops("asyncio")
@pytest.mark.parametrize("kind", sorted(FAMILIES))
async def test_family_replays_with_mlx_lms_tokens(kind):
    model = tiny(kind)
    want = [mlx_lm_tokens(model, prompt, N) for prompt in PROMPTS]
    async with ea.Runtime(pool_size=2) as rt:
        for mode in ("parallel", "batch"):
            engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode=mode,
                            max_concurrent=2)
            if mode == "batch" and kind in BATCH_REFUSED:
                for step in ("auto", "python"):
                    with pytest.raises(ValueError, match=f"mode 'batch' cannot serve model type '{kind}': "
                                                         f".*{BATCH_REFUSED[kind]}.*mode 'parallel'"):
                        await engine.prepare_step(step)
                await engine.close()
                continue
            assert await engine.prepare_step(cache_sizes=(16, 32)) == "replay", engine.step_note
            assert await _prompts_at_once(engine) == want, mode


@on_loops("asyncio")
async def test_a_batch_that_fails_in_the_models_own_code_is_refused_by_name():
    """gemma2 with 4 key-value heads: a batch of 2 rows does not even broadcast in its attention."""
    model = tiny("gemma2", num_attention_heads=8, num_key_value_heads=4)
    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode="batch")
        with pytest.raises(ValueError, match="mode 'batch' cannot serve model type 'gemma2': a batch of 2 rows "
                                             "fails in the model's own code"):
            await engine.prepare_step()
        await engine.close()


@on_loops("asyncio")
@pytest.mark.parametrize("heads", [(4, 1), (8, 4)])  # a batch of 2 wrong, and failing to broadcast
async def test_gemma2_with_its_batch_mask_fixed_batches_with_mlx_lms_tokens(heads):
    from emlx_async.llm.loading import fix_batch_masks

    model = tiny("gemma2", num_attention_heads=heads[0], num_key_value_heads=heads[1])
    want = [mlx_lm_tokens(model, prompt, N) for prompt in PROMPTS]  # each alone: right before the fix too
    assert fix_batch_masks(model) and not fix_batch_masks(tiny("llama"))
    assert [mlx_lm_tokens(model, prompt, N) for prompt in PROMPTS] == want
    async with ea.Runtime(pool_size=2) as rt:
        for step in ("python", "auto"):
            engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode="batch",
                            max_concurrent=2)
            assert await engine.prepare_step(step, cache_sizes=(16, 32)) == ("replay" if step == "auto" else "python")
            assert await _prompts_at_once(engine) == want, step


def test_mode_auto_serves_alone_a_model_whose_batch_is_wrong_unchecked_or_fails(monkeypatch):
    """Engine.load(mode="auto")'s check: None where the batch gives each row its logits
    alone, else the reason parallel mode is chosen."""
    from mlx_lm.models import llama
    from mlx_lm.models.cache import ChunkedKVCache

    from emlx_async.llm.cache_options import CacheOptions
    from emlx_async.llm.engine import _batching_refusal
    from support.tiny_models import BASE

    class Chunked(llama.Model):
        def make_cache(self):
            return [ChunkedKVCache(4) for _ in self.layers]

    class FailsBatched(llama.Model):
        def __call__(self, inputs, *args, **kwargs):
            if inputs.shape[0] > 1:
                raise RuntimeError("no batches here")
            return super().__call__(inputs, *args, **kwargs)

    args = llama.ModelArgs.from_dict({**BASE, "model_type": "llama"})
    options = CacheOptions()
    assert _batching_refusal(tiny("llama"), options) is None
    assert "mode 'batch' cannot serve model type 'gemma2'" in _batching_refusal(tiny("gemma2"), options)
    assert "its batch cannot be checked" in _batching_refusal(Chunked(args), options)
    assert "a batch of 2 rows fails in the model's own code: no batches here" in \
        _batching_refusal(FailsBatched(args), options)

    def broken(model, spec):
        raise KeyError("a buffer")

    monkeypatch.setattr("emlx_async.llm.engine.check_batch_against_rows", broken)
    assert _batching_refusal(tiny("llama"), options) == "checking its batch failed: KeyError('a buffer')"
