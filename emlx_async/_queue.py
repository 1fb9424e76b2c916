"""CommandQueue: an actor over one native worker thread and its MLX stream.

Every job goes through ``_submit``: it takes a slot (backpressure), registers
the job with the runtime, and hands it to the worker. The worker reports on
the runtime's completion channel; ``Runtime._drain`` calls ``_finish``.

Cancellation contract (the same for every kind of job):

* A job still queued when its awaiting task is cancelled is removed from the
  worker's queue and never runs.
* A job already running cannot be interrupted. The awaiting task is released
  at once with ``CancelledError``; the job runs to the end, in queue order,
  and its result is discarded. Its backpressure slot is held until then,
  because the worker really is busy. Python jobs can poll ``ea.cancelled()``
  to stop early.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from . import _interop
from ._errors import EMLXError, ForkedProcessError, QueueClosed, QueueFull, native_error
from ._native import ffi, lib
from ._trees import iter_arrays

if TYPE_CHECKING:
    from ._runtime import Runtime

_job_ids = itertools.count(1)

# The job a worker thread is running now, for ea.cancelled().
_running = threading.local()


class JobFuture(asyncio.Future):
    """The awaitable a job returns: an asyncio.Future whose ``cancel()`` acts at once.

    A plain future runs its done-callbacks on a later loop iteration, by which
    time the worker may have started the job; cancelling here removes a queued
    job from the worker before ``cancel()`` returns. Like ``run_in_executor``,
    it is a Future, not a coroutine: use ``asyncio.ensure_future`` (not
    ``create_task``) to hold it as a task.
    """

    _job: _Job | None = None

    def cancel(self, msg: Any = None) -> bool:
        if not super().cancel(msg):
            return False
        job, self._job = self._job, None
        if job is not None:
            job.queue._on_cancel(job)
        return True


class _Job:
    __slots__ = ("id", "queue", "future", "fn", "args", "kwargs", "lazy", "result", "exception", "cancelled",
                 "op_name", "publish_into")

    def __init__(self, queue: CommandQueue, future: JobFuture, fn: Callable | None = None,
                 args: tuple = (), kwargs: dict | None = None, lazy: bool = False, result: Any = None):
        self.id = next(_job_ids)
        self.queue = queue
        self.future = future
        future._job = self
        self.fn = fn
        self.args = args
        self.kwargs = kwargs or {}
        self.lazy = lazy
        self.result = result  # what the future resolves to on success
        self.exception: BaseException | None = None
        self.cancelled = False  # set on the loop when the awaiting task gave up
        self.op_name: str | None = None  # native op jobs: their results arrive as a payload
        self.publish_into: dict[int, mx.array] | None = None  # result index -> donated input object

    def run_python(self) -> int:
        """Body of a Python job, on the worker thread (holding the GIL)."""
        if self.cancelled:  # cancelled after the worker took it: never run it
            return lib.EMLX_DONE
        _running.job = self
        try:
            result = self.fn(*self.args, **self.kwargs)
            if asyncio.iscoroutine(result):
                result.close()
                raise TypeError("queue.run() takes a plain callable; it returned a coroutine. "
                                "Await async code on the event loop instead.")
            if not self.lazy:
                arrays = list(iter_arrays(result))
                if arrays:
                    mx.eval(arrays)  # releases the GIL while MLX computes
            self.result = result
            return lib.EMLX_DONE
        except BaseException as exc:  # noqa: BLE001 - re-raised on the loop with its traceback
            self.exception = exc
            return lib.EMLX_PY_FAILED
        finally:
            _running.job = None
            self.fn = self.args = self.kwargs = None


@ffi.def_extern()
def emlx_python_job(context, job_id):
    queue: CommandQueue = ffi.from_handle(context)
    job = queue._runtime._jobs.get(job_id)
    if job is None:
        return lib.EMLX_DONE
    return job.run_python()


# Ops whose results are a tuple (split: a list), as in mlx.core.
_MULTI_OUTPUT = {"split", "kv_cache_attention", "linalg_qr", "linalg_svd", "linalg_lu", "linalg_eigh", "quantize"}


def _published(job: _Job, payload) -> Any:
    """An op job's results in mx.arrays, set here on the loop thread: fresh
    placeholders, or the donated input objects the job returns into."""
    count = lib.emlx_payload_size(payload)
    into = job.publish_into or {}
    arrays = [into.get(i) if i in into else mx.array(0) for i in range(count)]
    lib.emlx_publish_results(payload, [ffi.cast("void*", id(a)) for a in arrays], count)
    if into:
        return arrays[0]
    if job.op_name not in _MULTI_OUTPUT or (job.op_name == "linalg_svd" and count == 1):
        return arrays[0]
    return arrays if job.op_name == "split" else tuple(arrays)


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


class CommandQueue:
    """A FIFO of jobs run on one OS thread that owns one MLX stream.

    Get queues from a Runtime (``rt.queue()``, ``rt.default_queue()``); they
    are pooled because MLX never frees a stream's thread.

    Jobs are submitted when the method is called and run in submission order;
    the returned awaitable gives the result. Many jobs may be in flight at
    once, up to ``max_pending``; past it, callers wait for a slot or, with
    ``nowait=True``, get ``QueueFull`` at once.
    """

    def __init__(self, runtime: Runtime, device: mx.DeviceType, worker, *, max_pending: int):
        self._runtime = runtime
        self._loop = runtime._loop
        self._pid = runtime._pid
        self.device = device
        self._worker = worker
        self.stream_index: int = lib.emlx_worker_stream_index(worker)
        self.thread_id: int = lib.emlx_worker_thread_id(worker)
        self.max_pending = max_pending
        self._pending = 0  # slots held: submitted jobs not yet reported
        self._slot_waiters: collections.deque[asyncio.Future] = collections.deque()
        self._closing = False
        self._closed_future: asyncio.Future | None = None
        self._handle = ffi.new_handle(self)  # context for emlx_python_job

    def __repr__(self) -> str:
        state = "closed" if self.closed else "closing" if self._closing else "open"
        return (f"<CommandQueue {self.device.name} stream={self.stream_index} "
                f"pending={self._pending} {state}>")

    @property
    def closed(self) -> bool:
        return self._worker is None

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet finished (running ones included)."""
        return self._pending

    # ---- public jobs -------------------------------------------------------

    def run(self, fn: Callable[..., Any], /, *args: Any, lazy: bool = False,
            nowait: bool = False, **kwargs: Any) -> asyncio.Future:
        """Run ``fn(*args, **kwargs)`` on this queue's thread; await the result.

        MLX code in ``fn`` uses this queue's stream (it is the thread's default).
        Every ``mx.array`` in the result (any nesting of lists, tuples, dicts)
        is evaluated on the worker before the await completes, so it is safe
        to read anywhere. With ``lazy=True`` they stay unevaluated graphs owned
        by this queue: later jobs on this queue can extend them, and
        ``await ea.eval(x)`` materialises them here.

        Lazy array arguments are made usable first: graphs built on the event
        loop thread are evaluated there, graphs owned by another queue are
        evaluated on that queue. An exception raised by ``fn`` is re-raised
        with its own type and traceback; the queue keeps working.

        Cancellation: see the module docstring; ``fn`` may poll ``ea.cancelled()``.

        Example:
            >>> y = await q.run(lambda a: (a @ a.T).sum(), x)
        """
        if not callable(fn):
            raise TypeError(f"queue.run() needs a callable, got {type(fn).__name__}")
        self._check_open()
        future = JobFuture(loop=self._loop)
        job = _Job(self, future, fn, args, kwargs, lazy)
        inputs = list(iter_arrays((args, kwargs)))
        return self._submit(job, lambda: lib.emlx_submit_python(self._worker, job.id, self._handle),
                            nowait, inputs)

    def eval(self, *arrays: mx.array, nowait: bool = False) -> asyncio.Future:
        """Evaluate arrays on this queue's thread, natively and without the GIL.

        The arrays must be evaluated already or lazy graphs owned by this queue
        (``ea.eval`` routes each array to its owner for you). Resolves to the
        single array, or a tuple of them.
        """
        self._check_open()
        future = JobFuture(loop=self._loop)
        flat = list(iter_arrays(arrays))
        job = _Job(self, future, result=arrays[0] if len(arrays) == 1 else arrays)
        if not _interop.ZERO_COPY:  # pragma: no cover - layout fallback
            job.fn, job.args = (lambda *xs: mx.eval(list(xs))), tuple(flat)
            return self._submit(job, lambda: lib.emlx_submit_python(self._worker, job.id, self._handle),
                                nowait, flat)

        def start() -> int:
            return lib.emlx_submit_eval(self._worker, job.id, _interop.handles(flat), len(flat))

        return self._submit(job, start, nowait, flat)

    def _submit_op(self, code: int, name: str, inputs: list[mx.array], ints: list[int], floats: list[float],
                   text: str, lazy: bool, nowait: bool, check_finite: bool,
                   donate: dict[int, int] | None = None) -> asyncio.Future:
        """Submit native op `code` (see emlx_async/ops.py, which validates the arguments)."""
        self._check_open()
        if not _interop.ZERO_COPY:  # pragma: no cover - layout fallback
            raise EMLXError("native ops need the zero-copy interop layer, which failed validation")
        job = _Job(self, JobFuture(loop=self._loop), lazy=lazy)
        job.op_name = name
        # donate: input index -> result index that is published back into that input object
        mask = 0
        if donate:
            job.publish_into = {result: inputs[index] for index, result in donate.items()}
            for index in donate:
                mask |= 1 << index

        def start() -> int:
            return lib.emlx_submit_op(
                self._worker, job.id, code, _interop.handles(inputs), len(inputs),
                ffi.new("int64_t[]", ints), len(ints), ffi.new("double[]", floats), len(floats),
                text.encode(), int(not lazy), int(check_finite), mask)

        return self._submit(job, start, nowait, inputs)

    def synchronize(self, *, nowait: bool = False) -> asyncio.Future:
        """Wait until all work queued on this queue's stream has finished."""
        self._check_open()
        job = _Job(self, JobFuture(loop=self._loop))
        return self._submit(job, lambda: lib.emlx_submit_synchronize(self._worker, job.id), nowait, [])

    async def close(self, *, cancel_pending: bool = False) -> None:
        """Stop taking jobs, finish (or drop) the queued ones, release the thread.

        With ``cancel_pending=False`` queued jobs run first. With
        ``cancel_pending=True`` queued jobs are dropped (their awaiters get
        ``QueueClosed``) and only the running one finishes. The worker thread
        is handed back without blocking the loop; it parks with its stream for
        reuse, since MLX never frees a stream. Closing twice is harmless.
        """
        if self._closed_future is None:
            if self.closed:
                return
            self._closing = True
            for waiter in self._slot_waiters:
                if not waiter.done():
                    waiter.set_exception(QueueClosed("queue closed while waiting for a free slot"))
            self._slot_waiters.clear()
            stop = _Job(self, JobFuture(loop=self._loop))
            self._closed_future = stop.future
            self._runtime._jobs[stop.id] = stop
            if lib.emlx_worker_release(self._worker, stop.id, int(cancel_pending)) != 0:
                self._runtime._jobs.pop(stop.id, None)
                self._closed_future.set_result(None)
                self._detach()
        await asyncio.shield(self._closed_future)

    # ---- machinery -----------------------------------------------------------

    def _check_open(self) -> None:
        if os.getpid() != self._pid:
            raise ForkedProcessError(
                "this queue's runtime was created in another process; worker threads do not "
                "survive fork(), so create a new Runtime in the child")
        if self._closing or self._worker is None:
            raise QueueClosed(f"{self!r} is closed")
        if self._runtime._loop_is_not_running_here():
            raise EMLXError("CommandQueue used outside its runtime's event loop thread")

    def _submit(self, job: _Job, start: Callable[[], int], nowait: bool,
                inputs: list[mx.array]) -> asyncio.Future:
        self._runtime._host_server.check_not_blocking(self)
        foreign = self._runtime._prepare_inputs(inputs, self)
        if foreign or self._slot_waiters or self._pending >= self.max_pending:
            if nowait and not foreign:
                raise QueueFull(f"{self!r} has {self._pending} jobs in flight (max_pending="
                                f"{self.max_pending}); retry later or submit without nowait")
            return self._loop.create_task(self._submit_later(job, start, foreign))
        self._pending += 1
        return self._start(job, start)

    async def _submit_later(self, job: _Job, start: Callable[[], int],
                            foreign: list[asyncio.Future]) -> Any:
        if foreign:  # lazy inputs owned by other queues: materialise them there
            await asyncio.gather(*foreign)
        if self._slot_waiters or self._pending >= self.max_pending:
            waiter = self._loop.create_future()
            self._slot_waiters.append(waiter)
            try:
                await waiter  # resolves holding a slot handed over by _release_slot
            except asyncio.CancelledError:
                if waiter in self._slot_waiters:
                    self._slot_waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._release_slot()  # we were handed a slot; pass it on
                raise
        else:
            self._pending += 1
        self._check_open_or_release()
        return await self._start(job, start)

    def _check_open_or_release(self) -> None:
        try:
            self._check_open()
        except BaseException:
            self._release_slot()
            raise

    def _start(self, job: _Job, start: Callable[[], int]) -> asyncio.Future:
        jobs = self._runtime._jobs
        jobs[job.id] = job
        if start() != 0:
            del jobs[job.id]
            self._release_slot()
            raise QueueClosed(f"{self!r} is closing")
        return job.future

    def _on_cancel(self, job: _Job) -> None:
        """The job's future was cancelled (on the loop thread)."""
        if job.id not in self._runtime._jobs:
            return  # not submitted yet (waiting for a slot), or already finished
        if self._worker is not None and lib.emlx_cancel(self._worker, job.id):
            del self._runtime._jobs[job.id]  # dropped before it started
            self._release_slot()
        else:
            job.cancelled = True  # running: its record arrives later and is discarded
            self._runtime._host_server.cancel_for(self)  # unblock a worker waiting on a callback

    def _release_slot(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # hand the slot over; _pending is unchanged
                return
        self._pending -= 1

    def _finish(self, job: _Job, status: int, error_kind: int, message: str | None, payload=ffi.NULL) -> None:
        """Called by Runtime._drain on the loop thread for this queue's record."""
        if status == lib.EMLX_STOPPED:
            self._detach()
            if not job.future.done():
                job.future.set_result(None)
            return
        self._release_slot()
        future = job.future
        if future.done():
            if payload != ffi.NULL:
                lib.emlx_payload_free(payload)
            return  # abandoned by a cancelled awaiter
        if status == lib.EMLX_DONE:
            future.set_result(_published(job, payload) if payload != ffi.NULL else job.result)
        elif status == lib.EMLX_PY_FAILED:
            exc, job.exception = job.exception, None
            exc = exc if exc is not None else EMLXError("Python job failed")
            future.set_exception(self._with_host_cause(exc, str(exc)))
        elif status == lib.EMLX_DROPPED:
            future.set_exception(QueueClosed("the queue was closed before this job ran; it never ran"))
        else:
            exc = native_error(error_kind, message or "unknown MLX error")
            future.set_exception(self._with_host_cause(exc, message))

    def _with_host_cause(self, exc: BaseException, message: str | None) -> BaseException:
        """Chain the host callback's own exception onto the graph error it caused."""
        cause = self._runtime._host_server.cause_for(message)
        if cause is not None and exc.__cause__ is None:
            exc.__cause__ = cause
        return exc

    def _detach(self) -> None:
        self._worker = None
        self._closing = True
        self._runtime._forget_queue(self)
