"""Constrained decoding on the replayed step (llm/constrained.py; the masked variant of llm/replay_step.py).

Every constrained request takes the traced step with its token mask as an
input: its tokens are the Python step's for the same seed, greedy and
seeded, in both modes and on architectures besides llama; forced tokens let
a parallel stream plan several masks per thread hop; a batch mixes
constrained and free rows (the free rows' tokens unchanged); random schemas
validate on either step; a grammar that cannot finish in the budget ends
with "length"; a grammar that fails fails its request alone. Tiny random
models with SmolLM2's vocabulary (the grammar needs the real tokenizer)
keep the steps fast.
"""

from __future__ import annotations

import functools
import json
import random
import re

import anyio
import mlx.core as mx
import pytest

from support.engine import answer_of
from support.helpers import needs_model, on_loops
from support.schemas import random_schema
from support.tiny_models import smollm2_vocab_llama, tiny

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from emlx_async.llm import Engine, Grammar, GrammarStateError, _gguf  # noqa: E402
from emlx_async.llm import constrained  # noqa: E402
from emlx_async.llm.grammar import GrammarMatcher  # noqa: E402

pytestmark = [needs_model]
MODES = ["parallel", "batch"]
VOCAB = 49152  # SmolLM2's
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
GREEDY, SEEDED = dict(), dict(temperature=1.0, seed=7)
SAMPLED = dict(temperature=0.9, top_p=0.9, top_k=50, seed=3)
LARK = 'start: "(" NUMBER ("+" NUMBER)* ")"\nNUMBER: /[0-9]{1,3}/\n'


@pytest.fixture(scope="module")
def gguf():
    """(tokenizers.Tokenizer, eos ids) from the SmolLM2 GGUF, as the engine builds them."""
    _, meta = mx.load(_gguf.smollm2_path(), return_metadata=True)
    _, eos = _gguf.gguf_special_ids(meta)
    return _gguf.gguf_tokenizer(meta), eos


@functools.cache
def model_of(kind: str):
    return smollm2_vocab_llama() if kind == "llama" else tiny(kind, vocab_size=VOCAB)


async def engine_of(rt, gguf, kind: str, mode: str, step: str, **options) -> Engine:
    tokenizer, eos = gguf
    engine = Engine(model_of(kind), tokenizer, eos_ids=eos, chat_template=None, runtime=rt, mode=mode,
                    context_length=512, **options)
    assert await engine.prepare_step(step, cache_sizes=(128,)) == ("python" if step == "python" else "replay")
    return engine


async def at_once(engine: Engine, requests: dict) -> dict:
    """Each named request's (text, tokens, finish), or its exception, all running at once."""
    results: dict = {}

    async def run(name, kwargs):
        try:
            results[name] = await answer_of(engine, **kwargs)
        except GrammarStateError as exc:
            results[name] = exc

    async with anyio.create_task_group() as tg:
        for name, kwargs in requests.items():
            tg.start_soon(run, name, kwargs)
    return results


def masked_shapes(engine: Engine) -> set:
    """The (greedy, rows, size) of every masked step traced so far: the constrained path ran."""
    return {shape for (_, masked), traced in engine.decoding.replay.variants.items() if masked for shape in traced}


GRAMMARS = {"schema": lambda: Grammar.json_schema(PERSON), "regex": lambda: Grammar.regex(r"[0-9]{3}-[a-z]{2,4}"),
            "lark": lambda: Grammar.lark(LARK)}


@on_loops("asyncio", "uvloop")
@pytest.mark.parametrize("mode", MODES)
async def test_replayed_constrained_tokens_are_the_python_steps(rt, gguf, mode):
    python = await engine_of(rt, gguf, "llama", "parallel", "python")
    replayed = await engine_of(rt, gguf, "llama", mode, "auto", max_concurrent=4)
    assert "constrained requests (grammar) take the replayed step" in replayed.step_note
    for name, make in GRAMMARS.items():
        for sampling in (GREEDY, SEEDED, SAMPLED):
            want = await answer_of(python, grammar=make(), max_tokens=40, **sampling)
            got = await answer_of(replayed, grammar=make(), max_tokens=40, **sampling)
            assert got == want, (name, sampling)
            assert want[2] == "stop", (name, sampling, want)
    # Greedy and sampled masked steps ran (one stream's, or a batch's of one row).
    assert {greedy for greedy, _, _ in masked_shapes(replayed)} == {True, False}
    assert {rows for _, rows, _ in masked_shapes(replayed)} == ({None} if mode == "parallel" else {1})
    await replayed.wait_idle()


@on_loops("asyncio")
async def test_forced_tokens_let_a_stream_plan_several_masks_per_thread_hop(rt, gguf, monkeypatch):
    """PERSON's keys and punctuation are forced (their masks allow one token): the grammar takes
    them as it plans, so far fewer thread hops than tokens, and the same tokens."""
    python = await engine_of(rt, gguf, "llama", "parallel", "python")
    replayed = await engine_of(rt, gguf, "llama", "parallel", "auto")
    hops, plans = [], constrained.plan_masks

    def counted(*args):
        planned, finished = plans(*args)
        hops.append(len(planned))
        return planned, finished

    monkeypatch.setattr(constrained, "plan_masks", counted)
    for sampling in (GREEDY, SEEDED):
        hops.clear()
        want = await answer_of(python, grammar=Grammar.json_schema(PERSON), max_tokens=40, **sampling)
        got = await answer_of(replayed, grammar=Grammar.json_schema(PERSON), max_tokens=40, **sampling)
        assert got == want and got[2] == "stop"
        jsonschema.validate(json.loads(got[0]), PERSON)
        assert max(hops) >= 2 and len(hops) < len(got[1]) / 2, (hops, len(got[1]))


@on_loops("asyncio", "uvloop")
async def test_a_batch_mixes_constrained_and_free_rows_on_the_masked_step(rt, gguf):
    python = await engine_of(rt, gguf, "llama", "parallel", "python")
    batch = await engine_of(rt, gguf, "llama", "batch", "auto", max_concurrent=4)
    free = {"free greedy": dict(prompt="Once upon", max_tokens=24),
            "free seeded": dict(prompt="a b c", max_tokens=24, **SEEDED)}
    constrained_rows = {"schema": dict(grammar=Grammar.json_schema(PERSON), max_tokens=40, **SEEDED),
                        "regex": dict(grammar=Grammar.regex(r"[0-9]{3}-[a-z]{2,4}"), max_tokens=20)}
    alone = {name: await answer_of(batch, **r) for name, r in free.items()}
    want = {name: await answer_of(python, **r) for name, r in constrained_rows.items()}
    got = await at_once(batch, {**free, **constrained_rows})
    for name in free:  # the free rows decode as they do with no constrained neighbour
        assert got[name] == alone[name], name
    for name in constrained_rows:  # the constrained rows as the Python step decodes them alone
        assert got[name] == want[name], name
    jsonschema.validate(json.loads(got["schema"][0]), PERSON)
    assert any(rows > 1 for _, rows, _ in masked_shapes(batch))  # rows of both kinds in one masked step
    await batch.wait_idle()


@on_loops("asyncio")
async def test_a_row_its_grammar_ends_beside_running_rows_saves_an_intact_prompt_cache(rt, gguf):
    """A row whose grammar ends in a batch round (only end-of-sequence may follow) leaves its
    slot before that round's step: the step must not write the free slot's position 0 over
    the cache its prompt-cache save reads, or the next request with its prompt restores
    wrong keys and values (other tokens than the Python step's)."""
    from emlx_async.llm import PrefixCache

    python = await engine_of(rt, gguf, "llama", "parallel", "python")
    batch = await engine_of(rt, gguf, "llama", "batch", "auto", max_concurrent=4,
                            prompt_cache=PrefixCache(1000, 1 << 28))
    constrained_row = dict(prompt=[9, 8], grammar=Grammar.regex(r"[0-9]{3}-[a-z]{2,4}"), max_tokens=30,
                           temperature=1.0, seed=5)
    want = await answer_of(python, **constrained_row)
    running = dict(prompt=[100, 101, 102], max_tokens=24)  # still decoding when the grammar ends
    got = await at_once(batch, {"running": running, "constrained": constrained_row})
    assert got["constrained"] == want and want[2] == "stop"
    # Its prompt now restores from what the save kept.
    assert await answer_of(batch, **constrained_row) == want
    await batch.wait_idle()


@on_loops("asyncio")
@pytest.mark.parametrize("mode, step", [("parallel", "python"), ("parallel", "auto"), ("batch", "python"),
                                        ("batch", "auto")])
async def test_random_schemas_validate_on_either_step_beside_free_rows(rt, gguf, mode, step):
    engine = await engine_of(rt, gguf, "llama", mode, step, max_concurrent=4)
    rng = random.Random(20)
    schemas = [random_schema(rng) for _ in range(12)]
    completed = 0
    for group in range(0, len(schemas), 3):  # three constrained rows and a free one at a time
        requests = {i: dict(prompt="JSON:", grammar=Grammar.json_schema(schemas[i]), max_tokens=40,
                            temperature=1.0, seed=i) for i in range(group, group + 3)}
        results = await at_once(engine, {**requests, "free": dict(prompt="Once upon", max_tokens=12)})
        for i in requests:
            text, tokens, finish = results[i]
            if finish == "stop":
                completed += 1
                jsonschema.validate(json.loads(text), schemas[i])
            else:
                assert finish == "length" and len(tokens) == 40, (schemas[i], text)
    assert completed >= 9, completed  # bounded schemas mostly finish in the budget even on noise
    if step == "auto":
        assert masked_shapes(engine)
    await engine.wait_idle()


@on_loops("asyncio")
@pytest.mark.parametrize("mode", MODES)
async def test_a_grammar_that_cannot_finish_in_the_budget_ends_with_length(rt, gguf, mode):
    engine = await engine_of(rt, gguf, "llama", mode, "auto")
    text, tokens, finish = await answer_of(engine, grammar=Grammar.regex(r"[a-z]{300}"), max_tokens=5)
    assert finish == "length" and len(tokens) == 5 and re.fullmatch(r"[a-z]+", text)
    # Forced all the way (one token allowed at every step): cut at the budget all the same.
    forced = Grammar.json_schema({"const": {"answer": "yes", "reason": "none at all"}})
    text, tokens, finish = await answer_of(engine, grammar=forced, max_tokens=4, **SEEDED)
    assert finish == "length" and len(tokens) == 4 and text.startswith('{"')
    text, tokens, finish = await answer_of(engine, grammar=forced, max_tokens=40, **SEEDED)
    assert finish == "stop" and json.loads(text) == {"answer": "yes", "reason": "none at all"}
    assert masked_shapes(engine)
    await engine.wait_idle()


@on_loops("asyncio", "uvloop")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("at", [0, 2], ids=["first token", "third token"])  # the first one is the prefill's
async def test_a_grammar_failure_on_the_replayed_step_fails_its_request_alone(rt, gguf, mode, at, monkeypatch):
    engine = await engine_of(rt, gguf, "llama", mode, "auto", max_concurrent=3)
    free = dict(prompt="Once upon", max_tokens=16)
    alone = await answer_of(engine, **free)
    failing = Grammar.regex(r"[a-z]{40}")
    made = Engine._matcher

    async def matcher(self, grammar):
        m = await made(self, grammar)
        if grammar == failing:
            def advance(token, m=m):  # the grammar engine fails on token `at`
                if len(m.tokens) == at:
                    raise m._fail("a failure for the test")
                GrammarMatcher.advance(m, token)
            m.advance = advance
        return m

    monkeypatch.setattr(Engine, "_matcher", matcher)
    results = await at_once(engine, {"failing": dict(grammar=failing, max_tokens=20),
                                     "json": dict(grammar=Grammar.json_schema(PERSON), max_tokens=40),
                                     "free": free})
    assert isinstance(results["failing"], GrammarStateError)
    assert "a failure for the test" in str(results["failing"])
    jsonschema.validate(json.loads(results["json"][0]), PERSON)
    assert results["free"] == alone
    assert masked_shapes(engine)
    assert (await answer_of(engine, **free)) == alone  # the engine goes on
    await engine.wait_idle()


@on_loops("asyncio")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["qwen3", "gemma3_text", "mamba2"])
async def test_other_architectures_replay_the_python_steps_constrained_tokens(rt, gguf, kind, mode):
    """qwen3, gemma3's sliding-window rings (answers past the window) and mamba2's states."""
    python = await engine_of(rt, gguf, kind, "parallel", "python")
    replayed = await engine_of(rt, gguf, kind, mode, "auto", max_concurrent=2)
    requests = {"schema": dict(grammar=Grammar.json_schema(PERSON), max_tokens=32, **SEEDED),
                "regex": dict(grammar=Grammar.regex(r"[0-9]{3}-[a-z]{2,4}"), max_tokens=16)}
    want = {name: await answer_of(python, **r) for name, r in requests.items()}
    assert await at_once(replayed, requests) == want
    assert masked_shapes(replayed)
    await replayed.wait_idle()


# ---- the planning itself (llm/constrained.py) ------------------------------------

@pytest.fixture(scope="module")
def grammar_tokenizer(gguf):
    from emlx_async.llm.grammar import GrammarTokenizer

    tokenizer, eos = gguf
    with GrammarTokenizer(tokenizer, eos_ids=eos) as adapter:
        yield adapter


def test_planning_goes_through_forced_tokens_and_stops_at_a_choice_or_the_end(gguf, grammar_tokenizer):
    tokenizer, eos = gguf
    vocab, eos = grammar_tokenizer.vocab_size, frozenset(eos)
    matcher = grammar_tokenizer.matcher(Grammar.json_schema({"const": {"answer": "yes"}}))
    planned, finished = constrained.plan_masks(matcher, None, 16, vocab, eos)
    forced = [token for _, token in planned]
    # Every token forced, then only end-of-sequence: planned to the end in one call.
    assert None not in forced and tokenizer.decode(forced) == '{"answer": "yes"}' and finished
    assert all(allowed.sum() == 1 and allowed[token] for allowed, token in planned)
    matcher = grammar_tokenizer.matcher(Grammar.json_schema(PERSON))
    planned, finished = constrained.plan_masks(matcher, None, 16, vocab, eos)
    assert tokenizer.decode([t for _, t in planned[:-1]]) == '{"name":' and planned[-1][1] is None
    assert planned[-1][0].sum() > 1 and not finished  # the string's opening (' "', ' "a', ...) is a choice
    assert len(constrained.plan_masks(grammar_tokenizer.matcher(Grammar.json_schema(PERSON)), None, 2, vocab,
                                      eos)[0]) == 2  # at most `wanted`
    done = grammar_tokenizer.matcher(Grammar.regex("ab"))
    for token in tokenizer.encode("ab").ids:
        done.advance(token)
    assert constrained.plan_masks(done, None, 4, vocab, eos) == ([], True)  # only end-of-sequence follows


def test_a_batch_round_feeds_each_grammar_its_new_tokens_and_ends_the_rows_that_are_done(gguf, grammar_tokenizer):
    tokenizer, _ = gguf
    vocab = grammar_tokenizer.vocab_size
    digits, done, broken = (grammar_tokenizer.matcher(Grammar.regex(p)) for p in (r"[0-9]{4}", "ab", "[a-z]{9}"))
    answer = tokenizer.encode("12").ids
    done_answer = tokenizer.encode("ab").ids
    broken_answer = tokenizer.encode("7").ids  # a digit: the grammar rejects it
    allowed, ended = constrained.batch_masks([(digits, answer), None, (done, done_answer), (broken, broken_answer)],
                                             vocab)
    assert digits.tokens == answer and done.tokens == done_answer  # each took what it had not seen
    assert set(ended) == {2, 3} and ended[2] is None and isinstance(ended[3], GrammarStateError)
    assert allowed.shape == (4, vocab) and allowed.dtype == bool
    assert allowed[1].all() and allowed[2].all() and allowed[3].all()  # free and ended rows: everything
    assert allowed[0].sum() < vocab and all(tokenizer.decode([t]).isdigit() for t in allowed[0].nonzero()[0][:50])
    again, ended = constrained.batch_masks([(digits, answer), None], vocab)  # nothing new: the same mask
    assert (again[0] == allowed[0]).all() and not ended
    assert constrained.batch_masks([None, None], vocab) == (None, {})
