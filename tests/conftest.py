"""Every async test runs under asyncio and uvloop; every test is leak-checked.

The folders mirror the package: core/ (runtime, queues, host calls, process
life), ops/, replay/, ipc/, distributed/ (with llm/sharded.py), llm/ (with
llm/replay_step.py), serve/, packaging/ (layers, typing, benchmarks); shared
helpers and the scripts tests start are in support/.

After each test: no worker is still leased to a queue, no fd is left open,
and nothing called the loop's exception handler. pytest-timeout and
faulthandler (pyproject.toml) turn a deadlock into a failure with stacks.
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import sys

import pytest
import uvloop

import emlx_async as ea
from emlx_async import testing
from support.helpers import handler_calls, recording_loop


def pytest_asyncio_loop_factories(config, item):
    return {"asyncio": recording_loop(asyncio.new_event_loop), "uvloop": recording_loop(uvloop.new_event_loop)}


@pytest.fixture(autouse=True, scope="session")
def _warm_up_loops():
    # uvloop keeps a process-wide pipe from its first loop on; open it before
    # the per-test fd baselines so it is not reported as a leak.
    for factory in (asyncio.new_event_loop, uvloop.new_event_loop):
        loop = factory()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


@pytest.fixture(autouse=True)
def _faulthandler_follows_the_test_timeout(request):
    # pytest's faulthandler_timeout is one number for every test, so a slow
    # smoke test with a longer timeout mark of its own would dump every
    # thread's stack mid-run although it passes. Such a test's dump comes
    # shortly before its own timeout instead (pytest cancels it afterwards).
    mark = request.node.get_closest_marker("timeout")
    default = float(request.config.getini("faulthandler_timeout") or 0)
    if mark and mark.args and default and float(mark.args[0]) > default:
        faulthandler.dump_traceback_later(max(float(mark.args[0]) - 5, default), file=sys.__stderr__)


@pytest.fixture(autouse=True)
def no_leaks(_warm_up_loops):
    fds_before = testing.open_fds()
    handler_calls.clear()
    yield
    gc.collect()
    calls, handler_calls[:] = list(handler_calls), []
    assert not calls, f"the loop's exception handler was called: {calls}"
    assert testing.active_workers() == 0, "a worker is still leased after the test"
    leaked = testing.open_fds() - fds_before
    assert not leaked, f"fds left open: {_describe(leaked)}"


def _describe(fds):
    import os

    out = []
    for fd in sorted(fds):
        try:
            out.append(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            out.append(str(fd))
    return out


@pytest.fixture
async def loop_errors():
    """Fails the test if anything reaches the loop's exception handler."""
    loop = asyncio.get_running_loop()
    errors: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield errors
    await asyncio.sleep(0)
    assert not errors, f"loop exception handler called: {errors}"


@pytest.fixture
async def rt(loop_errors):
    runtime = ea.Runtime(pool_size=4)
    yield runtime
    await runtime.close()
    assert not runtime._jobs, f"pending jobs after close: {runtime._jobs}"
    assert not runtime._owners
