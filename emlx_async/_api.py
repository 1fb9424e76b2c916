"""Top-level calls: eval, item, to_numpy, synchronize, run, current_queue."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from ._backend import wait_all
from ._devices import DeviceLike
from ._queue import CommandQueue
from ._routing import prepare_inputs, route
from ._runtime import get_runtime
from ._trees import iter_arrays


async def eval(*arrays: Any, queue: CommandQueue | None = None) -> Any:  # noqa: A001 - MLX's name
    """Evaluate arrays (or trees of them) without blocking the event loop.

    Each lazy array is evaluated natively, without the GIL, on the queue that
    owns it (or on `queue`); lazy graphs built on the loop thread are
    evaluated there. Returns the argument, or a tuple of the arguments.

    Example:
        >>> y = await ea.eval(lazy_y)
    """
    flat = list(iter_arrays(arrays))
    if queue is not None:
        await queue.eval(*flat)
    else:
        # Owned lazy arrays are evaluated on their owners; the loop thread's
        # own here (a foreign one is a clear error).
        pending = prepare_inputs(get_runtime().channel, flat, None)
        if pending:
            await wait_all(pending)
    return arrays[0] if len(arrays) == 1 else arrays


async def item(array: mx.array, /, *, queue: CommandQueue | None = None) -> Any:
    """The value of a one-element array as a Python scalar, evaluating it first."""
    await eval(array, queue=queue)
    return array.item()


async def to_numpy(array: mx.array, /, *, queue: CommandQueue | None = None) -> np.ndarray:
    """A NumPy copy of `array`, evaluating it first."""
    await eval(array, queue=queue)
    return np.array(array, copy=True)


async def synchronize(device: DeviceLike = None, *, queue: CommandQueue | None = None) -> None:
    """Wait for the work queued on `queue` (default: the current queue for `device`)."""
    await route((), queue, device, runtime=get_runtime).synchronize()


async def run(fn: Any, /, *args: Any, queue: CommandQueue | None = None, **kwargs: Any) -> Any:
    """``queue.run`` on the routed queue: explicit, owner of a lazy input, bound, default."""
    target = route(iter_arrays((args, kwargs)), queue, runtime=get_runtime)
    return await target.run(fn, *args, **kwargs)


def current_queue(device: DeviceLike = None) -> CommandQueue:
    """The queue work from this task goes to: the bound one, else the runtime's default.

    With `device`, a bound queue on another device is skipped in favour of the
    default queue of `device`.
    """
    return route((), device=device, runtime=get_runtime)
