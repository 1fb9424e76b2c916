"""Engine.generate_choices (n answers from one prefill), generate_batch (several prompts), stop_token_ids and ignore_eos, in both modes, on both steps."""

from __future__ import annotations

import contextlib
import functools

import anyio
import pytest

from support.engine import tokens_of
from support.helpers import on_every_loop
from support.tiny_models import QUANTIZABLE, IdsTokenizer, tiny

PROMPT = [5, 9, 2, 7, 1, 4]
SAMPLED = dict(temperature=0.9, top_p=0.95, top_k=40)
# (mode, step): every decode path a choice can take.
PATHS = [("parallel", "replay"), ("parallel", "python"), ("batch", "replay"), ("batch", "python")]


def counting_prefills(model):
    """`model`, recording the shape of every call that feeds more than one position (a prefill)."""
    class Counting(type(model)):
        def __call__(self, inputs, *args, **kwargs):
            if inputs.shape[-1] > 1:
                self.prefills.append(tuple(inputs.shape))
            return super().__call__(inputs, *args, **kwargs)

    model.__class__ = Counting
    model.prefills = []
    return model


async def engine_on(rt, mode: str, step: str, **options):
    from emlx_async.llm import Engine

    engine = Engine(counting_prefills(tiny("llama")), IdsTokenizer(), eos_ids=set(), chat_template=None,
                    runtime=rt, mode=mode, **options)
    assert await engine.prepare_step(step, cache_sizes=(16, 32)) == step, engine.step_note
    engine.model.prefills.clear()  # tracing calls the model
    return engine


async def choices_of(engine, prompt, n, **options) -> tuple[list[list[int]], list[str | None]]:
    tokens: list[list[int]] = [[] for _ in range(n)]
    finish: list[str | None] = [None] * n
    with anyio.fail_after(60):
        async for i, delta in engine.generate_choices(prompt, n=n, **options):
            assert finish[i] is None, f"choice {i} went on after its finish delta"
            if delta.token is not None:
                tokens[i].append(delta.token)
            finish[i] = delta.finish_reason
    return tokens, finish


async def greedy_and_a_fresh_token(engine, max_tokens=10) -> tuple[list[int], int]:
    """The greedy answer to PROMPT and the index of its first token, from the third on, not
    seen before it (a token to end it at)."""
    greedy = await tokens_of(engine, PROMPT, max_tokens=max_tokens)
    return greedy, next(k for k, t in enumerate(greedy) if t not in greedy[:k] and k >= 2)


def assert_idle(engine):
    assert engine.active_requests == 0
    assert engine._slots.value == engine.max_concurrent
    assert len(engine.decoding.held) == 0


@pytest.mark.parametrize("mode,step", PATHS)
@on_every_loop
async def test_choices_share_one_prefill_and_choice_0_is_the_plain_request(rt, mode, step):
    engine = await engine_on(rt, mode, step)
    plain = await tokens_of(engine, PROMPT, max_tokens=10, seed=11, **SAMPLED)
    assert len(engine.model.prefills) == 1  # (mlx-lm's BatchGenerator leaves the last token to its step)
    engine.model.prefills.clear()
    tokens, finish = await choices_of(engine, PROMPT, 3, max_tokens=10, seed=11, **SAMPLED)
    # One prefill of one row for all three: each choice starts from the held keys, values and logits.
    assert engine.model.prefills == [(1, len(PROMPT))]
    assert tokens[0] == plain
    assert finish == ["length"] * 3 and all(len(t) == 10 for t in tokens)
    assert len({tuple(t) for t in tokens}) == 3, tokens  # each its own key
    again, _ = await choices_of(engine, PROMPT, 3, max_tokens=10, seed=11, **SAMPLED)
    assert again == tokens  # reproducible with a seed
    greedy, _ = await choices_of(engine, PROMPT, 2, max_tokens=10)
    assert greedy == [await tokens_of(engine, PROMPT, max_tokens=10)] * 2
    assert_idle(engine)
    await engine.wait_idle()


@pytest.mark.parametrize("mode,step", PATHS)
@on_every_loop
async def test_a_batch_of_prompts_gives_each_prompt_its_choices_in_openais_order(rt, mode, step):
    engine = await engine_on(rt, mode, step)
    other = [8, 3, 3, 6]
    prompts = [PROMPT, other]
    alone = [(await choices_of(engine, prompt, 2, max_tokens=8, seed=11, **SAMPLED))[0] for prompt in prompts]
    engine.model.prefills.clear()
    tokens: list[list[int]] = [[] for _ in range(4)]
    finish: list[str | None] = [None] * 4
    with anyio.fail_after(60):
        async for i, delta in engine.generate_batch(prompts, n=2, max_tokens=8, seed=11, **SAMPLED):
            assert finish[i] is None, f"stream {i} went on after its finish delta"
            if delta.token is not None:
                tokens[i].append(delta.token)
            finish[i] = delta.finish_reason
    # Choice i of prompt j at j * n + i: what generate_choices gives that prompt alone, same seed.
    assert tokens == [choice for choices in alone for choice in choices]
    assert finish == ["length"] * 4
    assert sorted(engine.model.prefills) == [(1, len(other)), (1, len(PROMPT))]  # one per prompt
    engine.model.prefills.clear()
    twice = [t async for t in _batch_tokens(engine, [PROMPT, PROMPT], max_tokens=6, seed=5, **SAMPLED)]
    assert engine.model.prefills == [(1, len(PROMPT))]  # a prompt sent twice is prefilled once
    assert twice == [await tokens_of(engine, PROMPT, max_tokens=6, seed=5, **SAMPLED)] * 2  # same seed
    greedy = [t async for t in _batch_tokens(engine, [other, PROMPT], max_tokens=6)]
    assert greedy == [await tokens_of(engine, other, max_tokens=6), await tokens_of(engine, PROMPT, max_tokens=6)]
    assert_idle(engine)
    await engine.wait_idle()


async def _batch_tokens(engine, prompts, **options):
    """Each prompt's tokens, from one generate_batch of n=1."""
    tokens: list[list[int]] = [[] for _ in prompts]
    with anyio.fail_after(60):
        async for i, delta in engine.generate_batch(prompts, **options):
            if delta.token is not None:
                tokens[i].append(delta.token)
    for answer in tokens:
        yield answer


@on_every_loop
async def test_a_batch_of_prompts_is_checked_before_it_runs_and_ends_together(rt):
    from emlx_async.llm import EngineBusy, RequestStats

    engine = await engine_on(rt, "batch", "replay", max_concurrent=4)
    for bad in ([], "a prompt", None):
        with pytest.raises(ValueError, match="prompts must be a non-empty list"):
            engine.generate_batch(bad)
    with pytest.raises(ValueError, match=r"the prompts times n \(6\) exceeds the engine's 4 request slots"):
        engine.generate_batch([PROMPT] * 3, n=2)  # could never run
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate_batch([PROMPT, [10**6]])  # each prompt is checked
    with pytest.raises(ValueError, match="n must be"):
        engine.generate_batch([PROMPT], n=0)
    with pytest.raises(ValueError, match=r"one RequestStats per stream \(4\)"):
        engine.generate_batch([PROMPT, PROMPT], n=2, stats=[RequestStats(), RequestStats()])
    running = engine.generate(PROMPT, max_tokens=200)
    with anyio.fail_after(30):
        await anext(running)  # holds one of the four slots
        with pytest.raises(EngineBusy, match="4 request slots are needed and 3"):
            engine.generate_batch([PROMPT, PROMPT], n=2, wait=False)
        await running.aclose()
    with anyio.fail_after(30):
        async with contextlib.aclosing(engine.generate_batch([PROMPT, [4, 4]], n=2, max_tokens=100,
                                                             temperature=1.0)) as streams:
            async for _ in streams:
                break
        await engine.wait_idle()
    assert_idle(engine)


@on_every_loop
async def test_choice_seeds_follow_the_documented_rule(rt):
    from emlx_async.llm.engine import CHOICE_SEED_STEP

    engine = await engine_on(rt, "parallel", "replay")
    tokens, _ = await choices_of(engine, PROMPT, 3, max_tokens=8, seed=2**64 - 1, **SAMPLED)
    for i in (1, 2):
        seed = (2**64 - 1 + i * CHOICE_SEED_STEP) % 2**64
        assert await tokens_of(engine, PROMPT, max_tokens=8, seed=seed, **SAMPLED) == tokens[i]


@on_every_loop
async def test_a_cache_that_cannot_be_held_prefills_each_choice(rt):
    """Quantized KV caches cannot be restored: each choice prefills on its own, with the same tokens."""
    from emlx_async.llm import Engine
    from emlx_async.llm.cache_options import CacheOptions

    engine = Engine(counting_prefills(tiny("llama", **QUANTIZABLE)), IdsTokenizer(), eos_ids=set(),
                    chat_template=None, runtime=rt, cache_options=CacheOptions(kv_bits=8, kv_group_size=32))
    await engine.prepare_step("python")
    plain = await tokens_of(engine, PROMPT, max_tokens=6, seed=3, **SAMPLED)
    engine.model.prefills.clear()
    tokens, finish = await choices_of(engine, PROMPT, 2, max_tokens=6, seed=3, **SAMPLED)
    assert tokens[0] == plain and finish == ["length", "length"]
    assert len(engine.model.prefills) == 2
    assert_idle(engine)


@on_every_loop
async def test_n_choices_take_n_slots_or_wait(rt):
    from emlx_async.llm import EngineBusy

    engine = await engine_on(rt, "parallel", "replay", max_concurrent=3)
    with pytest.raises(ValueError, match="n must be"):
        engine.generate_choices(PROMPT, n=0)
    with pytest.raises(ValueError, match="n must be"):
        engine.generate_choices(PROMPT, n=17)
    with pytest.raises(ValueError, match="request slots"):
        engine.generate_choices(PROMPT, n=4)  # could never run
    with pytest.raises(ValueError, match="stats"):
        engine.generate_choices(PROMPT, n=2, stats=[])
    running = engine.generate(PROMPT, max_tokens=200)
    with anyio.fail_after(30):
        await anext(running)  # holds one of the three slots
        with pytest.raises(EngineBusy, match="3 request slots are needed and 2"):
            engine.generate_choices(PROMPT, n=3, wait=False)
        choices = engine.generate_choices(PROMPT, n=3, max_tokens=4)
        started = anyio.Event()

        async def read_choices(out: list):
            async for item in choices:
                started.set()
                out.append(item)

        out: list = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_choices, out)
            await anyio.sleep(0.3)
            assert not started.is_set()  # two slots are free, three are needed: it waits
            await running.aclose()
            await started.wait()
        assert sorted({i for i, _ in out}) == [0, 1, 2]
    assert_idle(engine)


@pytest.mark.parametrize("mode", ["parallel", "batch"])
@on_every_loop
async def test_leaving_early_ends_every_choice(rt, mode):
    engine = await engine_on(rt, mode, "replay")
    with anyio.fail_after(30):
        async with contextlib.aclosing(engine.generate_choices(PROMPT, n=3, max_tokens=100,
                                                               temperature=1.0)) as choices:
            async for _ in choices:
                break
        await engine.wait_idle()
    assert_idle(engine)
    tokens, finish = await choices_of(engine, PROMPT, 2, max_tokens=3)  # the engine still serves
    assert finish == ["length", "length"]


@pytest.mark.parametrize("mode,step", PATHS)
@on_every_loop
async def test_stop_token_ids_end_with_stop_and_leave_the_token_out(rt, mode, step):
    engine = await engine_on(rt, mode, step)
    greedy, stop_at = await greedy_and_a_fresh_token(engine)
    deltas = [d async for d in engine.generate(PROMPT, max_tokens=10, stop_token_ids=[greedy[stop_at], 255])]
    assert [d.token for d in deltas if d.token is not None] == greedy[:stop_at]
    assert "".join(d.text for d in deltas) == "".join(f"<{t}>" for t in greedy[:stop_at])
    assert deltas[-1].finish_reason == "stop" and deltas[-1].token is None
    tokens, finish = await choices_of(engine, PROMPT, 2, max_tokens=10, stop_token_ids=(greedy[stop_at],))
    assert tokens == [greedy[:stop_at]] * 2 and finish == ["stop", "stop"]
    for bad in ([256], [-1], [True], "5", [1.0], [3, None]):
        with pytest.raises(ValueError, match="stop_token_ids"):
            engine.generate(PROMPT, stop_token_ids=bad)
    with pytest.raises(ValueError) as huge:  # the bad id named, short (it wrote out the whole list)
        engine.generate(PROMPT, stop_token_ids=[3, 10 ** 4290] * 256)
    assert str(huge.value).endswith("got <an integer of 14252 bits>"), str(huge.value)[:200]
    assert_idle(engine)
    await engine.wait_idle()


@pytest.mark.parametrize("mode", ["parallel", "batch"])
@on_every_loop
async def test_stops_given_as_iterators_are_read_once_and_none_is_no_stop(rt, mode):
    """An iterator of stop ids or strings was read by the checks, then again (empty): its stops dropped."""
    engine = await engine_on(rt, mode, "replay", max_concurrent=2)
    greedy, stop_at = await greedy_and_a_fresh_token(engine)
    ended = greedy[:stop_at]
    assert await tokens_of(engine, PROMPT, max_tokens=10, stop_token_ids=iter([greedy[stop_at]])) == ended
    text = "".join([d.text async for d in engine.generate(PROMPT, max_tokens=10,
                                                           stop=(f"<{t}>" for t in greedy[stop_at:stop_at + 1]))])
    assert text == "".join(f"<{t}>" for t in ended)
    tokens = [[], []]
    async for i, delta in engine.generate_batch([PROMPT, PROMPT], max_tokens=10,
                                                stop_token_ids=iter([greedy[stop_at]])):
        if delta.token is not None:
            tokens[i].append(delta.token)
    assert tokens == [ended, ended]  # every prompt, not only the first, has the stop
    assert await tokens_of(engine, PROMPT, max_tokens=10, stop=None, stop_token_ids=None) == greedy
    for name in ("stop", "stop_token_ids"):
        with pytest.raises(ValueError, match=f"{name} must be a list, got int"):
            engine.generate(PROMPT, **{name: 5})
    assert_idle(engine)
    await engine.wait_idle()


@pytest.mark.parametrize("mode,step", PATHS)
@on_every_loop
async def test_ignore_eos_decodes_past_end_of_sequence_to_max_tokens(rt, mode, step):
    from emlx_async.llm.grammar import Grammar

    engine = await engine_on(rt, mode, step)
    greedy, eos_at = await greedy_and_a_fresh_token(engine)
    eos = greedy[eos_at]
    engine.eos_ids = {eos}
    assert await tokens_of(engine, PROMPT, max_tokens=10) == greedy[:eos_at]
    deltas = [d async for d in engine.generate(PROMPT, max_tokens=10, ignore_eos=True)]
    assert [d.token for d in deltas if d.token is not None] == greedy and deltas[-1].finish_reason == "length"
    # The end-of-sequence token is counted and gives no text.
    assert "".join(d.text for d in deltas) == "".join(f"<{t}>" for t in greedy if t != eos)
    # A stop token id still ends it; so does max_tokens at the end-of-sequence token itself.
    after = greedy[eos_at + 1]
    stopped = [d async for d in engine.generate(PROMPT, max_tokens=10, ignore_eos=True, stop_token_ids=[after])]
    assert [d.token for d in stopped if d.token is not None] == greedy[:eos_at + 1]
    assert stopped[-1].finish_reason == "stop"
    cut = [d async for d in engine.generate(PROMPT, max_tokens=eos_at + 1, ignore_eos=True)]
    assert [d.token for d in cut if d.token is not None] == greedy[:eos_at + 1]
    assert cut[-1].finish_reason == "length"
    tokens, finish = await choices_of(engine, PROMPT, 2, max_tokens=10, ignore_eos=True)
    assert tokens == [greedy] * 2 and finish == ["length", "length"]
    # Requests beside it still end at end-of-sequence (in batch mode, rows of one batch).
    async with anyio.create_task_group() as tg:
        ended = []
        tg.start_soon(lambda: choices_of(engine, PROMPT, 1, max_tokens=10, ignore_eos=True))

        async def plain():
            ended.append(await tokens_of(engine, PROMPT, max_tokens=10))
        tg.start_soon(plain)
    assert ended == [greedy[:eos_at]]
    with pytest.raises(ValueError, match="ignore_eos must be a bool"):
        engine.generate(PROMPT, ignore_eos="yes")
    with pytest.raises(ValueError, match="ignore_eos cannot be combined with a grammar"):
        engine.generate(PROMPT, ignore_eos=True, grammar=Grammar.regex("a+"))
    assert_idle(engine)
    await engine.wait_idle()


@pytest.mark.parametrize("mode", ["parallel", "batch kv_bits"])
@on_every_loop
async def test_choices_on_queues_of_their_own_past_the_pool_are_refused_and_concurrent_ones_do_not_deadlock(mode):
    """In parallel mode each choice's stream holds a pooled queue from its first token, and so
    in batch mode with kv_bits does one the replayed step cannot take (the Python step alone):
    two requests' choices taking theirs at once could each hold some and wait for the rest."""
    import emlx_async as ea
    from emlx_async.llm import Engine
    from emlx_async.llm.cache_options import CacheOptions

    async with ea.Runtime(pool_size=2) as rt:
        quantized = mode == "batch kv_bits"
        engine = Engine(tiny("llama", **(QUANTIZABLE if quantized else {})), IdsTokenizer(), eos_ids=set(),
                        chat_template=None, runtime=rt, mode=mode.split()[0], max_concurrent=4,
                        cache_options=CacheOptions(kv_bits=8, kv_group_size=32) if quantized else None)
        if quantized:
            assert await engine.prepare_step("python") == "python"
        with pytest.raises(ValueError, match="n \\(3\\) exceeds the runtime's 2 pooled queues"):
            engine.generate_choices(PROMPT, n=3, max_tokens=4)
        results = []

        async def two_choices(seed):
            results.append(await choices_of(engine, PROMPT, 2, max_tokens=6, seed=seed, **SAMPLED))

        with anyio.fail_after(30):  # a deadlock fails here, not by hanging
            for _ in range(3):
                async with anyio.create_task_group() as tg:
                    for seed in (1, 2):
                        tg.start_soon(two_choices, seed)
        assert len(results) == 6 and all(finish == ["length", "length"] for _, finish in results)
        assert_idle(engine)


@on_every_loop
async def test_the_sharded_engine_plans_ignore_eos_for_every_rank(rt):
    from emlx_async import distributed
    from emlx_async.llm.sharded import ShardedEngine
    from emlx_async.llm.sharded import _planned_join as planned_join

    engine = ShardedEngine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None,
                           runtime=rt, group=distributed.init())
    greedy, eos_at = await greedy_and_a_fresh_token(engine, max_tokens=8)
    engine.eos_ids = {greedy[eos_at]}
    await engine.wait_idle()  # the next driver's generator ends rows at the new end-of-sequence
    assert await tokens_of(engine, PROMPT, max_tokens=8) == greedy[:eos_at]
    await engine.wait_idle()
    sent = []
    jobs = engine.batch_jobs
    lead = jobs._lead

    async def recording(plan, job, *args):
        sent.append(plan)
        return await lead(plan, job, *args)
    jobs._lead = recording
    assert await tokens_of(engine, PROMPT, max_tokens=8, ignore_eos=True) == greedy
    joins = [planned_join(row) for plan in sent if plan["op"] == "step" for row in plan["join"]]
    assert [j.sampler.ignore_eos for j in joins] == [True]  # as a follower reads the plan
    await engine.close()


@on_every_loop
async def test_the_sharded_engine_holds_one_prefill_for_the_choices_through_its_plans(rt):
    """A sharded engine's choices prefill once, in a "hold" plan every rank runs, and the
    "release" plan drops it: here over a group of one rank (its plans' collectives are
    identities), against the one-process engine's choices."""
    from emlx_async import distributed
    from emlx_async.llm.sharded import ShardedEngine

    engine = ShardedEngine(counting_prefills(tiny("llama")), IdsTokenizer(), eos_ids=set(), chat_template=None,
                           runtime=rt, group=distributed.init())
    jobs = engine.batch_jobs
    tokens, finish = await choices_of(engine, PROMPT, 3, max_tokens=8, seed=4, **SAMPLED)
    assert engine.model.prefills == [(1, len(PROMPT))]  # the hold's; each row runs the last token alone
    reference, _ = await choices_of(await engine_on(rt, "batch", "python"), PROMPT, 3, max_tokens=8, seed=4,
                                    **SAMPLED)
    assert tokens == reference and finish == ["length"] * 3
    assert_idle(engine)
    assert not jobs._holds
    engine.model.prefills.clear()
    async with anyio.create_task_group() as tg:  # two requests of one prompt: one hold, counted twice
        for seed in (4, 5):
            tg.start_soon(functools.partial(choices_of, engine, PROMPT, 2, max_tokens=3, seed=seed))
    assert engine.model.prefills == [(1, len(PROMPT))]
    assert_idle(engine)
    assert not jobs._holds
    await engine.wait_idle()


@on_every_loop
async def test_a_sharded_request_cancelled_while_its_choices_prefill_still_releases_it(rt):
    """Once the hold plan is out every rank holds the prefill, so a request cancelled during it
    must still get it back to release (its "release" plan), not leave it held on every rank."""
    import threading
    import time

    from emlx_async import distributed
    from emlx_async.llm.sharded import ShardedEngine

    engine = ShardedEngine(tiny("llama"), IdsTokenizer(), eos_ids=set(), chat_template=None, runtime=rt,
                           group=distributed.init())
    jobs, entered = engine.batch_jobs, threading.Event()
    real_hold = jobs.hold

    def slow_hold(prompt):  # on the group's worker
        entered.set()
        time.sleep(0.3)
        return real_hold(prompt)

    jobs.hold = slow_hold
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(choices_of, engine, PROMPT, 2, max_tokens=4))
        with anyio.fail_after(30):
            while not entered.is_set():
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    await engine.group.run(lambda: None)  # queued behind the hold on the group's queue: it is over
    assert not jobs._holds and len(engine.decoding.held) == 0
    assert_idle(engine)
    await engine.wait_idle()


@pytest.mark.parametrize("mode", ["parallel", "batch"])
@on_every_loop
async def test_wait_false_is_busy_when_the_request_starts_not_only_when_it_is_made(rt, mode):
    """The free slot was checked when generate() was called and taken when the stream started:
    two wait=False requests made while one slot was free both passed, and the second waited."""
    from emlx_async.llm import EngineBusy

    engine = await engine_on(rt, mode, "replay", max_concurrent=1)
    made = [engine.generate(PROMPT, max_tokens=20, wait=False), engine.generate(PROMPT, max_tokens=2, wait=False),
            engine.generate_choices(PROMPT, n=1, max_tokens=2, wait=False)]
    first = made[0]
    assert (await anext(first)).token is not None
    with anyio.fail_after(10):
        for stream in made[1:]:
            with pytest.raises(EngineBusy, match="0 of 1 are free"):
                await anext(stream)
    await first.aclose()
    assert len(await tokens_of(engine, PROMPT, max_tokens=2, wait=False)) == 2  # its slot is back
    assert_idle(engine)
    await engine.wait_idle()
