"""Engine.prompt_logprobs: a prompt's tokens scored (OpenAI's completions echo with logprobs,
lm-eval's loglikelihood), checked against one plain forward pass of the model."""

from __future__ import annotations

import functools

import mlx.core as mx
import pytest

import emlx_async as ea
from support.helpers import on_every_loop
from support.tiny_models import QUANTIZABLE, IdsTokenizer, tiny

pytest.importorskip("mlx_lm")

PROMPT = [3, 17, 5, 9, 100, 42, 8, 1, 6, 2, 11, 19, 7]


@pytest.mark.parametrize("mode", ["parallel", "batch"])
@on_every_loop
async def test_each_token_is_scored_as_one_forward_pass_gives_it(mode):
    from emlx_async.llm import Engine

    model = tiny("llama")
    logits = model(mx.array([PROMPT]))[0].astype(mx.float32)
    plain = (logits - mx.logsumexp(logits, axis=-1, keepdims=True)).tolist()
    async with ea.Runtime(pool_size=2) as rt:
        # Chunks of 4: the prompt runs in pieces, each continuing the cache of the last.
        engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode=mode,
                        prefill_chunk=4)
        scored = await engine.prompt_logprobs(PROMPT, top_logprobs=3)
        assert [token for token, _, _ in scored] == PROMPT
        assert scored[0][1:] == (None, ())  # nothing precedes the first
        for i, (token, logprob, top) in enumerate(scored[1:], start=1):
            row = plain[i - 1]  # the logits after the tokens before it
            assert logprob == pytest.approx(row[token], abs=1e-4)
            best = sorted(range(len(row)), key=lambda t: -row[t])[:3]
            assert [t for t, _ in top] == best and [v for _, v in top] == pytest.approx([row[t] for t in best], abs=1e-4)
        assert [s[:2] for s in await engine.prompt_logprobs(PROMPT)] == [s[:2] for s in scored]
        assert all(top == () for _, _, top in await engine.prompt_logprobs(PROMPT))
        assert await engine.prompt_logprobs(PROMPT[:1]) == [(PROMPT[0], None, ())]  # one token: nothing to score
        for bad, words in ((dict(top_logprobs=21), "top_logprobs"), (dict(top_logprobs=-1), "top_logprobs")):
            with pytest.raises(ValueError, match=words):
                await engine.prompt_logprobs(PROMPT, **bad)
        with pytest.raises(ValueError):
            await engine.prompt_logprobs([10**6])  # outside the vocabulary
        assert engine.active_requests == 0
        await engine.close()


@pytest.mark.parametrize("mode", ["parallel", "batch"])
@on_every_loop
async def test_a_scored_prompt_is_not_prefilled_again_by_its_generation(mode):
    """An echo with logprobs scores the prompt, then generates: the prompt cache keeps the
    scoring's keys and values, so the generation runs the last token alone, with the same tokens."""
    from emlx_async.llm import Engine, PrefixCache

    model = tiny("llama")
    fed: list[int] = []

    class Counting(type(model)):
        def __call__(self, inputs, *args, **kwargs):
            fed.append(inputs.shape[-1])
            return super().__call__(inputs, *args, **kwargs)

    async with ea.Runtime(pool_size=2) as rt:
        plain = Engine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode=mode)
        expected = [d.token async for d in plain.generate(PROMPT, max_tokens=4) if d.token is not None]
        await plain.close()
        model.__class__ = Counting
        engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode=mode,
                        prompt_cache=PrefixCache(1024))
        await engine.prompt_logprobs(PROMPT)
        assert sum(fed) == len(PROMPT) - 1
        fed.clear()
        tokens = [d.token async for d in engine.generate(PROMPT, max_tokens=4) if d.token is not None]
        assert tokens == expected
        assert fed and max(fed) == 1  # the last token alone, then the steps: no prefill
        await engine.close()


@on_every_loop
async def test_the_service_echoes_the_clients_tokens_not_the_bos_it_adds():
    """lm-eval sends a prompt's ids without the BOS and reads its logprobs from its own
    context length: the BOS the encoder adds is scored as context, never echoed."""
    pytest.importorskip("starlette")
    from emlx_async.llm import Engine
    from emlx_async.serve.protocol import GenerationRequest
    from emlx_async.serve.service import ServeConfig, Service

    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, bos_id=1)
        service = Service(ServeConfig())
        scored = await engine.prompt_logprobs([1, 5, 6, 7])
        for prompt, listed in (([5, 6, 7], scored[1:]), ([1, 5, 6, 7], scored)):
            request = GenerationRequest(chat=False, model=None, prompt=prompt, echo=True, logprobs=True)
            echo = await service._echo(engine, request, engine.encode(prompt))
            assert echo.text == "".join(f"<{t}>" for t in prompt)
            assert [(e["token"], e["logprob"]) for e in echo.logprobs] == [(f"<{t}>", lp) for t, lp, _ in listed]
        await engine.close()


@on_every_loop
async def test_the_service_scores_a_lists_prompts_together_up_to_its_admission():
    """A list's echoed prompts are scored at once, as many as the request was admitted as
    (a step runs on one core), each what it gets alone; a prompt that fails raises its own error."""
    pytest.importorskip("starlette")
    import anyio

    from emlx_async.llm import Engine
    from emlx_async.serve.protocol import APIError, GenerationRequest
    from emlx_async.serve.service import ServeConfig, Service

    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14, 15], [16, 17, 18]]
    async with ea.Runtime(pool_size=4) as rt:
        engine = Engine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt,
                        max_concurrent=4)
        service = Service(ServeConfig())
        asked = [GenerationRequest(chat=False, model=None, prompt=p, echo=True, logprobs=True) for p in prompts]
        alone = [await service._echo(engine, a, p) for a, p in zip(asked, prompts)]
        scoring, most = 0, 0
        score = engine.prompt_logprobs

        async def counted(prompt, **options):
            nonlocal scoring, most
            scoring += 1
            most = max(most, scoring)
            try:
                await anyio.sleep(0.05)  # the others start meanwhile, as far as the limit lets them
                return await score(prompt, **options)
            finally:
                scoring -= 1

        engine.prompt_logprobs = counted
        together = await service._echoes(engine, asked, prompts, at_once=2)
        assert most == 2
        assert [(e.text, e.logprobs) for e in together] == [(e.text, e.logprobs) for e in alone]

        async def refused(prompt, **options):
            if prompt == prompts[3]:
                raise ValueError("no scoring here")
            return await counted(prompt, **options)

        engine.prompt_logprobs = refused
        with pytest.raises(APIError, match="no scoring here") as error:
            await service._echoes(engine, asked, prompts, at_once=2)
        assert error.value.param == "echo" and scoring == 0
        await engine.close()


@pytest.mark.parametrize("mode", ["parallel", "batch"])
@on_every_loop
async def test_top_logprobs_past_a_small_vocabulary_lists_the_whole_vocabulary(mode):
    """MLX's argpartition refused a kth past the vocabulary: the request failed and, in batch mode,
    the whole batch driver with it (every neighbour's request too)."""
    import anyio

    from emlx_async.llm import Engine

    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(tiny("llama", vocab_size=12), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt,
                        mode=mode, max_concurrent=2)
        await engine.prepare_step("auto", cache_sizes=(32,))
        scored = await engine.prompt_logprobs([1, 2, 3], top_logprobs=20)
        assert [len(top) for _, _, top in scored] == [0, 12, 12]
        results = {}

        async def run(name, **options):
            results[name] = [d async for d in engine.generate([1, 2, 3], max_tokens=6, **options)]

        async with anyio.create_task_group() as group:  # one batch in batch mode
            group.start_soon(functools.partial(run, "top", logprobs=True, top_logprobs=20))
            group.start_soon(run, "plain")
        assert all(len(d.top_logprobs) == 12 for d in results["top"][:-1])
        assert [d.token for d in results["top"]] == [d.token for d in results["plain"]]
        await engine.wait_idle()


def _generate_step_scores(model, prompt: list[int], step: int, **options) -> list[float]:
    """Each prompt token's log-probability as generate_step's prefill computes the keys: the
    prompt but its last token in calls of `step`, the cache quantized (kv_bits) after each."""
    from mlx_lm.generate import maybe_quantize_kv_cache
    from mlx_lm.models.cache import make_prompt_cache

    cache, scores = make_prompt_cache(model), []
    for start in range(0, len(prompt) - 1, step):
        chunk = prompt[start:min(start + step, len(prompt) - 1)]
        logits = model(mx.array([chunk]), cache=cache)[0].astype(mx.float32)
        maybe_quantize_kv_cache(cache, 0, options["kv_group_size"], options["kv_bits"])
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        following = mx.array(prompt[start + 1:start + 1 + len(chunk)])[:, None]
        scores += mx.take_along_axis(logprobs, following, axis=-1)[:, 0].tolist()
    return scores


@on_every_loop
async def test_kv_bits_scores_quantize_where_the_prefill_does():
    """Quantized after every prefill chunk, a prompt's scores past the first chunk came from 2-bit
    keys where generate_step's prefill (and the engine's) keeps them full until 2048 tokens."""
    from emlx_async.llm import Engine
    from emlx_async.llm.cache_options import PREFILL_STEP, CacheOptions

    model = tiny("llama", **QUANTIZABLE)
    options = dict(kv_bits=2, kv_group_size=32)
    prompt = [1] + [(i * 37) % 250 + 3 for i in range(PREFILL_STEP + 59)]  # past the quantization point
    async with ea.Runtime(pool_size=2) as rt:
        want = await rt.default_queue().run(_generate_step_scores, model, prompt, PREFILL_STEP, **options)
        for chunk in (32, 100):  # 100: chunks that do not end where generate_step's calls do
            engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt,
                            prefill_chunk=chunk, cache_options=CacheOptions(**options), context_length=4096)
            scored = await engine.prompt_logprobs(prompt)
            assert [logprob for _, logprob, _ in scored[1:]] == pytest.approx(want, abs=1e-4), chunk
            await engine.close()
