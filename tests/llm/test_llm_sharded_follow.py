"""ShardedEngine.follow runs each plan it takes to its end, and check_shardable (the
two-rank scenarios are in tests/distributed/test_sharded.py; these need no ring)."""

from __future__ import annotations

import queue as queue_module

import anyio
import pytest

import emlx_async as ea
from support.helpers import on_loops

pytest.importorskip("mlx_lm")


class _Group:
    """A follower's group as follow() uses it: its jobs run on one queue, and an awaiter that
    leaves does not take its job off it (distributed.Group.run's contract)."""

    def __init__(self, queue):
        self.queue = queue

    def rank(self) -> int:
        return 1

    def check(self) -> None:
        pass

    async def run(self, fn, *args, what=None):
        future = self.queue.run(fn, *args)
        settled = anyio.Event()
        future.add_done_callback(lambda f: settled.set())
        await settled.wait()
        return future.result()


def _follower(rt, plans: queue_module.Queue):
    """A rank-1 ShardedEngine without a model: its plans are what the test puts in `plans`."""
    from emlx_async.llm.sharded import ShardedBatchJobs, ShardedEngine, _Follower

    class Jobs(ShardedBatchJobs):
        def __init__(self):
            pass

        def follow_one(self, state) -> dict:
            return {"op": plans.get(timeout=20)}  # rank 0's next plan: blocks the group's worker until it comes

    class Follower(ShardedEngine):
        async def _release(self) -> None:  # no model to free
            self.released = True

    engine = object.__new__(Follower)
    engine.leader, engine._following, engine.idle_interval, engine.released = False, False, 0.01, False
    engine.group, engine.batch_jobs, engine._follower = _Group(rt.default_queue()), Jobs(), _Follower(None, None)
    return engine


@on_loops("asyncio")
async def test_a_cancelled_follow_returns_once_the_plan_it_took_has_run(rt):
    # A cancelled follow() returned while its plan still waited on the group's queue: a second
    # follow() started beside it and took rank 0's next plan (a replayed round's jobs left half
    # issued), with a state of its own.
    plans: queue_module.Queue = queue_module.Queue()
    engine = _follower(rt, plans)
    returned = anyio.Event()

    async def cancelled_follow() -> None:
        with anyio.move_on_after(0.2):
            await engine.follow()  # its plan waits for rank 0's: cancelled meanwhile
        returned.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancelled_follow)
            await anyio.sleep(0.5)
            assert not returned.is_set()  # still running the plan it took
            with pytest.raises(ea.InvalidState, match="follow\\(\\) already runs on rank 1"):
                await engine.follow()
            plans.put("idle")  # the plan comes: it is run, then the cancellation takes
            with anyio.fail_after(10):
                await returned.wait()
        assert not engine._following
        plans.put("stop")
        with anyio.fail_after(10):
            await engine.follow()  # now it may follow again, to rank 0's stop
        assert not engine._following and engine.released
    finally:
        for _ in range(2):  # whatever still waits on the worker (the test failed) ends
            plans.put("stop")


def test_check_shardable_names_what_does_not_divide_before_mlx_lm_tries():
    """Heads, an MLP's hidden units and a MoE's experts' units must divide by the ranks; a
    family with no shard() is named. MoE layers (qwen3_moe) pass where they divide."""
    from emlx_async.llm.sharded import check_shardable
    from support.tiny_models import tiny

    llama = tiny("llama")  # 4 query, 2 key-value heads, 128 MLP units
    check_shardable(llama, 2)
    with pytest.raises(ea.InvalidArgument, match=r"the model's 4 query and 2 key-value heads \(layer 0\) do not "
                                                 r"divide among 4 ranks"):
        check_shardable(llama, 4)
    moe = tiny("qwen3_moe", moe_intermediate_size=30)  # experts of 30 units: 2 ranks divide them
    check_shardable(moe, 2)
    moe_3 = tiny("qwen3_moe", num_attention_heads=6, num_key_value_heads=3, moe_intermediate_size=32)
    with pytest.raises(ea.InvalidArgument, match=r"the MLP's 32 hidden units \(layer 0\) do not divide among 3"):
        check_shardable(moe_3, 3)
    with pytest.raises(ea.InvalidArgument, match="models have no shard"):
        check_shardable(tiny("gemma3_text"), 2)
