"""The routing rule (emlx_async/_routing.py): which queue runs a call, in one place."""

from __future__ import annotations

import pathlib
import threading

import mlx.core as mx
import numpy as np
import pytest

import emlx_async as ea
from emlx_async._routing import route
from support.helpers import on_every_loop

PACKAGE = pathlib.Path(ea.__file__).resolve().parent


def _no_runtime():
    raise AssertionError("an explicit queue decides without looking up the loop's runtime")


@on_every_loop
async def test_first_match_wins_explicit_device_owner_bound_default(rt):
    q_bound, q_owner, q_explicit = [await rt.acquire_queue() for _ in range(3)]
    try:
        lazy = await q_owner.run(lambda: mx.ones(2) * 5, lazy=True)
        plain = mx.ones(2)
        with ea.bind(q_bound):
            assert route([lazy], q_explicit, "cpu", runtime=_no_runtime) is q_explicit
            # device= promotes: the bound queue (it is on that device), not the input's owner
            assert route([lazy], device="cpu", runtime=ea.get_runtime) is q_bound
            assert route([lazy], runtime=ea.get_runtime) is q_owner
            assert route([plain], runtime=ea.get_runtime) is q_bound
            assert ea.current_queue() is q_bound and ea.current_queue("cpu") is q_bound
        assert route([lazy], device="cpu", runtime=ea.get_runtime) is rt.default_queue("cpu")
        assert route([plain], runtime=ea.get_runtime) is rt.default_queue()
        assert ea.current_queue() is rt.default_queue()
        np.testing.assert_array_equal(np.array(await ea.eval(lazy)), [5, 5])
    finally:
        for q in (q_bound, q_owner, q_explicit):
            rt.release_queue(q)


@on_every_loop
async def test_a_closing_bound_queue_is_skipped(rt):
    q = await rt.acquire_queue()
    with ea.bind(q):
        await q.close()
        assert route([mx.ones(2)], runtime=ea.get_runtime) is rt.default_queue()
        assert ea.current_queue() is rt.default_queue()
        assert np.array(await ea.ops.add(mx.ones(2), 1)).tolist() == [2, 2]  # ran on the default queue
        await ea.synchronize()
    rt.release_queue(q)


@on_every_loop
async def test_every_entry_point_follows_the_rule(rt):
    # ops, ea.run, ea.eval, host_call and replay all route a lazy input to its owner.
    q = await rt.acquire_queue()
    try:
        lazy = await ea.ops.add(mx.ones(3), 1, queue=q, lazy=True)
        out = await ea.ops.multiply(lazy, 2, lazy=True)
        assert rt.queue_of(out) is q
        assert await ea.run(lambda v: threading.get_native_id() if bool((v == 4).all()) else None, out) == q.thread_id
        out = await ea.ops.add(mx.ones(3), 3, queue=q, lazy=True)  # the job above evaluated the others
        (hosted,) = await ea.host_call(lambda v: np.array(v) + 1, out, outputs=[((3,), mx.float32)])
        assert rt.queue_of(hosted) is q
        assert np.array(await ea.eval(hosted)).tolist() == [5, 5, 5]
    finally:
        rt.release_queue(q)


def test_the_owner_lookup_and_the_rule_live_in_routing_only():
    # The owner of a lazy array is read from a channel's owners map in one module.
    readers = sorted(p.name for p in PACKAGE.glob("*.py")
                     if "owners.get(" in p.read_text() and p.name != "_routing.py")
    assert readers == [], f"modules that look up a lazy array's owner themselves: {readers}"


@pytest.mark.parametrize("name", ["current_queue", "_target", "prepare_inputs"])
def test_no_second_copy_of_the_rule(name):
    for module in ("_queue", "_runtime", "_submit", "_api", "_host_call", "replay", "ipc"):
        source = (PACKAGE / f"{module}.py").read_text()
        assert f"def {name}(" not in source or (module, name) == ("_api", "current_queue"), (module, name)
