"""Helpers for users' tests: leak checks for workers, threads and fds."""

from __future__ import annotations

import os

from ._native import lib


def active_workers() -> int:
    """Worker threads leased to a queue right now (0 once every queue is closed)."""
    return lib.emlx_workers_active()


def parked_workers() -> int:
    """Idle worker threads kept with their MLX stream for reuse."""
    return lib.emlx_workers_parked()


def sweep_orphans() -> None:
    """Free what runtimes collected while open left behind (done by every new Runtime too)."""
    from ._runtime import _sweep_orphans

    _sweep_orphans()


def thread_count() -> int:
    """OS threads in this process (Linux: /proc/self/task)."""
    return len(os.listdir("/proc/self/task"))


def open_fds() -> set[int]:
    """This process's open file descriptors (Linux: /proc/self/fd)."""
    return {int(fd) for fd in os.listdir("/proc/self/fd")}
