"""Mode "batch": continuous batching on one queue.

Requests join and leave at step boundaries and long prompts are prefilled in
chunks. ``Batcher`` is the driver every batch step shares; ``GeneratorBatcher``
is the Python step (mlx-lm's BatchGenerator), whose jobs (``BatchJobs``) the
sharded engine (llm/sharded.py) runs on every rank. The replayed step's
batcher is llm/batch_replay.py.
"""

from __future__ import annotations

import abc
import math
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Protocol

import anyio
import mlx.core as mx

from .decoding import Decoding
from .grammar import GrammarLogitsProcessor
from .penalties import PenaltyProcessor
from .sampling import Sampler, token_logprobs
from .state import GeneratorState
from .types import BatchDriverError


class Joining(Protocol):
    """What a batch step reads of a request joining it."""

    prompt: list[int]
    max_tokens: int
    sampler: Sampler


class BatchRequest:
    __slots__ = ("prompt", "max_tokens", "sampler", "uid", "inbox", "outbox", "done")

    def __init__(self, prompt: list[int], max_tokens: int, sampler: Sampler):
        self.prompt, self.max_tokens, self.sampler = prompt, max_tokens, sampler
        self.uid: int | None = None  # the batch row, once inserted
        # (token, finish reason) or an exception, from the driver to the consumer;
        # unbounded: the driver must never wait on a slow consumer.
        self.outbox, self.inbox = anyio.create_memory_object_stream(math.inf)
        self.done = False

    def close(self) -> None:
        self.outbox.close()
        self.inbox.close()


class Batcher(abc.ABC):
    """Continuous batching on one queue with one driver task.

    Requests join and leave at step boundaries; the driver exits when idle
    and restarts on demand. If anything fails (a step, the start, the queue,
    cancellation), every request it carries gets a BatchDriverError chained
    to the cause and the next request starts a new driver. Subclasses say
    what a step is (``_serve``), what it keeps on the worker (``_new_state``)
    and how that is dropped (``_close``).
    """

    def __init__(self, decoding: Decoding):
        self.decoding = decoding
        self.waiting: list[BatchRequest] = []
        self.joining: list[BatchRequest] = []  # taken by the driver, not decoding yet
        self.running: dict[int, BatchRequest] = {}
        self.leaving: list[int] = []
        self._driving = False  # a driver task runs (it exits when idle)

    @property
    def streams(self) -> int:
        """Requests it carries: waiting, joining and running."""
        return len(self.waiting) + len(self.joining) + len(self.running)

    @property
    def driving(self) -> bool:
        """A driver task runs (it holds the batch queue)."""
        return self._driving

    def submit(self, request: BatchRequest) -> None:
        # The driver runs on the runtime's loop and feeds each request's stream there: a request
        # from another loop would wait forever (a closed one's: a driver that never starts).
        self.decoding.runtime.check_current()
        self.waiting.append(request)
        if not self._driving:
            self._start_driver()

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no driver runs (its queue is handed back); for tests and shutdown."""
        with anyio.fail_after(timeout):
            while self._driving:
                await anyio.sleep(0.005)

    def _start_driver(self) -> None:
        self._driving = True
        self.decoding.runtime.start_soon(self._drive)

    def forget(self, request: BatchRequest) -> None:
        """The consumer is gone: drop the request now or at the next step."""
        request.done = True
        if request in self.waiting:
            self.waiting.remove(request)
        # A finished request read slowly may be forgotten after a new driver
        # gave its uid to another request: only its own row leaves.
        elif request.uid is not None and self.running.get(request.uid) is request:
            del self.running[request.uid]
            self.leaving.append(request.uid)

    def _deliver(self, uid: int, token: int, finish: str | None, info=None) -> None:
        """A row's token to its consumer, if it still reads; a finished row stops running."""
        request = self.running.get(uid)
        if request is None:
            return
        request.outbox.send_nowait((token, finish, info))
        if finish is not None:
            del self.running[uid]

    async def _drive(self) -> None:
        runtime = self.decoding.runtime
        queue = None
        state = self._new_state()
        try:
            queue = await runtime.acquire_queue()
            await self._serve(queue, state)
        except BaseException as exc:
            carried = [*self.joining, *self.running.values(), *self.waiting]
            self.running.clear()
            self.joining, self.waiting, self.leaving = [], [], []
            for request in carried:
                error = BatchDriverError(f"the batch driver failed: {exc!r}")
                error.__cause__ = exc
                if not request.done:
                    request.outbox.send_nowait(error)
            if not isinstance(exc, Exception):
                raise  # cancellation and exits go on; errors went to the requests
        finally:
            if queue is not None:
                try:
                    await self._close(queue, state)
                except Exception:  # noqa: BLE001 - a closed runtime: the state is dropped anyway
                    pass
                finally:
                    runtime.release_queue(queue)
            self._driving = False
            if self.waiting:  # arrived while this driver was winding down
                self._start_driver()

    @abc.abstractmethod
    def _new_state(self) -> Any:
        """The empty worker state of one driver's life."""

    @abc.abstractmethod
    async def _serve(self, queue, state) -> None:
        """Run steps until no request is left."""

    @abc.abstractmethod
    async def _close(self, queue, state) -> None:
        """Drop what the driver kept on the worker."""


class BatchJobs:
    """The Python batch step as three jobs on the batch queue: ``start`` makes an
    mlx-lm BatchGenerator, ``step`` inserts the joining requests, removes the
    leaving rows and decodes one token for every row (prefilling at most one
    chunk of waiting prompts), ``close`` drops it.

    The batcher calls the ``run_*`` methods from the loop; they run the job on
    `queue`. The sharded engine's jobs run each on every rank instead.
    """

    def __init__(self, decoding: Decoding):
        self.decoding = decoding

    async def run_start(self, queue, state: GeneratorState) -> None:
        return await queue.run(self.start, state)

    async def run_step(self, queue, state: GeneratorState, joining: Sequence[Joining], leaving: list[int]):
        return await queue.run(self.step, state, joining, leaving)

    async def run_close(self, queue, state: GeneratorState) -> None:
        return await queue.run(self.close, state)

    def start(self, state: GeneratorState) -> None:
        from mlx_lm.generate import BatchGenerator, StopSequences

        d = self.decoding
        # Keyed by the row's ignore_eos.
        state.stops = {False: StopSequences([[e] for e in d.eos_ids]), True: StopSequences()}
        # The queue's stream: mlx-lm's default is a thread-local stream, which
        # would make another MLX thread for this worker.
        state.generator = BatchGenerator(
            d.model, prefill_step_size=d.prefill_chunk,
            completion_batch_size=max(d.max_concurrent, 1), prefill_batch_size=max(d.max_concurrent, 1),
            max_kv_size=d.cache_options.max_kv_size, stream=mx.default_stream(mx.default_device()))

    def close(self, state: GeneratorState) -> None:
        # On the queue's thread: close() synchronizes the generator's stream.
        generator = state.generator
        state.clear()
        if generator is not None:
            generator.close()

    def step(self, state: GeneratorState, joining: Sequence[Joining], leaving: list[int]):
        """(uids of the joining requests, [(uid, token, finish reason, logprobs or None)]);
        a row that ended on its grammar's failure has the GrammarStateError in place of logprobs."""
        generator = state.generator
        # Rows whose request asked for logprobs: uid -> number of top alternatives.
        wanted = state.logprobs
        grammars = state.grammars
        if leaving:
            generator.remove(leaving)
            for uid in leaving:
                wanted.pop(uid, None)
                grammars.pop(uid, None)
        uids = []
        if joining:
            prompts, caches, cached_tokens = self._prefixes(joining)
            # A constrained row's grammar masks its logits; on a failure it ends the row (only
            # end-of-sequence allowed) instead of raising, which would fail the whole batch.
            processors = [None if r.sampler.grammar is None else
                          GrammarLogitsProcessor(r.sampler.grammar, on_error="end") for r in joining]
            # Penalties and bias first, the grammar's mask last (mlx-lm runs them in list order).
            penalties = [None if r.sampler.penalties is None else PenaltyProcessor(r.sampler.penalties)
                         for r in joining]
            uids = generator.insert(prompts, max_tokens=[r.max_tokens for r in joining],
                                    samplers=[r.sampler for r in joining], caches=caches, all_tokens=cached_tokens,
                                    stop_sequences=[state.stops[r.sampler.ignore_eos] for r in joining],
                                    logits_processors=[[p for p in pair if p is not None]
                                                       for pair in zip(penalties, processors)])
            for request, uid, processor in zip(joining, uids, processors):
                if request.sampler.logprobs is not None:
                    wanted[uid] = request.sampler.logprobs
                if processor is not None:
                    grammars[uid] = processor
        _, responses = generator.next()
        prompt_cache = self.decoding.prompt_cache
        out = []
        for r in responses:
            top = wanted.get(r.uid)
            # r.logprobs is the step's whole distribution, computed anyway by the generator.
            info = None if top is None else token_logprobs(r.logprobs, r.token, top)
            if r.finish_reason is not None:
                wanted.pop(r.uid, None)
                processor = grammars.pop(r.uid, None)
                if processor is not None and processor.error is not None:
                    info = processor.error  # the row ended on its grammar's failure: fail that request
                if prompt_cache is not None and r.prompt_cache is not None:
                    # The finished row's keys and values: its prompt and answer, for the next turn.
                    prompt_cache.save(r.all_tokens, r.prompt_cache)
            out.append((r.uid, r.token, r.finish_reason, info))
        return uids, out

    def _prefixes(self, joining: Sequence[Joining]):
        """Each joining prompt's start from what is kept of it (a prefill held for its choices, the
        prompt cache): (prompts left to prefill, caches, tokens cached)."""
        d = self.decoding
        if d.prompt_cache is None and not len(d.held):
            return [r.prompt for r in joining], None, None
        prompts, caches, cached_tokens = [], [], []
        for request in joining:
            cache = d.cache_options.prompt_cache(d.model)
            reused = d.restore(request.prompt, cache)
            prompts.append(request.prompt[reused:])
            caches.append(cache if reused else None)  # None: the generator makes a fresh one
            cached_tokens.append(request.prompt[:reused])
        return prompts, caches, cached_tokens


class GeneratorBatcher(Batcher):
    """The Python step: one mlx-lm BatchGenerator. Each step job decodes one
    token for every running row and prefills at most one chunk
    (`prefill_chunk` tokens) of waiting prompts, so running streams stall for
    at most one chunk."""

    def __init__(self, decoding: Decoding, jobs: BatchJobs):
        super().__init__(decoding)
        self.jobs = jobs

    def _new_state(self) -> GeneratorState:
        return GeneratorState()

    async def _serve(self, queue, state: GeneratorState) -> None:
        await self.jobs.run_start(queue, state)
        while self.waiting or self.running or self.leaving:
            self.joining, self.waiting = self.waiting, []
            leaving, self.leaving = self.leaving, []
            uids, responses = await self.jobs.run_step(queue, state, self.joining, leaving)
            for request, uid in zip(self.joining, uids):
                if request.done:
                    self.leaving.append(uid)  # left while it was being inserted
                else:
                    request.uid = uid
                    self.running[uid] = request
            self.joining = []
            for uid, token, finish, info in responses:
                self._deliver(uid, token, finish, info)

    async def _close(self, queue, state: GeneratorState) -> None:
        if state.generator is not None:  # a failed start left nothing to close
            await self.jobs.run_close(queue, state)


async def batched_tokens(decoding: Decoding, prompt: list[int], max_tokens: int, sampler: Sampler,
                         batcher: Batcher) -> AsyncGenerator[int | tuple | str, None]:
    """One request's tokens from `batcher`, then its finish reason."""
    request = BatchRequest(prompt, max_tokens, sampler)
    try:
        batcher.submit(request)
        while True:
            item = await request.inbox.receive()
            if isinstance(item, BaseException):
                raise item
            token, finish, info = item
            if isinstance(info, BaseException):  # this request's failure (its grammar), not the batch's
                raise info
            if decoding.ends(token, sampler):
                yield "stop"
                return
            yield token if info is None else (token, *info)
            if finish is not None:
                yield finish
                return
    finally:
        batcher.forget(request)
        request.close()


__all__ = ["BatchJobs", "BatchRequest", "Batcher", "GeneratorBatcher", "Joining", "batched_tokens"]
