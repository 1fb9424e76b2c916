"""The event-loop backends: asyncio (and uvloop) or trio, behind one small face.

Everything the runtime needs from a loop lives here: watching the completion
fd, the future a job returns, starting a background task, and telling which
loop is running. ``current()`` picks the backend of the running async
library (sniffio, as anyio does). Everything above this module is
backend-neutral.

Cancellation follows each library's semantics:

* asyncio: ``JobFuture`` is an ``asyncio.Future``; a task awaiting it that is
  cancelled cancels it (asyncio's own rule), and ``cancel()`` acts on the job
  at once.
* trio: ``TrioJobFuture.__await__`` parks the task with
  ``wait_task_rescheduled``; when the task's cancel scope fires, the abort
  callback cancels the job (a queued job is dropped, a running one is
  abandoned), exactly the asyncio contract, level-triggered. Other tasks
  awaiting that job get ``CancelledJob`` (an ``EMLXError``) where asyncio's
  get ``CancelledError``.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import sniffio

from ._errors import CancelledJob, InvalidState, RuntimeClosed


_T = TypeVar("_T")


class _CoroutineFace:
    """Lets a job's future pass where a coroutine is expected.

    trio's ``nursery.start_soon(q.run, fn)``, anyio's task groups and
    ``asyncio.create_task(q.run(fn))`` call the function and insist on a
    coroutine back (``collections.abc.Coroutine``: ``send``, ``throw``,
    ``close``, ``__await__``). The job was submitted by that call, so its
    place in the queue is fixed there; driving this "coroutine" only awaits
    the future (the ``__await__`` iterator, made on the first ``send``).
    """

    _driver: Any = None

    def _drive(self) -> Any:
        if self._driver is None:
            self._driver = self.__await__()  # type: ignore[attr-defined]
        return self._driver

    def send(self, value: Any) -> Any:
        return self._drive().send(value)

    def throw(self, exc: Any, *rest: Any) -> Any:
        if self._driver is None and not self.done():  # type: ignore[attr-defined]
            # The task holding it was cancelled before its first step: the job
            # follows its awaiter, as it would had the task been waiting.
            self.cancel()  # type: ignore[attr-defined]
        return self._drive().throw(exc, *rest)

    def close(self) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.close()


class JobFuture(_CoroutineFace, asyncio.Future[_T]):  # generic, so ops can say JobFuture[mx.array]
    """The awaitable a job returns under asyncio: an asyncio.Future whose ``cancel()`` acts at once.

    A plain future runs its done-callbacks on a later loop iteration, by which
    time the worker may have started the job; cancelling here removes a queued
    job from the worker before ``cancel()`` returns. It is also accepted as a
    coroutine, so ``asyncio.create_task(q.run(fn))``, ``asyncio.ensure_future``
    and anyio's ``tg.start_soon(q.run, fn)`` all work; the job's place in the
    queue is fixed when ``q.run`` is called, not when the task starts.
    """

    _job: Any = None

    def cancel(self, msg: Any = None) -> bool:
        if not super().cancel(msg):
            return False
        job, self._job = self._job, None
        if job is not None:
            job.queue._on_cancel(job)
        return True


_PENDING, _DONE, _CANCELLED = 0, 1, 2
_INFINITY = float("inf")

_trio: Any = None  # the trio module, imported by the first TrioBackend (trio is optional)


class TrioJobFuture(_CoroutineFace):
    """The awaitable a job returns under trio: a one-shot result with asyncio.Future's surface.

    Await it from any number of trio tasks. Done-callbacks run when it
    settles. A waiting task that is cancelled cancels the job for every
    awaiter, as under asyncio (see the module docstring): that task gets
    ``trio.Cancelled`` in the usual way, and any other task awaiting it, then
    or later, gets ``ea.CancelledJob`` (as do ``result()`` and ``exception()``),
    where asyncio's would get ``CancelledError``.
    It is also accepted as a coroutine: ``nursery.start_soon(q.run, fn)``
    submits the job at that call and the new task awaits it.
    """

    # Class defaults: a job's future is made per submission, and most never
    # get a callback, a second waiter or an exception.
    _job: Any = None
    _state = _PENDING
    _result: Any = None
    _exception: BaseException | None = None
    _callbacks: list[Callable[[Any], None]] | None = None
    _waiters: list[Any] | None = None  # parked trio tasks
    _retrieved = False
    _wake: _TrioWakeFd | None = None  # the runtime's second completion fd, set by TrioBackend.new_future

    # -- the asyncio.Future surface the runtime uses --------------------------
    def done(self) -> bool:
        return self._state != _PENDING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def result(self) -> Any:
        if self._state == _CANCELLED:
            raise _cancelled_job()
        if self._state == _PENDING:
            raise asyncio.InvalidStateError("result is not set")
        self._retrieved = True
        if self._exception is not None:
            raise self._exception
        return self._result

    def exception(self) -> BaseException | None:
        if self._state == _CANCELLED:
            raise _cancelled_job()
        if self._state == _PENDING:
            raise asyncio.InvalidStateError("exception is not set")
        self._retrieved = True
        return self._exception

    def set_result(self, value: Any) -> None:
        self._settle(_DONE, value, None)

    def set_exception(self, exc: BaseException) -> None:
        self._settle(_DONE, None, exc)

    def awaited(self) -> bool:
        """Whether a task waits on it now."""
        return bool(self._waiters) or (self._wake is not None and self._wake.future is self)

    def add_done_callback(self, fn: Callable[[Any], None], *, context: Any = None) -> None:
        if self.done():
            fn(self)
        elif self._callbacks is None:
            self._callbacks = [fn]
        else:
            self._callbacks.append(fn)

    def cancel(self, msg: Any = None) -> bool:
        if self.done():
            return False
        self._settle(_CANCELLED, None, None)
        job, self._job = self._job, None
        if job is not None:
            job.queue._on_cancel(job)
        return True

    def _settle(self, state: int, value: Any, exc: BaseException | None) -> None:
        if self.done():
            raise asyncio.InvalidStateError("the future is already done")
        self._state, self._result, self._exception = state, value, exc
        if self._wake is not None:
            self._wake.settled(self)
        waiters, self._waiters = self._waiters, None
        if waiters:
            reschedule = _trio.lowlevel.reschedule
            for task in waiters:
                reschedule(task)
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for fn in callbacks:
                fn(self)

    def __await__(self):
        if not self.done():
            wake = self._wake
            if wake is not None and wake.free():
                try:
                    yield from wake.wait_for(self).__await__()
                except BaseException:
                    self.cancel()  # the job follows its awaiter (nothing happens if it is done)
                    raise
        if not self.done():
            trio = _trio
            task = trio.lowlevel.current_task()
            if self._waiters is None:
                self._waiters = [task]
            else:
                self._waiters.append(task)

            def abort(_raise_cancel):
                if self._waiters is not None and task in self._waiters:
                    self._waiters.remove(task)
                self.cancel()  # the job follows its awaiter: dropped if queued, abandoned if running
                return trio.lowlevel.Abort.SUCCEEDED

            yield from trio.lowlevel.wait_task_rescheduled(abort).__await__()
        return self.result()


def _cancelled_job() -> CancelledJob:
    # Not asyncio.CancelledError: in a trio task that was not cancelled it would read as a crash.
    return CancelledJob("the job was cancelled (by cancel(), or because a task awaiting it was cancelled)")


class _TrioWakeFd:
    """A second fd on a runtime's completion channel, for one awaiting trio task at a time.

    trio has no fd callbacks: a watcher task waits on the channel's fd and
    drains it, and the awaiting task it reschedules runs in the next batch of
    trio's run loop, one more turn than asyncio's reader callback (about 4 us
    of the round trip here). trio lets only one task wait on an fd, so one
    awaiting task at a time waits on a duplicate of it instead and drains the
    channel itself: it resumes in the batch the record woke it in. While it
    waits, the watcher parks off the fd (were both waiting, both would wake
    for each record, and half the time trio would run the watcher's step
    first), and it is woken when the task stops waiting. Other tasks awaiting
    meanwhile park as before and are woken by its drain. A future settled
    other than by that task's drain (a cancel from another task, a queue's
    close) signals the channel, so the waiting task wakes and sees it.

    When that task stops waiting with no job left in flight, the watcher stays
    parked: in a loop of awaited round trips, the watcher's step after each
    one (about 2 us, and in the way of the next record's drain) is saved. A
    job submitted meanwhile arms the park's deadline, `LINGER_S` on: if no
    task has waited on the fd by then, the watcher watches it again, so a
    completion nobody awaits (a job's done-callbacks, a host call of an
    unawaited job) is read within that time instead of at once.
    """

    LINGER_S = 0.005

    def __init__(self, trio: Any, fd: int, drain: Callable[[], None], signal: Callable[[], None],
                 in_flight: Callable[[], bool]):
        self._trio = trio
        self.fd = os.dup(fd)  # not inherited by child processes (os.dup's default)
        self._drain = drain
        self._signal = signal
        self._in_flight = in_flight
        self._park_scope: Any = None  # the parked watcher's deadline scope
        self._context = contextvars.copy_context()  # the drain runs where the watcher's would
        self.future: TrioJobFuture | None = None  # the one a task waits for here
        self._draining = False
        self._closed = False
        self._parked_watcher: Any = None  # the watcher task, while it leaves the fd to a waiting task

    def free(self) -> bool:
        return self.future is None and not self._closed

    async def wait_for(self, future: TrioJobFuture) -> None:
        """Wait until `future` is done, draining the channel whenever it is readable.

        Returns early, the future not done, when the channel closes; the
        caller then parks as usual. Raises trio's cancellation as is.
        """
        trio = self._trio
        self.future = future
        try:
            while not future.done():
                try:
                    await trio.lowlevel.wait_readable(self.fd)
                except (OSError, trio.ClosedResourceError):
                    return  # closing: notify_closing woke us, or the fd is gone
                self._draining = True
                try:
                    self._context.run(_report_errors, self._drain)
                finally:
                    self._draining = False
        finally:
            self.future = None
            watcher = self._parked_watcher
            if watcher is not None and self._in_flight():  # else it sleeps on (see the class docstring)
                self._parked_watcher = None
                trio.lowlevel.reschedule(watcher)  # the fd is the watcher's again

    async def park_watcher(self) -> None:
        """The watcher's wait while a task waits on the fd itself; returns when it stops
        waiting with jobs in flight, or when a job submitted meanwhile found no task waiting."""
        trio = self._trio
        self._parked_watcher = trio.lowlevel.current_task()

        def abort(_raise_cancel: Any) -> Any:
            self._parked_watcher = None
            return trio.lowlevel.Abort.SUCCEEDED

        with trio.CancelScope() as self._park_scope:
            try:
                await trio.lowlevel.wait_task_rescheduled(abort)
            finally:
                self._park_scope = None

    def submitted(self) -> None:
        """A job is being submitted: a watcher parked with no deadline gets one."""
        scope = self._park_scope
        if scope is not None and scope.deadline == _INFINITY:
            scope.deadline = self._trio.current_time() + self.LINGER_S

    def settled(self, future: TrioJobFuture) -> None:
        """`future` settled: wake its waiting task unless its own drain did it."""
        if future is self.future and not self._draining and not self._closed:
            self._signal()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._trio.lowlevel.notify_closing(self.fd)  # wake a waiting task before the fd closes
        except RuntimeError:
            pass  # outside the run: nothing waits
        os.close(self.fd)


class _Handle:
    """A started background task: ``cancel()`` stops it."""

    def __init__(self, cancel: Callable[[], None]):
        self.cancel = cancel


class AsyncioBackend:
    name = "asyncio"

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.key: Any = loop

    def debug(self) -> bool:
        return self.loop.get_debug()

    def is_current(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def is_closed(self) -> bool:
        return self.loop.is_closed()

    def new_future(self) -> JobFuture:
        return JobFuture(loop=self.loop)

    def watch(self, fd: int, on_ready: Callable[[], None], signal: Callable[[], None] | None = None,
              in_flight: Callable[[], bool] | None = None) -> Callable[[], None]:
        """Call `on_ready` on the loop thread whenever `fd` is readable; returns the stop function.

        (`signal` and `in_flight` are for trio's backend: a reader callback needs neither.)
        """
        self.loop.add_reader(fd, on_ready)

        def stop() -> None:
            if not self.loop.is_closed():
                self.loop.remove_reader(fd)

        return stop

    def spawn(self, fn: Callable[[], Coroutine], context: contextvars.Context | None = None) -> _Handle:
        task = self.loop.create_task(fn(), context=context)
        return _Handle(task.cancel)

    def report_error(self, message: str, exc: BaseException) -> None:
        """An error no awaiter can receive: to the loop's exception handler."""
        self.loop.call_exception_handler({"message": message, "exception": exc})

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> bool:
        """Run `fn` on the loop (from any thread); False if the loop is gone."""
        if self.loop.is_closed() or not self.loop.is_running():
            return False
        try:
            self.loop.call_soon_threadsafe(fn)
            return True
        except RuntimeError:
            return False


class TrioBackend:
    name = "trio"

    def __init__(self) -> None:
        global _trio
        import trio

        _trio = self._trio = trio
        self.token = trio.lowlevel.current_trio_token()
        self.key: Any = self.token
        self._closed = False
        self._wake: _TrioWakeFd | None = None  # made by watch()

    def debug(self) -> bool:
        return False

    def is_current(self) -> bool:
        try:
            return self._trio.lowlevel.current_trio_token() is self.token
        except RuntimeError:
            return False

    def is_closed(self) -> bool:
        return self._closed

    def new_future(self) -> TrioJobFuture:
        future = TrioJobFuture()
        wake = future._wake = self._wake
        if wake is not None:
            wake.submitted()  # every job's future is made here, as it is submitted
        return future

    def watch(self, fd: int, on_ready: Callable[[], None], signal: Callable[[], None] | None = None,
              in_flight: Callable[[], bool] | None = None) -> Callable[[], None]:
        """Call `on_ready` in a task whenever `fd` is readable; returns the stop function.

        `signal` makes `fd` readable and `in_flight` says whether any job
        still reports to `fd`; given both, an awaiting task may wait on the
        fd itself (``_TrioWakeFd``).
        """
        trio = self._trio
        wake = self._wake = (_TrioWakeFd(trio, fd, on_ready, signal, in_flight)
                             if signal is not None and in_flight is not None else None)
        # Shielded: trio cancels system tasks when the main task returns, but
        # the runtimes still open then are closed in that cancellation and
        # need their completions; stop() ends the watcher.
        scope = trio.CancelScope(shield=True)

        stopped = False

        async def watcher() -> None:
            with scope:
                while not stopped:
                    if wake is not None and wake.future is not None:  # a task waits on the fd and drains
                        await wake.park_watcher()
                        continue
                    try:
                        await trio.lowlevel.wait_readable(fd)
                    except (OSError, trio.ClosedResourceError):
                        return  # the channel closed its fd (notify_closing, or already gone)
                    if not stopped and (wake is None or wake.future is None):  # else that task drains
                        _report_errors(on_ready)

        trio.lowlevel.spawn_system_task(watcher, name="emlx_async completion watcher")

        def stop() -> None:
            nonlocal stopped
            stopped = True
            scope.cancel()
            self._wake = None
            if wake is not None:
                wake.close()
            try:
                trio.lowlevel.notify_closing(fd)  # wake the watcher before the fd closes
            except RuntimeError:
                pass

        return stop

    def spawn(self, fn: Callable[[], Coroutine], context: contextvars.Context | None = None) -> _Handle:
        trio = self._trio
        scope = trio.CancelScope()

        async def body() -> None:
            with scope:
                try:
                    await fn()
                except trio.Cancelled:
                    raise  # the run's shutdown, or `scope` (which catches its own)
                except BaseException:  # noqa: BLE001 - a system task's raise would be TrioInternalError
                    traceback.print_exc()

        trio.lowlevel.spawn_system_task(body, context=context)
        return _Handle(scope.cancel)

    def report_error(self, message: str, exc: BaseException) -> None:
        """An error no awaiter can receive: printed, as trio has no exception handler."""
        print(message, file=sys.stderr)
        traceback.print_exception(exc)

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> bool:
        if self._closed:
            return False
        try:
            self.token.run_sync_soon(fn)
            return True
        except self._trio.RunFinishedError:
            self._closed = True
            return False


def _report_errors(fn: Callable[[], None]) -> None:
    # What asyncio's exception handler does for a failing reader callback.
    try:
        fn()
    except Exception:  # noqa: BLE001
        traceback.print_exc()


def current() -> AsyncioBackend | TrioBackend:
    """The backend of the running async library (asyncio, uvloop or trio)."""
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        raise InvalidState("emlx_async needs a running event loop (asyncio, uvloop or trio); "
                           "call it from async code") from None
    if library == "trio":
        return TrioBackend()
    if library == "asyncio":
        return AsyncioBackend(asyncio.get_running_loop())
    raise InvalidState(f"emlx_async runs on asyncio, uvloop or trio, not {library}")


def current_key() -> Any:
    """An identity for the running loop (the asyncio loop, or trio's run token); None outside one."""
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return None
    if library == "trio":
        import trio

        return trio.lowlevel.current_trio_token()
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def wait_all(futures: list) -> list:
    """Await every future (backend-neutral ``gather``); raise the first failure.

    Exceptions of the others are marked retrieved, so none is reported as
    "never retrieved".
    """
    results = []
    for i, future in enumerate(futures):
        try:
            results.append(await future)
        except BaseException:
            for rest in futures[i + 1:]:
                rest.add_done_callback(_retrieve)
            raise
    return results


def _retrieve(future) -> None:
    if not future.cancelled():
        future.exception()


async def shielded(awaitable_fn: Callable[[], Any]) -> Any:
    """Await `awaitable_fn()` so that cancelling the caller does not stop it.

    asyncio: the caller is released at once and the work goes on (asyncio.shield).
    trio: the caller waits for it inside a shielded cancel scope.
    """
    if sniffio.current_async_library() == "trio":
        import trio

        with trio.CancelScope(shield=True):
            return await awaitable_fn()
    return await asyncio.shield(awaitable_fn())


__all__ = ["AsyncioBackend", "JobFuture", "RuntimeClosed", "TrioBackend", "TrioJobFuture", "current",
           "current_key", "shielded", "wait_all"]
