"""Every async test names its event loops (support.helpers.on_loops); every test is leak-checked.

The folders mirror the package: core/ (runtime, queues, host calls, process
life), ops/, replay/, ipc/, distributed/ (with llm/sharded.py), llm/ (with
llm/replay_step.py), serve/, packaging/ (layers, typing, benchmarks); shared
helpers and the scripts tests start are in support/.

After each test (and, after a full collection, each module): no worker is
still leased to a queue, no fd is left open, and nothing called the loop's
exception handler. pytest-timeout and faulthandler (pyproject.toml) turn a
deadlock into a failure with stacks.
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import sys

import pytest
import uvloop

from emlx_async import testing
from support.helpers import bare_async_tests, handler_calls


def pytest_collection_modifyitems(config, items):
    # One loop parametrisation: a bare `async def` test would run on whatever
    # a plugin picks (or not at all), so it is refused by name.
    bare = bare_async_tests(items)
    if bare:
        raise pytest.UsageError(
            "async tests take their loops from support.helpers: decorate them with @on_loops(\"asyncio\", "
            "\"uvloop\") (asyncio's API), @on_every_loop (asyncio, uvloop and trio) or @on_loops(\"asyncio\"): "
            + ", ".join(bare))


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


@pytest.fixture(autouse=True, scope="module")
def no_leaks_in_old_garbage(_warm_up_loops):
    # A test's leftovers that lived long enough to reach the oldest generation
    # (a long test's task, say) are found here, after the module's fixtures.
    fds_before = testing.open_fds()
    yield
    gc.collect()
    _assert_clean(fds_before, "by the module (found by its full collection)")


@pytest.fixture(autouse=True)
def no_leaks(_warm_up_loops):
    fds_before = testing.open_fds()
    handler_calls.clear()
    yield
    # What the test made is in the young generations; a full collection costs
    # 0.1-0.3 s with the suite's imports (most of the suite's time, once), so
    # it runs only when something looks leaked, and once per module (above).
    gc.collect(1)
    if testing.active_workers() or testing.open_fds() - fds_before:
        gc.collect()
    _assert_clean(fds_before, "by the test")


def _assert_clean(fds_before: set[int], by: str) -> None:
    calls, handler_calls[:] = list(handler_calls), []
    assert not calls, f"the loop's exception handler was called {by}: {calls}"
    assert testing.active_workers() == 0, f"a worker is still leased, left {by}"
    leaked = testing.open_fds() - fds_before
    assert not leaked, f"fds left open {by}: {_describe(leaked)}"


def _describe(fds):
    import os

    out = []
    for fd in sorted(fds):
        try:
            out.append(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            out.append(str(fd))
    return out
