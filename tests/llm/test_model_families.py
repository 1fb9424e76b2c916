"""The long tail of mlx-lm's families replays natively and gives mlx-lm's own tokens.

Tiny random models (tests/support/tiny_models.py's FAMILIES: about a hundred more
families than test_engine_architectures.py's deep checks, multimodal wrappers
and hybrids of state and key-value layers among them), each through the engine
in "parallel" and "batch" mode: the step must be the replayed one, and two
greedy requests at once must give mlx-lm's ``generate_step`` tokens. A family
whose own code batches wrongly (``BATCH_REFUSED``) is refused batch mode at load;
one whose step cannot replay (``FALLS_BACK``) takes the Python step, its
``step_note`` saying why.
"""

from __future__ import annotations

import re

import anyio
import pytest

import emlx_async as ea
from emlx_async.llm import Engine
from emlx_async.llm.model_fixes import fix_block_sparse_masks, fix_expert_picks, fix_position_arrays, fix_weight_rewrites
from support.engine import tokens_of
from support.helpers import on_loops
from support.tiny_models import FAMILIES, IdsTokenizer, mlx_lm_tokens, tiny

PROMPTS = [[3, 17, 5, 9, 100, 42, 8, 1, 6, 2, 11, 19], [7, 1, 4]]
N = 10  # the first prompt crosses the 16-position trace into the 32
# mlx-lm's gemma2 adds a batch's mask along its key-value heads (its attention splits
# the query heads into groups by hand): a batch's rows get other logits than alone. The
# models here are mlx-lm's own, as a user may hand one to Engine; Engine.load fixes it
# (model_fixes.fix_batch_masks, below).
BATCH_REFUSED = {"gemma2": "other logits than the same row alone",
                 # Where the buffers cannot vouch for a batch, mlx-lm's own is checked (its Python step).
                 "deepseek_v41": r"mlx-lm cannot batch its LayerCache \(layer 0\)",
                 # Its block-sparse layers let a prompt's queries see their whole block: a batch's
                 # padding after a row's end (batch prefill, BatchGenerator) would reach them.
                 "phi3small": "its block-sparse layers let a prompt's queries see every key of their block"}
# mlx-lm's gemma3n writes its own weights in every call (its AltUp's coefficients cast and
# clipped, lazily, on the calling thread's stream), so two threads calling it at once race
# (MLX: "There is no Stream(cpu, n) in current thread", or a crash): model_fixes.fix_weight_rewrites
# (which Engine.load applies) does the rewrite once. The only family that rewrites its weights.
REWRITES_ITS_WEIGHTS = {"gemma3n"}
# mlx-lm's llama4 (its multimodal checkpoints) builds its chunked layers' mask and its rope-less
# layers' temperature from Python-int positions, afm7's key-reusing layers rotate their
# queries at the keys' length less one (a shape), and gpt_bigcode computes its positions' ids in
# numpy: model_fixes.fix_position_arrays (which Engine.load applies) has them take the position as
# an array (llama4 asking its cache for the chunk mask), so they replay (and afm7's and
# gpt_bigcode's mlx-lm batches, left-padded, get each row's own logits too).
INT_POSITIONS = {"afm7", "gpt_bigcode", "llama4"}
# mlx-lm's dbrx picks its experts in Python (inds.tolist()): model_fixes.fix_expert_picks (which
# Engine.load applies) has it take them with array ops, so it replays.
PYTHON_EXPERT_PICKS = {"dbrx"}
# mlx-lm's phi3small's block-sparse layers place the query in the keys' last block and add the
# mask as numbers (mlx-lm's keys end at the token: no mask for one): model_fixes.fix_block_sparse_masks
# (which Engine.load applies) has them, given a boolean mask for one token, place it in its own
# block and hide what the mask hides, so it replays.
BLOCK_SPARSE = {"phi3small"}
# Batches the buffers vouch for (the replayed step's) whose mlx-lm batch (the Python step's) is
# wrong or cannot be made: batch mode on the Python step is refused, naming why.
PYTHON_BATCH_REFUSED = {"llama4": r"mlx-lm cannot batch its ChunkedKVCache \(layer 0\)",
                        "longcat_flash_ngram": "mlx-lm's batch gives row 1 other logits than the same row alone"}
# Families whose step cannot replay: the Python step serves them, step_note naming why
# (and still mlx-lm's tokens).
FALLS_BACK = {
    # Its LayerCache's compressed groups grow, and a group closes, as the position goes (shapes).
    "deepseek_v41": r"LayerCache \(layer 0\) has no fixed-buffer form",
}


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
    want = [mlx_lm_tokens(model, prompt, N) for prompt in PROMPTS]  # mlx-lm's, before the fixes
    assert bool(fix_weight_rewrites(model)) == (kind in REWRITES_ITS_WEIGHTS)  # as Engine.load does
    assert fix_position_arrays(model) == (kind in INT_POSITIONS)
    assert fix_expert_picks(model) == (kind in PYTHON_EXPERT_PICKS)
    assert fix_block_sparse_masks(model) == (kind in BLOCK_SPARSE)
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
            if kind in FALLS_BACK:
                assert await engine.prepare_step(cache_sizes=(16, 32)) == "python"
                assert re.search(f"model type '{kind}' could not be traced: .*{FALLS_BACK[kind]}", engine.step_note), \
                    engine.step_note
            else:
                assert await engine.prepare_step(cache_sizes=(16, 32)) == "replay", engine.step_note
            assert await _prompts_at_once(engine) == want, mode
        if kind in PYTHON_BATCH_REFUSED:
            engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode="batch")
            with pytest.raises(ValueError, match=f"mode 'batch' cannot serve model type '{kind}': "
                                                 f"{PYTHON_BATCH_REFUSED[kind]}; mode 'parallel'"):
                await engine.prepare_step("python")
            await engine.close()
        elif kind in (INT_POSITIONS | PYTHON_EXPERT_PICKS | BLOCK_SPARSE) - BATCH_REFUSED.keys():  # mlx-lm's batch, fixed too
            engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode="batch",
                            max_concurrent=2)
            assert await engine.prepare_step("python") == "python"
            assert await _prompts_at_once(engine) == want


def test_layers_reading_anothers_cache_step_as_the_model_does():
    """gemma3n's KV-shared layers read an earlier layer's cache with keys_and_values():
    the stand-in gives its whole buffer (as update_and_fetch does), the mask hiding the rest;
    the step's logits are the model's own (mlx-lm's KVCache sliced at the position array)."""
    from emlx_async.llm.replay_step import CacheSpec, check_against_model

    model = tiny("gemma3n")
    assert check_against_model(model, CacheSpec.of(model), tokens=PROMPTS[0][:8]) == 256  # 8: its buffers


def test_block_sparse_layers_step_as_the_model_does_past_their_blocks():
    """phi3small's block-sparse layers (blocks of 32, 2 local, every 2nd strided) over a buffer of
    128: each step's logits are the model's own (mlx-lm's KVCache) through 4 blocks, where which
    blocks the token sees follows its position (the families' test stays within the first)."""
    import mlx.core as mx

    from emlx_async.llm.replay_step import CacheSpec, forward

    model = tiny("phi3small")
    assert fix_block_sparse_masks(model)
    spec = CacheSpec.of(model)
    tokens = [(7 * i + 3) % 1000 for i in range(110)]
    caches = spec.prompt_cache(model)
    model(mx.array([tokens[:1]]), cache=caches)
    buffers = spec.from_prompt_cache(caches, 128)
    for position, token in enumerate(tokens[1:], start=1):
        want = model(mx.array([[token]]), cache=caches)[:, -1, :]
        logits, buffers = forward(model, spec, mx.array([[token]]), mx.array(position), buffers)
        shown = mx.isfinite(want)  # its logits hide the dummy tokens (-inf)
        assert mx.array_equal(mx.isfinite(logits), shown).item(), position
        assert mx.allclose(mx.where(shown, logits, 0), mx.where(shown, want, 0), rtol=1e-3, atol=1e-3).item(), position


def test_block_sparse_layers_give_a_left_padded_prompt_batch_each_rows_logits_alone():
    """mlx-lm's batch caches (left-padded, a boolean mask {B, 1, L, S}) through phi3small's
    block-sparse layers: each row's logits at every prompt position are its own alone (mlx-lm's:
    its queries placed in its keys' last blocks, aligned to their end, and its causal mask added
    as numbers), in chunks of 20, 4 and 46 tokens (longer than a block), past two blocks."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache, KVCache

    model = tiny("phi3small", num_attention_heads=8, num_key_value_heads=4)
    assert fix_block_sparse_masks(model)
    prompts = [[(5 * i + k) % 1000 + 1 for i in range(n)] for k, n in ((1, 70), (2, 37), (3, 50))]
    longest = max(map(len, prompts))
    padding = [longest - len(p) for p in prompts]
    batch = [BatchKVCache(padding) for _ in model.layers]
    alone = [[KVCache() for _ in model.layers] for _ in prompts]
    padded = mx.array([[0] * pad + p for pad, p in zip(padding, prompts)])
    for start, end in ((0, 20), (20, 24), (24, longest)):  # 46 tokens: a chunk longer than a block
        together = model(padded[:, start:end], cache=batch)
        for row, (pad, prompt) in enumerate(zip(padding, prompts)):
            first = max(start, pad)  # the row's own tokens in this chunk
            if first >= end:
                continue
            want = model(mx.array([prompt[first - pad:end - pad]]), cache=alone[row])
            got = together[row:row + 1, first - start:]
            assert mx.allclose(got, want, rtol=1e-3, atol=1e-3).item(), (row, start)


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
    from emlx_async.llm.model_fixes import fix_batch_masks

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
    # The buffers vouch for llama4's batch (fixed), mlx-lm's own (the Python step's) cannot merge its caches.
    llama4 = tiny("llama4")
    assert fix_position_arrays(llama4) and _batching_refusal(llama4, options) is None
    assert "mlx-lm cannot batch its ChunkedKVCache (layer 0)" in _batching_refusal(llama4, options, python_step=True)
    assert _batching_refusal(tiny("llama"), options, python_step=True) is None
    assert "mode 'batch' cannot serve model type 'gemma2'" in _batching_refusal(tiny("gemma2"), options)
    # No buffer form to check a batch with, and mlx-lm's own batch cannot merge its caches.
    assert "mode 'batch' cannot serve model type 'llama': mlx-lm cannot batch its ChunkedKVCache (layer 0)" in \
        _batching_refusal(Chunked(args), options)
    assert "a batch of 2 rows fails in the model's own code: no batches here" in \
        _batching_refusal(FailsBatched(args), options)

    def broken(model, spec):
        raise KeyError("a buffer")

    monkeypatch.setattr("emlx_async.llm.engine.check_batch_against_rows", broken)
    assert _batching_refusal(tiny("llama"), options) == "checking its batch failed: KeyError('a buffer')"
