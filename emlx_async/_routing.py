"""The routing rule every op and job follows.

First match wins: an explicit ``queue=``; the queue that owns a lazy input
(a lazy array built on queue Q continues on Q); the queue bound to the
current task (``bind``); the runtime's default queue for the device.
"""

from __future__ import annotations

from collections.abc import Iterable

import mlx.core as mx

from ._context import bound_queue
from ._devices import DeviceLike, device_type
from ._queue import CommandQueue
from ._runtime import Runtime, get_runtime


def current_queue(device: DeviceLike = None, runtime: Runtime | None = None) -> CommandQueue:
    """The queue work from this task goes to: the bound one, else the default.

    With `device`, a bound queue on another device is skipped in favour of the
    default queue of `device`. `runtime`: the running loop's, when the caller
    has looked it up already.
    """
    queue = bound_queue()
    if queue is not None and not queue._closing and (device is None or queue.device == device_type(device)):
        return queue
    return (runtime if runtime is not None else get_runtime()).default_queue(device)


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
    return current_queue(device, runtime)
