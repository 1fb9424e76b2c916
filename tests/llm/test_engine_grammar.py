"""Grammar-constrained decoding through Engine.generate (llm/grammar.py in the engine).

Both modes, engines prepared for either step (constrained requests take the
replayed step's masked variant where it is traced; free ones beside them keep
theirs): JSON schemas that validate,
greedy and seeded, any JSON, a regex, a budget too small to finish ("length"),
a grammar failure that fails its request alone, constrained and free rows in
one batch (the free rows' tokens unchanged), and a cancelled constrained
stream handing its slot back. A tiny random llama with SmolLM2's vocabulary
makes the steps fast; SmolLM2 itself checks real answers.
"""

from __future__ import annotations

import json
import re

import anyio
import mlx.core as mx
import pytest

from support.engine import answer_of
from support.helpers import needs_model, on_loops
from support.tiny_models import smollm2_vocab_llama

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from emlx_async.llm import Engine, EngineBusy, Grammar, GrammarError, GrammarStateError  # noqa: E402
from emlx_async.llm import _gguf  # noqa: E402
from emlx_async.llm.grammar import GrammarMatcher  # noqa: E402

pytestmark = [needs_model]
one_loop = on_loops("asyncio")

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
MODES_AND_STEPS = [("parallel", "python"), ("parallel", "auto"), ("batch", "python"), ("batch", "auto")]


@pytest.fixture(scope="module")
def gguf():
    """(tokenizers.Tokenizer, eos ids) from the SmolLM2 GGUF, as the engine builds them."""
    _, meta = mx.load(_gguf.smollm2_path(), return_metadata=True)
    _, eos = _gguf.gguf_special_ids(meta)
    return _gguf.gguf_tokenizer(meta), eos


@pytest.fixture(scope="module")
def tiny_llama():
    return smollm2_vocab_llama()


async def tiny_engine(rt, gguf, model, mode: str, step: str, **options) -> Engine:
    tokenizer, eos = gguf
    engine = Engine(model, tokenizer, eos_ids=eos, chat_template=None, runtime=rt, mode=mode,
                    context_length=512, **options)
    await engine.prepare_step(step, cache_sizes=(128,))
    return engine


@one_loop
@pytest.mark.parametrize("mode, step", MODES_AND_STEPS)
async def test_a_schema_request_validates_greedy_and_seeded_alone_and_beside_free_rows(rt, gguf, tiny_llama,
                                                                                        mode, step):
    engine = await tiny_engine(rt, gguf, tiny_llama, mode, step, max_concurrent=4)
    free = [dict(prompt="Once upon", max_tokens=8), dict(prompt="a b c", max_tokens=8, temperature=0.8, seed=3)]
    alone = [await answer_of(engine, **r) for r in free]
    grammar = Grammar.json_schema(PERSON)
    for sampling in (dict(), dict(temperature=1.0, seed=7)):
        text, tokens, finish = await answer_of(engine, grammar=grammar, max_tokens=48, **sampling)
        jsonschema.validate(json.loads(text), PERSON)
        assert finish == "stop" and len(tokens) < 48
    async with anyio.create_task_group() as tg:
        results: dict = {}

        async def run(name, **kwargs):
            results[name] = await answer_of(engine, **kwargs)

        tg.start_soon(lambda: run("constrained", grammar=grammar, max_tokens=48, temperature=1.0, seed=7))
        for i, r in enumerate(free):
            tg.start_soon(lambda r=r, i=i: run(i, **r))
    jsonschema.validate(json.loads(results["constrained"][0]), PERSON)
    # The free rows decode as they do with no constrained neighbour.
    assert [results[i][1] for i in range(len(free))] == [a[1] for a in alone]
    await engine.wait_idle()


@one_loop
@pytest.mark.parametrize("mode", ["parallel", "batch"])
async def test_any_json_a_regex_and_a_budget_too_small_to_finish(rt, gguf, tiny_llama, mode):
    engine = await tiny_engine(rt, gguf, tiny_llama, mode, "auto")
    text, _, finish = await answer_of(engine, grammar=Grammar.json_object(), max_tokens=40)
    # Any JSON object, or (a random model may never close it) one cut at the budget.
    if finish == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert finish == "length" and text.startswith("{")
    text, tokens, finish = await answer_of(engine, grammar=Grammar.regex(r"[0-9]{3}-[a-z]{2}"), max_tokens=12)
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", text) and finish == "stop"  # the first token is masked too
    text, tokens, finish = await answer_of(engine, grammar=Grammar.regex(r"[a-z]{300}"), max_tokens=5)
    assert finish == "length" and len(tokens) == 5 and re.fullmatch(r"[a-z]+", text)
    await engine.wait_idle()


@one_loop
@pytest.mark.parametrize("mode", ["parallel", "batch"])
async def test_a_grammar_failure_fails_its_request_alone(rt, gguf, tiny_llama, mode, monkeypatch):
    engine = await tiny_engine(rt, gguf, tiny_llama, mode, "python", max_concurrent=3)
    free = dict(prompt="Once upon", max_tokens=10)
    alone = await answer_of(engine, **free)
    failing = Grammar.regex(r"[a-z]{40}")
    made = Engine._matcher

    async def matcher(self, grammar):
        m = await made(self, grammar)
        if grammar == failing:
            def advance(token, m=m):  # the grammar engine fails on the third token
                if len(m.tokens) == 2:
                    raise m._fail("a failure for the test")
                GrammarMatcher.advance(m, token)
            m.advance = advance
        return m

    monkeypatch.setattr(Engine, "_matcher", matcher)
    results: dict = {}

    async def run(name, **kwargs):
        try:
            results[name] = await answer_of(engine, **kwargs)
        except GrammarStateError as exc:
            results[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run("failing", grammar=failing, max_tokens=20))
        tg.start_soon(lambda: run("json", grammar=Grammar.json_schema(PERSON), max_tokens=48))
        tg.start_soon(lambda: run("free", **free))
    assert isinstance(results["failing"], GrammarStateError)
    assert "a failure for the test" in str(results["failing"])
    jsonschema.validate(json.loads(results["json"][0]), PERSON)
    assert results["free"][1] == alone[1]
    # The engine goes on.
    assert (await answer_of(engine, **free))[1] == alone[1]
    await engine.wait_idle()


@one_loop
@pytest.mark.parametrize("mode", ["parallel", "batch"])
async def test_cancelling_a_constrained_stream_frees_its_slot(rt, gguf, tiny_llama, mode):
    engine = await tiny_engine(rt, gguf, tiny_llama, mode, "auto", max_concurrent=1)
    with anyio.fail_after(60):
        stream = engine.generate("Hi", grammar=Grammar.regex(r"[a-z]{300}"), max_tokens=200)
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 2:
                break
        await stream.aclose()
        assert engine.active_requests == 0
        # wait=False: the slot is free now, not after the 200 tokens.
        text, _, finish = await answer_of(engine, grammar=Grammar.regex(r"[0-9]{2}"), max_tokens=4, wait=False)
    assert re.fullmatch(r"[0-9]{2}", text) and finish == "stop"
    await engine.wait_idle()


@one_loop
async def test_bad_grammars_are_refused(rt, gguf, tiny_llama):
    engine = await tiny_engine(rt, gguf, tiny_llama, "parallel", "python")
    with pytest.raises(ValueError, match="grammar must be a Grammar"):
        engine.generate("Hi", grammar={"type": "object"})
    with pytest.raises(GrammarError, match="unclosed group"):
        Grammar.regex("a(b")
    assert isinstance(GrammarError("x"), ValueError)
    # A grammar nothing matches fails before its first token (it failed mid-decode: GrammarStateError).
    with pytest.raises(GrammarError, match="unsatisfiable"):
        await answer_of(engine, grammar=Grammar.regex(r"[^\s\S]"), max_tokens=4)
    with pytest.raises(EngineBusy):  # the usual checks still come first
        engine._slots = anyio.Semaphore(0)
        engine.generate("Hi", grammar=Grammar.json_object(), wait=False)


# ---- SmolLM2 ---------------------------------------------------------------------

@one_loop
@pytest.mark.model
@pytest.mark.parametrize("mode", ["parallel", "batch"])
async def test_smollm2_answers_a_schema_with_json_that_validates(rt, mode):
    engine = await Engine.load(runtime=rt, mode=mode, max_concurrent=2)
    assert "constrained requests (grammar) take the replayed step" in engine.step_note
    messages = [{"role": "user", "content": "Describe a person called Ann, aged 31, as JSON."}]
    grammar = Grammar.json_schema(PERSON)
    results: dict = {}

    async def run(name, **kwargs):
        results[name] = await answer_of(engine, prompt=None, messages=messages, **kwargs)

    alone = await answer_of(engine, prompt=None, messages=messages, max_tokens=6)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run("greedy", grammar=grammar, max_tokens=32))
        tg.start_soon(lambda: run("seeded", grammar=grammar, max_tokens=32, temperature=0.7, seed=1))
    for name in ("greedy", "seeded"):
        text, _, finish = results[name]
        jsonschema.validate(json.loads(text), PERSON)
        assert finish == "stop"
    assert json.loads(results["greedy"][0]) == {"name": "Ann", "age": 31}
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run("any", grammar=Grammar.json_object(), max_tokens=24))
        tg.start_soon(lambda: run("year", grammar=Grammar.regex(r"[0-9]{2,4}"), max_tokens=6))
        tg.start_soon(lambda: run("free", max_tokens=6))
    assert results["free"][1] == alone[1]
    text, _, finish = results["any"]  # SmolLM2 writes long objects: stopped or cut at the budget
    assert isinstance(json.loads(text), dict) if finish == "stop" else finish == "length" and text.startswith("{")
    text, _, finish = results["year"]
    assert re.fullmatch(r"[0-9]{2,4}", text) and finish == "stop"
    await engine.wait_idle()


@one_loop
@pytest.mark.parametrize("mode", ["parallel", "batch"])
async def test_a_bias_and_penalties_shape_a_constrained_request_within_its_grammar(rt, gguf, tiny_llama, mode):
    """Penalties and a bias on a constrained request (the penalized, masked step): a bias of 100 picks
    its token where the grammar allows it and cannot where it does not."""
    tokenizer, _ = gguf
    seven = tokenizer.token_to_id("7")
    engine = await tiny_engine(rt, gguf, tiny_llama, mode, "auto")
    pattern = r"[0-9]{3}-[a-z]{2}"
    text, _, finish = await answer_of(engine, grammar=Grammar.regex(pattern), max_tokens=12,
                                    logit_bias={seven: 100}, presence_penalty=2.0, repetition_penalty=1.5)
    assert re.fullmatch(pattern, text) and text.startswith("777-") and finish == "stop", text
    await engine.wait_idle()
