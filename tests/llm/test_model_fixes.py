"""llm/model_fixes.py: fixes of mlx-lm's model code (gemma2's batch mask, the families' steps: test_model_families)."""

from __future__ import annotations

import re

import mlx.core as mx
import mlx.nn as nn
import pytest

from emlx_async.llm.model_fixes import fix_weight_rewrites


class _Rewriting(nn.Module):
    """A model whose forward assigns a weight computed from itself, as mlx-lm's gemma3n does."""

    def __init__(self, rewrite):
        super().__init__()
        self.inner = nn.Linear(2, 2)
        self.rewrite = rewrite

    def make_cache(self):
        return []

    def __call__(self, x, cache=None):
        self.inner.weight = self.rewrite(self.inner.weight)
        return self.inner(mx.ones((1, 2)))


def test_a_weight_rewritten_the_same_every_call_is_rewritten_once():
    model = _Rewriting(lambda w: mx.clip(w, -0.125, 0.125))
    assert fix_weight_rewrites(model) == ["inner.weight"]
    fixed = model.inner.weight
    assert mx.abs(fixed).max().item() <= 0.125
    model(mx.array([[0]]))
    assert model.inner.weight is fixed  # the forward's assignment dropped: no lazy array of this thread
    assert isinstance(model.inner, nn.Linear) and type(model.inner).__name__ == "Linear"
    model.update({"inner": {"weight": mx.zeros((2, 2))}})  # loading weights still works
    assert mx.array_equal(model.inner.weight, mx.zeros((2, 2))).item()
    assert fix_weight_rewrites(model) == []


def test_a_model_that_rewrites_nothing_is_left_as_it_is():
    model = _Rewriting(lambda w: w)
    assert fix_weight_rewrites(model) == [] and type(model.inner) is nn.Linear


def test_a_rewrite_with_other_values_each_call_is_refused_by_name():
    model = _Rewriting(lambda w: w * 2)
    with pytest.raises(ValueError, match=r"rewrites its weights \(inner.weight\) with other values in each call"):
        fix_weight_rewrites(model)


def _tiny_dbrx(kind: str):
    """tests' tiny dbrx (4 experts, top 2): float32, float16, or its layers 4-bit (groups of 32)."""
    from support.tiny_models import tiny

    model = tiny("dbrx")
    if kind == "float16":
        model.set_dtype(mx.float16)
        mx.eval(model.parameters())
    if kind == "4bit":
        nn.quantize(model, group_size=32, bits=4)
        mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("kind", ["float32", "float16", "4bit"])
def test_dbrx_blocks_read_only_their_picked_experts_with_mlx_lms_tokens(kind):
    # mlx-lm's dbrx reads its picks in Python (inds.tolist()); fix_expert_picks stacks each block's
    # experts into mlx-lm's SwitchGLU (gather_mm / gather_qmm) so a step reads only the picked ones;
    # where gather_mm cannot take the dtype (MLX's CPU: float32 only) the Python step serves it, as
    # running every expert would read all their weights for each token.
    import anyio
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchGLU, SwitchLinear

    import emlx_async as ea
    from emlx_async.llm import Engine
    from emlx_async.llm.model_fixes import _gathers, fix_expert_picks
    from support.engine import tokens_of
    from support.tiny_models import IdsTokenizer, mlx_lm_tokens

    model = _tiny_dbrx(kind)
    prompt = [3, 17, 5, 9, 100, 42, 8, 1, 6, 2, 11, 19]
    want = mlx_lm_tokens(model, prompt, 10)  # mlx-lm's, before the fix
    w1 = [mx.array(expert.w1["weight"]) for expert in model.layers[0].ffn.experts]
    assert fix_expert_picks(model) and not fix_expert_picks(model)
    stacks = kind == "4bit" or _gathers(getattr(mx, kind))
    for block in model.layers:
        if not stacks:
            assert "switch_mlp" not in block.ffn and len(block.ffn.experts) == 4
            continue
        assert "experts" not in block.ffn  # no per-expert list left to run
        assert isinstance(block.ffn.switch_mlp, SwitchGLU)
        linear = QuantizedSwitchLinear if kind == "4bit" else SwitchLinear
        assert all(isinstance(block.ffn.switch_mlp[name], linear) for name in ("gate_proj", "up_proj", "down_proj"))
    if stacks:
        gate = model.layers[0].ffn.switch_mlp.gate_proj
        assert gate["weight"].shape[0] == 4 and mx.array_equal(gate["weight"], mx.stack(w1))  # {experts, out, in}
    if kind == "4bit":
        assert (gate.bits, gate.group_size, gate.mode) == (4, 32, "affine")
    assert mlx_lm_tokens(model, prompt, 10) == want

    async def replayed():
        async with ea.Runtime(pool_size=2) as rt:
            engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode="parallel")
            step = await engine.prepare_step(cache_sizes=(16, 32))
            assert step == ("replay" if stacks else "python"), engine.step_note
            if not stacks:
                assert re.search(r"dbrx picks .* in Python .*: MLX's gather_mm cannot take its experts' float16 "
                                 r"weights .*; running every expert would read 4 experts' weights for 2",
                                 engine.step_note), engine.step_note
            with anyio.fail_after(120):
                got = await tokens_of(engine, prompt, max_tokens=10)
            await engine.close()
            return got

    assert anyio.run(replayed) == want


@pytest.mark.parametrize("kind", ["float32", "4bit"])
def test_a_dbrx_with_stacked_experts_saves_as_mlx_lm_loads_it(tmp_path, kind):
    # mlx-lm's dbrx has one layer per expert (experts.{e}.w1): the saved folder keeps its names.
    from types import SimpleNamespace

    from mlx_lm.utils import load_model

    from emlx_async.llm.model_fixes import fix_expert_picks
    from emlx_async.llm.save import save_mlx_lm
    from support.tiny_models import mlx_lm_tokens

    model = _tiny_dbrx(kind)
    prompt = [3, 17, 5, 9, 100, 42]
    want = mlx_lm_tokens(model, prompt, 6)
    assert fix_expert_picks(model) and "switch_mlp" in model.layers[0].ffn
    tokenizer = SimpleNamespace(save_pretrained=lambda path: None)  # a Hugging Face one is saved as is
    save_mlx_lm(str(tmp_path), model, tokenizer, eos_ids={2}, bos_id=None, chat_template=None)
    loaded, _ = load_model(tmp_path)  # strict: every name mlx-lm's, none left over
    assert "experts" in loaded.layers[0].ffn
    assert mlx_lm_tokens(loaded, prompt, 6) == want
