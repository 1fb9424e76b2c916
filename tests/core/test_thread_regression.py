"""The bug that motivates the project, and the same program through the runtime."""

from __future__ import annotations

import threading

import mlx.core as mx
import numpy as np
import pytest

import emlx_async as ea
from support.helpers import on_every_loop
from emlx_async.testing import LoopLag


def _in_thread(fn):
    errors: list[BaseException] = []

    def target():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - collected and asserted on
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    return errors


def test_plain_threading_lazy_input_from_another_thread_crashes():
    x = mx.ones((4, 4)) + 1  # lazy, built on this thread
    errors = _in_thread(lambda: mx.eval(x * 2))
    assert len(errors) == 1
    assert "There is no Stream" in str(errors[0]) and "current thread" in str(errors[0])


def test_plain_threading_lazy_result_read_on_loop_thread_crashes():
    box = {}
    assert not _in_thread(lambda: box.setdefault("y", mx.ones((4, 4)) @ mx.ones((4, 4))))
    with pytest.raises(RuntimeError, match="There is no Stream"):
        mx.eval(box["y"])


@on_every_loop
async def test_same_program_through_the_runtime_works(rt):
    x = mx.ones((4, 4)) + 1  # lazy on the loop thread: evaluated before submission
    async with rt.queue() as q:
        doubled = await q.run(lambda a: a * 2, x)
        lazy = await q.run(lambda: mx.ones((4, 4)) @ mx.ones((4, 4)), lazy=True)
        await ea.eval(lazy)
    np.testing.assert_array_equal(np.array(doubled), np.full((4, 4), 4.0))
    np.testing.assert_array_equal(np.array(lazy), np.full((4, 4), 4.0))  # readable on the loop thread


@on_every_loop
async def test_the_event_loop_keeps_running_during_a_long_job(rt):
    a = mx.random.normal((512, 512), key=mx.random.key(0))
    await ea.eval(a)

    def heavy(m):
        out = m
        for _ in range(40):
            out = (out @ m) / 512.0
        return out

    async with LoopLag() as lag, rt.queue() as q:
        await q.run(heavy, a)
    assert len(lag.samples) > 3, "the loop did not run while the job computed"


@on_every_loop
async def test_loop_lag_sees_a_blocked_loop_and_stops_cleanly():
    import time

    import anyio

    async with LoopLag(interval=0.001) as lag:
        await anyio.sleep(0.02)
        time.sleep(0.1)  # blocks the loop: the ticker wakes about 0.1 s late
        await anyio.sleep(0.02)
    assert max(lag.samples) >= 0.08
    count = len(lag.samples)
    await anyio.sleep(0.01)
    assert len(lag.samples) == count, "the ticker kept running after the block"
    plain = LoopLag().start()  # the start()/stop() form, as examples/concurrent_decode.py uses it
    with pytest.raises(RuntimeError, match="already running"):
        plain.start()
    await anyio.sleep(0.02)
    await plain.stop()
    assert plain.samples and plain.p99() < 1.0
