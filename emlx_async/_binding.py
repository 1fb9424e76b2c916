"""Binding queues to tasks, and the routing rule every op follows.

Routing, first match wins: an explicit ``queue=``; the queue that owns a lazy
input (a lazy array built on queue Q continues on Q); the queue bound to the
current task (``bind``); the runtime's default queue for the device.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable
from typing import Any

import mlx.core as mx

from ._devices import DeviceLike, device_type
from ._queue import CommandQueue
from ._runtime import get_runtime

_bound: contextvars.ContextVar[CommandQueue | None] = contextvars.ContextVar(
    "emlx_async_bound_queue", default=None)


class bind:
    """Bind `queue` to the current task (and the tasks it starts) for a block.

    Usable as ``with ea.bind(q):`` and ``async with ea.bind(q):``. Bindings
    live in a contextvar, so child tasks inherit them and sibling tasks are
    unaffected.
    """

    def __init__(self, queue: CommandQueue):
        if not isinstance(queue, CommandQueue):
            raise TypeError(f"ea.bind() needs a CommandQueue, got {type(queue).__name__}")
        self.queue = queue
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> CommandQueue:
        self._tokens.append(_bound.set(self.queue))
        return self.queue

    def __exit__(self, *exc_info: Any) -> None:
        _bound.reset(self._tokens.pop())

    async def __aenter__(self) -> CommandQueue:
        return self.__enter__()

    async def __aexit__(self, *exc_info: Any) -> None:
        self.__exit__()


def bound_queue() -> CommandQueue | None:
    """The queue bound to the current task, or None."""
    return _bound.get()


def current_queue(device: DeviceLike = None) -> CommandQueue:
    """The queue work from this task goes to: the bound one, else the default.

    With `device`, a bound queue on another device is skipped in favour of the
    default queue of `device`.
    """
    queue = _bound.get()
    if queue is not None and not queue._closing and (device is None or queue.device == device_type(device)):
        return queue
    return get_runtime().default_queue(device)


def route(arrays: Iterable[mx.array], queue: CommandQueue | None = None,
          device: DeviceLike = None) -> CommandQueue:
    """Pick the queue for an op on `arrays` by the routing rule above."""
    if queue is not None:
        return queue
    runtime = get_runtime()
    for array in arrays:
        owner = runtime.queue_of(array)
        if owner is not None:
            return owner
    return current_queue(device)
