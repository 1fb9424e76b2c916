"""Runtime: one per event loop. Owns the completion channel and the queues.

The loop integration (watching the channel's fd) lives in ``_LoopWatcher``
alone, so another loop backend can be added without touching queues.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import os
import traceback
import warnings
import weakref
from typing import Any

import mlx.core as mx

from . import _interop
from ._devices import DeviceLike, device_type, from_native_device, native_device, require_available
from ._errors import EMLXError, ForeignLazyArrayError, ForkedProcessError, RuntimeClosed
from ._host_call import HostCallServer
from ._native import check_pointer, ffi, lib
from ._queue import CommandQueue

_DRAIN_BATCH = 256
DEFAULT_MAX_PENDING = 1024


class _LoopWatcher:
    """Calls `on_ready` on the loop thread whenever the channel fd is readable."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, on_ready):
        self._loop, self._fd = loop, fd
        loop.add_reader(fd, on_ready)

    def stop(self) -> None:
        if not self._loop.is_closed():
            self._loop.remove_reader(self._fd)


class _Pool:
    """Up to `size` queues on one device, lent to one holder at a time."""

    def __init__(self, runtime: Runtime, kind: mx.DeviceType, size: int):
        self._runtime, self._kind, self.size = runtime, kind, size
        self.queues: list[CommandQueue] = []
        self._idle: collections.deque[CommandQueue] = collections.deque()
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    async def acquire(self) -> CommandQueue:
        while True:
            while self._idle:
                queue = self._idle.popleft()
                if not queue.closed and not queue._closing:
                    return queue
            self.queues = [q for q in self.queues if not q._closing]
            if len(self.queues) < self.size:
                queue = self._runtime._new_queue(self._kind)
                self.queues.append(queue)
                return queue
            waiter = self._runtime._loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def release(self, queue: CommandQueue) -> None:
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
        from ._binding import _bound

        self._queue = await self._runtime.acquire_queue(self._kind)
        if self._bind:
            self._token = _bound.set(self._queue)
        return self._queue

    async def __aexit__(self, *exc_info: Any) -> None:
        from ._binding import _bound

        if self._token is not None:
            _bound.reset(self._token)
        self._runtime.release_queue(self._queue)


_runtimes: "weakref.WeakValueDictionary[int, Runtime]" = weakref.WeakValueDictionary()  # id(loop) -> runtime


_exiting = False  # set once emlx_shutdown has run: worker pointers are gone


def _close_all_at_exit() -> None:
    # Stop every worker (parked ones included). Workers stuck in a long native
    # job are left detached, so interpreter exit never hangs on them.
    global _exiting
    _exiting = True
    lib.emlx_shutdown(2000)


atexit.register(_close_all_at_exit)
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
    """

    def __init__(self, *, pool_size: int | None = None, max_pending: int = DEFAULT_MAX_PENDING,
                 host_call_timeout: float | None = 30.0):
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("ea.Runtime() must be created inside a running event loop "
                               "(for example in `async def main()` run by asyncio.run)") from None
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self._pid = os.getpid()
        _sweep_orphans()
        self.pool_size = max(2, pool_size if pool_size is not None else (os.cpu_count() or 2))
        self.max_pending = max_pending
        self._channel = check_pointer(lib.emlx_channel_new(), "cannot create the completion channel")
        self._records = ffi.new("emlx_completion[]", _DRAIN_BATCH)
        self._jobs: dict[int, Any] = {}  # job id -> _Job, for every job in flight
        self._owners: dict[tuple[int, int], CommandQueue] = {}  # (device, stream) -> queue
        self._defaults: dict[mx.DeviceType, CommandQueue] = {}
        self._callback_queues: dict[mx.DeviceType, CommandQueue] = {}
        self.host_call_timeout = host_call_timeout
        self._host_calls: dict[int, Any] = {}  # call id -> _host_call._Call
        self._host_server = HostCallServer(self)
        self._pools: dict[mx.DeviceType, _Pool] = {}
        self._closed = False
        self._close_task: asyncio.Task | None = None
        self._created_at = traceback.format_stack() if self._loop.get_debug() else None
        self._watcher = _LoopWatcher(self._loop, lib.emlx_channel_fd(self._channel), self._drain)
        _runtimes.setdefault(id(self._loop), self)

    # ---- public --------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<emlx_async.Runtime queues={len(self._owners)} jobs={len(self._jobs)}{' closed' if self._closed else ''}>"

    @property
    def closed(self) -> bool:
        return self._closed

    def queue(self, device: DeviceLike = None, *, bind: bool = True) -> _QueueLease:
        """Lend a pooled queue for ``async with``; it is bound to the task inside.

        Waits while every queue of the pool is lent out.

        Example:
            >>> async with rt.queue("cpu") as q:
            ...     logits = await q.run(model, tokens)
        """
        return _QueueLease(self, device_type(device), bind)

    async def acquire_queue(self, device: DeviceLike = None) -> CommandQueue:
        """Borrow a pooled queue; give it back with ``release_queue``."""
        self._check_open()
        kind = device_type(device)
        require_available(kind)
        pool = self._pools.get(kind)
        if pool is None:
            pool = self._pools[kind] = _Pool(self, kind, self.pool_size)
        return await pool.acquire()

    def release_queue(self, queue: CommandQueue) -> None:
        pool = self._pools.get(queue.device)
        if pool is not None and not self._closed:
            pool.release(queue)

    def default_queue(self, device: DeviceLike = None) -> CommandQueue:
        """The queue unbound work on `device` runs on (made on first use)."""
        return self._dedicated_queue(self._defaults, device)

    def callback_queue(self, device: DeviceLike = None) -> CommandQueue:
        """The queue host callbacks' own MLX work runs on (never a blocked worker)."""
        return self._dedicated_queue(self._callback_queues, device)

    def _dedicated_queue(self, registry: dict[mx.DeviceType, CommandQueue], device: DeviceLike) -> CommandQueue:
        self._check_open()
        kind = device_type(device)
        queue = registry.get(kind)
        if queue is None or queue._closing:
            queue = registry[kind] = self._new_queue(kind)
        return queue

    def queue_of(self, array: mx.array) -> CommandQueue | None:
        """The queue owning a lazy `array`, or None if it is evaluated or unowned."""
        state = _interop.array_state(array)
        if state.state != _interop.LAZY:
            return None
        return self._owners.get((state.device_type, state.stream_index))

    async def close(self, *, cancel_pending: bool = False) -> None:
        """Close every queue (draining, or dropping queued jobs), then the channel.

        Never blocks the loop: worker threads are handed back as they finish.
        """
        if self._close_task is None:
            self._closed = True
            self._close_task = self._loop.create_task(self._close(cancel_pending))
        await asyncio.shield(self._close_task)

    # ---- machinery -------------------------------------------------------------

    async def _close(self, cancel_pending: bool) -> None:
        queues = list(self._owners.values())
        await asyncio.gather(*(q.close(cancel_pending=cancel_pending) for q in queues))
        self._release_channel()

    def _release_channel(self) -> None:
        if self._channel is not None:
            self._watcher.stop()
            lib.emlx_channel_free(self._channel)
            self._channel = None
        if _runtimes.get(id(self._loop)) is self:
            del _runtimes[id(self._loop)]

    def _check_open(self) -> None:
        if os.getpid() != self._pid:
            raise ForkedProcessError("this runtime was created in another process; worker threads "
                                     "do not survive fork(), so create a new Runtime in the child")
        if self._closed:
            raise RuntimeClosed("the emlx_async runtime is closed")

    def _loop_is_not_running_here(self) -> bool:
        try:
            return asyncio.get_running_loop() is not self._loop
        except RuntimeError:
            return True

    def _new_queue(self, kind: mx.DeviceType) -> CommandQueue:
        require_available(kind)
        worker = check_pointer(lib.emlx_worker_acquire(self._channel, native_device(kind)),
                               f"cannot start a {kind.name} worker")
        queue = CommandQueue(self, kind, worker, max_pending=self.max_pending)
        self._owners[(native_device(kind), queue.stream_index)] = queue
        return queue

    def _forget_queue(self, queue: CommandQueue) -> None:
        self._owners.pop((native_device(queue.device), queue.stream_index), None)

    def _drain(self) -> None:
        """Resolve the futures of finished jobs (the channel fd is readable)."""
        if self._channel is None:
            return
        records = self._records
        while True:
            count = lib.emlx_channel_drain(self._channel, records, _DRAIN_BATCH)
            for i in range(count):
                record = records[i]
                message = None
                if record.message != ffi.NULL:
                    message = ffi.string(record.message).decode(errors="replace")
                    lib.emlx_message_free(record.message)
                if record.status == lib.EMLX_HOST_REQUEST:
                    self._host_server.request(record.job_id)
                    continue
                job = self._jobs.pop(record.job_id, None)
                if job is not None:
                    job.queue._finish(job, record.status, record.error_kind, message, record.payload)
                elif record.payload != ffi.NULL:
                    lib.emlx_payload_free(record.payload)
            if count < _DRAIN_BATCH:
                break

    def _prepare_inputs(self, arrays: list[mx.array], target: CommandQueue) -> list[asyncio.Future]:
        """Make lazy inputs usable on `target`'s thread.

        Graphs built on the loop thread are evaluated here (cheap for inputs;
        big graphs belong on a queue). Graphs owned by another queue are
        evaluated there: the returned futures must finish before submitting.
        """
        if not arrays:
            return []
        on_loop: list[mx.array] = []
        elsewhere: dict[CommandQueue, list[mx.array]] = {}
        for array in arrays:
            state = _interop.array_state(array)
            if state.state != _interop.LAZY:
                continue
            owner = self._owners.get((state.device_type, state.stream_index))
            if owner is target:
                continue
            if owner is not None:
                elsewhere.setdefault(owner, []).append(array)
            elif _is_this_threads_stream(state):
                on_loop.append(array)
            else:
                raise ForeignLazyArrayError(
                    f"a lazy array built on Stream({from_native_device(state.device_type).name}, "
                    f"{state.stream_index}) belongs to a thread that no queue of this runtime owns; "
                    "evaluate it on that thread (mx.eval) before passing it in")
        if on_loop:
            mx.eval(on_loop)
        return [owner.eval(*group) for owner, group in elsewhere.items()]

    def __del__(self, _warn=warnings.warn) -> None:
        if getattr(self, "_closed", True) and getattr(self, "_channel", None) is None:
            return
        if _exiting:  # after emlx_shutdown the workers no longer exist; nothing to release
            return
        if not getattr(self, "_closed", True):
            where = "".join(self._created_at) if self._created_at else ""
            _warn(f"unclosed emlx_async runtime {self!r}; use `async with ea.Runtime()` or "
                  f"`await rt.close()`{(chr(10) + 'created at:' + chr(10) + where) if where else ''}",
                  ResourceWarning, source=self)
        # Hand the workers back. The channel must outlive their last record,
        # so it becomes an orphan that _sweep_orphans frees later.
        from ._queue import _job_ids

        stops = set()
        for queue in list(self._owners.values()):
            if queue._worker is not None and not queue._closing:
                stop_id = next(_job_ids)
                if lib.emlx_worker_release(queue._worker, stop_id, 1) == 0:
                    stops.add(stop_id)
        if self._channel is not None:
            _orphans.append((self._channel, stops))
            self._channel = None


_orphans: list[tuple[Any, set[int]]] = []  # (channel, stop ids still to come)


def _sweep_orphans() -> None:
    """Free the channels of runtimes collected while open, once their workers left."""
    records = ffi.new("emlx_completion[]", _DRAIN_BATCH)
    for entry in list(_orphans):
        channel, stops = entry
        while count := lib.emlx_channel_drain(channel, records, _DRAIN_BATCH):
            for i in range(count):
                if records[i].message != ffi.NULL:
                    lib.emlx_message_free(records[i].message)
                if records[i].payload != ffi.NULL:
                    lib.emlx_payload_free(records[i].payload)
                if records[i].status == lib.EMLX_STOPPED:
                    stops.discard(records[i].job_id)
        if not stops:
            lib.emlx_channel_free(channel)
            _orphans.remove(entry)


def _is_this_threads_stream(state: _interop.ArrayState) -> bool:
    return lib.emlx_thread_stream_index(state.device_type) == state.stream_index


async def _close_when_loop_shuts_down(runtime: Runtime):
    """An async generator that asyncio.run()/Runner finalise at loop shutdown."""
    try:
        yield
    finally:
        await runtime.close()


def get_runtime() -> Runtime:
    """The running loop's runtime, made on first use.

    The implicit runtime closes itself when the loop shuts down its async
    generators (``asyncio.run`` and ``asyncio.Runner`` do).
    """
    loop = asyncio.get_running_loop()
    runtime = _runtimes.get(id(loop))
    if runtime is not None and runtime._loop is loop and not runtime.closed:
        return runtime
    runtime = Runtime()
    _runtimes[id(loop)] = runtime
    closer = _close_when_loop_shuts_down(runtime)
    runtime._shutdown_hook = closer  # the loop holds async generators weakly
    loop.create_task(closer.__anext__())
    return runtime


def runtime_of_loop() -> Runtime | None:
    """The running loop's runtime if it has one (never creates it)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    runtime = _runtimes.get(id(loop))
    return runtime if runtime is not None and runtime._loop is loop and not runtime.closed else None


__all__ = ["Runtime", "CommandQueue", "get_runtime", "EMLXError"]
