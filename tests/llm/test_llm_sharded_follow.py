"""ShardedEngine.follow keeps its wait for rank 0's next plan across calls, and
check_shardable (the two-rank scenarios are in tests/distributed/test_sharded.py;
these need no ring)."""

from __future__ import annotations

import queue as queue_module

import anyio
import pytest

import emlx_async as ea
from support.helpers import on_loops

pytest.importorskip("mlx_lm")


class _Issued:
    """distributed.Issued as follow() uses it: a queued job, awaitable again after a cancelled wait."""

    def __init__(self, future):
        self.future, self.settled = future, anyio.Event()
        future.add_done_callback(lambda f: self.settled.set())

    def __await__(self):
        return self._wait().__await__()

    async def _wait(self):
        await self.settled.wait()
        return self.future.result()


class _Group:
    """A follower's group as follow() uses it: its jobs run on one queue, and an awaiter that
    leaves does not take its job off it (distributed.Group.issue's contract)."""

    def __init__(self, queue):
        self.queue = queue

    def rank(self) -> int:
        return 1

    def check(self) -> None:
        pass

    def issue(self, fn, *args, what=None):
        return _Issued(self.queue.run(fn, *args))


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
    engine.leader, engine._following, engine._stopped, engine.idle_interval = False, False, False, 0.01
    engine.released = False
    engine.group, engine.batch_jobs, engine._follower = _Group(rt.default_queue()), Jobs(), _Follower(None, None)
    return engine


@on_loops("asyncio")
async def test_a_cancelled_follow_leaves_its_wait_for_the_next_call_which_takes_that_plan(rt):
    # A cancelled follow() used to return while its plan still waited on the group's queue; the
    # next call queued a second wait behind it, and the plan the first one took went unrun.
    plans: queue_module.Queue = queue_module.Queue()
    engine = _follower(rt, plans)
    try:
        with anyio.fail_after(5):
            with anyio.move_on_after(0.2):
                await engine.follow()  # waits for rank 0's plan: cancelled meanwhile, at once
        assert not engine._following
        with anyio.fail_after(10), anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(engine.follow)
                await anyio.sleep(0.1)
                with pytest.raises(ea.InvalidState, match="follow\\(\\) already runs on rank 1"):
                    await engine.follow()
                # The first call's wait takes it: the second call must await that one, not queue its own.
                plans.put("stop")
        assert not scope.cancelled_caught
        assert engine.released and not engine._following
        with pytest.raises(ea.InvalidState, match="rank 0 stopped the group; rank 1 follows no more"):
            await engine.follow()
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
