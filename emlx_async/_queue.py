"""CommandQueue: an actor over one native worker thread and its MLX stream.

A queue takes a completion channel, never a runtime. Every job goes through
``_submit``: it takes its place in the queue's FIFO at once and returns a
``JobFuture``, whatever it waits on. A job starts on the worker when every
job before it has started, a backpressure slot is free and its lazy inputs
owned by other queues are evaluated (there, by ``_routing.prepare_inputs``); until
then it waits in the queue's backlog, in order. The worker reports on the
channel; ``CompletionChannel._drain`` calls ``_finish``.

Cancellation contract (the same for every kind of job):

* A job not yet running when its awaiter is cancelled (in the backlog or
  queued on the worker) is removed and never runs.
* A job already running cannot be interrupted. The awaiter is released at
  once with ``CancelledError``; the job runs to the end, in queue order,
  and its result is discarded. Its backpressure slot is held until then,
  because the worker really is busy. Python jobs can poll ``ea.cancelled()``
  to stop early.
* When a run ends (for a runtime that closes with it) or the interpreter
  exits, nobody can await a job any more, and nothing waits for one, as for
  daemon threads: queued jobs never run; a running job, Python or native,
  is abandoned (its result is dropped; its worker goes back to the pool when
  the job returns, and exit does not wait for it).

Donation (``donate=`` on op jobs): the job takes the only reference to the
donated inputs when it is queued (before a spinning worker can start it). On every path that does not
succeed before the graph is built (dropped, cancelled while queued, invalid
arguments) the caller's arrays get their original contents back. A job that
ran (even one whose awaiter gave up, or whose non-finite check failed)
publishes its updated arrays into them.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import itertools
import os
import threading
import traceback
import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import monotonic_ns
from typing import Any

import mlx.core as mx

from . import _interop
from ._backend import JobFuture, TrioJobFuture, shielded
from ._channel import CompletionChannel
from ._errors import EMLXError, HostCallDeadlock, InvalidArgumentType, QueueClosed, QueueFull, RuntimeClosed, mlx_error, native_error
from ._native import ensure, exiting, ffi, lib
from ._native import error as native_call_error
from ._op_table import ARRAY, LIST, LIST_OR_ARRAY, OPS, TUPLE_OR_ARRAY
from ._routing import prepare_inputs, remove_owner
from ._trees import iter_arrays

_job_ids = itertools.count(1)
_ARRAY = mx.array

# Compared on every submission and completion: module constants, not attribute look-ups on the cffi lib.
_DONE, _STOPPED, _NULL = lib.EMLX_DONE, lib.EMLX_STOPPED, ffi.NULL

# Abandoned queues, kept alive while their worker may still be inside the job
# it was abandoned in (the job holds the queue's cffi handle). One whose
# worker the shim took back (worker set) is dropped once that job has
# returned and the worker parked for reuse; without it (the shim could not be
# told: a fork child, interpreter exit), it is kept for good.
_abandoned: list[tuple[CommandQueue, Any]] = []


def _drop_returned_abandoned() -> None:
    """Forget the abandoned queues whose worker has left the job (called before abandoning
    another: the same worker, reused, may be abandoned again)."""
    if exiting():  # after the exit hook the worker pointers are gone
        return
    pid = os.getpid()  # a fork child must not touch its parent's workers (their locks)
    _abandoned[:] = [(q, w) for q, w in _abandoned
                     if w is None or q._channel.pid != pid or lib.emlx_worker_retiring(w)]

# The job a worker thread is running now, for ea.cancelled().
_running = threading.local()

# Set inside a host callback's task: the queue whose worker waits for it.
# Submitting to that queue from there would deadlock, so it raises instead.
host_call_blocking: contextvars.ContextVar[CommandQueue | None] = contextvars.ContextVar(
    "emlx_async_host_call_blocking", default=None)


class _Job:
    """One submission. Made for every job on the loop thread's hot path, so the
    fields most jobs never set are class defaults (immutable ones) rather than
    per-instance stores."""

    fn: Callable | None = None
    args: tuple = ()
    kwargs: Any = types.MappingProxyType({})
    result: Any = None  # what the future resolves to on success
    exception: BaseException | None = None
    cancelled = False  # set on the loop when the awaiting task gave up
    op_name: str | None = None  # native op jobs: their results arrive as a payload
    publish_into: dict[int, mx.array] | None = None  # result index -> donated input object
    donated: Sequence[mx.array] = ()  # donated input objects, in input order
    start: Callable[..., int] | None = None  # hands the job to the worker; 0 on success (see _start)
    deps: Sequence[Any] = ()  # evaluations on other queues it waits for
    host_cause: BaseException | None = None  # a host callback's exception that failed it
    submitted_ns = 0  # time.monotonic_ns() when it took its place in the FIFO (the worker stamps its start)

    def __init__(self, queue: CommandQueue, future: JobFuture | TrioJobFuture, fn: Callable | None = None,
                 args: tuple = (), kwargs: dict | None = None, lazy: bool = False, result: Any = None):
        self.id = next(_job_ids)
        self.queue = queue
        self.future = future
        future._job = self
        if fn is not None:
            self.fn, self.args, self.kwargs = fn, args, kwargs or {}
        self.lazy = lazy
        if result is not None:
            self.result = result

    def run_python(self) -> int:
        """Body of a Python job, on the worker thread (holding the GIL)."""
        if self.cancelled:  # cancelled after the worker took it: never run it
            return lib.EMLX_DONE
        _running.job = self
        try:
            result = self.fn(*self.args, **self.kwargs)
            if asyncio.iscoroutine(result):
                result.close()
                raise InvalidArgumentType("queue.run() takes a plain callable; it returned a coroutine. "
                                          "Await async code on the event loop instead.")
            if not self.lazy:
                arrays = list(iter_arrays(result))
                if arrays:
                    try:
                        _interop.check_evaluable(arrays, "eval")  # a failed allocation would end the process
                        mx.eval(arrays)  # releases the GIL while MLX computes
                    except Exception as exc:  # noqa: BLE001 - the runtime's eval: MLX's error, our class
                        converted = mlx_error(exc)
                        if converted is exc:
                            raise
                        # From None: a host callback's exception becomes its cause (_with_host_cause).
                        raise converted from None
            self.result = result
            return lib.EMLX_DONE
        except BaseException as exc:  # noqa: BLE001 - re-raised on the loop with its traceback
            self.exception = exc
            return lib.EMLX_PY_FAILED
        finally:
            _running.job = None
            self.fn = self.args = self.kwargs = None


def _not_a_flag(where: str, name: str, value: Any) -> InvalidArgumentType:
    """A flag is a bool: 1 or "yes" would count as true, 0 or "" as false (as everywhere in the package)."""
    return InvalidArgumentType(f"[{where}] {name} must be True or False, got {value!r}")


@ffi.def_extern()
def emlx_python_job(context, job_id):
    queue: CommandQueue = ffi.from_handle(context)
    job = queue._channel.jobs.get(job_id)
    if job is None:
        return lib.EMLX_DONE
    return job.run_python()


# How each op's results reach Python (tuple, list or one array), from the op spec.
_OUTPUTS = {op.name: op.outputs for op in OPS}


def _publish(payload, targets: list[mx.array | None]) -> None:
    """Move a payload's arrays into mx.array objects (None: skip), freeing it; on the loop thread."""
    try:
        handles = [ffi.cast("void*", id(a)) if a is not None else ffi.NULL for a in targets]
    except BaseException:
        lib.emlx_payload_free(payload)
        raise
    ensure(lib.emlx_publish_results(payload, handles, len(targets)), "cannot publish results")


def _published(job: _Job, payload) -> Any:
    """An op job's results in mx.arrays: fresh ones, or the donated input objects.

    The payload is consumed whether this returns or raises.
    """
    try:
        count = lib.emlx_payload_size(payload)
        into = job.publish_into or {}
        arrays = [into[i] if i in into else mx.array(0) for i in range(count)]
    except BaseException:
        lib.emlx_payload_free(payload)
        raise
    _publish(payload, arrays)
    if into:
        return arrays[0]
    outputs = _OUTPUTS[job.op_name]  # only op jobs carry a payload
    if outputs == ARRAY or (count == 1 and outputs in (TUPLE_OR_ARRAY, LIST_OR_ARRAY)):
        return arrays[0]
    return arrays if outputs in (LIST, LIST_OR_ARRAY) else tuple(arrays)


def _settle_payload(job: _Job, payload, payload_kind: int) -> None:
    """A job that did not succeed: put donated arrays back into the caller's objects."""
    if payload == ffi.NULL:
        return
    if payload_kind == lib.EMLX_PAYLOAD_RESTORE:
        _publish(payload, list(job.donated))
    elif job.publish_into:  # it ran: the updated arrays go where the caller expects them
        count = lib.emlx_payload_size(payload)
        _publish(payload, [job.publish_into.get(i) for i in range(count)])
    else:
        lib.emlx_payload_free(payload)


def current_job() -> _Job | None:
    """The queue job running on this thread, if this is a worker thread inside one."""
    return getattr(_running, "job", None)


def cancelled() -> bool:
    """True inside a ``queue.run`` job whose awaiting task was cancelled.

    Long Python jobs may poll this and return early; the result is discarded
    anyway. Outside a job it is always False.
    """
    job = getattr(_running, "job", None)
    return bool(job is not None and job.cancelled)


@dataclass(frozen=True)
class QueueStats:
    """A snapshot of one queue's counters (``q.stats()``, ``rt.stats()``).

    Every submitted job ends in exactly one of ``completed`` (its awaiter got
    a result), ``failed`` (an exception, including ``QueueClosed`` for jobs a
    closing queue dropped) or ``cancelled`` (its awaiter gave up, whether or
    not it had started); ``in_flight`` are the rest. ``started`` counts jobs
    the worker ran, cancelled ones included. ``wait_time`` sums, over started
    jobs, the time from submission to the worker starting them (backlog,
    dependencies and the worker's FIFO); ``run_time`` the time the worker
    spent in them (timed on the worker thread). ``busy_fraction`` is
    ``run_time / uptime``. Times are in seconds.
    """

    name: str            # "cpu:3": device and stream index; "total" for the runtime's sum
    role: str            # "default", "callback", "pool", "distributed" (or "total")
    submitted: int
    started: int
    completed: int
    failed: int
    cancelled: int
    in_flight: int
    wait_time: float
    run_time: float
    uptime: float
    busy_fraction: float


class _Counters:
    """A queue's running counters; updated on the loop thread only, so no lock."""

    __slots__ = ("submitted", "started", "completed", "failed", "cancelled", "wait_ns", "run_ns",
                 "opened_ns", "closed_ns")

    def __init__(self) -> None:
        self.submitted = self.started = self.completed = self.failed = self.cancelled = 0
        self.wait_ns = self.run_ns = 0
        self.opened_ns = monotonic_ns()
        self.closed_ns = 0  # set when the queue hands its worker back

    def uptime_ns(self, now_ns: int) -> int:
        return (self.closed_ns or now_ns) - self.opened_ns

    def add(self, other: _Counters) -> None:
        """Add `other`'s job counts and times to these (totals over queues)."""
        self.submitted += other.submitted
        self.started += other.started
        self.completed += other.completed
        self.failed += other.failed
        self.cancelled += other.cancelled
        self.wait_ns += other.wait_ns
        self.run_ns += other.run_ns

    def snapshot(self, name: str, role: str, now_ns: int) -> QueueStats:
        uptime = self.uptime_ns(now_ns)
        return QueueStats(name=name, role=role, submitted=self.submitted, started=self.started,
                          completed=self.completed, failed=self.failed, cancelled=self.cancelled,
                          in_flight=self.submitted - self.completed - self.failed - self.cancelled,
                          wait_time=self.wait_ns / 1e9, run_time=self.run_ns / 1e9, uptime=uptime / 1e9,
                          busy_fraction=min(1.0, self.run_ns / uptime) if uptime > 0 else 0.0)


class CommandQueue:
    """A FIFO of jobs run on one OS thread that owns one MLX stream.

    Get queues from a Runtime (``rt.queue()``, ``rt.default_queue()``); they
    are pooled because MLX never frees a stream's thread.

    Jobs take their place in the FIFO when the method is called and run in
    that order; the returned awaitable gives the result. Many jobs may be in
    flight at once, up to ``max_pending`` on the worker; past it, jobs wait
    in order for a slot or, with ``nowait=True``, raise ``QueueFull`` at once.

    A queue garbage-collected without being closed (by ``close()``, or by
    its runtime's close) emits a ResourceWarning, with the creation
    traceback when the loop runs in debug mode, and hands its worker back.
    """

    _was_abandoned = False  # set by abandon() (the module's _abandoned lists the queues still held)

    def __init__(self, channel: CompletionChannel, device: mx.DeviceType, worker, *, max_pending: int,
                 role: str = "pool", owner: Any = None):
        self._channel = channel
        # Its runtime, held strongly: a job's future holds its queue, so a runtime
        # nobody else references still completes the jobs in flight (then gc warns).
        self._owner = owner
        self._backend = channel.backend
        self.device = device
        self._worker = worker
        self.stream_index: int = lib.emlx_worker_stream_index(worker)
        self.thread_id: int = lib.emlx_worker_thread_id(worker)
        self.max_pending = max_pending
        self._pending = 0  # slots held: jobs handed to the worker, not yet reported
        self._backlog: collections.deque[_Job] = collections.deque()  # submitted, not yet on the worker
        self._started: dict[int, _Job] = {}  # on the worker, in start (= run) order
        self._closing = False
        self._closed_future: asyncio.Future | None = None
        self._backlog_empty = None  # a future while close() waits for the backlog
        self._handle = ffi.new_handle(self)  # context for emlx_python_job
        self._addresses = _interop.AddressBuffer()  # the submit calls' input addresses
        self.role = role
        self._counters = _Counters()
        self._created_at = traceback.format_stack() if self._backend.debug() else None

    def __repr__(self) -> str:
        state = "closed" if self.closed else "closing" if self._closing else "open"
        return (f"<CommandQueue {self.device.name} stream={self.stream_index} "
                f"pending={self.pending} {state}>")

    @property
    def closed(self) -> bool:
        return self._worker is None

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet finished (running and waiting ones included)."""
        return self._pending + len(self._backlog)

    @property
    def name(self) -> str:
        """``device:stream index``, unique among this process's queues."""
        return f"{self.device.name}:{self.stream_index}"

    def stats(self) -> QueueStats:
        """This queue's counters now (see ``QueueStats``); cheap, no job is run."""
        return self._counters.snapshot(self.name, self.role, monotonic_ns())

    # ---- public jobs -------------------------------------------------------

    def run(self, fn: Callable[..., Any], /, *args: Any, lazy: bool = False,
            nowait: bool = False, **kwargs: Any) -> JobFuture:
        """Run ``fn(*args, **kwargs)`` on this queue's thread; await the result.

        MLX code in ``fn`` uses this queue's stream (it is the thread's default).
        Every ``mx.array`` in the result (any nesting of lists, tuples, dicts)
        is evaluated on the worker before the await completes, so it is safe
        to read anywhere. With ``lazy=True`` they stay unevaluated graphs owned
        by this queue: later jobs on this queue can extend them, and
        ``await ea.eval(x)`` materialises them here.

        Lazy array arguments are made usable first: graphs built on the event
        loop thread are evaluated there, graphs owned by another queue are
        evaluated on that queue (this job keeps its place in the FIFO and
        waits for them). An exception raised by ``fn`` is re-raised with its
        own type and traceback; the queue keeps working.

        Cancellation: see the module docstring; ``fn`` may poll ``ea.cancelled()``.

        Example:
            >>> y = await q.run(lambda a: (a @ a.T).sum(), x)
        """
        if not callable(fn):
            raise InvalidArgumentType(f"queue.run() needs a callable, got {type(fn).__name__}")
        if lazy is not False and lazy is not True:
            raise _not_a_flag("queue.run()", "lazy", lazy)
        self._check_open()
        job = _Job(self, self._backend.new_future(), fn, args, kwargs, lazy)
        job.start = lambda: lib.emlx_submit_python(self._worker, job.id, self._handle)
        return self._submit(job, nowait, list(iter_arrays((args, kwargs))))

    def eval(self, *arrays: mx.array, nowait: bool = False) -> JobFuture:
        """Evaluate arrays on this queue's thread, natively and without the GIL.

        The arrays must be evaluated already or lazy graphs owned by this queue
        (``ea.eval`` routes each array to its owner for you). Resolves to the
        single array, or a tuple of them.
        """
        self._check_open()
        for x in arrays:
            if type(x) is not _ARRAY:
                flat = list(iter_arrays(arrays))
                break
        else:  # the common call: arrays only
            flat = list(arrays)
        job = _Job(self, self._backend.new_future(), result=arrays[0] if len(arrays) == 1 else arrays)
        if not _interop.ZERO_COPY:  # pragma: no cover - layout fallback
            job.fn, job.args = (lambda *xs: mx.eval(list(xs))), tuple(flat)
            job.start = lambda: lib.emlx_submit_python(self._worker, job.id, self._handle)
            return self._submit(job, nowait, flat)
        job.start = lambda check_ready=0: lib.emlx_submit_eval(self._worker, job.id, self._addresses.of(flat),
                                                               len(flat), check_ready)
        return self._submit(job, nowait, flat, checks_inputs=True)

    def _submit_op(self, code: int, name: str, inputs: list[mx.array], ints: list[int], floats: list[float],
                   text: str, lazy: bool, nowait: bool, check_finite: bool,
                   donate: dict[int, int] | None = None, deps: list | None = None) -> JobFuture:
        """Submit native op `code` (see emlx_async/ops.py, which validates the arguments).

        `donate` maps an input index to the result index published back into
        that input object; `deps` are futures (on this or other queues) that
        must succeed before the op starts.
        """
        # Identity checks: every op call passes here, and the default costs one comparison.
        if lazy is not False and lazy is not True:
            raise _not_a_flag(name, "lazy", lazy)
        if check_finite is not False and check_finite is not True:
            raise _not_a_flag(name, "check_finite", check_finite)
        self._check_open()
        if not _interop.ZERO_COPY:  # pragma: no cover - layout fallback
            raise EMLXError("native ops need the zero-copy interop layer, which failed validation")
        job = _Job(self, self._backend.new_future(), lazy=lazy)
        job.op_name = name
        donated = ffi.NULL
        if donate:
            job.publish_into = {result: inputs[index] for index, result in donate.items()}
            job.donated = [inputs[index] for index in sorted(donate)]
            donated = ffi.new("unsigned char[]", len(inputs))
            for index in donate:
                donated[index] = 1
        # Most ops have no int or float parameters: no allocation for those.
        ints_c = ffi.new("int64_t[]", ints) if ints else _NULL
        floats_c = ffi.new("double[]", floats) if floats else _NULL
        text_c = text.encode() if text else b""

        def start(check_ready: int = 0) -> int:
            return lib.emlx_submit_op(self._worker, job.id, code, self._addresses.of(inputs), len(inputs),
                                      ints_c, len(ints), floats_c, len(floats), text_c, int(not lazy),
                                      int(check_finite), donated, check_ready)

        job.start = start
        return self._submit(job, nowait, inputs, deps, checks_inputs=True)

    def synchronize(self, *, nowait: bool = False) -> JobFuture:
        """Wait until all work queued on this queue's stream has finished."""
        self._check_open()
        job = _Job(self, self._backend.new_future())
        job.start = lambda: lib.emlx_submit_synchronize(self._worker, job.id)
        return self._submit(job, nowait, [])

    async def close(self, *, cancel_pending: bool = False) -> None:
        """Stop taking jobs, finish (or drop) the queued ones, release the thread.

        With ``cancel_pending=False`` queued jobs run first. With
        ``cancel_pending=True`` jobs not yet running are dropped (their
        awaiters get ``QueueClosed``) and only the running one finishes. The
        worker thread is handed back without blocking the loop; it parks with
        its stream for reuse, since MLX never frees a stream. Closing twice is
        harmless.
        """
        if self._closed_future is None:
            if self.closed:
                return
            self._closing = True
            self._closed_future = self._backend.new_future()
            if cancel_pending:
                self._drop_backlog()
            while self._backlog:  # drain: waiting jobs keep their place before the stop
                self._backlog_empty = self._backend.new_future()
                await shielded(lambda: self._backlog_empty)
                self._backlog_empty = None
            self._release_worker(cancel_pending)
        await shielded(lambda: self._closed_future)

    def abandon(self, error: BaseException, *, unawaited: bool = False) -> None:
        """Give up on a worker stuck in a job that may never end; on the loop thread.

        For a job blocked in native code that nothing can interrupt (a
        collective whose peer stalled). Every job of this queue, the running
        one included, fails with `error` at once; the queue closes without
        waiting; the worker takes no more jobs from it, is waited for by
        neither the runtime's close nor the interpreter's exit, and goes back
        to the pool (with its stream, which MLX never frees) when its job
        returns (its result is discarded). Donated inputs of
        jobs that never ran are not given back. Abandoning twice does nothing.
        `unawaited`: nobody can await these jobs any more (the loop's run is
        ending), so their failure is not reported as never retrieved.
        """
        jobs = [*self._started.values(), *self._backlog]
        self._started.clear()
        self._backlog.clear()
        self._was_abandoned = True
        self._owner = None  # kept in _abandoned until its worker is back: it must not keep its runtime
        if self._worker is not None:
            _drop_returned_abandoned()
            taken_back = self._channel.is_alive() and lib.emlx_worker_abandon(self._worker) == 0
            _abandoned.append((self, self._worker if taken_back else None))
            self._detach()
        for job in jobs:
            self._channel.jobs.pop(job.id, None)
            job.cancelled = True  # a queued Python job that still starts returns at once
            if not job.future.done():
                job.future.set_exception(error)
                if unawaited:
                    job.future.exception()  # marks it retrieved
        self._pending = 0
        for waiter in (self._backlog_empty, self._closed_future):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    # ---- machinery -----------------------------------------------------------

    _released_quietly = False  # see hand_back_now

    def hand_back_now(self, *, quietly: bool) -> None:
        """Hand the worker back, its queued jobs dropped, from any thread and without the
        loop (the runtime was collected, or its loop closed). `quietly`: its runtime answers
        for it, so it is not reported as unclosed when collected."""
        if self._worker is not None and not self._closing:
            lib.emlx_worker_release(self._worker, next(_job_ids), 1)
            self._worker = None
        self._released_quietly = self._released_quietly or quietly

    def __del__(self, _warn=warnings.warn) -> None:
        # Closed means close() began (the runtime's close calls it) or the
        # queue was abandoned; a worker handed back by a collected runtime
        # does not count, so each unclosed queue warns, in any order.
        if getattr(self, "_closed_future", True) is not None or self._was_abandoned or self._released_quietly:
            return
        channel = self._channel
        if exiting() or os.getpid() != channel.pid:  # workers are gone (exit) or not ours (fork)
            return
        worker, self._worker = self._worker, None
        if worker is not None and channel.is_alive():  # drop its queued jobs, park the thread
            lib.emlx_worker_release(worker, next(_job_ids), 1)
        where = "".join(self._created_at) if self._created_at else ""
        _warn(f"unclosed emlx_async queue {self!r}; close its runtime (`async with ea.Runtime()`) or give it "
              f"back (`async with rt.queue()`){(chr(10) + 'created at:' + chr(10) + where) if where else ''}",
              ResourceWarning, source=self)

    def _release_worker(self, drop_pending: bool) -> None:
        stop = _Job(self, self._backend.new_future())
        stop.future.add_done_callback(self._stopped)
        if self._channel.is_alive() and self._worker is not None:  # None: abandoned meanwhile
            self._channel.jobs[stop.id] = stop
            if lib.emlx_worker_release(self._worker, stop.id, int(drop_pending)) == 0:
                return
            self._channel.jobs.pop(stop.id, None)
        self._detach()
        stop.future.set_result(None)

    def _stopped(self, _future) -> None:
        if not self._closed_future.done():
            self._closed_future.set_result(None)

    def _drop_backlog(self) -> None:
        while self._backlog:
            job = self._backlog.popleft()
            if not job.future.done():
                self._counters.failed += 1
                job.future.set_exception(QueueClosed("the queue was closed before this job ran; it never ran"))

    def _check_open(self) -> None:
        channel = self._channel
        if self._closing or self._worker is None or not channel.is_alive():  # the rare case: say which
            if os.getpid() == channel.pid and (self._closing or self._worker is None):
                raise QueueClosed(f"{self!r} is closed")
            channel.ensure_alive()  # fork, interpreter exit, closed runtime
        if not self._backend.is_current():
            raise EMLXError("CommandQueue used outside its runtime's event loop thread")

    def _submit(self, job: _Job, nowait: bool, inputs: list[mx.array],
                deps: list | None = None, checks_inputs: bool = False) -> JobFuture:
        """Give `job` its place in the FIFO; start it now if nothing is ahead of it.

        `checks_inputs`: the job's native submit can check that its inputs
        are usable on the worker (``start(1)``), so the common case, nothing
        ahead and nothing to prepare, costs one native call.
        """
        if host_call_blocking.get() is self:
            raise HostCallDeadlock(
                f"a host callback awaited {self!r}, whose worker is waiting for that same callback; "
                "do the callback's MLX work through ea.* ops (they use the callback queue) or another queue")
        full = self._pending >= self.max_pending
        if nowait is not False:
            if nowait is not True:
                raise _not_a_flag(job.op_name or "queue", "nowait", nowait)
            if full or self._backlog:
                raise QueueFull(f"{self!r} has {self.pending} jobs in flight (max_pending="
                                f"{self.max_pending}); retry later or submit without nowait")
        if checks_inputs and not (full or deps or self._backlog):
            self._counters.submitted += 1
            job.submitted_ns = monotonic_ns()
            if self._start(job, 1):
                return job.future
            self._counters.submitted -= 1  # an input needs preparing: the general path below
        waits = prepare_inputs(self._channel, inputs, self) if inputs else []
        if deps:
            waits = [*deps, *waits]
        job.deps = waits
        self._counters.submitted += 1
        job.submitted_ns = monotonic_ns()
        if self._backlog or full or (waits and any(not d.done() for d in waits)):
            self._backlog.append(job)
            for dep in job.deps:
                if not dep.done():
                    dep.add_done_callback(self._pump)
            return job.future
        self._start(job)
        return job.future

    def _pump(self, _done_dependency=None) -> None:
        """Start backlog jobs from the head while they are ready and slots are free.

        Also a done-callback of the futures backlog jobs depend on.
        """
        while self._backlog and self._pending < self.max_pending:
            job = self._backlog[0]
            if job.future.done():  # cancelled while waiting
                self._backlog.popleft()
                continue
            if any(not d.done() for d in job.deps):
                break
            self._backlog.popleft()
            self._start(job)
        if not self._backlog and self._backlog_empty is not None and not self._backlog_empty.done():
            self._backlog_empty.set_result(None)

    def _start(self, job: _Job, check_ready: int = 0) -> bool:
        """Hand `job` to the worker (its dependencies are done).

        With `check_ready` (see ``_submit``) it returns False, having changed
        nothing, when the native submit found an input that needs preparing;
        otherwise True: the job started or failed.
        """
        for dep in job.deps:
            error = QueueClosed("a lazy input's evaluation was cancelled") if dep.cancelled() else dep.exception()
            if error is not None:
                self._counters.failed += 1
                job.future.set_exception(error)
                return True
        job.deps = ()
        if self._worker is None:
            self._counters.failed += 1
            job.future.set_exception(QueueClosed(f"{self!r} is closed; the job never ran"))
            return True
        jobs = self._channel.jobs
        jobs[job.id] = job
        self._pending += 1
        start = job.start
        try:
            status = start(check_ready) if check_ready else start()
            refused = native_call_error(f"{self!r} refused the job") if status < 0 else None
        except BaseException as exc:  # noqa: BLE001 - this job fails; the queue goes on
            status, refused = -1, exc
        if status == 1:  # not queued: an input needs preparing first
            del jobs[job.id]
            self._pending -= 1
            return False
        job.start = None  # the closure refers to the job: no cycle left behind
        if refused is not None:
            if isinstance(refused, RuntimeClosed):  # the worker is stopping: this queue is closing
                refused = QueueClosed(str(refused))
            del jobs[job.id]
            self._pending -= 1
            self._counters.failed += 1
            job.future.set_exception(refused)
            return True
        self._started[job.id] = job
        return True

    def _on_cancel(self, job: _Job) -> None:
        """The job's future was cancelled (on the loop thread)."""
        self._counters.cancelled += 1
        if job.id not in self._channel.jobs:  # still in the backlog, or finished
            if job in self._backlog:
                self._backlog.remove(job)
                self._pump()
            return
        restored = ffi.new("void**")
        dropped = False
        if self._worker is not None and self._channel.is_alive():  # never raise from cancel()
            dropped = lib.emlx_cancel(self._worker, job.id, restored) == 1
        if dropped:
            del self._channel.jobs[job.id]  # dropped before it started
            self._started.pop(job.id, None)
            _settle_payload(job, restored[0], lib.EMLX_PAYLOAD_RESTORE)
            self._release_slot()
        else:
            job.cancelled = True  # running: its record arrives later and is discarded
            server = self._channel.host_server
            if server is not None:
                server.cancel_for(self)  # unblock a worker waiting on a callback

    def _release_slot(self) -> None:
        self._pending -= 1
        self._pump()

    def running_job(self) -> _Job | None:
        """The job the worker runs now (the oldest one started), if any."""
        return next(iter(self._started.values()), None)

    def _finish(self, job: _Job, status: int, error_kind: int, message: str | None, payload=ffi.NULL,
                payload_kind: int = 0, started_ns: int = 0, finished_ns: int = 0) -> None:
        """Called by the channel's drain on the loop thread for this queue's record."""
        if status == _STOPPED:
            self._detach()
            if not job.future.done():
                job.future.set_result(None)
            return
        self._started.pop(job.id, None)
        counters = self._counters
        if started_ns:  # 0: dropped before it started
            counters.started += 1
            counters.wait_ns += started_ns - job.submitted_ns
            counters.run_ns += finished_ns - started_ns
        self._pending -= 1
        if self._backlog or self._backlog_empty is not None:  # _release_slot, without the call when idle
            self._pump()
        future = job.future
        future._job = None  # break the future <-> job cycle: a dropped result is freed at once
        publish_error = None
        if payload == _NULL:  # no arrays to publish or give back
            result = job.result
        else:
            try:
                if status == _DONE:
                    result = _published(job, payload)  # also when abandoned: donated arrays get their update
                else:
                    result = job.result
                    _settle_payload(job, payload, payload_kind)
            except Exception as exc:  # noqa: BLE001 - this job fails, not the drain
                result, publish_error = None, exc
            job.publish_into = None
            job.donated = ()
        job.result = None
        if future.done():
            return  # abandoned by a cancelled awaiter (counted as cancelled then)
        if status == _DONE and publish_error is None:
            counters.completed += 1
            future.set_result(result)
            return
        counters.failed += 1
        if publish_error is not None:
            future.set_exception(publish_error)
        elif status == lib.EMLX_PY_FAILED:
            exc, job.exception = job.exception, None
            exc = exc if exc is not None else EMLXError("Python job failed")
            future.set_exception(self._with_host_cause(job, exc))
        elif status == lib.EMLX_DROPPED:
            future.set_exception(QueueClosed("the queue was closed before this job ran; it never ran"))
        else:
            exc = native_error(error_kind, message or "unknown MLX error")
            future.set_exception(self._with_host_cause(job, exc))

    @staticmethod
    def _with_host_cause(job: _Job, exc: BaseException) -> BaseException:
        """Chain the host callback's own exception (carried by identity) onto the error it caused.

        Under trio a callback's KeyboardInterrupt or SystemExit is raised
        itself: its system task cannot raise it, so the awaiter passes it on
        (asyncio's loop already ended its run with it; see _host_call).
        """
        cause, job.host_cause = job.host_cause, None
        if isinstance(cause, (KeyboardInterrupt, SystemExit)) and isinstance(job.future, TrioJobFuture):
            return cause
        if cause is not None and exc.__cause__ is None and exc is not cause:
            exc.__cause__ = cause
        return exc

    def _detach(self) -> None:
        if not self._counters.closed_ns:
            self._counters.closed_ns = monotonic_ns()
        self._worker = None
        self._closing = True
        remove_owner(self._channel.owners, self)
