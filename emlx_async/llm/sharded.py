"""The engine across ranks: one model sharded over an ``ea.distributed`` group.

Every rank loads the same model and shards it with mlx-lm's ``model.shard``
(tensor parallel: each rank holds 1/N of every attention and MLP projection,
and each layer ends with an ``all_sum``). The forward pass is then a graph
with collectives in it, so every rank must run the very same graphs in the
same order, or the ranks wait on each other forever.

Rank 0 leads: it runs the batch engine (continuous batching) and decides
each step, which requests join (their token ids, ``max_tokens`` and
sampling, seed included) and which leave. Before a batch job runs, rank 0 broadcasts that plan to the others through one
``all_sum`` of a byte buffer (a second one only for plans over 4 KiB: long
prompts joining), and every rank then runs the same job on its group queue.
Followers (``follow()``) loop on plans until rank 0 says stop. Sampling is
replicated, not broadcast: the logits after the last ``all_sum`` are the same
on every rank, and each request's random key is seeded from the plan.

The step is replayed: at load each rank traces its shard's decode step with
the group (``Group.trace``: each all_sum a marker in the export, MLX's
all_sum over the group in its place at every call), and the batch runs in
rounds (``ShardedReplayBatcher``, llm/sharded_replay.py): one plan a round,
then a prefill chunk, a move of the rows and a chain of native steps, the
same on every rank. ``step="python"`` (or a step that cannot be traced,
``step_note`` says why) runs mlx-lm's batched Python step instead, one plan
a step (``ShardedBatchJobs``); requests the replayed step cannot take
(logprobs) run on it beside the rounds. A lock (``ShardedBatchJobs.plans``)
keeps each plan's jobs together on rank 0's queue.

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
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import anyio
import anyio.lowlevel
import mlx.core as mx
import numpy as np

from .. import DistributedError, InvalidArgument, InvalidArgumentType, InvalidState, Runtime, get_runtime
from .. import replay as _replay
from ..distributed import Group, all_max, all_min, all_sum
from .batching import Batcher, BatchJobs, BatchRequest, Joining
from .decoding import Decoding
from .engine import Engine
from .penalties import Penalties
from .prompt_cache import HeldPrefill
from .sampling import Sampler
from .sharded_replay import Planned, ShardedReplayBatch, break_mid_round
from .state import GeneratorState
from .traces import UNKNOWN_CONTEXT, ReplayTraces, cache_sizes

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


def _planned_join(plan: list, uid: int | None = None) -> Planned:
    """A joining request's plan (``_join_plan``) as a follower runs it (no consumer here)."""
    prompt, max_tokens, temperature, top_p, top_k, seed, penalties, ignore_eos = plan
    sampler = Sampler(temperature, top_p, top_k, seed, _penalties_from_plan(penalties))
    sampler.ignore_eos = ignore_eos
    return Planned(uid, prompt, max_tokens, sampler)


class ShardedBatchJobs(BatchJobs):
    """The batch step's jobs on every rank: rank 0 broadcasts each job's plan
    (which requests join, with their sampling and seed, and which leave) and
    runs the job, in one task on the group's queue; the others run the same
    job from the plan (``follow_one``)."""

    def __init__(self, decoding: Decoding, group: Group):
        super().__init__(decoding)
        self.group = group
        # Held from a plan's broadcast until its jobs are queued: a plan's jobs (a replayed
        # round's are several) must not interleave with another plan's on rank 0's queue.
        self.plans = anyio.Lock()
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

        async with self.plans:
            return await self.group.run(lead, what=f"sharded {plan['op']}")

    async def send(self, plan: dict, timeout: float | None = None) -> None:
        """Rank 0, holding ``plans``: `plan` to every rank (its jobs follow it)."""
        await self.group.run(_broadcast_bytes, self.group, json.dumps(plan).encode(), timeout=timeout,
                             what=f"sharded {plan['op']}")

    def follow_one(self, state: GeneratorState) -> dict:
        """Ranks other than 0, on the group's worker: run rank 0's next plan (a replayed
        round's jobs are the caller's: ``ShardedEngine.follow``); the plan."""
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
        elif op not in ("stop", "idle", "replay", "replay_close"):
            raise InvalidArgument(f"unknown plan from rank 0: {op!r}")
        return plan


class ShardedReplayBatcher(Batcher):
    """Rank 0's replayed batch: each round's plan (joins and leaves) to every rank, then the
    round, the same on every rank (llm/sharded_replay.py). The pooled queue its driver
    holds is not used: every job runs on the group's queue."""

    def __init__(self, decoding: Decoding, jobs: ShardedBatchJobs):
        super().__init__(decoding)
        self.jobs = jobs
        self._next_uid = 0
        self._planned: dict[int, BatchRequest] = {}  # uid -> a joining request, until its prompt is through

    def _new_state(self) -> ShardedReplayBatch:
        return ShardedReplayBatch(self.decoding, self.jobs.group, deliver=self._deliver, started=self._started)

    def _started(self, uid: int) -> None:
        request = self._planned.pop(uid)
        self.joining.remove(request)
        if request.done:  # its reader left during its last chunk: its row (on every rank) leaves next round
            self.leaving.append(uid)
        else:
            self.running[uid] = request

    async def _serve(self, queue, batch: ShardedReplayBatch) -> None:
        while self.waiting or self.joining or self.running or self.leaving:
            leaves, self.leaving = self.leaving, []
            for request in [r for r in self.joining if r.done]:  # left mid-prompt
                self.joining.remove(request)
                del self._planned[request.uid]
                leaves.append(request.uid)
            joins, self.waiting = self.waiting, []
            for request in joins:
                request.uid, self._next_uid = self._next_uid, self._next_uid + 1
                self._planned[request.uid] = request
            self.joining += joins
            plan = {"op": "replay", "join": [[r.uid, *_join_plan(r)] for r in joins], "leave": leaves}
            async with self.jobs.plans:
                await self.jobs.send(plan)
                try:
                    await batch.round([Planned(r.uid, r.prompt, r.max_tokens, r.sampler) for r in joins], leaves)
                except DistributedError:
                    raise
                except Exception as exc:
                    raise break_mid_round(self.jobs.group, exc) from exc
                except BaseException as exc:  # cancelled mid-round: the same break, the cancellation goes on
                    break_mid_round(self.jobs.group, exc)
                    raise

    async def _close(self, queue, batch: ShardedReplayBatch) -> None:
        batch.clear()
        self._planned.clear()
        if self.jobs.group.broken is None:  # the followers drop theirs (and a chain a failure left)
            async with self.jobs.plans:
                await self.jobs.send({"op": "replay_close"})
            await self.jobs.group.run(_replay.end_chain_here, what="sharded chain end")


def _check_idle_interval(seconds: Any) -> None:
    if isinstance(seconds, bool) or not (isinstance(seconds, (int, float)) and 0 < seconds < 60):
        raise InvalidArgument(f"idle_interval must be in (0, 60) seconds, got {seconds!r}")


def check_shardable(model, size: int) -> None:
    """Refuse a model mlx-lm's ``shard`` cannot split `size` ways (ValueError), before it tries:
    its attention heads and its MLP's hidden units (a MoE's experts' too) must divide by `size`."""
    if not hasattr(model, "shard"):
        raise InvalidArgument(f"{type(model).__module__} models have no shard(); mlx-lm shards only some "
                              "families (llama, qwen2, qwen3, qwen3_moe, ministral3, ...)")
    for i, layer in enumerate(getattr(model, "layers", [])):
        attention = getattr(layer, "self_attn", None)
        heads, kv_heads = getattr(attention, "n_heads", None), getattr(attention, "n_kv_heads", None)
        if heads is not None and kv_heads is not None and (heads % size or kv_heads % size):
            raise InvalidArgument(f"the model's {heads} query and {kv_heads} key-value heads (layer {i}) do not "
                                  f"divide among {size} ranks; use a group size that divides both")
        hidden = _hidden_units(getattr(layer, "mlp", None))
        if hidden is not None and hidden % size:
            raise InvalidArgument(f"the MLP's {hidden} hidden units (layer {i}) do not divide among {size} ranks")


def _hidden_units(mlp) -> int | None:
    """The MLP's hidden units: its gate projection's outputs, or its experts' (a MoE's
    ``switch_mlp``; weights {experts, out, in}); None: another form, mlx-lm's shard decides."""
    for holder in (mlp, getattr(mlp, "switch_mlp", None)):
        weight = getattr(getattr(holder, "gate_proj", None), "weight", None)
        if weight is not None:
            return weight.shape[-2]
    return None


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
        # The replayed batch's driver plans through the Python step's jobs (their lock and
        # broadcast), which Engine.__init__ makes first.
        super().__init__(*args, batch_jobs=lambda decoding: ShardedBatchJobs(decoding, group),
                         replay_batcher=lambda decoding: ShardedReplayBatcher(decoding, self._jobs()), **kwargs)
        _check_idle_interval(idle_interval)
        self.group = group
        self.leader = group.rank() == 0
        self.idle_interval = float(idle_interval)
        self._stopped = False
        self._following = False
        self._follower = _Follower(GeneratorState(), ShardedReplayBatch(self.decoding, group))
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

        `step` as ``Engine.load``'s: "auto" traces the shard's decode step with
        the group (``Group.trace``) and falls back to mlx-lm's Python step with
        the reason in ``step_note``; "replay" raises ValueError with it instead
        (on every rank: the ranks agree on the step before any request);
        "python" takes the Python step.
        """
        if unsupported:  # Engine.load's other options: silently dropped, a kv_bits would go unquantized
            raise InvalidArgumentType(f"ShardedEngine.load does not take {', '.join(sorted(unsupported))}: a sharded "
                                      "engine runs one batch on every rank, with a plain KV cache and no prompt "
                                      "cache")
        if step not in ("auto", "replay", "python"):
            raise InvalidArgument(f"step must be one of ('auto', 'replay', 'python'), got {step!r}")
        _check_idle_interval(idle_interval)  # before the model loads
        runtime = runtime or get_runtime()
        whole = await Engine.load(path, runtime=runtime, max_concurrent=max_concurrent, mode="batch",
                                  prefill_chunk=prefill_chunk, step="python")  # the unsharded step is never run
        model = whole.model
        check_shardable(model, group.size())

        def shard() -> None:
            model.shard(group.mlx_group)
            mx.eval(model.parameters())  # evaluated slices: usable from the group's thread

        async with runtime.queue() as q:
            await q.run(shard)
        engine = cls(model, whole.tokenizer, group=group, eos_ids=whole.eos_ids,
                     chat_template=whole.chat_template, bos_id=whole.bos_id, runtime=runtime,
                     max_concurrent=whole.max_concurrent, prefill_chunk=whole.prefill_chunk,
                     vocab_size=whole.vocab_size, context_length=whole.context_length,
                     idle_interval=idle_interval)
        # Every rank is loaded before the first plan (a rank that loads slowly must not look
        # like a stalled one), with the same settings: rank 0's rounds run on every rank, so
        # other row counts or cache sizes would pair collectives of other shapes.
        await engine._check_same_settings(step, load_timeout)
        untraced = "the Python step was asked for" if step == "python" else await engine._trace_step()
        # And every rank takes the same step.
        ready = await all_sum(mx.array([1, int(untraced is None)], dtype=mx.int32), group=group,
                              timeout=load_timeout)
        loaded, replayed = ready.tolist()
        if loaded != group.size():
            raise DistributedError(f"only {loaded} of {group.size()} ranks reported ready")
        if untraced is None and replayed < group.size():
            untraced = f"{group.size() - replayed} of {group.size()} ranks could not trace their shard's step"
        if untraced is not None:
            engine._untrace()
            if step == "replay":
                raise InvalidArgument(f"the replayed step is not available on this sharded engine: {untraced}")
            engine.step_note = ("the sharded engine runs mlx-lm's batched Python step on every rank: "
                                + untraced)
        if engine.leader:
            engine._start_ticker()
        return engine

    async def _check_same_settings(self, step: str, timeout: float) -> None:
        """Refuse (InvalidState, on every rank) ranks loaded with other settings or models."""
        settings = {"step": step, "max_concurrent": self.max_concurrent, "prefill_chunk": self.prefill_chunk,
                    "context_length": self.context_length, "vocab_size": self.vocab_size,
                    "layers": len(getattr(self.model, "layers", []))}
        mine = mx.array([zlib.crc32(json.dumps(settings, sort_keys=True).encode()) & 0x7FFFFFFF], dtype=mx.int32)
        highest = await all_max(mine, group=self.group, timeout=timeout)
        lowest = await all_min(mine, group=self.group, timeout=timeout)
        if highest.item() != lowest.item():
            raise InvalidState(f"the ranks were loaded with different settings or models; every rank must load the "
                               f"same model with the same step, max_concurrent and prefill_chunk (rank "
                               f"{self.group.rank()} has {settings})")

    async def _trace_step(self) -> str | None:
        """Trace this rank's shard of the decode step with the group; None, or why it could not be."""
        decoding = self.decoding
        sizes = cache_sizes(self.context_length or UNKNOWN_CONTEXT)
        try:
            decoding.replay = await ReplayTraces.trace(self.runtime, self.model, sizes, mode="batch",
                                                       max_concurrent=self.max_concurrent,
                                                       options=decoding.cache_options, group=self.group)
        except DistributedError:
            raise  # a broken group: the ranks cannot agree on anything
        except Exception as exc:  # noqa: BLE001 - any failure means: use the Python step
            return f"the sharded step could not be traced: {exc}"
        replay = decoding.replay
        self.step_kind = "replay"
        self.step_note = (f"the sharded step is replayed on every rank (each all_sum MLX's over the group), "
                          f"traced for caches of {replay.sizes} tokens, batches of {replay.row_buckets} rows")
        return None

    def _untrace(self) -> None:
        if self.decoding.replay is not None:
            self.decoding.replay.release()
        self.decoding.replay, self.step_kind = None, "python"

    def _start_ticker(self) -> None:
        self._ticker_done = anyio.Event()
        self.runtime.start_soon(self._tick)

    async def _tick(self) -> None:
        """Rank 0, while no request runs: an idle plan every `idle_interval` seconds."""
        try:
            while not self._stopped and self.group.broken is None:
                await anyio.sleep(self.idle_interval)
                if not self._stopped and not self.batch_driving and self.group.broken is None:
                    async with self._jobs().plans:
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
        async with self._jobs().plans:
            await self._jobs().send({"op": "stop"}, timeout=timeout)
        await self._release()

    async def _release(self) -> None:
        """The group has stopped: free what this rank holds (its traces now), as Engine.close
        does; a stream a client has not closed yet only reads what it was given."""
        await self._free()

    async def prepare_step(self, step: str = "auto", *, cache_sizes=None) -> str:
        """Not on a sharded engine: its ranks choose their step together at load."""
        raise InvalidArgument("a sharded engine chooses its step at load, on every rank at once: "
                              "ShardedEngine.load(step=...)")

    # ---- other ranks ----------------------------------------------------------------

    async def follow(self) -> None:
        """Ranks other than 0: run rank 0's batch jobs, in its order, until it stops.

        A cancelled follow() returns at once while it waits for rank 0's next
        plan (that wait stays queued, and the next call takes the plan it
        brings), and once the plan it is running has run to its end (a replayed
        round's jobs included: the other ranks issue them all). Raises
        DistributedError if the group breaks (rank 0 died, say, or a round
        failed here), InvalidState once rank 0 has stopped the group.
        """
        if self.leader:
            raise InvalidState("rank 0 leads; follow() is for the other ranks")
        self.group.check()
        if self._stopped:
            raise InvalidState(f"rank 0 stopped the group; rank {self.group.rank()} follows no more")
        if self._following:  # two loops would each take some of rank 0's plans
            raise InvalidState(f"follow() already runs on rank {self.group.rank()}")
        self._following = True
        follower = self._follower
        try:
            while True:
                if follower.waiting is None:
                    follower.waiting = self.group.issue(self._jobs().follow_one, follower.state,
                                                        what="sharded follow")
                plan = await follower.waiting
                follower.waiting = None
                with anyio.CancelScope(shield=True):
                    op = await self._run_plan(plan)
                if op == "stop":
                    self._stopped = True
                    await self._release()
                    return
                if op == "idle":  # sleep outside the collective (see the module docstring)
                    await anyio.sleep(self.idle_interval * 0.9)
                else:
                    await anyio.lowlevel.checkpoint()  # a cancellation takes between plans
        finally:
            self._following = False

    async def _run_plan(self, plan: dict) -> str:
        """What rank 0's plan leaves to this rank's loop (a replayed round's jobs); its op."""
        op = plan["op"]
        try:
            if op == "replay":
                joins = [_planned_join(join, uid) for uid, *join in plan["join"]]
                await self._follower.batch.round(joins, plan["leave"])
            elif op == "replay_close":
                self._follower.batch.clear()
                await self.group.run(_replay.end_chain_here, what="sharded chain end")
        except DistributedError:
            raise
        except Exception as exc:
            raise break_mid_round(self.group, exc) from exc
        return op


@dataclass
class _Follower:
    """What a follower keeps between plans, across follow() calls: the Python step's
    batch and the replayed one, as rank 0 has them."""

    state: GeneratorState
    batch: ShardedReplayBatch
    waiting: Any = None  # the wait for rank 0's next plan, queued (an Issued), kept across follow() calls


__all__ = ["ShardedBatchJobs", "ShardedEngine", "ShardedReplayBatcher", "check_shardable"]
