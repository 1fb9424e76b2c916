"""Engine faults: a failing batch driver, cancellation during a long prefill."""

from __future__ import annotations

import asyncio
import threading
import time

import anyio
import pytest

import emlx_async as ea
from support.engine import PARIS, collect, settle
from support.helpers import Awaiter, needs_model, on_every_loop, on_loops

pytestmark = [pytest.mark.model, needs_model]
# The injected driver failures are engine logic: one loop flavour is enough (the model is slow on CPU).
asyncio_only = on_loops("asyncio")


async def collect_until_error(engine, seen=None, **kwargs):
    """(tokens, the exception that ended the stream or None); `seen` counts tokens as they come."""
    tokens = seen if seen is not None else []
    try:
        async for delta in engine.generate(**kwargs):
            if delta.token is not None:
                tokens.append(delta.token)
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return tokens, exc
    return tokens, None


async def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        await anyio.sleep(0.002)


@asyncio_only
async def test_batch_step_failure_fails_every_request_and_the_next_one_starts_a_new_driver(rt):
    from emlx_async.llm import BatchDriverError, Engine

    # mlx-lm's BatchGenerator (the Python step); test_engine_replay.py fails the replayed batch.
    engine = await Engine.load(runtime=rt, max_concurrent=3, mode="batch", step="python")
    reference = await collect(engine, prompt=PARIS, max_tokens=3)
    await settle(engine)

    boom = RuntimeError("injected step failure")
    real_step = engine.batch_jobs.step
    step_threads, close_threads = [], []
    failed = []  # the step failed once
    seen = [[], []]  # tokens each request has received so far (appended on the loop)

    def failing_step(state, joining, leaving):
        step_threads.append(threading.get_ident())
        # Fail once, as soon as both requests are decoding in the batch.
        if all(seen) and not close_threads and not failed:
            failed.append(True)
            generator = state.generator
            real_close = generator.close

            def close():
                close_threads.append(threading.get_ident())
                real_close()

            generator.close = close
            raise boom
        return real_step(state, joining, leaving)

    engine.batch_jobs.step = failing_step
    started = time.perf_counter()
    results = await asyncio.wait_for(asyncio.gather(
        collect_until_error(engine, seen[0], prompt=PARIS, max_tokens=20),
        collect_until_error(engine, seen[1], prompt="Once upon a time", max_tokens=20)), 60)
    failed_after = time.perf_counter() - started
    for tokens, error in results:
        assert tokens, "the failure came before the request was decoding"
        assert isinstance(error, BatchDriverError) and error.__cause__ is boom
    assert failed_after < 30
    await settle(engine)
    assert close_threads == [step_threads[0]], "the generator is closed once, on its queue's thread"

    engine.batch_jobs.step = real_step
    assert await asyncio.wait_for(collect(engine, prompt=PARIS, max_tokens=3), 60) == reference
    await settle(engine)
    assert not engine._batcher.running and not engine._batcher.waiting


@asyncio_only
async def test_batch_start_failure_fails_waiting_requests_promptly(rt):
    from emlx_async.llm import BatchDriverError, Engine

    engine = await Engine.load(runtime=rt, max_concurrent=3, mode="batch", step="python")
    boom = MemoryError("injected start failure")
    real_start = engine.batch_jobs.start

    def failing_start(state):
        raise boom

    engine.batch_jobs.start = failing_start
    results = await asyncio.wait_for(asyncio.gather(
        collect_until_error(engine, prompt="Hello", max_tokens=2),
        collect_until_error(engine, prompt="Hi", max_tokens=2)), 10)
    for tokens, error in results:
        assert tokens == [] and isinstance(error, BatchDriverError) and error.__cause__ is boom

    engine.batch_jobs.start = real_start
    _, tokens = await asyncio.wait_for(collect(engine, prompt="Hello", max_tokens=2), 60)
    assert len(tokens) == 2
    await settle(engine)


class _PrefillCounter:
    """The model, counting the forward passes over `chunk` tokens (prefill chunks)."""

    def __init__(self, model, chunk: int):
        self._model, self._chunk = model, chunk
        self.chunks = 0

    def __call__(self, inputs, *args, **kwargs):
        if inputs.shape[-1] == self._chunk:
            self.chunks += 1
        return self._model(inputs, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


@pytest.mark.parametrize("mode", ["parallel", "batch"])
@on_every_loop
async def test_cancelled_long_prompt_frees_its_queue_within_a_chunk(mode):
    from emlx_async.llm import Engine

    chunk, chunks_in_prompt = 16, 40
    # One pooled queue: the short request needs the one the long prompt holds.
    async with ea.Runtime(pool_size=1) as rt:
        engine = await Engine.load(runtime=rt, max_concurrent=2, mode=mode, prefill_chunk=chunk)
        counter = engine.model = _PrefillCounter(engine.model, chunk)
        long_prompt = list(range(1000, 1000 + chunk * chunks_in_prompt))
        async with anyio.create_task_group() as tg:
            long_request = Awaiter(tg, collect(engine, prompt=long_prompt, max_tokens=2))
            await wait_until(lambda: counter.chunks >= 1)
            long_request.cancel()
        assert long_request.outcome == "cancelled"
        with anyio.fail_after(60):
            _, tokens = await collect(engine, prompt="Hello", max_tokens=2)
        assert len(tokens) == 2
        # A cancelled prompt costs at most the chunk that was running (and one more by a race).
        assert counter.chunks <= 3, f"{counter.chunks} of {chunks_in_prompt} chunks ran; a cancel should stop it within one"
        await settle(engine)
