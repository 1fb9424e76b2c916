"""The traced decode step of any mlx-lm model (llm/replay_step.py) against mlx-lm's own decoding.

Tiny random models of each architecture are built here (no download). Each
is prefilled by mlx-lm, its caches copied into the step's fixed buffers, and
the step traced (``ea.trace``) and replayed natively as the engine does it
(weights bound, one row as a chain across cache sizes, B rows donated):
its greedy tokens must be mlx-lm's ``generate_step``'s.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache, RotatingKVCache

import emlx_async as ea
from emlx_async import replay
from emlx_async.llm.cache_options import CacheOptions
from emlx_async.llm.replay_step import (CacheSpec, NotTraceable, check_against_model, check_batch_against_rows,
                                        forward, make_step, model_weights)
from emlx_async.llm.traced import sampling_inputs, sampling_rows
from support.helpers import on_loops
from support.tiny_models import ARCHITECTURES, BASE, QUANTIZABLE, WINDOW, mlx_lm_tokens, tiny

PROMPT = [3, 17, 5, 9, 100, 42]
BATCH_PROMPTS = [[3, 17, 5], [9, 100, 42, 7, 7, 1, 2, 3, 4, 5, 6], [8]]
STEPS = 16  # past gemma3's window and the 16-position trace below


def prefilled(model, spec: CacheSpec, prompt: list[int], size: int) -> tuple[int, list[mx.array]]:
    """generate_step's prefill (all but the last token, then the last), copied into buffers of `size`."""
    cache = spec.prompt_cache(model)
    if len(prompt) > 1:
        model(mx.array([prompt[:-1]]), cache=cache)
        spec.quantize(cache)
    logits = model(mx.array([prompt[-1:]]), cache=cache)[:, -1, :]
    spec.quantize(cache)
    buffers = spec.from_prompt_cache(cache, size)
    mx.eval(buffers)
    return int(mx.argmax(logits).item()), buffers


async def traced_step(queue, model, spec: CacheSpec, rows: int | None, size: int, greedy: bool = True):
    """The step as the engine traces it: the weights as inputs, then bound."""
    if rows is None:
        per_row = [mx.random.key(0), mx.array([[0]], dtype=mx.int32), mx.array(0, dtype=mx.int32),
                   *sampling_inputs(0.0, 1.0, 0, 1)]
    else:
        per_row = [mx.zeros((rows, 2), dtype=mx.uint32), mx.zeros((rows, 1), dtype=mx.int32),
                   mx.zeros((rows,), dtype=mx.int32), *sampling_rows([(0.0, 1.0, 0)] * rows, 1)]
    weights = model_weights(model)
    step = make_step(model, spec, weights_as_inputs=True, greedy=greedy)
    traced = await ea.trace(step, *spec.example(rows or 1, size), *per_row, *weights, queue=queue)
    try:
        return traced.bind(*weights)
    finally:
        traced.release()


async def replayed_tokens(rt, model, spec: CacheSpec, prompt: list[int], n: int, sizes=(8, 16, 32)) -> list[int]:
    """One stream's greedy tokens: a chain on one worker, moving to the next size when full."""
    size_for = lambda tokens: next(s for s in sizes if s >= spec.positions_needed(tokens))  # noqa: E731
    token, buffers = prefilled(model, spec, prompt, size_for(len(prompt) + 1))
    carried = {i: 2 + i for i in range(spec.n_buffers)}  # buffers <- outputs 2..., key <- 1, token <- 0
    carried.update({spec.n_buffers: 1, spec.n_buffers + 1: 0})
    options = sampling_inputs(0.0, 1.0, 0, model.args.vocab_size)
    tokens, position, chains = [token], len(prompt), {}
    async with rt.queue() as queue:
        try:
            for step in range(n - 1):
                size = size_for(position + 1)
                if size not in chains:
                    bound = await traced_step(queue, model, spec, None, size)
                    chains[size] = bound.chain(carried, returned=(0,))
                    bound.release()
                inputs = [*buffers, mx.random.key(0), mx.array([[token]], dtype=mx.int32)] if step == 0 else \
                    [mx.array(0)] * (spec.n_buffers + 2)  # stand-ins: the chain carries them
                token = (await chains[size](*inputs, mx.array(position, dtype=mx.int32), *options, queue=queue,
                                            fed=step > 0)).item()
                tokens.append(token)
                position += 1
        finally:
            await queue.run(replay.end_chain_here)
            for chain in chains.values():
                chain.release()
    return tokens


async def replayed_batch(rt, model, spec: CacheSpec, prompts: list[list[int]], n: int, rows: int = 4,
                         size: int = 32) -> list[list[int]]:
    """B streams at different positions in one batch (a free row too), buffers donated."""
    buffers = spec.zeros(rows, size)
    tokens, positions = [], []
    for row, prompt in enumerate(prompts):
        token, one_row = prefilled(model, spec, prompt, size)
        spec.write_row(buffers, row, one_row)
        tokens.append([token])
        positions.append(len(prompt))
    mx.eval(buffers)
    keys = mx.zeros((rows, 2), dtype=mx.uint32)
    free = rows - len(prompts)
    donate = {**{i: 2 + i for i in range(spec.n_buffers)}, spec.n_buffers: 1}
    async with rt.queue() as queue:
        step = await traced_step(queue, model, spec, rows, size)
        try:
            for _ in range(n - 1):
                out = await step(*buffers, keys, mx.array([[t[-1]] for t in tokens] + [[0]] * free, dtype=mx.int32),
                                 mx.array(positions + [0] * free, dtype=mx.int32),
                                 *sampling_rows([(0.0, 1.0, 0)] * rows, model.args.vocab_size),
                                 queue=queue, donate=donate)
                for row, (token,) in enumerate(out.tolist()[:len(prompts)]):
                    tokens[row].append(token)
                    positions[row] += 1
        finally:
            step.release()
    return tokens


@on_loops("asyncio", "uvloop")
@pytest.mark.parametrize("kind", list(ARCHITECTURES))
async def test_one_stream_replays_mlx_lms_tokens(rt, kind):
    model = tiny(kind)
    spec = CacheSpec.of(model)
    if kind == "gemma3_text":
        assert [type(layer).__name__ for layer in spec.layers] == ["KVLayer", "KVLayer"]
        assert spec.layers[0].max_size == WINDOW and spec.layers[1].max_size is None
    assert check_against_model(model, spec) == 256
    want = mlx_lm_tokens(model, PROMPT, STEPS)
    # The chain moves from 8 to 16 to 32 positions; gemma3 decodes past its window.
    assert await replayed_tokens(rt, model, spec, PROMPT, STEPS) == want


@on_loops("asyncio", "uvloop")
@pytest.mark.parametrize("kind", list(ARCHITECTURES))
async def test_rows_at_their_own_positions_replay_mlx_lms_tokens(rt, kind):
    model = tiny(kind)
    spec = CacheSpec.of(model)
    want = [mlx_lm_tokens(model, prompt, 12) for prompt in BATCH_PROMPTS]
    assert await replayed_batch(rt, model, spec, BATCH_PROMPTS, 12) == want


@on_loops("asyncio", "uvloop")
@pytest.mark.parametrize("kind", ["qwen3", "starcoder2"])
async def test_max_kv_size_rotates_as_mlx_lms_rotating_cache(rt, kind):
    model = tiny(kind)
    spec = CacheSpec.of(model, CacheOptions(max_kv_size=12))
    assert all(layer.max_size == 12 and layer.keep == 4 for layer in spec.layers)  # make_prompt_cache's
    want = mlx_lm_tokens(model, PROMPT, 20, max_kv_size=12)
    assert want != mlx_lm_tokens(model, PROMPT, 20)  # the bound changes the answer: it is exercised
    # Rings of 8, then 12 positions (the chain pads the 8 to 16, cut to the ring); it wraps after 12 tokens.
    assert await replayed_tokens(rt, model, spec, PROMPT, 20) == want
    # A prompt longer than the ring: mlx-lm's prefill already dropped tokens.
    long_prompt = list(range(30, 45))
    assert await replayed_tokens(rt, model, spec, long_prompt, 10) == \
        mlx_lm_tokens(model, long_prompt, 10, max_kv_size=12)
    assert await replayed_batch(rt, model, spec, BATCH_PROMPTS + [long_prompt], 14) == \
        [mlx_lm_tokens(model, p, 14, max_kv_size=12) for p in BATCH_PROMPTS + [long_prompt]]
    # Every layer a ring: a stream longer than the largest trace still fits it.
    assert spec.positions_needed(1000) == 12 and CacheSpec.of(model).positions_needed(1000) == 1000
    assert await replayed_tokens(rt, model, spec, PROMPT, 30, sizes=(8, 16)) == \
        mlx_lm_tokens(model, PROMPT, 30, max_kv_size=12)


@on_loops("asyncio", "uvloop")
@pytest.mark.parametrize("bits", [4, 8])
async def test_quantized_cache_replays_mlx_lms_quantized_cache(rt, bits):
    # Head size 32: a whole quantization group of 32.
    model = tiny("qwen3", **QUANTIZABLE)
    spec = CacheSpec.of(model, CacheOptions(kv_bits=bits, kv_group_size=32))
    assert [(type(layer).__name__, layer.bits, layer.group_size) for layer in spec.layers] == \
        [("QuantizedLayer", bits, 32)] * 2
    assert spec.dtypes()[:3] == [mx.uint32, mx.float32, mx.float32]  # mlx-lm's (weights, scales, biases)
    want = mlx_lm_tokens(model, PROMPT, STEPS, kv_bits=bits, kv_group_size=32)
    assert await replayed_tokens(rt, model, spec, PROMPT, STEPS) == want
    assert await replayed_batch(rt, model, spec, BATCH_PROMPTS, 12) == \
        [mlx_lm_tokens(model, p, 12, kv_bits=bits, kv_group_size=32) for p in BATCH_PROMPTS]
    # The logits are the quantized cache's: close to mlx-lm's quantized attention, not the full-precision one.
    token, buffers = prefilled(model, spec, PROMPT, 8)
    logits, _ = forward(model, spec, mx.array([[token]]), mx.array(len(PROMPT)), buffers)
    quantized, full = spec.prompt_cache(model), spec.prompt_cache(model)
    model(mx.array([PROMPT[:-1]]), cache=quantized)
    spec.quantize(quantized)
    model(mx.array([PROMPT[-1:]]), cache=quantized)
    spec.quantize(quantized)
    model(mx.array([PROMPT]), cache=full)
    assert isinstance(quantized[0], QuantizedKVCache) and isinstance(full[0], KVCache)
    mlx_quantized = model(mx.array([[token]]), cache=quantized)[:, -1, :]
    mlx_full = model(mx.array([[token]]), cache=full)[:, -1, :]
    assert mx.abs(logits - mlx_quantized).max().item() < 1e-4 < mx.abs(logits - mlx_full).max().item()


@on_loops("asyncio", "uvloop")
async def test_ssm_states_replay(rt):
    model = tiny("mamba2")
    spec = CacheSpec.of(model)
    assert {type(layer).__name__ for layer in spec.layers} == {"ArraysLayer"}
    assert spec.positions_needed(1000) == 1  # states have no positions: the smallest trace serves any length
    assert await replayed_tokens(rt, model, spec, PROMPT, STEPS, sizes=(8,)) == mlx_lm_tokens(model, PROMPT, STEPS)
    assert await replayed_batch(rt, model, spec, BATCH_PROMPTS, 10) == \
        [mlx_lm_tokens(model, p, 10) for p in BATCH_PROMPTS]


@on_loops("asyncio", "uvloop")
async def test_a_hybrid_model_whose_conv_state_goes_through_contiguous_replays(rt):
    """qwen3_next's buffers capture its step (linear-attention states and a key-value layer),
    and its conv state's mx.contiguous, which MLX cannot serialize, is traced as ops it can."""
    model = tiny("qwen3_next")
    spec = CacheSpec.of(model)
    assert [type(layer).__name__ for layer in spec.layers] == ["ArraysLayer", "KVLayer"]
    check_against_model(model, spec)
    assert await replayed_tokens(rt, model, spec, PROMPT, STEPS, sizes=(8, 16, 32)) == mlx_lm_tokens(model, PROMPT, STEPS)
    assert await replayed_batch(rt, model, spec, BATCH_PROMPTS, 10) == \
        [mlx_lm_tokens(model, p, 10) for p in BATCH_PROMPTS]


@on_loops("asyncio", "uvloop")
async def test_a_layer_of_several_caches_replays(rt):
    """falcon_h1's layers are CacheLists (a Mamba-2 state beside a KVCache): each part's buffers
    in turn, the key-value part masked and positioned as a plain layer."""
    model = tiny("falcon_h1")
    spec = CacheSpec.of(model)
    assert [[type(part).__name__ for part in layer.parts] for layer in spec.layers] == [["ArraysLayer", "KVLayer"]] * 2
    check_against_model(model, spec)
    assert await replayed_tokens(rt, model, spec, PROMPT, STEPS) == mlx_lm_tokens(model, PROMPT, STEPS)
    assert await replayed_batch(rt, model, spec, BATCH_PROMPTS, 10) == \
        [mlx_lm_tokens(model, p, 10) for p in BATCH_PROMPTS]


def test_a_step_taking_the_weights_leaves_the_model_its_own_while_it_runs(monkeypatch):
    # A trace runs the step on stand-ins for the weights while other workers run the model
    # itself (a prompt prefilling beside it): had the model held the stand-ins meanwhile,
    # those calls would fail ("eval an array without a primitive").
    from emlx_async.llm import replay_step

    model = tiny("llama")
    spec = CacheSpec.of(model)
    weights = model_weights(model)
    during = []

    def watched(*args):
        during.append(all(a is b for a, b in zip(model_weights(model), weights)))
        return forward(*args)

    monkeypatch.setattr(replay_step, "forward", watched)
    step = make_step(model, spec, weights_as_inputs=True, greedy=True)
    inputs = [*spec.zeros(1, 8), mx.random.key(0), mx.array([[5]], dtype=mx.int32), mx.array(0, dtype=mx.int32),
              *sampling_inputs(0.0, 1.0, 0, 256)]
    with_model, *_ = step(*inputs, *weights)
    # The step reads the weights it is given: other ones give other logits (here every token ties).
    with_zeros, *_ = step(*inputs, *(mx.zeros_like(w) for w in weights))
    assert during == [True, True]
    assert with_zeros.item() == 0 and with_model.item() == int(mx.argmax(model(mx.array([[5]]))[0, -1]).item())
    assert all(a is b for a, b in zip(model_weights(model), weights))


def test_cache_options_mlx_lm_or_mlx_refuse_are_refused_with_their_message():
    with pytest.raises(ValueError, match="kv_bits: mlx-lm cannot quantize.*RotatingKVCache Quantization NYI"):
        CacheSpec.of(tiny("gemma3_text", **QUANTIZABLE),
                     CacheOptions(kv_bits=4, kv_group_size=32))
    with pytest.raises(ValueError, match="max_kv_size must be more than 4"):
        CacheOptions(max_kv_size=4)
    # mlx's own checks, with mlx's messages: a group larger than the head (16), an unsupported width.
    with pytest.raises(ValueError, match="quantize"):
        CacheSpec.of(tiny("qwen3"), CacheOptions(kv_bits=4))
    with pytest.raises(ValueError, match="number of bits 7 is not supported"):
        CacheSpec.of(tiny("qwen3", **QUANTIZABLE),
                     CacheOptions(kv_bits=7, kv_group_size=32))


def test_caches_that_cannot_be_written_as_buffers_are_named():
    from mlx_lm.models import llama
    from mlx_lm.models.cache import ConcatenateKVCache

    class Concatenated(llama.Model):
        def make_cache(self):
            return [ConcatenateKVCache() for _ in self.layers]

    model = Concatenated(llama.ModelArgs.from_dict({**BASE, "model_type": "llama"}))
    with pytest.raises(NotTraceable, match="ConcatenateKVCache \\(layer 0\\) has no fixed-buffer form"):
        CacheSpec.of(model)


class Unmasked(nn.Module):
    """Attends over its whole cache, fine for mlx-lm's growing cache only: without asking it
    for a mask, or (`drops_mask`) asking and then not using it."""

    def __init__(self, drops_mask: bool = False):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.layers = [nn.Identity()]
        self.drops_mask = drops_mask

    def __call__(self, tokens, cache):
        h = self.embed(tokens)[:, None]  # {B, 1 head, L, 8}
        if self.drops_mask:
            create_attention_mask(self.embed(tokens), cache[0])
        keys, values = cache[0].update_and_fetch(h, h)
        return self.embed.as_linear(mx.fast.scaled_dot_product_attention(h, keys, values, scale=1.0)[:, 0])


def test_a_model_that_ignores_the_mask_is_refused():
    model = Unmasked()
    mx.eval(model.parameters())
    spec = CacheSpec.of(model)
    with pytest.raises(NotTraceable, match="without asking its cache for a mask"):
        forward(model, spec, mx.array([[1]]), mx.array(0), spec.zeros(1, 8))
    # One that asks and then attends to everything decodes wrong logits: the check says so.
    model = Unmasked(drops_mask=True)
    mx.eval(model.parameters())
    with pytest.raises(ValueError, match="disagrees with the model's own forward"):
        check_against_model(model, CacheSpec.of(model))


def test_chunked_attention_steps_as_mlx_lms_over_its_chunks():
    """llama4's chunked layers (ChunkedKVCache, chunks of 8 here) in a ring of a chunk's slots:
    stepped across several chunks from an mlx-lm prefill, the logits are mlx-lm's, and the
    buffers go back to caches that continue them. mlx-lm's llama4 builds the chunk mask from
    int positions: refused until model_fixes.fix_position_arrays has it ask its cache."""
    from mlx_lm.models import llama
    from mlx_lm.models.cache import ChunkedKVCache

    from emlx_async.llm.model_fixes import fix_position_arrays

    model = tiny("llama4")
    spec = CacheSpec.of(model)
    assert spec.shapes(1, 32)[:2] == [(1, 2, 8, 16)] * 2 and spec.shapes(1, 4)[0] == (1, 2, 4, 16)
    with pytest.raises(NotTraceable, match="builds its chunked attention's mask itself from int positions"):
        forward(model, spec, mx.array([[1]]), mx.array(0), spec.zeros(1, 8))
    assert fix_position_arrays(model) and not fix_position_arrays(model) and not fix_position_arrays(tiny("llama"))
    for layer in model.layers:  # the rope-less layer's query temperature: a new step every 4 positions
        layer.self_attn.floor_scale = 4
    tokens = [3, 17, 5, 9, 100, 42, 8, 1, 6, 2, 11, 19, 7, 1, 4, 250, 30, 31, 32, 33, 34, 35, 36, 37, 38]
    caches = spec.prompt_cache(model)
    model(mx.array([tokens[:5]]), cache=caches)
    buffers = spec.from_prompt_cache(caches, 32)
    for position, token in enumerate(tokens[5:], start=5):
        want = model(mx.array([[token]]), cache=caches)[:, -1, :]
        logits, buffers = forward(model, spec, mx.array([[token]]), mx.array(position), buffers)
        assert mx.allclose(logits, want, atol=1e-4).item(), position
    back = spec.to_prompt_cache(buffers, 0, len(tokens))
    assert mx.allclose(model(mx.array([[9]]), cache=back), model(mx.array([[9]]), cache=caches), atol=1e-4).item()
    check_batch_against_rows(model, spec, prompts=((1, 2, 3, 4, 5, 6, 7), (5, 6)))  # each row its own temperature

    class Chunked(llama.Model):  # chunked caches, the model's mask from create_attention_mask (none in mlx-lm)
        def make_cache(self):
            return [ChunkedKVCache(4) for _ in self.layers]

    model = Chunked(llama.ModelArgs.from_dict({**BASE, "model_type": "llama"}))
    with pytest.raises(NotTraceable, match="asks its ChunkedKVCache for a mask"):
        check_against_model(model, CacheSpec.of(model))


def test_key_reusing_layers_rotate_their_queries_at_the_position_once_fixed():
    """afm7's key-reusing layers rotate their queries at the reused keys' length less one: over
    a fixed buffer the step disagrees with the model, and mlx-lm's left-padded batch is wrong.
    model_fixes.fix_position_arrays has them rotate at the position (an array): both right."""
    from emlx_async.llm.model_fixes import fix_position_arrays
    from emlx_async.llm.replay_step import check_mlx_batch_against_rows

    model = tiny("afm7")
    spec = CacheSpec.of(model)
    with pytest.raises(ValueError, match="disagrees with the model's own forward"):
        check_against_model(model, spec)
    with pytest.raises(ValueError, match="mlx-lm's batch gives row 1 other logits"):
        check_mlx_batch_against_rows(model)
    assert fix_position_arrays(model)
    assert check_against_model(model, spec, tokens=(3, 17, 5, 9, 100, 42, 8, 1)) == 256
    check_batch_against_rows(model, spec)
    check_mlx_batch_against_rows(model)


class Context(nn.Module):
    """Keeps the last `keep` token ids (all of them: None) in an ArraysCache, as
    longcat_flash_ngram's n-gram context: 1 id after one token, `keep` from then on. Its
    logits count the ids of the context and the token, id 0 too where `counts_zeros`."""

    def __init__(self, keep: int | None = 3, counts_zeros: bool = False):
        super().__init__()
        self.layers = [nn.Identity()]
        self.keep, self.counts_zeros = keep, counts_zeros

    def make_cache(self):
        return [ArraysCache(1)]

    def __call__(self, tokens, cache):
        held = cache[0][0]
        context = tokens if held is None else mx.concatenate([held, tokens], axis=1)
        cache[0][0] = context if self.keep is None else context[:, max(0, context.shape[1] - self.keep):]
        counts = mx.eye(16)[context].sum(axis=1, keepdims=True)  # {B, 1, 16}
        return counts if self.counts_zeros else counts * (mx.arange(16) > 0)


def test_a_state_that_grows_to_a_bound_is_buffered_at_it():
    """A state of the first tokens' ids settles at its bound: its buffer holds it, the
    narrower state of fewer tokens at its end (zeros before it, as the model shifts in)."""
    spec = CacheSpec.of(Context())
    assert spec.shapes(2, 8) == [(2, 3)]
    caches = spec.prompt_cache(Context())
    Context()(mx.array([[5]]), cache=caches)
    assert spec.from_prompt_cache(caches, 8)[0].tolist() == [[0, 0, 5]]
    assert check_against_model(Context(), spec, tokens=(1, 2, 3, 4, 5)) == 16
    # A model that tells the zeros from no token disagrees with its own forward: refused.
    with pytest.raises(ValueError, match="disagrees with the model's own forward"):
        check_against_model(Context(counts_zeros=True), CacheSpec.of(Context(counts_zeros=True)))
    # One that never settles grows in the step too.
    spec = CacheSpec.of(Context(keep=None))
    with pytest.raises(NotTraceable, match="ArraysCache state 0 does not keep its shape"):
        forward(Context(keep=None), spec, mx.array([[1]]), mx.array(0), spec.zeros(1, 8))


@pytest.mark.parametrize("kind, options", [("qwen3", {}), ("gemma3_text", {}), ("qwen3", {"max_kv_size": 12}),
                                           ("qwen3", {"kv_bits": 8, "kv_group_size": 32}), ("mamba2", {})])
def test_buffers_go_back_to_mlx_lm_caches_that_continue_its_tokens(kind, options):
    """to_prompt_cache after a decoded stretch (past the ring's end) gives mlx-lm caches
    that decode on to mlx-lm's tokens; relayout moves rows and keeps what they hold."""
    overrides = QUANTIZABLE if "kv_bits" in options else {}
    model = tiny(kind, **overrides)
    spec = CacheSpec.of(model, CacheOptions(**options))
    want = mlx_lm_tokens(model, PROMPT, 20, **options)
    token, one_row = prefilled(model, spec, PROMPT, 32)
    buffers = spec.zeros(2, 32)
    spec.write_row(buffers, 1, one_row)
    buffers = spec.relayout(buffers, [1], 3, 64)  # row 1 to row 0, longer buffers
    tokens, position = [token], len(PROMPT)
    for _ in range(13):
        logits, buffers = forward(model, spec, mx.array([[tokens[-1]], [0], [0]]),
                                  mx.array([position, 0, 0]), buffers)
        tokens.append(int(mx.argmax(logits[0]).item()))
        position += 1
    buffers = spec.relayout(buffers, [0], 1, 32)  # shorter again
    caches = spec.to_prompt_cache(buffers, 0, position)
    assert [type(c) for c in caches] == [
        {"KVLayer": RotatingKVCache if getattr(layer, "max_size", None) else KVCache,
         "QuantizedLayer": QuantizedKVCache, "ArraysLayer": ArraysCache}[type(layer).__name__]
        for layer in spec.layers]
    for _ in range(20 - len(tokens)):
        logits = model(mx.array([[tokens[-1]]]), cache=caches)[:, -1, :]
        spec.quantize(caches)
        tokens.append(int(mx.argmax(logits).item()))
    assert tokens == want
