"""One rank of the distributed tests (started by tests/distributed/test_distributed.py with LocalRing).

usage: python dist_rank.py SCENARIO LOOP
Prints one JSON line per result ("RESULT {...}") for the test to read.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import mlx.core as mx

import emlx_async as ea
from emlx_async import distributed as dist


def report(**fields) -> None:
    print("RESULT " + json.dumps(fields), flush=True)


async def collectives(group: dist.Group) -> None:
    rank, size = group.rank(), group.size()
    raw = group.mlx_group
    x = mx.arange(6 * size, dtype=mx.float32).reshape(2 * size, 3) * (rank + 1) - rank
    checks = {}
    for name in ("all_sum", "all_max", "all_min", "all_gather"):
        ours = await getattr(dist, name)(x)
        plain = getattr(mx.distributed, name)(x, group=raw)  # on the loop thread, after ours
        mx.eval(plain)
        checks[name] = ours.shape == plain.shape and mx.array_equal(ours, plain).item()
    try:  # MLX's ring backend has none: refused before it runs, the group stays usable
        await dist.sum_scatter(x)
        checks["sum_scatter_refused"] = False
    except ValueError as exc:
        checks["sum_scatter_refused"] = "ring" in str(exc)
    ints = await dist.all_sum(mx.array([rank, 1], dtype=mx.int32))
    checks["all_sum_int32"] = ints.tolist() == [sum(range(size)), size]
    # Point to point around the ring: even ranks send first, odd ranks receive first.
    right, left = (rank + 1) % size, (rank - 1) % size
    payload = mx.full((4,), float(rank), dtype=mx.float16)
    if rank % 2 == 0:
        await dist.send(payload, right)
        got = await dist.recv((4,), mx.float16, left)
        got_like = await dist.recv_like(payload, left)
        await dist.send(payload * 2, right)
    else:
        got = await dist.recv((4,), mx.float16, left)
        await dist.send(payload, right)
        await dist.send(payload * 2, right)
        got_like = await dist.recv_like(payload, left)
    checks["send_recv"] = got.dtype == mx.float16 and got.tolist() == [float(left)] * 4
    checks["recv_like"] = got_like.tolist() == [2.0 * left] * 4
    # Argument errors are refused before MLX and leave the group usable.
    refused = []
    for bad in (lambda: dist.send(payload, rank), lambda: dist.recv((2,), "float32", left),
                lambda: dist.all_sum([1, 2]), lambda: dist.all_gather(x, group=raw),
                lambda: dist.all_sum(x, timeout=-1), lambda: dist.all_sum(x, stream=mx.new_stream(mx.cpu))):
        try:
            await bad()
        except (ValueError, TypeError) as exc:
            refused.append(type(exc).__name__)
    checks["refused"] = len(refused) == 6
    checks["still_usable"] = (await dist.all_sum(mx.array([1.0]))).item() == size
    # The sharded engine's plan broadcast: short, and past its 4 KiB buffer.
    from emlx_async.llm.sharded import _broadcast_bytes

    for plan in (b'{"op": "idle"}', bytes(range(256)) * 40):
        got = await group.run(_broadcast_bytes, group, plan if rank == 0 else None)
        checks[f"broadcast_{len(plan)}"] = got == plan
    report(rank=rank, checks=checks)


async def stall(group: dist.Group) -> None:
    """The last rank never joins; rank 0 must give up within its timeout and exit."""
    rank = group.rank()
    await dist.all_sum(mx.array([1.0]))  # everyone is up
    if rank == group.size() - 1:
        time.sleep(120)  # a stalled peer (the test kills it)
        return
    import anyio

    start = time.monotonic()
    errors = []

    async def queued_behind():
        try:
            await dist.all_max(mx.array([1.0]), timeout=60)
        except ea.DistributedError as exc:
            errors.append(("queued", str(exc)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(queued_behind)
        try:
            await dist.all_sum(mx.ones(8), timeout=1.5)
        except ea.DistributedError as exc:
            errors.append(("first", str(exc)))
    elapsed = time.monotonic() - start
    later = time.monotonic()
    try:
        await dist.all_sum(mx.ones(8))
    except ea.DistributedError as exc:
        errors.append(("later", str(exc)))
    report(rank=rank, elapsed=elapsed, later_s=time.monotonic() - later, errors=errors,
           broken=group.broken is not None, exiting_at=time.time())


async def die(group: dist.Group) -> None:
    """The last rank dies before a collective; the others get a peer failure, not a hang."""
    rank = group.rank()
    await dist.all_sum(mx.array([1.0]))
    if rank == group.size() - 1:
        os._exit(3)
    start = time.monotonic()
    try:
        await dist.all_sum(mx.ones(8), timeout=30)
        report(rank=rank, error=None)
    except ea.DistributedError as exc:
        report(rank=rank, error=str(exc), elapsed=time.monotonic() - start, exiting_at=time.time())


async def mismatch(group: dist.Group) -> None:
    """The ranks issue collectives that do not match (MISMATCH says how); each must get a clear error."""
    rank, how = group.rank(), os.environ["MISMATCH"]
    await dist.all_sum(mx.array([1.0]))  # everyone is up
    start = time.monotonic()
    try:
        if how == "size":
            await dist.all_sum(mx.ones(4 if rank == 0 else 100_000))
        elif how == "dtype":
            await dist.all_sum(mx.ones(8, dtype=mx.float32 if rank == 0 else mx.int8))
        elif how == "kind":
            await (dist.all_sum if rank == 0 else dist.all_max)(mx.ones(8))
        elif how == "deep":  # the same first 12 dimensions and size; they differ past them
            await dist.all_sum(mx.ones((1,) * 12 + ((2, 3) if rank == 0 else (3, 2))))
        elif how == "send_against_sum":
            await (dist.all_sum(mx.ones(8), timeout=5) if rank == 0 else dist.send(mx.ones(8), 0, timeout=5))
        elif rank == 0:  # "recv": a thousand elements sent, four expected
            await dist.send(mx.ones(1000), 1)
        else:
            await dist.recv((4,), mx.float32, 0)
        report(rank=rank, error=None)
    except ea.DistributedError as exc:
        report(rank=rank, error=str(exc), elapsed=time.monotonic() - start, broken=group.broken is not None)


async def cancelled(group: dist.Group) -> None:
    """Rank 0 gives up on an all_sum still queued behind a slow job; rank 1 does not. The
    collective must still run on rank 0, or the next one pairs with rank 1's first."""
    import anyio

    await dist.all_sum(mx.array([1.0]))  # everyone is up
    if group.rank() == 0:
        async with anyio.create_task_group() as tg:
            tg.start_soon(group.run, time.sleep, 0.5)
            await anyio.sleep(0.05)  # the slow job is queued first
            with anyio.move_on_after(0.1):
                await dist.all_sum(mx.array([1.0]))
    else:
        first = await dist.all_sum(mx.array([1.0]))
        assert first.item() == 2.0, first
    second = await dist.all_sum(mx.array([10.0]), timeout=10)
    report(rank=group.rank(), second=second.item(), broken=group.broken is not None)


async def any_after_ring(group: dist.Group) -> None:
    """init(backend="any") after the ring is up: MLX gives the same communicator, so it must be
    the same group, its collectives on one queue (two queues garbled each other's bytes)."""
    import anyio

    again = dist.init(strict=True, backend="any")
    sums, gathers = [], []

    async def on(g: dist.Group, op, x, into: list) -> None:
        into.append((await op(x, group=g, timeout=10)).tolist())

    for _ in range(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(on, group, dist.all_sum, mx.ones(4), sums)
            tg.start_soon(on, again, dist.all_gather, mx.ones(3), gathers)
    report(rank=group.rank(), same=again is group, sums_ok=sums == [[2.0] * 4] * 20,
           gathers_ok=gathers == [[1.0] * 6] * 20, broken=group.broken is not None)


PROMPTS = ["The capital of France is", "Water boils at", "My favourite colour is", "Once upon a time"]
MAX_TOKENS = 6


async def tokens_of(engine, prompt: str) -> list[int]:
    return [d.token async for d in engine.generate(prompt, max_tokens=MAX_TOKENS) if d.token is not None]


async def engine(group: dist.Group) -> None:
    """Rank 0: greedy tokens of the sharded engine, each prompt alone and all 4 at once."""
    import anyio

    from emlx_async.llm.sharded import ShardedEngine

    rank = group.rank()
    sharded = await ShardedEngine.load(group=group)
    if rank != 0:
        await sharded.follow()
        report(rank=rank, followed=True)
        return
    alone = [await tokens_of(sharded, p) for p in PROMPTS[:2]]
    together: list = [None] * len(PROMPTS)

    async def one(i: int) -> None:
        together[i] = await tokens_of(sharded, PROMPTS[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(PROMPTS)):
            tg.start_soon(one, i)
    await sharded.close()
    report(rank=rank, alone=alone, together=together, prompts=PROMPTS, max_tokens=MAX_TOKENS)


TINY_PROMPTS = ["The capital of France is", "Water boils at", "Once upon a time"]
TINY_TOKENS = 8
SAMPLED = dict(temperature=0.9, top_p=0.95, top_k=50)


async def tiny_run(engine) -> dict:
    """Greedy and seeded tokens, alone and three at once, and n=2 seeded choices: what the
    two-rank test compares with the one-process engine (the same function runs there).
    "moving": a batch that grows, shrinks and moves to a longer cache (past 64 positions)
    while rows run rounds of steps, one of them penalized with min_tokens."""
    import anyio

    async def tokens(prompt: str, max_tokens: int = TINY_TOKENS, **options) -> list[int]:
        return [d.token async for d in engine.generate(prompt, max_tokens=max_tokens, **options)
                if d.token is not None]

    greedy = [await tokens(p) for p in TINY_PROMPTS[:2]]
    seeded = [await tokens(p, seed=7 + i, **SAMPLED) for i, p in enumerate(TINY_PROMPTS[:2])]
    together: list = [None] * len(TINY_PROMPTS)

    async def one(i: int) -> None:
        together[i] = await tokens(TINY_PROMPTS[i], seed=i, **SAMPLED) if i % 2 else await tokens(TINY_PROMPTS[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(TINY_PROMPTS)):
            tg.start_soon(one, i)
    choices: list[list[int]] = [[], []]  # n=2: the pool (and so max_concurrent) of a 2-core machine
    async for i, delta in engine.generate_choices(TINY_PROMPTS[0], n=2, seed=5, max_tokens=TINY_TOKENS, **SAMPLED):
        if delta.token is not None:
            choices[i].append(delta.token)
    moving: list = [None] * 4
    requests = [dict(max_tokens=70, ignore_eos=True),
                dict(max_tokens=5, ignore_eos=True),
                dict(max_tokens=20, seed=3, presence_penalty=0.8, repetition_penalty=1.3, min_tokens=11,
                     **SAMPLED),
                dict(max_tokens=40, ignore_eos=True)]  # its reader leaves after 3 tokens

    async def later(i: int) -> None:
        await anyio.sleep(0.05 * i)  # joins while the first runs
        if i == 3:
            moving[i] = []
            async with contextlib.aclosing(engine.generate(TINY_PROMPTS[0], **requests[i])) as deltas:
                async for d in deltas:
                    moving[i] += [d.token] if d.token is not None else []
                    if len(moving[i]) == 3:
                        break
            return
        moving[i] = await tokens(TINY_PROMPTS[i % len(TINY_PROMPTS)], **requests[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(requests)):
            tg.start_soon(later, i)
    return {"greedy": greedy, "seeded": seeded, "together": together, "choices": choices, "moving": moving}


async def tiny_engine(group: dist.Group) -> None:
    """A tiny random llama (heads divide by 2) sharded over the ranks with step $STEP: rank 0
    reports tiny_run and the step it took and why."""
    from emlx_async.llm.sharded import ShardedEngine

    rank, path = group.rank(), os.environ["TINY_MODEL"]
    sharded = await ShardedEngine.load(path, group=group, step=os.environ["STEP"])
    step_kind, step_note = sharded.step_kind, sharded.step_note  # until close (or the stop plan) releases it
    if rank != 0:
        await sharded.follow()
        report(rank=rank, followed=True, step_kind=step_kind)
        return
    result = await tiny_run(sharded)
    await sharded.close()
    report(rank=rank, step_kind=step_kind, step_note=step_note, **result)


async def family_run(engine) -> dict:
    """Greedy tokens alone, then a greedy and a seeded stream at once, past one round of steps:
    what the two-rank family test compares with the one-process engine."""
    import anyio

    async def tokens(prompt: str, **options) -> list[int]:
        return [d.token async for d in engine.generate(prompt, max_tokens=20, ignore_eos=True, **options)
                if d.token is not None]

    alone = await tokens(TINY_PROMPTS[0])
    together: list = [None, None]

    async def one(i: int) -> None:
        together[i] = await (tokens(TINY_PROMPTS[1], seed=4, **SAMPLED) if i else tokens(TINY_PROMPTS[2]))

    async with anyio.create_task_group() as tg:
        for i in range(2):
            tg.start_soon(one, i)
    return {"alone": alone, "together": together}


async def tiny_family(group: dist.Group) -> None:
    """Another family's tiny model ($TINY_MODEL) sharded over the ranks, its step replayed:
    rank 0 reports family_run and the step it took."""
    from emlx_async.llm.sharded import ShardedEngine

    sharded = await ShardedEngine.load(os.environ["TINY_MODEL"], group=group, step="replay")
    if group.rank() != 0:
        await sharded.follow()
        return
    step_kind = sharded.step_kind  # until close releases it
    result = await family_run(sharded)
    await sharded.close()
    report(step_kind=step_kind, **result)


async def replay_faults(group: dist.Group) -> None:
    """The replayed rounds under faults: a reader leaves while its prompt's last chunk runs
    (then a request on the same engine), and the follower's follow() is cancelled while rank 0
    decodes, then called again; each rank reports what it got and whether close (rank 0) or
    the stop plan (the follower) released its traces."""
    import anyio

    from emlx_async.llm import batch_replay
    from emlx_async.llm.sharded import ShardedEngine

    sharded = await ShardedEngine.load(os.environ["TINY_MODEL"], group=group, step="replay")
    if group.rank() != 0:
        with anyio.move_on_after(1.0):
            await sharded.follow()
        cancelled_following = sharded._following
        await sharded.follow()
        report(rank=1, cancelled_following=cancelled_following, released=sharded.decoding.replay is None)
        return
    original = batch_replay.ReplayBatchJobs.prefill

    def slow_prefill(self, *args):
        time.sleep(0.3)  # a long prompt's chunk
        return original(self, *args)

    batch_replay.ReplayBatchJobs.prefill = slow_prefill
    with anyio.move_on_after(0.1):  # the reader leaves while the (only) chunk runs
        async for _ in sharded.generate(TINY_PROMPTS[1], max_tokens=6):
            pass
    batch_replay.ReplayBatchJobs.prefill = original
    after = await tokens_of(sharded, TINY_PROMPTS[1])
    # The follower's first follow() is cancelled meanwhile (at 1 s).
    lengths = [len([d async for d in sharded.generate(TINY_PROMPTS[0], max_tokens=60, ignore_eos=True)
                    if d.token is not None]) for _ in range(4)]
    try:
        await sharded.prepare_step("python")  # on one rank only: its collectives would pair wrong
        refused = None
    except ea.InvalidArgument as exc:
        refused = str(exc)
    # A stream whose tokens are all out but which its client has not read to the end: close
    # stops the group and releases the traces all the same.
    unread = sharded.generate(TINY_PROMPTS[0], max_tokens=2, ignore_eos=True)
    await anext(unread)
    await sharded.wait_idle()
    await sharded.close()
    await unread.aclose()
    report(rank=0, after=after, lengths=lengths, broken=group.broken is not None,
           released=sharded.decoding.replay is None, refused=refused)


async def mismatched_settings(group: dist.Group) -> None:
    """Rank 1 loads with another max_concurrent (so other batch row counts): refused on every rank."""
    from emlx_async.llm.sharded import ShardedEngine

    try:
        await ShardedEngine.load(os.environ["TINY_MODEL"], group=group, max_concurrent=1 + group.rank())
        report(rank=group.rank(), error=None)
    except ea.InvalidState as exc:
        report(rank=group.rank(), error=str(exc))


async def closed_engine(group: dist.Group) -> None:
    """Rank 0 closes its sharded engine while a request runs, then asks for another: refused at
    once (the followers have stopped), the group left intact."""
    import anyio

    from emlx_async.llm.sharded import ShardedEngine

    sharded = await ShardedEngine.load(os.environ["TINY_MODEL"], group=group)
    if group.rank() != 0:
        await sharded.follow()
        report(rank=group.rank(), followed=True)
        return
    running: list = []
    async with anyio.create_task_group() as tg:
        async def long() -> None:
            running.extend([d.token async for d in sharded.generate("Once upon a time", max_tokens=40, ignore_eos=True)
                            if d.token is not None])
        tg.start_soon(long)
        await anyio.sleep(0.2)
        await sharded.close()
    start = time.monotonic()
    try:
        await tokens_of(sharded, "Water boils at")
        refused = None
    except Exception as exc:  # noqa: BLE001 - the test reads what it was
        refused = f"{type(exc).__name__}: {exc}"
    report(rank=0, ran=len(running), refused=refused, refused_s=time.monotonic() - start,
           broken=group.broken is not None)


async def close_bad_timeout(group: dist.Group) -> None:
    """Rank 0 calls close() with bad timeouts: each refused naming it, the engine still serves
    and a proper close still stops the followers."""
    from emlx_async.llm.sharded import ShardedEngine

    sharded = await ShardedEngine.load(os.environ["TINY_MODEL"], group=group)
    if group.rank() != 0:
        await sharded.follow()
        report(rank=group.rank(), followed=True)
        return
    refused = []
    for bad in (float("nan"), -1, 0, True, "5"):
        try:
            await sharded.close(timeout=bad)
        except ValueError as exc:
            refused.append("timeout" in str(exc))
    after = await tokens_of(sharded, "Water boils at")
    await sharded.close()
    report(rank=0, refused=refused, after=len(after), broken=group.broken is not None)


async def follow_twice(group: dist.Group) -> None:
    """A follower calls follow() a second time while the first runs: refused at once, and rank 0's
    requests still get the one-rank tokens (two loops split its plans and broke the group)."""
    import anyio

    from emlx_async.llm.sharded import ShardedEngine

    sharded = await ShardedEngine.load(os.environ["TINY_MODEL"], group=group)
    if group.rank() == 0:
        # Idle (plans every 20 ms) until the follower's second call is in: the replayed
        # requests would otherwise be done, and the group stopped, before it comes.
        await anyio.sleep(1.0)
        tokens = [await tokens_of(sharded, p) for p in TINY_PROMPTS[:2]]
        await sharded.close()
        report(rank=0, tokens=tokens, broken=group.broken is not None)
        return
    second = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(sharded.follow)
        await anyio.sleep(0.1)
        try:
            await sharded.follow()
        except RuntimeError as exc:
            second.append(str(exc))
    report(rank=group.rank(), second=second)


async def traced(group: dist.Group) -> None:
    """Functions with all_sum, traced by the group and replayed natively, against the same
    computed in Python: a scaled sum, a chain of steps, a tiny llama sharded over the ranks."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from support.tiny_models import tiny

    rank, size = group.rank(), group.size()
    await dist.all_sum(mx.array([1.0]))  # everyone is up
    checks = {}
    x = mx.arange(3, dtype=mx.float32)
    scaled = await group.trace(lambda v: mx.distributed.all_sum(v * (rank + 1)) + 1, mx.ones(3))
    checks["all_sum"] = (await scaled(x)).tolist() == (x * sum(range(1, size + 1)) + 1).tolist()
    # A chain of steps on the worker: s <- all_sum(s) / size + 1, from zeros: 1, 2, 3, 4.
    step = await group.trace(lambda s: mx.distributed.all_sum(s) / size + 1, mx.zeros(2))
    chained = step.chain({0: 0})
    out = await chained(mx.zeros(2))
    for _ in range(3):
        out = await chained(mx.zeros(2), fed=True)
    checks["chain"] = out.tolist() == [4.0, 4.0]
    # mlx-lm's llama sharded (4 query, 2 key-value heads: 2 and 1 per rank): 4 all_sums a forward.
    model = tiny("llama")
    model.shard(group.mlx_group)
    mx.eval(model.parameters())
    tokens = mx.array([[1, 5, 9, 13, 17]])

    def forward(t: mx.array) -> mx.array:
        logits = model(t)
        mx.eval(logits)
        return logits

    plain = await group.run(forward, tokens)
    forward_traced = await group.trace(lambda t: model(t), tokens)
    logits = await forward_traced(tokens)
    checks["sharded_forward"] = logits.shape == plain.shape and mx.allclose(logits, plain, atol=1e-5).item()
    bound = (await group.trace(lambda t, w: model(t) * w, tokens, mx.array(2.0))).bind(mx.array(2.0))
    checks["bound"] = mx.allclose(await bound(tokens), plain * 2, atol=1e-5).item()
    checks["decode_step"] = await _sharded_decode_step_matches_mlx_lm(group, model)
    checks["sum_gradients_by_name"] = await _traces_sum_gradients_imported_by_name(group)
    report(rank=rank, broken=group.broken is not None, **checks)


async def _traces_sum_gradients_imported_by_name(group: dist.Group) -> bool:
    """A module holding mlx.nn's sum_gradients under its own name (mlx-lm's glm4_moe, gpt_oss,
    deepseek_v32, ... import it so) traces: its copy is left out too, and is MLX's again after."""
    import types

    from mlx.nn.layers.distributed import sum_gradients

    family = types.ModuleType("moe_family")
    family.sum_gradients = sum_gradients
    sys.modules[family.__name__] = family
    try:
        traced = await group.trace(lambda v: mx.distributed.all_sum(family.sum_gradients(group.mlx_group)(v) * 2),
                                   mx.ones(3))
        x = mx.arange(3, dtype=mx.float32)
        return (await traced(x)).tolist() == (x * 2 * group.size()).tolist() and family.sum_gradients is sum_gradients
    finally:
        del sys.modules[family.__name__]


async def _sharded_decode_step_matches_mlx_lm(group: dist.Group, model) -> bool:
    """The engine's fixed-buffer decode step (llm/replay_step.py) of the sharded model, traced
    by the group and replayed natively, token by token: mlx-lm's greedy tokens for it."""
    from emlx_async.llm.replay_step import CacheSpec, make_step
    from emlx_async.llm.traced import sampling_inputs
    from support.tiny_models import mlx_lm_tokens

    prompt, steps, size = [1, 5, 9, 13, 17, 21], 6, 32
    want = await group.run(mlx_lm_tokens, model, prompt, steps)  # its collectives in order, on the group's queue
    spec = CacheSpec.of(model)
    caches = spec.zeros(1, size)
    greedy = sampling_inputs(0.0, 1.0, 0, 1)
    key = mx.random.key(0)
    example = [*caches, key, mx.array([[0]], dtype=mx.int32), mx.array(0, dtype=mx.int32), *greedy]
    mx.eval(example)
    step = await group.trace(make_step(model, spec, greedy=True), *example)
    state, tokens, got = list(caches), list(prompt), []
    for position in range(len(prompt) + steps - 1):  # the prompt token by token, then greedy
        token = mx.array([[tokens[position]]], dtype=mx.int32)
        next_token, key, *state = await step(*state, key, token, mx.array(position, dtype=mx.int32), *greedy)
        if position >= len(prompt) - 1:
            got.append(next_token.item())
            tokens.append(got[-1])
    return got == want


SCENARIOS = {"engine": engine, "traced": traced, "tiny_engine": tiny_engine, "collectives": collectives, "stall": stall, "die": die,
             "mismatch": mismatch, "cancelled": cancelled, "any_after_ring": any_after_ring,
             "closed_engine": closed_engine,
             "close_bad_timeout": close_bad_timeout,
             "follow_twice": follow_twice, "tiny_family": tiny_family, "replay_faults": replay_faults,
             "mismatched_settings": mismatched_settings}


def absent() -> None:
    """Rank 0 starts alone (the others exit before init): init must give up within its deadline."""
    if int(os.environ["MLX_RANK"]) != 0:
        return
    start = time.monotonic()
    try:
        dist.init(strict=True, backend="ring", init_timeout=2)
        report(error=None)
    except ea.DistributedError as exc:
        elapsed = time.monotonic() - start
        again = time.monotonic()
        try:
            dist.init(strict=True, backend="ring")
        except ea.DistributedError as second:
            report(error=str(exc), elapsed=elapsed, second=str(second), second_s=time.monotonic() - again,
                   exiting_at=time.time())


def main() -> None:
    scenario, loop = sys.argv[1], sys.argv[2]
    if scenario == "absent":
        return absent()
    group = dist.init(strict=True, backend="ring", timeout=float(os.environ.get("RANK_TIMEOUT", "30")))

    async def run() -> None:
        await SCENARIOS[scenario](group)

    if loop == "trio":
        import trio

        trio.run(run)
    elif loop == "uvloop":
        import uvloop

        uvloop.run(run())
    else:
        import asyncio

        asyncio.run(run())


if __name__ == "__main__":
    main()
