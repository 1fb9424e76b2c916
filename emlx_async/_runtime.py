"""Runtime: one per event loop. Owns the completion channel, the pools and the
default queues.

Layer: above queues and the task binding (``_context``); host calls and the
public API sit on top of it. The routing rule (``_routing``) sits below it,
given ``get_runtime`` by its callers.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import numbers
import operator
import os
from time import monotonic_ns
import traceback
import warnings
import weakref
from typing import Any

import mlx.core as mx

from . import _backend
from ._channel import CompletionChannel
from ._devices import DeviceLike, device_type, native_device, require_available
from ._errors import InvalidArgument, InvalidArgumentType, InvalidState, QueueClosed, QueueReleaseError, RuntimeClosed
from ._native import check_pointer, ensure_mlx_usable, exiting, lib
from ._queue import CommandQueue, QueueStats, _Counters
from ._routing import add_owner, owner_of, reset_bound, set_bound

DEFAULT_MAX_PENDING = 1024

# The longest finite host-call timeout, in seconds: the worker's own bound on
# its wait (twice it plus 10 s, in ms) must fit a C int. inf means no limit.
MAX_HOST_CALL_TIMEOUT = 1_000_000.0


def check_host_call_timeout(name: str, value: Any, none_means: str) -> float | None:
    """`value` if it is a host-call timeout (seconds, or inf for no limit); else a TypeError or ValueError naming `name`."""
    if value is None:
        return None
    allowed = f"seconds in (0, {MAX_HOST_CALL_TIMEOUT:.0f}] (about 11 days), inf for no limit, or None ({none_means})"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentType(f"{name} must be {allowed}, got {type(value).__name__}")
    if not (0 < value <= MAX_HOST_CALL_TIMEOUT or value == math.inf):
        raise InvalidArgument(f"{name} must be {allowed}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class RuntimeStats:
    """``rt.stats()``: each open queue's counters, and their sum since the runtime started.

    ``total`` also holds the counts of queues closed since (a pool replaces
    a closed queue with a new one); its ``busy_fraction`` is the summed run
    time over the summed lifetimes of those queues, and its ``uptime`` the
    runtime's.
    """

    queues: dict[str, QueueStats]  # by queue name ("cpu:3")
    total: QueueStats


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise InvalidArgumentType(f"{name} must be an int, got {value!r}")
    try:
        value = operator.index(value)  # numpy's ints too
    except TypeError:
        raise InvalidArgumentType(f"{name} must be an int, got {value!r}") from None
    if value < 1:
        raise InvalidArgument(f"{name} must be at least 1, got {value}")
    return value


class _Pool:
    """Up to `size` queues on one device, lent to one holder at a time.

    Release checks ownership (asyncpg's ``Pool.release`` habit): giving back
    a queue the pool did not lend, or giving it back twice, raises
    ``QueueReleaseError`` instead of letting two holders share a queue.
    """

    def __init__(self, runtime: Runtime, kind: mx.DeviceType, size: int):
        self._runtime, self._kind, self.size = runtime, kind, size
        self.queues: list[CommandQueue] = []
        self._idle: collections.deque[CommandQueue] = collections.deque()
        self._lent: set[CommandQueue] = set()
        self._waiters: collections.deque = collections.deque()  # backend futures

    async def acquire(self) -> CommandQueue:
        while True:
            queue = self.try_acquire()
            if queue is not None:
                return queue
            waiter = self._runtime._backend.new_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            self._runtime._check_open()  # woken by the close (its waiter's error raised above) or a release

    def try_acquire(self) -> CommandQueue | None:
        """An idle queue (or a new one while the pool is below its size), None if every one is lent."""
        while self._idle:
            queue = self._idle.popleft()
            if not queue._closing:
                self._lent.add(queue)
                return queue
        self.queues = [q for q in self.queues if not q._closing]
        if len(self.queues) < self.size:
            queue = self._runtime._new_queue(self._kind, role="pool")
            self.queues.append(queue)
            self._lent.add(queue)
            return queue
        return None

    def close(self) -> None:
        """The runtime closed: every task waiting for a queue gets RuntimeClosed now."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(RuntimeClosed())

    def release(self, queue: CommandQueue) -> None:
        if queue not in self._lent:
            raise QueueReleaseError(f"{queue!r} is not lent by this pool (released twice, or never acquired)")
        self._lent.discard(queue)
        if not queue._closing:
            self._idle.append(queue)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break


class _QueueLease:
    """``async with rt.queue() as q``: a pooled queue bound to the current task."""

    def __init__(self, runtime: Runtime, kind: mx.DeviceType, bind: bool):
        self._runtime, self._kind, self._bind = runtime, kind, bind
        self._queue: CommandQueue | None = None
        self._token = None

    async def __aenter__(self) -> CommandQueue:
        self._queue = await self._runtime.acquire_queue(self._kind)
        if self._bind:
            self._token = set_bound(self._queue)
        return self._queue

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._token is not None:
            reset_bound(self._token)
        self._runtime.release_queue(self._queue)


# The runtime of each running loop, by id() of the asyncio loop or trio's run token.
_runtimes: "weakref.WeakValueDictionary[int, Runtime]" = weakref.WeakValueDictionary()


# The implicit runtimes, held strongly until they close: the loop holds its
# async generators (the asyncio closer) only weakly, so a gc pass would
# otherwise collect the runtime and its closer together mid-run.
_implicit: set[Runtime] = set()


def _registered(key: Any) -> Runtime | None:
    runtime = _runtimes.get(id(key))
    return runtime if runtime is not None and runtime._backend.key is key and not runtime.closed else None
os.register_at_fork(after_in_child=lambda: _runtimes.clear())


class Runtime:
    """The emlx_async runtime for one event loop.

    Create it inside the running loop (``async with ea.Runtime() as rt``), or
    let ``ea.get_runtime()`` make the loop's implicit one. It owns:

    * a completion channel (an eventfd on Linux, a pipe on macOS) that the loop
      watches; workers signal it only when its record list becomes non-empty;
    * a default queue per device, used by unbound work;
    * a bounded pool of queues per device (``pool_size``, default the number
      of cores and never fewer than 2), lent with ``rt.queue()``.

    ``close()`` closes every queue and releases the channel. A runtime that is
    garbage-collected while open emits a ResourceWarning.

    Process contracts: in a fork child of a process that had used MLX, the
    constructor raises ``ForkedProcessError`` at once (MLX would hang there;
    use the ``spawn`` or ``forkserver`` start method). At the end of a loop's
    run and at interpreter exit, a running job (Python or native) is
    abandoned as a daemon thread is, never waited for (see ``get_runtime``
    and the exit hook in ``_native``).
    """

    def __init__(self, *, pool_size: int | None = None, max_pending: int = DEFAULT_MAX_PENDING,
                 host_call_timeout: float | None = 30.0, _implicit: bool = False):
        try:
            self._backend = _backend.current()
        except RuntimeError:
            raise InvalidState("ea.Runtime() must be created inside a running event loop "
                               "(for example in `async def main()` run by asyncio.run or trio.run)") from None
        max_pending = _check_count("max_pending", max_pending)
        if pool_size is not None:
            pool_size = _check_count("pool_size", pool_size)
        check_host_call_timeout("host_call_timeout", host_call_timeout, "no limit")
        ensure_mlx_usable()  # a fork child of a process that used MLX would hang: refuse now
        self.pool_size = max(2, pool_size if pool_size is not None else (os.cpu_count() or 2))
        self.max_pending = max_pending
        self.host_call_timeout = host_call_timeout
        self._channel = CompletionChannel(self._backend)
        self._channel.owner = weakref.ref(self)
        self._defaults: dict[mx.DeviceType, CommandQueue] = {}
        self._callback_queues: dict[mx.DeviceType, CommandQueue] = {}
        self._pools: dict[mx.DeviceType, _Pool] = {}
        # Every queue made here, for stats(); closed ones are folded into
        # _retired (and dropped) whenever a queue is made or stats are read.
        self._made_queues: list[CommandQueue] = []
        self._retired = _Counters()
        self._retired_lifetime_ns = 0
        self._closed = False
        self._close_future = None
        self._created_at = traceback.format_stack() if self._backend.debug() else None
        if _registered(self._backend.key) is None:
            _runtimes[id(self._backend.key)] = self  # the loop's runtime, for ea.* calls
        if self._backend.name == "trio":  # every trio runtime closes when its run ends
            _close_at_the_end_of_trio_run(self, keep_alive=_implicit)

    # ---- public --------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and not isinstance(exc, Exception):
            # Cancelled, KeyboardInterrupt, SystemExit: nobody will await a job now, and
            # the caller must stop at once, so nothing is waited for (as at a run's end).
            await self._close_once(True, abandon_why=f"the runtime's `async with` block ended with "
                                                     f"{type(exc).__name__} before this job finished")
        else:
            await self.close()

    def __repr__(self) -> str:
        return (f"<emlx_async.Runtime queues={len(self._channel.owners)} jobs={len(self._channel.jobs)}"
                f"{' closed' if self._closed else ''}>")

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def channel(self) -> CompletionChannel:
        return self._channel

    @property
    def _jobs(self) -> dict[int, Any]:
        """Jobs in flight on this runtime's workers (tests read it)."""
        return self._channel.jobs

    @property
    def _owners(self) -> dict[tuple[int, int], CommandQueue]:
        return self._channel.owners

    def stats(self) -> RuntimeStats:
        """Per-queue counters: jobs submitted, started, completed, failed and
        cancelled, wait and run time, busy fraction (see ``QueueStats``).

        Kept on the loop thread as jobs are submitted and their records are
        drained (the worker stamps each job's start and end), so reading them
        runs nothing. Also valid after ``close()``.

        Example:
            >>> s = rt.stats()
            >>> s.total.completed, s.total.busy_fraction
        """
        now = monotonic_ns()
        self._fold_closed_queues()
        queues = {q.name: q.stats() for q in self._made_queues}
        total = _Counters()
        total.opened_ns, total.closed_ns = self._retired.opened_ns, self._retired.closed_ns
        lifetime_ns = self._retired_lifetime_ns
        for counters in [self._retired, *(q._counters for q in self._made_queues)]:
            total.add(counters)
        lifetime_ns += sum(q._counters.uptime_ns(now) for q in self._made_queues)
        snapshot = total.snapshot("total", "total", now)
        busy = min(1.0, total.run_ns / lifetime_ns) if lifetime_ns > 0 else 0.0
        return RuntimeStats(queues=queues, total=dataclasses.replace(snapshot, busy_fraction=busy))

    def _fold_closed_queues(self) -> None:
        kept = []
        for queue in self._made_queues:
            counters = queue._counters
            if not counters.closed_ns:
                kept.append(queue)
                continue
            self._retired.add(counters)
            self._retired_lifetime_ns += counters.closed_ns - counters.opened_ns
        self._made_queues = kept

    def queue(self, device: DeviceLike = None, *, bind: bool = True) -> _QueueLease:
        """Lend a pooled queue for ``async with``; it is bound to the task inside.

        Waits while every queue of the pool is lent out.

        Example:
            >>> async with rt.queue("cpu") as q:
            ...     logits = await q.run(model, tokens)
        """
        return _QueueLease(self, device_type(device), bind)

    async def acquire_queue(self, device: DeviceLike = None) -> CommandQueue:
        """Borrow a pooled queue; give it back with ``release_queue`` (once)."""
        return await self._pool(device).acquire()

    def try_acquire_queue(self, device: DeviceLike = None) -> CommandQueue | None:
        """Borrow a pooled queue if one is free now, without waiting (None: every one is lent);
        give it back with ``release_queue`` (once)."""
        return self._pool(device).try_acquire()

    def _pool(self, device: DeviceLike) -> _Pool:
        self._check_open()
        kind = device_type(device)
        require_available(kind)
        pool = self._pools.get(kind)
        if pool is None:
            pool = self._pools[kind] = _Pool(self, kind, self.pool_size)
        return pool

    def release_queue(self, queue: CommandQueue) -> None:
        """Give back a queue from ``acquire_queue``.

        Raises ``QueueReleaseError`` for a queue this runtime did not lend or
        that was already given back. After ``close()`` it does nothing.
        """
        if self._closed:
            return
        pool = self._pools.get(queue.device)
        if pool is None:
            raise QueueReleaseError(f"{queue!r} was not lent by this runtime")
        pool.release(queue)

    def default_queue(self, device: DeviceLike = None) -> CommandQueue:
        """The queue unbound work on `device` runs on (made on first use)."""
        return self._dedicated_queue(self._defaults, device, "default")

    def callback_queue(self, device: DeviceLike = None) -> CommandQueue:
        """The queue host callbacks' own MLX work runs on (never a blocked worker)."""
        return self._dedicated_queue(self._callback_queues, device, "callback")

    def _dedicated_queue(self, registry: dict[mx.DeviceType, CommandQueue], device: DeviceLike,
                         role: str) -> CommandQueue:
        self._check_open()
        kind = device_type(device)
        queue = registry.get(kind)
        if queue is None or queue._closing:
            queue = registry[kind] = self._new_queue(kind, role=role)
        return queue

    def check_current(self) -> None:
        """Raise RuntimeClosed unless this runtime is open and the caller runs on its event loop
        (a task fed from another loop's thread would never be woken)."""
        self._check_open()
        if not self._backend.is_current():
            raise RuntimeClosed("the runtime belongs to another event loop; use one made on this loop")

    def start_soon(self, fn, *, context=None) -> None:
        """Start ``await fn()`` as a background task on this runtime's loop.

        An asyncio task, or a trio system task (it must not raise: an error
        is printed, as asyncio's handler would). It is not awaited by anyone,
        so it handles its own errors.
        """
        self._backend.spawn(fn, context)

    def queue_of(self, array: mx.array) -> CommandQueue | None:
        """The queue owning a lazy `array`, or None if it is evaluated or unowned."""
        return owner_of(self._channel.owners, array)

    async def close(self, *, cancel_pending: bool = False) -> None:
        """Close every queue (draining, or dropping queued jobs), then the channel.

        Never blocks the loop: worker threads are handed back as they finish.
        """
        await self._close_once(cancel_pending)

    # ---- machinery -------------------------------------------------------------

    async def _close_at_end_of_run(self) -> None:
        """The close a runtime gets when its loop's run ends, as daemon threads do at exit.

        Nobody can await a job any more (asyncio.run has cancelled every task;
        trio's main task has returned), so nothing is waited for: a queue
        with jobs in flight is abandoned (see ``CommandQueue.abandon``): its
        queued jobs never run, a running job (Python or native) goes on
        detached until it returns, its result dropped, and the process can
        exit at once. Idle queues close as usual.
        """
        await self._close_once(False, abandon_why="the event loop's run ended before this job finished")

    async def _close_once(self, cancel_pending: bool, *, abandon_why: str | None = None) -> None:
        """Close once (later calls wait for the first). `abandon_why`: queues with jobs
        in flight are abandoned, not drained, their jobs failing with QueueClosed(why)."""
        if self._close_future is None:
            self._closed = True
            self._close_future = self._backend.new_future()
            self._backend.spawn(lambda: self._close(cancel_pending, abandon_why))
        await _backend.shielded(lambda: self._close_future)

    async def _close(self, cancel_pending: bool, abandon_why: str | None = None) -> None:
        for pool in self._pools.values():
            pool.close()
        try:
            # Each queue's close only hands its worker back and waits for the
            # stop record; awaiting them one by one costs no more than at once.
            for queue in list(self._channel.owners.values()):
                if abandon_why is not None and queue.pending:
                    queue.abandon(QueueClosed(f"{abandon_why}; it was abandoned and its result dropped"),
                                  unawaited=True)
                else:
                    await queue.close(cancel_pending=cancel_pending)
        finally:
            self._retired.closed_ns = monotonic_ns()  # the total's uptime stops here
            self._channel.close()
            if _runtimes.get(id(self._backend.key)) is self:
                del _runtimes[id(self._backend.key)]
            _implicit.discard(self)
            self._close_future.set_result(None)

    def _check_open(self) -> None:
        self._channel.ensure_alive()
        if self._closed:
            raise RuntimeClosed()

    def _new_queue(self, kind: mx.DeviceType, *, role: str) -> CommandQueue:
        require_available(kind)
        worker = check_pointer(lib.emlx_worker_acquire(self._channel.native, native_device(kind)),
                               f"cannot start a {kind.name} worker")
        queue = CommandQueue(self._channel, kind, worker, max_pending=self.max_pending, role=role, owner=self)
        add_owner(self._channel.owners, queue)
        self._fold_closed_queues()
        self._made_queues.append(queue)
        return queue

    def _hand_back_now(self, *, quietly: bool) -> None:
        """Hand every worker back, dropping its queued jobs, and close the channel, without
        the loop (from ``__del__``, or for a runtime whose loop was closed). The channel is
        reference-counted natively: closing it now is safe, the workers' last records are refused."""
        # Its own list, not the channel's weak map: a collection clears weak references
        # before finalizers run.
        for queue in list(self._made_queues):
            queue.hand_back_now(quietly=quietly)
        self._channel.close_from_any_thread()

    def __del__(self, _warn=warnings.warn) -> None:
        channel = getattr(self, "_channel", None)
        if channel is None or channel.closed:
            return
        if exiting() or os.getpid() != channel.pid:  # workers are gone (exit) or not ours (fork)
            return
        # Hand the workers back first (a warning turned into an error must not stop that).
        self._hand_back_now(quietly=False)
        if not self._closed:
            where = "".join(self._created_at) if self._created_at else ""
            _warn(f"unclosed emlx_async runtime {self!r}; use `async with ea.Runtime()` or "
                  f"`await rt.close()`{(chr(10) + 'created at:' + chr(10) + where) if where else ''}",
                  ResourceWarning, source=self)


async def _close_when_loop_shuts_down(runtime: Runtime):
    """An async generator that asyncio.run()/Runner finalise at loop shutdown."""
    try:
        yield
    finally:
        await runtime._close_at_end_of_run()


def _close_at_the_end_of_trio_run(runtime: Runtime, *, keep_alive: bool = False) -> None:
    # trio cancels system tasks when the main task returns: close then,
    # shielded so the close can finish. An explicit runtime is held weakly,
    # so one nobody references can still be collected (and warn); the
    # implicit one is kept alive here until the run ends.
    import trio

    ref = (lambda kept=runtime: kept) if keep_alive else weakref.ref(runtime)
    del runtime

    async def closer() -> None:
        try:
            await trio.sleep_forever()
        finally:
            runtime = ref()
            if runtime is not None and not runtime.closed:
                with trio.CancelScope(shield=True):
                    await runtime._close_at_end_of_run()

    trio.lowlevel.spawn_system_task(closer, name="emlx_async implicit runtime closer")


def get_runtime() -> Runtime:
    """The running loop's runtime, made on first use.

    The implicit runtime closes itself at the end of the run: when asyncio
    shuts down its async generators (``asyncio.run`` and ``asyncio.Runner``
    do), or when ``trio.run``'s main task returns. Then nothing is waited
    for, as daemon threads are not at exit: jobs still queued never run, and
    a job still running (Python or native, which nothing can interrupt) is
    abandoned: its worker is detached, its result dropped, and the run (and
    the process) ends at once.
    """
    key = _backend.current_key()
    if key is None:
        raise InvalidState("ea.get_runtime() needs a running event loop (asyncio, uvloop or trio)")
    runtime = _registered(key)
    if runtime is not None:
        return runtime
    _reap_runtimes_of_closed_loops()
    runtime = Runtime(_implicit=True)
    _runtimes[id(key)] = runtime
    _implicit.add(runtime)
    if runtime._backend.name != "trio":  # trio's closer was started by the runtime itself
        closer = _close_when_loop_shuts_down(runtime)
        runtime._shutdown_hook = closer  # the loop holds async generators weakly
        runtime._backend.loop.create_task(closer.__anext__())
    return runtime


def _reap_runtimes_of_closed_loops() -> None:
    """Release the implicit runtimes of asyncio loops closed without shutting down their
    async generators (``loop.close()`` after ``run_until_complete``): their closer never
    runs, and each would hold its channel's fd and its workers for good."""
    for runtime in [r for r in list(_implicit) if r._backend.name != "trio" and r._backend.loop.is_closed()]:
        _implicit.discard(runtime)
        if not runtime._closed:
            runtime._closed = True
            runtime._hand_back_now(quietly=True)


def runtime_of_loop() -> Runtime | None:
    """The running loop's runtime if it has one (never creates it)."""
    key = _backend.current_key()
    return _registered(key) if key is not None else None


__all__ = ["Runtime", "RuntimeStats", "get_runtime", "runtime_of_loop"]
