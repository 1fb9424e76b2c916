"""The completion channel: where workers report finished jobs to the loop.

One channel per runtime. It owns the native channel (an eventfd on Linux, a
pipe on macOS), the loop's reader on its fd, and the registries every queue
of the runtime shares: jobs in flight (job id -> job) and queue owners
((device, stream index) -> queue, to route lazy arrays to their owner).

Layer: above the native binding; below queues. It never imports a queue: a
job record is handed to ``job.queue._finish``, and a host-call request to the
``host_server`` that the host-call layer attaches.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from ._backend import AsyncioBackend, TrioBackend
from ._errors import ForkedProcessError, RuntimeClosed
from ._native import FORK_ADVICE, check_pointer, ensure_not_exiting, exiting, ffi, lib

_DRAIN_BATCH = 256

# This process's id, renewed in a fork child: checked on every submission,
# and os.getpid() is a system call (0.8 us measured on a 2-core VM).
_process_id = os.getpid()


def _renew_process_id() -> None:
    global _process_id
    _process_id = os.getpid()


os.register_at_fork(after_in_child=_renew_process_id)
# Read per record on the loop: module constants, not attribute look-ups on the cffi lib.
_HOST_REQUEST, _HOST_FREED, _DONE, _NULL = lib.EMLX_HOST_REQUEST, lib.EMLX_HOST_FREED, lib.EMLX_DONE, ffi.NULL


class CompletionChannel:
    """The native completion channel of one runtime, watched by one event loop."""

    def __init__(self, backend: AsyncioBackend | TrioBackend):
        self.backend = backend
        self.pid = _process_id
        self._native = check_pointer(lib.emlx_channel_new(), "cannot create the completion channel")
        self._records = ffi.new("emlx_completion[]", _DRAIN_BATCH)
        self._fd = lib.emlx_channel_fd(self._native)
        self.jobs: dict[int, Any] = {}  # job id -> _queue._Job, every job the workers hold
        # (device, stream index) -> CommandQueue, held weakly: the loop holds this channel (its
        # fd's reader), and a queue holds its runtime, so a strong map would keep an unclosed
        # runtime alive for the whole run. Its runtime holds its open queues.
        self.owners: weakref.WeakValueDictionary[tuple[int, int], Any] = weakref.WeakValueDictionary()
        self.host_server: Any = None  # set by the host-call layer on first use
        self.owner: Any = None  # a weak reference to the runtime, set by it
        self._stop_watching = backend.watch(self._fd, self._drain, self._signal, self._in_flight)

    @property
    def native(self):
        """The ``emlx_channel*`` (raises once the channel is closed)."""
        self.ensure_alive()
        return self._native

    @property
    def closed(self) -> bool:
        return self._native is None

    def is_alive(self) -> bool:
        return self._native is not None and not exiting() and _process_id == self.pid

    def ensure_alive(self) -> None:
        """The check before every native call that reports here (uvloop's ``_ensure_alive``)."""
        if _process_id != self.pid:
            raise ForkedProcessError("this runtime was created in another process; worker threads do not "
                                     f"survive fork(): {FORK_ADVICE}")
        ensure_not_exiting()
        if self._native is None:
            raise RuntimeClosed()

    def close(self) -> None:
        """Stop watching and close the native channel.

        Workers and host-call nodes that still hold it find it closed: their
        records are refused, never written to freed memory.
        """
        if self._native is None:
            return
        self._stop_watching()
        if not exiting() and os.getpid() == self.pid:
            lib.emlx_channel_free(self._native)
        self._native = None

    def _in_flight(self) -> bool:
        """Whether any job may still report here (a host call's request comes from inside one)."""
        return bool(self.jobs)

    def _signal(self) -> None:
        """Make the fd readable with no record: wakes a task waiting on it to re-check (trio)."""
        if self._native is not None:
            lib.emlx_channel_signal(self._native)

    def close_from_any_thread(self) -> None:
        """``close`` for finalizers, which may run off the loop thread."""
        if self._native is None:
            return
        if not self.backend.call_soon_threadsafe(self.close):  # the loop is gone: close here
            self.close()

    def _drain(self) -> None:
        """Resolve finished jobs (the fd is readable); runs on the loop thread.

        Each record is handled on its own: an exception while finishing one
        job fails that job's future (or, if it is settled already, goes to
        the loop's exception handler) and the drain goes on with the rest.
        One bad job never strands the others.
        """
        records, jobs, drain = self._records, self.jobs, lib.emlx_channel_drain
        while self._native is not None:
            count = drain(self._native, records, _DRAIN_BATCH)
            for i in range(count):
                record = records[i]
                status = record.status
                job = jobs.get(record.job_id) if status not in (_HOST_REQUEST, _HOST_FREED) else None
                try:
                    if status == _DONE and job is not None and record.message == _NULL:
                        del jobs[record.job_id]  # the common record, without _handle's general path
                        job.queue._finish(job, _DONE, 0, None, record.payload, record.payload_kind,
                                          record.started_ns, record.finished_ns)
                    else:
                        self._handle(record)
                except Exception as exc:  # noqa: BLE001 - isolated to its job, reported
                    future = getattr(job, "future", None)
                    if future is not None and not future.done():
                        future.set_exception(exc)
                    else:
                        self.backend.report_error(f"emlx_async: handling the completion of job {record.job_id} "
                                                  "failed", exc)
            if count < _DRAIN_BATCH:
                break

    def _handle(self, record) -> None:
        """One completion record: a job's end, or a host call's request."""
        message = None
        if record.message != ffi.NULL:
            message = ffi.string(record.message).decode(errors="replace")
            lib.emlx_message_free(record.message)
        if record.status == lib.EMLX_HOST_REQUEST:
            if self.host_server is not None:
                self.host_server.request(record.job_id)
            else:  # no host call was ever built here: answer so the worker moves on
                lib.emlx_host_request_reply(record.job_id, ffi.NULL, 0,
                                            b"[host_call] this runtime serves no host calls")
            return
        if record.status == _HOST_FREED:  # job_id is a call id
            if self.host_server is not None:
                self.host_server.freed(record.job_id)
            return
        job = self.jobs.pop(record.job_id, None)
        if job is None:
            if record.payload != ffi.NULL:
                lib.emlx_payload_free(record.payload)
            return
        job.queue._finish(job, record.status, record.error_kind, message, record.payload,
                          record.payload_kind, record.started_ns, record.finished_ns)
