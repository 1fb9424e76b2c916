"""The engine across ranks: one model sharded over an ``ea.distributed`` group.

Every rank loads the same model and shards it with mlx-lm's ``model.shard``
(tensor parallel: each rank holds 1/N of every attention and MLP projection,
and each layer ends with an ``all_sum``). The forward pass is then a graph
with collectives in it, so every rank must run the very same graphs in the
same order, or the ranks wait on each other forever.

Rank 0 leads: it runs the batch engine (continuous batching with mlx-lm's
``BatchGenerator``) and decides each step, which requests join (their token
ids, ``max_tokens`` and sampling, seed included) and which leave. Before a
batch job runs, rank 0 broadcasts that plan to the others through one
``all_sum`` of a byte buffer (a second one only for plans over 4 KiB: long
prompts joining), and every rank then runs the same job on its group queue.
Followers (``follow()``) loop on plans until rank 0 says stop. Sampling is
replicated, not broadcast: the logits after the last ``all_sum`` are the same
on every rank, and each request's random key is seeded from the plan.

The step is mlx-lm's batched Python step on every rank, not the replayed
one: at load each rank traces its shard's decode step (llm/replay_step.py,
the one-process engine's) and asks ``mx.export_function`` to hold it, and
MLX 0.32 cannot. mlx.nn's sharded layers wrap their input in
``sum_gradients`` (an identity with a custom gradient: "Unable to serialize
primitive CustomTransforms"), and MLX's exporter has no serializer for a
collective at all (a lone ``mx.distributed.all_sum`` fails to export with
``std::bad_array_new_length``). ``step_note`` gives what MLX said, measured
at load, and how many collectives the step holds; ``step="replay"`` is
refused with it. ``Group.trace`` replays such a step natively (each all_sum
a marker in the export, MLX's all_sum in its place at every call); what is
missing is a batcher whose followers run the replayed batch's jobs in rank
0's order: today's plans go one per Python step, and a replayed batch
chains its native steps on the worker without the loop.

``generate_choices`` (n > 1) prefills the prompt once on every rank: a
"hold" plan (the prompt's tokens) makes each rank prefill and hold it, each
choice then joins as its own row with its own seed (restored from the held
prefill, on every rank alike, so the followers draw the same tokens), and a
"release" plan drops it once every choice is done. The hold runs to its end
even if rank 0's request is cancelled meanwhile, so the ranks hold alike.

Idle ranks. MLX's ring backend polls its sockets while a collective waits
(measured: a rank waiting 4 s in ``all_sum`` used 2.4 s of CPU), so a
follower must not sit in a collective while rank 0 has nothing to send.
When no request runs, rank 0 sends an "idle" plan every ``idle_interval``
seconds (20 ms by default) and followers sleep that long, outside any
collective, before they wait for the next plan: both enter the collective at
about the same time. A request arriving at an idle server waits at most one
interval more, and the idle plans double as a heartbeat: a follower lost
while no request runs breaks the group within the timeout too.

Failure: rank 0's jobs run under the group's timeout; a follower that dies
or stalls breaks the group (``DistributedError``), the requests it carried
end with ``BatchDriverError`` chained to it, and ``generate`` refuses new
ones at once. Followers' waits are bounded by the timeout too (the idle
plans keep coming), so they exit when rank 0 stops, dies or stalls.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import anyio
import mlx.core as mx
import numpy as np

from .. import DistributedError, InvalidArgument, InvalidArgumentType, InvalidState, Runtime, get_runtime
from ..distributed import Group, all_sum
from . import traced as _traced
from .batching import BatchJobs, Joining
from .decoding import Decoding
from .engine import Engine
from .penalties import Penalties
from .prompt_cache import HeldPrefill
from .replay_step import CacheSpec, make_step
from .sampling import Sampler
from .state import GeneratorState
from .traces import SMALLEST_CACHE

logger = logging.getLogger("emlx_async.llm.sharded")
_IDLE = json.dumps({"op": "idle"}).encode()

# The broadcast buffer: a 4-byte length, then the plan's first bytes.
_PLAN_BYTES = 4096


def _broadcast_bytes(group: Group, data: bytes | None) -> bytes:
    """Rank 0's `data` on every rank (others pass None); on the group's worker thread.

    One ``all_sum`` of a uint8 buffer where only rank 0's is non-zero (so the
    sum is its bytes), and a second for the rest of a plan past the buffer.
    """
    raw = group.mlx_group
    head = np.zeros(_PLAN_BYTES, np.uint8)
    if data is not None:
        head[:4] = np.frombuffer(len(data).to_bytes(4, "little"), np.uint8)
        first = data[: _PLAN_BYTES - 4]
        head[4:4 + len(first)] = np.frombuffer(first, np.uint8)
    summed = mx.distributed.all_sum(mx.array(head), group=raw)
    mx.eval(summed)
    got = np.array(summed)
    size = int.from_bytes(got[:4].tobytes(), "little")
    body = got[4:4 + min(size, _PLAN_BYTES - 4)].tobytes()
    if size > _PLAN_BYTES - 4:
        rest = np.zeros(size - (_PLAN_BYTES - 4), np.uint8)
        if data is not None:
            rest[:] = np.frombuffer(data[_PLAN_BYTES - 4:], np.uint8)
        summed = mx.distributed.all_sum(mx.array(rest), group=raw)
        mx.eval(summed)
        body += np.array(summed).tobytes()
    return body


@dataclass
class _PlannedJoin:
    """A request joining rank 0's batch as the other ranks see it (no consumer here)."""

    prompt: list[int]
    max_tokens: int
    sampler: Sampler


def _penalties_plan(penalties: Penalties | None) -> dict | None:
    """A row's penalties as JSON for the followers (they must process its logits alike)."""
    return None if penalties is None else asdict(penalties)


def _penalties_from_plan(plan: dict | None) -> Penalties | None:
    if plan is None:
        return None
    return Penalties(**{**plan, "logit_bias": tuple((int(i), float(b)) for i, b in plan["logit_bias"]),
                        "banned": tuple(int(i) for i in plan["banned"])})


def _join_plan(request: Joining) -> list:
    """A request joining rank 0's batch, as JSON for the followers (each must sample and end it alike)."""
    sampler = request.sampler
    return [request.prompt, request.max_tokens, sampler.temperature, sampler.top_p, sampler.top_k, sampler.seed,
            _penalties_plan(sampler.penalties), sampler.ignore_eos]


def _planned_join(plan: list) -> _PlannedJoin:
    prompt, max_tokens, temperature, top_p, top_k, seed, penalties, ignore_eos = plan
    sampler = Sampler(temperature, top_p, top_k, seed, _penalties_from_plan(penalties))
    sampler.ignore_eos = ignore_eos
    return _PlannedJoin(prompt, max_tokens, sampler)


class ShardedBatchJobs(BatchJobs):
    """The batch step's jobs on every rank: rank 0 broadcasts each job's plan
    (which requests join, with their sampling and seed, and which leave) and
    runs the job, in one task on the group's queue; the others run the same
    job from the plan (``follow_one``)."""

    def __init__(self, decoding: Decoding, group: Group):
        super().__init__(decoding)
        self.group = group
        # Prompts held for their choices ("hold"/"release" plans): tokens -> [held prefill, holders].
        self._holds: dict[tuple[int, ...], list] = {}

    # The batcher's pooled queue is not used: every collective of the group
    # (the plan's and the model's own) goes through its one queue.

    async def run_start(self, queue, state: GeneratorState) -> None:
        return await self._lead({"op": "start"}, self.start, state)

    async def run_step(self, queue, state: GeneratorState, joining: Sequence[Joining], leaving: list[int]):
        join = [_join_plan(r) for r in joining]
        return await self._lead({"op": "step", "join": join, "leave": list(leaving)},
                                self.step, state, joining, leaving)

    async def run_close(self, queue, state: GeneratorState) -> None:
        return await self._lead({"op": "close"}, self.close, state)

    async def run_hold(self, prompt: list[int]) -> HeldPrefill | None:
        # Shielded: once its plan is out the ranks hold it, so the caller must get it to release.
        with anyio.CancelScope(shield=True):
            held = await self._lead({"op": "hold", "prompt": list(prompt)}, self.hold, prompt)
        return held

    async def run_release(self, prompt: Sequence[int]) -> None:
        return await self._lead({"op": "release", "prompt": list(prompt)}, self.release, prompt)

    def hold(self, prompt: Sequence[int]) -> HeldPrefill | None:
        """On every rank: `prompt` prefilled and held for its choices (None: not restorable)."""
        tokens = tuple(prompt)
        entry = self._holds.get(tokens)
        if entry is None:
            prefill = self.decoding.hold_prefill(list(prompt), cancellable=False)
            if prefill is None:
                return None
            entry = self._holds[tokens] = [self.decoding.held.hold(prefill), 0]
        entry[1] += 1
        return entry[0]

    def release(self, prompt: Sequence[int]) -> None:
        tokens = tuple(prompt)
        entry = self._holds[tokens]
        entry[1] -= 1
        if entry[1] == 0:
            del self._holds[tokens]
            self.decoding.held.release(entry[0])

    async def _lead(self, plan: dict, job, *args) -> Any:
        data = json.dumps(plan).encode()

        def lead() -> Any:
            _broadcast_bytes(self.group, data)
            return job(*args)

        return await self.group.run(lead, what=f"sharded {plan['op']}")

    def follow_one(self, state: GeneratorState) -> str:
        """Ranks other than 0, on the group's worker: run rank 0's next plan; its op."""
        plan = json.loads(_broadcast_bytes(self.group, None))
        op = plan["op"]
        if op == "start":
            self.start(state)
        elif op == "step":
            self.step(state, [_planned_join(join) for join in plan["join"]], plan["leave"])
        elif op == "close":
            self.close(state)
        elif op == "hold":
            self.hold(plan["prompt"])
        elif op == "release":
            self.release(plan["prompt"])
        elif op not in ("stop", "idle"):
            raise InvalidArgument(f"unknown plan from rank 0: {op!r}")
        return op


def untraceable_step(model, group: Group) -> str | None:
    """Why this rank's shard of `model` has no replayed step, in MLX's words (None: its step
    exports). Nothing is evaluated, so no collective runs: each rank asks on its own.

    The shard's greedy decode step is traced as the one-process engine traces it
    and handed to ``mx.export_function``; a lone ``all_sum`` over `group` too, and
    the step's graph is counted for collectives (``mx.export_to_dot``'s labels).
    """
    spec = CacheSpec.of(model)
    step = make_step(model, spec, greedy=True)
    inputs = [*spec.example(1, SMALLEST_CACHE), mx.random.key(0), mx.array([[0]], dtype=mx.int32),
              mx.array(0, dtype=mx.int32), *_traced.sampling_inputs(0.0, 1.0, 0, 1)]

    def lone_collective(x: mx.array) -> mx.array:
        return mx.distributed.all_sum(x, group=group.mlx_group)

    with tempfile.TemporaryDirectory(prefix="emlx-shard-") as tmp:
        failures = []
        for what, function, args in (("the step", step, inputs), ("a lone all_sum", lone_collective, [mx.ones(2)])):
            try:
                mx.export_function(os.path.join(tmp, "step.mlxfn"), function, *args)
            except Exception as exc:  # noqa: BLE001 - what MLX says is the answer
                failures.append(f"{what}: {type(exc).__name__}: {exc}")
        if not failures:
            return None
        dot = os.path.join(tmp, "step.dot")
        mx.export_to_dot(dot, *step(*inputs))
        with open(dot) as f:
            labels = Counter(re.findall(r'label ?= ?"([^"]*)"', f.read()))
    collectives = {name: count for name, count in sorted(labels.items())
                   if re.search(r"AllReduce|AllGather|Send|Recv", name)}
    held = ", ".join(f"{count} {name}" for name, count in collectives.items()) or "no collectives"
    return (f"mlx {mx.__version__}'s export_function cannot hold the sharded step ({held} in its graph): "
            + "; ".join(failures))


def _check_idle_interval(seconds: Any) -> None:
    if isinstance(seconds, bool) or not (isinstance(seconds, (int, float)) and 0 < seconds < 60):
        raise InvalidArgument(f"idle_interval must be in (0, 60) seconds, got {seconds!r}")


def check_shardable(model, size: int) -> None:
    """Refuse a model mlx-lm's ``shard`` cannot split `size` ways (ValueError), before it tries."""
    if not hasattr(model, "shard"):
        raise InvalidArgument(f"{type(model).__module__} models have no shard(); mlx-lm shards llama-family models")
    for i, layer in enumerate(getattr(model, "layers", [])):
        attention = layer.self_attn
        heads, kv_heads = attention.n_heads, attention.n_kv_heads
        if heads % size or kv_heads % size:
            raise InvalidArgument(f"the model's {heads} query and {kv_heads} key-value heads (layer {i}) do not "
                                  f"divide among {size} ranks; use a group size that divides both")
        hidden = layer.mlp.gate_proj.weight.shape[0]
        if hidden % size:
            raise InvalidArgument(f"the MLP's {hidden} hidden units do not divide among {size} ranks")


class ShardedEngine(Engine):
    """A batch-mode ``Engine`` whose model is split over `group`'s ranks.

    On rank 0 use it like an Engine (``generate``); on the other ranks call
    ``await engine.follow()``, which returns when rank 0 calls ``close()``.

    Example:
        >>> group = ea.distributed.init(backend="ring", timeout=30)
        >>> engine = await ShardedEngine.load(group=group)
        >>> if group.rank() == 0: ...  # serve; then await engine.close()
        ... else: await engine.follow()
    """

    def __init__(self, *args: Any, group: Group, idle_interval: float = 0.02, **kwargs: Any):
        kwargs["mode"] = "batch"
        super().__init__(*args, batch_jobs=lambda decoding: ShardedBatchJobs(decoding, group), **kwargs)
        _check_idle_interval(idle_interval)
        self.group = group
        self.leader = group.rank() == 0
        self.idle_interval = float(idle_interval)
        self._stopped = False
        self._following = False
        self._ticker_done: anyio.Event | None = None
        # Every rank runs rank 0's plan with mlx-lm's BatchGenerator (load says why, see the module docstring).
        self.step_note = "the sharded engine runs mlx-lm's batched Python step on every rank"

    @classmethod
    async def load(cls, path: str | None = None, *, group: Group, runtime: Runtime | None = None,
                   max_concurrent: int | None = None, prefill_chunk: int | None = None,
                   idle_interval: float = 0.02, load_timeout: float = 600.0, step: str = "auto",
                   **unsupported: Any) -> ShardedEngine:
        """Load the model on this rank (as ``Engine.load``), keep its shard, and
        wait (up to `load_timeout` s) until every rank has done the same; rank 0
        then starts sending idle plans.

        `step` as ``Engine.load``'s: "auto" and "python" run the Python step
        ("auto" says in ``step_note`` why the sharded step is not replayed);
        "replay" raises ValueError with that reason, on every rank, before the
        ranks meet.
        """
        if unsupported:  # Engine.load's other options: silently dropped, a kv_bits would go unquantized
            raise InvalidArgumentType(f"ShardedEngine.load does not take {', '.join(sorted(unsupported))}: a sharded "
                                      "engine runs one batch of mlx-lm's Python step on every rank, with a plain KV "
                                      "cache and no prompt cache")
        if step not in ("auto", "replay", "python"):
            raise InvalidArgument(f"step must be one of ('auto', 'replay', 'python'), got {step!r}")
        _check_idle_interval(idle_interval)  # before the model loads
        runtime = runtime or get_runtime()
        whole = await Engine.load(path, runtime=runtime, max_concurrent=max_concurrent, mode="batch",
                                  prefill_chunk=prefill_chunk, step="python")  # the unsharded step is never run
        model = whole.model
        check_shardable(model, group.size())

        def shard() -> str | None:
            model.shard(group.mlx_group)
            mx.eval(model.parameters())  # evaluated slices: usable from the group's thread
            return None if step == "python" else untraceable_step(model, group)

        async with runtime.queue() as q:
            untraceable = await q.run(shard)
        if step == "replay":
            raise InvalidArgument("the replayed step is not available on a sharded engine: "
                                  + (untraceable or "the sharded step exports, but the ranks follow rank 0's plan "
                                     "on the Python step only"))
        engine = cls(model, whole.tokenizer, group=group, eos_ids=whole.eos_ids,
                     chat_template=whole.chat_template, bos_id=whole.bos_id, runtime=runtime,
                     max_concurrent=whole.max_concurrent, prefill_chunk=whole.prefill_chunk,
                     vocab_size=whole.vocab_size, context_length=whole.context_length,
                     idle_interval=idle_interval)
        if step == "python":
            engine.step_note = "the Python step was asked for"
        else:
            engine.step_note += f": its step is not replayed, {untraceable or 'the ranks follow rank 0 on it'}"
        # Every rank is loaded before the first plan: a rank that loads slowly
        # must not look like a stalled one.
        ready = await all_sum(mx.array([1], dtype=mx.int32), group=group, timeout=load_timeout)
        if ready.item() != group.size():
            raise DistributedError(f"only {ready.item()} of {group.size()} ranks reported ready")
        if engine.leader:
            engine._start_ticker()
        return engine

    def _start_ticker(self) -> None:
        self._ticker_done = anyio.Event()
        self.runtime.start_soon(self._tick)

    async def _tick(self) -> None:
        """Rank 0, while no request runs: an idle plan every `idle_interval` seconds."""
        try:
            while not self._stopped and self.group.broken is None:
                await anyio.sleep(self.idle_interval)
                if not self._stopped and not self.batch_driving and self.group.broken is None:
                    await self.group.run(_broadcast_bytes, self.group, _IDLE, what="sharded idle")
        except DistributedError as exc:  # the group is broken: /health and every request say so
            logger.error("the sharded engine's group broke while idle: %s", exc)
        except Exception as exc:  # noqa: BLE001 - the runtime closed under it
            logger.debug("the idle ticker stopped: %r", exc)
        finally:
            self._ticker_done.set()

    @property
    def broken(self) -> BaseException | None:
        """The group's DistributedError once it broke, else None."""
        return self.group.broken

    def generate(self, *args: Any, **kwargs: Any):
        self._check_leader(kwargs)
        return super().generate(*args, **kwargs)

    def generate_choices(self, *args: Any, **kwargs: Any):
        self._check_leader(kwargs)
        return super().generate_choices(*args, **kwargs)

    def generate_batch(self, *args: Any, **kwargs: Any):
        self._check_leader(kwargs)
        return super().generate_batch(*args, **kwargs)

    # A prefill on rank 0 alone cannot run sharded weights: a request's choices hold theirs on every rank.

    async def _hold_prefill(self, tokens: list[int]) -> HeldPrefill | None:
        return await self._jobs().run_hold(tokens)

    async def _release_prefill(self, prefill: HeldPrefill) -> None:
        try:
            await self._jobs().run_release(prefill.tokens)
        except DistributedError:  # a broken group: no rank will run another plan
            pass

    def _jobs(self) -> ShardedBatchJobs:
        jobs = self.batch_jobs
        assert isinstance(jobs, ShardedBatchJobs)  # made by __init__
        return jobs

    def _check_leader(self, options: dict) -> None:
        if not self.leader:
            raise InvalidState(f"rank {self.group.rank()} follows rank 0; only rank 0 takes requests")
        self.group.check()  # a broken group refuses at once instead of queueing
        if options.get("grammar") is not None:  # the followers' rows would decode unconstrained and diverge
            raise InvalidArgument("a sharded engine does not take a grammar: its followers cannot apply the mask")

    async def prompt_logprobs(self, prompt, *, top_logprobs: int = 0):
        """Not on a sharded engine: its ranks run only the plans of the batch's steps."""
        raise InvalidArgument("a sharded engine does not score prompts: its ranks run only decode plans")

    # ---- rank 0 -------------------------------------------------------------------

    async def close(self, timeout: float | None = None) -> None:
        """Rank 0: stop the followers (they return from ``follow()``). Idempotent.

        `timeout` (seconds; None: the group's) bounds the wait for the running
        requests and the stop plan; past it the group is declared broken.
        """
        # Checked before any state changes: a bad one must leave the engine closable.
        limit = self.group.limit(timeout)
        if not self.leader or self._stopped or self.group.broken is not None:
            return
        self._stopped = True
        self._closed = True  # new requests are refused at once: the followers stop with this close
        with anyio.move_on_after(limit if limit is not None else math.inf) as waiting:
            await self.wait_idle(timeout=math.inf)
            if self._ticker_done is not None:
                await self._ticker_done.wait()  # its last idle plan
        if waiting.cancelled_caught:  # a rank is gone (all of them got SIGTERM, say): do not wait on
            self.group.declare_broken(DistributedError(
                f"[sharded close] the ranks did not finish their last step within {limit} s"))
        if self.group.broken is not None:
            return
        stop = json.dumps({"op": "stop"}).encode()
        await self.group.run(_broadcast_bytes, self.group, stop, timeout=timeout, what="sharded stop")

    # ---- other ranks ----------------------------------------------------------------

    async def follow(self) -> None:
        """Ranks other than 0: run rank 0's batch jobs, in its order, until it stops.

        Raises DistributedError if the group breaks (rank 0 died, say).
        """
        if self.leader:
            raise InvalidState("rank 0 leads; follow() is for the other ranks")
        # A broken group first: a plan its queue dropped never ends, so the flag below stays set.
        self.group.check()
        if self._following:  # two loops would each take some of rank 0's plans, with two states
            raise InvalidState(f"follow() already runs on rank {self.group.rank()}")
        self._following = True
        jobs = self._jobs()
        state = GeneratorState()
        # A cancelled follow() returns while its last plan still runs on the group's queue (the
        # group keeps a job its awaiter left): the flag is cleared once both have ended, so a
        # new follow() cannot start beside that plan and take rank 0's next one with its own state.
        lock = threading.Lock()
        flags = {"running": False, "left": False}

        def one() -> str:
            try:
                return jobs.follow_one(state)
            finally:
                with lock:
                    flags["running"] = False
                    if flags["left"]:
                        self._following = False

        try:
            while True:
                flags["running"] = True  # queued: it takes rank 0's next plan whether awaited or not
                op = await self.group.run(one, what="sharded follow")
                if op == "stop":
                    return
                if op == "idle":  # sleep outside the collective (see the module docstring)
                    await anyio.sleep(self.idle_interval * 0.9)
        finally:
            with lock:
                flags["left"] = True
                if not flags["running"]:
                    self._following = False


__all__ = ["ShardedBatchJobs", "ShardedEngine", "check_shardable", "untraceable_step"]
