"""The tests' one loop parametrisation (support.helpers.on_loops) does what conftest relies on.

Each backend runs the body on its own loop, the loop's id comes first, loop
fixtures are torn down after a failing body, a test's defaults survive, and
conftest's refusal finds a bare ``async def`` test.
"""

from __future__ import annotations

import asyncio
import inspect
import types

import pytest

from support.helpers import BACKENDS, bare_async_tests, handler_calls, on_every_loop, on_loops


def test_each_backend_runs_the_body_on_a_loop_of_its_own():
    import sniffio

    seen = []

    @on_every_loop
    async def probe():
        if sniffio.current_async_library() == "trio":
            seen.append("trio")
        else:
            seen.append(type(asyncio.get_running_loop()).__module__.split(".")[0])

    for backend in BACKENDS:
        probe(backend=backend)
    assert seen == ["asyncio", "uvloop", "trio"]


def test_several_backends_parametrise_the_test_first_and_one_does_not():
    @on_loops("asyncio", "uvloop")
    @pytest.mark.parametrize("mode", ["parallel", "batch"])
    async def several(mode, tmp_path):
        pass

    @on_loops("asyncio")
    async def one(tmp_path):
        pass

    assert list(inspect.signature(several).parameters) == ["backend", "mode", "tmp_path"]
    marks = [(m.name, m.args[0]) for m in several.pytestmark]
    assert marks == [("parametrize", "backend"), ("parametrize", "mode")]  # ids read test_x[uvloop-batch]
    assert list(inspect.signature(one).parameters) == ["tmp_path"] and not one.pytestmark
    with pytest.raises(AssertionError, match="not"):
        on_loops("curio")


def test_a_loop_fixture_is_torn_down_after_a_failing_body_and_the_defaults_survive():
    log = []

    async def resource(rt):
        log.append("opened")
        yield rt
        log.append("closed")

    @on_loops("asyncio", "trio", fixtures={"resource": resource})
    async def failing(resource, rt, count=2):
        assert resource is rt  # one runtime per test, however many fixtures take it
        log.append(count)
        raise ValueError("the body failed")

    for backend in ("asyncio", "trio"):
        with pytest.raises(ValueError, match="the body failed"):
            failing(backend=backend)
    assert log == ["opened", 2, "closed"] * 2


def test_the_loop_exception_handler_records_for_the_leak_check():
    @on_loops("asyncio", "uvloop")
    async def report():
        asyncio.get_running_loop().call_exception_handler({"message": "planted"})

    for backend in ("asyncio", "uvloop"):
        report(backend=backend)
    planted, handler_calls[:] = [c["message"] for c in handler_calls], []  # the leak check would fail on them
    assert planted == ["planted", "planted"]


def test_conftest_refuses_a_bare_async_test():
    async def bare():
        pass

    @on_loops("asyncio")
    async def wrapped():
        pass

    items = [types.SimpleNamespace(nodeid=name, obj=obj) for name, obj in
             [("t.py::bare", bare), ("t.py::wrapped", wrapped), ("t.py::sync", lambda: None), ("doc", None)]]
    assert bare_async_tests(items) == ["t.py::bare"]
