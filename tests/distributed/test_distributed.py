"""ea.distributed: collectives against plain MLX on 2 and 3 loopback ranks, and failure.

Ranks are separate processes (tests/support/dist_rank.py) joined by MLX's ring
backend on 127.0.0.1, started with LocalRing; every rank is killed and
reaped by the test, and every wait is bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import anyio
import mlx.core as mx
import pytest

import emlx_async as ea
from emlx_async import distributed as dist
from emlx_async.testing import LocalRing, active_workers
from support import SUPPORT
from support.helpers import on_every_loop

RANK_SCRIPT = str(SUPPORT / "dist_rank.py")


def results(ring: LocalRing, rank: int) -> list[dict]:
    return [json.loads(line[len("RESULT "):]) for line in ring.output(rank).splitlines()
            if line.startswith("RESULT ")]


def launch(n: int, scenario: str, loop: str = "asyncio") -> LocalRing:
    return LocalRing(n, [sys.executable, RANK_SCRIPT, scenario, loop])


@pytest.mark.parametrize("n, loop", [(2, "asyncio"), (2, "trio"), (3, "uvloop")])
def test_each_collective_matches_plain_mlx(n, loop):
    with launch(n, "collectives", loop) as ring:
        codes = ring.wait(timeout=60)
        assert codes == [0] * n, [ring.errors(r)[-2000:] for r in range(n)]
        for rank in range(n):
            (result,) = results(ring, rank)
            assert result["rank"] == rank
            failed = [name for name, ok in result["checks"].items() if not ok]
            assert not failed, f"rank {rank}: {failed}"


def test_a_stalled_peer_breaks_the_group_within_the_timeout_and_rank_0_still_exits():
    with launch(2, "stall") as ring:
        try:
            code = ring.ranks[0].wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("rank 0 hung on a stalled peer")
        exited_at = time.time()
        assert code == 0, ring.errors(0)[-2000:]
        (result,) = results(ring, 0)
        assert ring.ranks[1].poll() is None  # the stalled peer is still there: nothing failed it
    assert 1.4 < result["elapsed"] < 5
    kinds = dict(result["errors"])
    assert set(kinds) == {"first", "queued", "later"}  # the awaiter, one queued behind it, one after
    assert "within 1.5 s" in kinds["first"] and "broken" in kinds["first"]
    assert result["later_s"] < 0.1 and result["broken"]
    # The worker stuck in the collective is abandoned: exit does not wait for
    # it (the native shutdown would give it 2 s; the runtime's close, forever).
    assert exited_at - result["exiting_at"] < 1.8


def test_a_dead_peer_fails_the_collective_at_once():
    with launch(3, "die") as ring:
        codes = ring.wait(timeout=40)
        assert codes[2] == 3
        assert codes[:2] == [0, 0], [ring.errors(r)[-2000:] for r in range(2)]
        for rank in range(2):
            (result,) = results(ring, rank)
            assert "connection to a peer was lost" in result["error"] and "broken" in result["error"]
            assert result["elapsed"] < 10  # the peer failure, not the 30 s timeout


def test_init_gives_up_on_a_peer_that_never_starts():
    with launch(2, "absent") as ring:
        try:
            code = ring.ranks[0].wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("init waited for ever for a peer that exited before it")
        exited_at = time.time()
        assert code == 0, ring.errors(0)[-2000:]
        (result,) = results(ring, 0)
    assert "did not connect to the other ranks within 2.0 s" in result["error"]
    assert 1.9 < result["elapsed"] < 6
    # MLX's attempt cannot be stopped: a second init says so at once, and exit does not wait for it.
    assert result["second"] == result["error"] and result["second_s"] < 0.1
    assert exited_at - result["exiting_at"] < 3


@pytest.mark.parametrize("how", ["size", "dtype", "kind", "recv", "deep"])
def test_mismatched_collectives_break_the_group_with_a_clear_error(how):
    with LocalRing(2, [sys.executable, RANK_SCRIPT, "mismatch", "asyncio"], env={"MISMATCH": how}) as ring:
        codes = ring.wait(timeout=60)
        assert codes == [0, 0], [ring.errors(r)[-2000:] for r in range(2)]
        got = {rank: results(ring, rank)[0] for rank in range(2)}
    # The receiver of a mismatched send learns it; its sender cannot (it completes).
    told = [1] if how == "recv" else [0, 1]
    for rank in told:
        error = got[rank]["error"]
        assert error and "different collectives" in error and "broken" in error, got
        assert got[rank]["broken"] and got[rank]["elapsed"] < 10
    wants = {"size": ["(4,) float32", "(100000,) float32"], "dtype": ["(8,) float32", "(8,) int8"],
             "kind": ["all_sum of (8,)", "all_max of (8,)"], "recv": ["(1000,) float32", "(4,) float32"],
             "deep": ["(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ...) float32 (6 elements)",
                      "their shapes differ past the first 12 dimensions"]}[how]
    for want in wants:
        assert want in got[1]["error"], got[1]["error"]


def test_a_send_against_an_all_sum_breaks_the_group_all_the_same():
    """The ring backend carries a send and a group collective on different connections, so the
    headers never meet: the all_sum waits for its peer (to its timeout, or the peer's exit) and breaks."""
    with LocalRing(2, [sys.executable, RANK_SCRIPT, "mismatch", "asyncio"], env={"MISMATCH": "send_against_sum"}) as ring:
        codes = ring.wait(timeout=60)
        assert codes == [0, 0], [ring.errors(r)[-2000:] for r in range(2)]
        got = {rank: results(ring, rank)[0] for rank in range(2)}
    assert got[1]["error"] is None  # the sender cannot know
    assert "[all_sum] rank 0 of 2" in got[0]["error"] and got[0]["broken"] and got[0]["elapsed"] < 10, got


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_traced_functions_with_all_sum_replay_natively_over_the_group(loop):
    with launch(2, "traced", loop) as ring:
        codes = ring.wait(timeout=120)
        assert codes == [0, 0], [ring.errors(r)[-2000:] for r in range(2)]
        for rank in range(2):
            (result,) = results(ring, rank)
            assert result == {"rank": rank, "broken": False, "all_sum": True, "chain": True,
                              "sharded_forward": True, "bound": True, "decode_step": True,
                              "sum_gradients_by_name": True}, result


def test_a_collective_cancelled_on_one_rank_still_runs_so_the_ranks_stay_in_step():
    with launch(2, "cancelled") as ring:
        codes = ring.wait(timeout=60)
        assert codes == [0, 0], [ring.errors(r)[-2000:] for r in range(2)]
        for rank in range(2):
            (result,) = results(ring, rank)
            assert result == {"rank": rank, "second": 20.0, "broken": False}, result


def test_init_any_after_the_ring_is_the_same_group_on_one_queue():
    with launch(2, "any_after_ring") as ring:
        codes = ring.wait(timeout=60)
        assert codes == [0, 0], [ring.errors(r)[-2000:] for r in range(2)]
        for rank in range(2):
            (result,) = results(ring, rank)
            assert result == {"rank": rank, "same": True, "sums_ok": True, "gathers_ok": True,
                              "broken": False}, result


def test_local_ring_reaps_every_rank():
    ring = launch(2, "stall")
    pids = [p.pid for p in ring.ranks]
    ring.close()
    assert all(p.returncode is not None for p in ring.ranks)
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


# ---- in one process ------------------------------------------------------------


@on_every_loop
async def test_a_single_process_group_returns_the_input():
    group = dist.init()
    assert (group.rank(), group.size()) == (0, 1)
    x = mx.arange(6, dtype=mx.float32).reshape(3, 2)
    for op in (dist.all_sum, dist.all_max, dist.all_min, dist.all_gather, dist.sum_scatter):
        assert mx.array_equal(await op(x), x).item()
    assert dist.init() is group and dist.world() is group
    await ea.get_runtime().close()


@on_every_loop
async def test_arguments_are_refused_before_mlx():
    """Each refusal is the package's class for the builtin a caller catches."""
    assert issubclass(ea.InvalidArgumentType, TypeError) and issubclass(ea.InvalidArgument, ValueError)
    group = dist.init()
    with pytest.raises(ea.InvalidArgumentType):
        await dist.all_sum([1.0, 2.0])
    with pytest.raises(ea.InvalidArgument, match="another rank"):
        await dist.send(mx.ones(2), 0)  # a group of one has no peer
    with pytest.raises(ea.InvalidArgument, match="timeout"):
        await dist.all_sum(mx.ones(2), timeout=0)
    with pytest.raises(ea.InvalidArgumentType, match="ea.distributed.Group"):
        await dist.all_sum(mx.ones(2), group=group.mlx_group)
    for shape in ((1 << 40,), (1 << 21,) * 3):  # a dimension past int32, a count past int64
        with pytest.raises(ea.MLXOverflowError, match=r"\[recv\] shape .* does not fit MLX"):
            await dist.recv(shape, mx.float32, 1)
    with pytest.raises(ea.InvalidArgumentType, match=r"\[all_sum\] queue must be an ea CommandQueue or None, got str"):
        await dist.all_sum(mx.ones(2), queue="the group's")
    with pytest.raises(ea.InvalidArgument, match="backend"):
        dist.init(backend="carrier-pigeon")
    with pytest.raises(ea.InvalidArgumentType, match=r"\[init\] strict must be a bool, got str"):  # "yes" was taken as True
        dist.init(strict="yes")
    with pytest.raises(ea.InvalidArgument, match="timeout must be"):
        dist.init(timeout=10**400)  # past float range: not an OverflowError
    with pytest.raises(ea.InvalidArgument, match="init_timeout must be"):
        dist.init(init_timeout=float("nan"))
    with pytest.raises(ea.InvalidArgument, match="cannot move to"):
        dist.init(device=mx.gpu)  # the group is cached on the CPU
    assert dist.init(device=mx.cpu) is group
    assert group.broken is None
    await ea.get_runtime().close()


def test_a_backend_that_cannot_start_raises_distributed_error(monkeypatch):
    monkeypatch.delenv("MLX_RANK", raising=False)
    monkeypatch.delenv("MLX_HOSTFILE", raising=False)
    with pytest.raises(ea.DistributedError, match=r"\[init\] the 'ring' backend did not start: .*MLX_HOSTFILE"):
        dist.init(strict=True, backend="ring")


def test_serve_distributed_without_a_launcher_exits_with_a_message(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MLX_RANK", "MLX_HOSTFILE")}
    done = subprocess.run([sys.executable, "-m", "emlx_async.serve", "--distributed", "--distributed-backend",
                           "ring", "--model", str(tmp_path), "--port", "0"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "the 'ring' backend did not start" in done.stderr


@on_every_loop
async def test_a_group_of_one_traces_all_sum_as_its_input_and_refuses_other_collectives():
    group = dist.init()
    traced = await group.trace(lambda v: mx.distributed.all_sum(v * 2) + 1, mx.ones(3))
    assert (await traced(mx.arange(3, dtype=mx.float32))).tolist() == [1.0, 3.0, 5.0]
    with pytest.raises(ea.InvalidArgument, match=r"\[traced\] the inputs \(\(4,\) float32\) fit no trace of the "
                                                 r"function: it takes \(\(3,\) float32\)"):
        await traced(mx.ones(4))
    with pytest.raises(ea.InvalidArgument, match="a group traces all_sum only; the function calls "
                                                 "mx.distributed.all_gather"):
        await group.trace(lambda v: mx.distributed.all_gather(v), mx.ones(3))
    with pytest.raises(ea.InvalidArgumentType, match="fn must be callable"):
        await group.trace(5, mx.ones(3))
    # Outside a trace (and on every other thread during one) MLX's own functions are there.
    assert mx.distributed.all_sum is dist._MLX_ALL_SUM and mx.distributed.all_gather is dist._MLX_UNTRACEABLE["all_gather"]
    assert group.broken is None
    await ea.get_runtime().close()


@on_every_loop
async def test_a_job_queued_ahead_gets_its_timeout_from_when_the_one_before_it_is_done():
    """A chain's steps are queued at once, each with a ceiling of k timeouts; awaited, each has
    the group's timeout from when the one before it is done (Issued.within): the second job
    ends 0.7 s after it was queued, past the 0.5 s timeout but 0.4 s after the first; the
    third, within its 2 s ceiling, is cut 0.5 s after the second ended (a peer that died)."""
    group = dist.Group(mx.distributed.init(), backend="any", timeout=0.5, device=mx.cpu)  # its own: it breaks
    first = group.issue(time.sleep, 0.3, what="first")
    second = group.issue(time.sleep, 0.4, timeout=1.0, what="second")
    third = group.issue(time.sleep, 0.9, timeout=2.0, what="third")
    await first
    second.within(group.limit(None))
    await second
    third.within(group.limit(None))
    with pytest.raises(ea.DistributedError, match=r"\[third\] rank 0 of 1: the group did not complete it within 0.5 s"):
        await third
    await ea.get_runtime().close()


@on_every_loop
async def test_a_traced_function_saved_by_a_group_loads_over_it(tmp_path):
    group = dist.init()
    path = tmp_path / "summed.mlxfn"
    # The sum of an intermediate: over one rank MLX's all_sum is that node itself (the shim once
    # gave the marker its primitive with the wrong inputs: the process died).
    await group.trace(lambda v: mx.distributed.all_sum(v * 2) * 3, mx.ones(2), save=path)
    loaded = group.load_traced(path, verify=True)  # the child replays its markers as their input
    assert (await loaded(mx.array([1.0, 2.0]))).tolist() == [6.0, 12.0]
    # Without its group, each all_sum would give this rank's part alone: refused by name.
    with pytest.raises(ea.MLXValueError, match=r"traced by an ea.distributed group .* group.load_traced\(path\)"):
        await ea.load_traced(path)(mx.array([1.0, 2.0]))
    with pytest.raises(ea.InvalidArgument, match="fixed shapes only"):
        await group.trace(lambda v: mx.distributed.all_sum(v), mx.ones(2), shapeless=True)
    await ea.get_runtime().close()


@on_every_loop
async def test_the_shims_refusal_of_a_traced_call_leaves_the_group_whole():
    group = dist.init()
    chained = (await group.trace(lambda v: mx.distributed.all_sum(v) + 1, mx.zeros(2))).chain({0: 0})
    with pytest.raises(ea.MLXValueError, match="no chained call ran"):  # refused before it ran
        await chained(mx.zeros(2), fed=True)
    assert group.broken is None
    assert (await chained(mx.zeros(2))).tolist() == [1.0, 1.0]
    assert (await chained(mx.zeros(2), fed=True)).tolist() == [2.0, 2.0]
    await group.queue().run(ea.replay.end_chain_here)
    await ea.get_runtime().close()


def fresh_group(timeout=None) -> dist.Group:
    """A group of its own (breaking it leaves the shared one alone)."""
    return dist.Group(mx.distributed.init(), backend="any", timeout=timeout, device=mx.cpu)


@on_every_loop
async def test_a_timeout_breaks_the_group_releases_its_tasks_and_abandons_the_stuck_worker():
    group = fresh_group(timeout=0.3)
    release = threading.Event()  # a collective that never completes, as with a stalled peer
    runtime = ea.get_runtime()
    queue = group.queue()
    started = time.monotonic()
    with pytest.raises(ea.DistributedError, match="within 0.3 s"):
        await group.run(release.wait, 60)
    assert time.monotonic() - started < 5
    assert group.broken is not None and queue.closed
    with pytest.raises(ea.DistributedError):
        await dist.all_sum(mx.ones(2), group=group)  # at once, no new worker
    with pytest.raises(ea.DistributedError):
        group.queue()
    assert active_workers() == 0  # abandoned: not leased, not waited for
    await runtime.close()  # does not wait for the stuck worker
    release.set()  # the thread ends when its job returns


@on_every_loop
async def test_a_timeout_on_a_callers_queue_abandons_that_queue_too():
    group = fresh_group()
    runtime = ea.get_runtime()
    queue = await runtime.acquire_queue()
    release = threading.Event()
    stuck = queue.run(release.wait, 60)  # a collective stuck on the caller's queue, as with a stalled peer
    with pytest.raises(ea.DistributedError, match="within 0.3 s"):
        await dist.all_sum(mx.ones(2), group=group, queue=queue, timeout=0.3)
    with pytest.raises(ea.DistributedError):
        await stuck  # released with the break
    assert queue.closed and active_workers() == 0
    with anyio.fail_after(5):
        await runtime.close()  # does not wait for the stuck worker
    release.set()


@on_every_loop
async def test_a_stream_of_another_thread_is_refused_and_the_group_stays_usable():
    group = fresh_group()
    with pytest.raises(ValueError, match=r"\[all_sum\] stream=.* is another thread's"):
        await dist.all_sum(mx.ones(2), group=group, stream=mx.new_stream(mx.cpu))
    assert group.broken is None
    assert (await dist.all_sum(mx.ones(2), group=group, stream=mx.cpu)).tolist() == [1.0, 1.0]
    await ea.get_runtime().close()


def failing_step():
    raise RuntimeError("[ring] connection to a peer was lost")


@on_every_loop
async def test_an_exception_inside_group_run_breaks_the_group():
    group = fresh_group()

    with pytest.raises(ea.DistributedError, match="connection to a peer was lost") as caught:
        await group.run(failing_step)
    assert isinstance(caught.value.__cause__, RuntimeError)
    with pytest.raises(ea.DistributedError):
        await group.run(lambda: 1)
    await ea.get_runtime().close()


@on_every_loop
async def test_a_cancelled_awaiter_leaves_its_job_in_the_queue():
    group = fresh_group()
    release = threading.Event()
    ran = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(group.run, release.wait, 30)
        await anyio.sleep(0.05)  # the blocking job is queued first
        with anyio.move_on_after(0.1) as waiting:
            await group.run(ran.append, "given up")  # queued behind the blocked job
        assert waiting.cancelled_caught
        release.set()
    await group.run(ran.append, "next")
    assert ran == ["given up", "next"] and group.broken is None
    await ea.get_runtime().close()


@on_every_loop
async def test_a_cancelled_awaiters_collective_still_breaks_the_group_at_its_deadline():
    """Its peer never issues it: the queue would be held for good, with nothing awaiting to time out."""
    group = fresh_group()
    release = threading.Event()  # as a collective whose peer never comes
    queue = group.queue()
    started = anyio.current_time()
    with anyio.move_on_after(0.1):
        await group.run(release.wait, 60, timeout=0.6)
    assert group.broken is None  # its deadline has not come yet
    with anyio.fail_after(5):
        while group.broken is None:
            await anyio.sleep(0.02)
    assert anyio.current_time() - started >= 0.55
    assert "within 0.6 s" in str(group.broken) and queue.closed and active_workers() == 0
    with pytest.raises(ea.DistributedError):
        await group.run(lambda: 1)
    await ea.get_runtime().close()
    release.set()


@on_every_loop
async def test_a_cancelled_awaiters_stuck_queue_is_abandoned_at_its_deadline_after_another_break():
    group = fresh_group()
    runtime = ea.get_runtime()
    queue = await runtime.acquire_queue()
    release = threading.Event()
    stuck = queue.run(release.wait, 60)  # a collective stuck on the caller's queue
    with anyio.move_on_after(0.1):
        await dist.all_sum(mx.ones(2), group=group, queue=queue, timeout=0.8)
    with pytest.raises(ea.DistributedError):  # the group breaks another way first
        await group.run(failing_step)
    assert not queue.closed
    with anyio.fail_after(5):
        while not queue.closed:  # its deadline still abandons it
            await anyio.sleep(0.02)
    with pytest.raises(ea.DistributedError):
        await stuck
    with anyio.fail_after(5):
        await runtime.close()
    release.set()


@on_every_loop
async def test_a_cancelled_awaiters_collective_that_completes_in_time_leaves_the_group_whole():
    group = fresh_group(timeout=0.5)
    release = threading.Event()
    with anyio.move_on_after(0.05):
        await group.run(release.wait, 60)
    release.set()  # the peer came, in time
    await anyio.sleep(0.8)  # past the deadline it had
    assert group.broken is None and await group.run(lambda: 7) == 7
    await ea.get_runtime().close()


@on_every_loop
async def test_a_cancelled_awaiters_job_that_fails_still_breaks_the_group():
    """Nobody awaits it any more, but the ranks are out of step all the same."""
    group = fresh_group()
    release = threading.Event()

    async with anyio.create_task_group() as tg:
        tg.start_soon(group.run, release.wait, 30)
        await anyio.sleep(0.05)
        with anyio.move_on_after(0.1):
            await group.run(failing_step)  # queued behind the blocked job, then given up
        release.set()
    with anyio.fail_after(5):
        while group.broken is None:
            await anyio.sleep(0.01)
    assert "connection to a peer was lost" in str(group.broken)
    with pytest.raises(ea.DistributedError):
        await group.run(lambda: 1)
    await ea.get_runtime().close()


@on_every_loop
async def test_a_callers_queue_is_abandoned_when_the_group_broke_another_way_first():
    group = fresh_group()
    runtime = ea.get_runtime()
    queue = await runtime.acquire_queue()
    release = threading.Event()
    stuck = queue.run(release.wait, 60)  # a collective stuck on the caller's queue

    async def breaks_the_group():
        await anyio.sleep(0.1)
        with pytest.raises(ea.DistributedError):
            await group.run(lambda: (_ for _ in ()).throw(RuntimeError("a peer failed")))

    async with anyio.create_task_group() as tg:
        tg.start_soon(breaks_the_group)
        with pytest.raises(ea.DistributedError, match="a peer failed"):
            await dist.all_sum(mx.ones(2), group=group, queue=queue, timeout=0.5)
    assert queue.closed
    with pytest.raises(ea.DistributedError):
        await stuck
    with anyio.fail_after(5):
        await runtime.close()
    release.set()


@on_every_loop
async def test_group_run_refuses_a_non_callable_and_the_group_stays_usable():
    group = fresh_group()
    with pytest.raises(TypeError, match="needs a callable, got int"):
        await group.run(5)
    assert group.broken is None
    assert await group.run(lambda: 7) == 7
    await ea.get_runtime().close()


@on_every_loop
async def test_a_failure_without_a_message_is_named_by_its_type():
    group = fresh_group()

    def failing_step():
        raise AssertionError

    with pytest.raises(ea.DistributedError, match=r"failed while it ran \(AssertionError\)"):
        await group.run(failing_step)
    await ea.get_runtime().close()


def test_a_stuck_collective_does_not_block_interpreter_exit(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent("""
        import asyncio, threading, time
        import mlx.core as mx
        import emlx_async as ea
        from emlx_async import distributed as dist

        async def main():
            group = dist.Group(mx.distributed.init(), backend="any", timeout=0.2, device=mx.cpu)
            try:
                await group.run(threading.Event().wait)  # never returns
            except ea.DistributedError:
                print("broken", time.time(), flush=True)

        asyncio.run(main())
    """))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail("a process with a stuck collective did not exit")
    exited_at = time.time()
    assert process.returncode == 0
    broken_at = float(out.split()[1])
    assert exited_at - broken_at < 1.8  # no 2 s native shutdown wait, no hang in the runtime's close


def test_a_model_that_does_not_split_evenly_is_refused_before_sharding():
    from mlx_lm.models import llama

    from emlx_async.llm.sharded import check_shardable

    # SmolLM2's head counts: 9 query and 3 key-value heads divide by 3, not by 2.
    args = llama.ModelArgs(model_type="llama", hidden_size=72, num_hidden_layers=2, intermediate_size=96,
                           num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, vocab_size=32)
    model = llama.Model(args)
    check_shardable(model, 3)
    with pytest.raises(ValueError, match="9 query and 3 key-value heads .* 2 ranks"):
        check_shardable(model, 2)
    with pytest.raises(ValueError, match="no shard"):
        check_shardable(object(), 3)
