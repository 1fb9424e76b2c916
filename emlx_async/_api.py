"""Top-level calls: eval, item, to_numpy, synchronize, run, current_queue."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

import mlx.core as mx
import numpy as np

from ._backend import JobFuture, current_key, wait_all
from ._devices import DeviceLike
from ._errors import InvalidArgumentType
from ._queue import CommandQueue
from ._routing import prepare_inputs, route
from ._runtime import get_runtime
from ._trees import iter_arrays


_Call = TypeVar("_Call", bound=Callable[..., Any])

# Each call submits its work when called, as ops and ``q.run`` do, so its place in
# a queue is fixed at the call even when a task group starts it later (trio's
# nursery.start_soon runs tasks in no fixed order); the awaitable returned (a
# JobFuture or a coroutine) only waits.

def _submits_at_the_call(call: _Call) -> _Call:
    """Outside a running loop (``asyncio.run(ea.run(fn))``) nothing can be submitted yet:
    there the call returns a coroutine that makes it once the loop runs it."""

    @functools.wraps(call)
    def submitting(*args: Any, **kwargs: Any) -> Any:
        if current_key() is None:
            return _in_the_loop(call, args, kwargs)
        return call(*args, **kwargs)

    return cast(_Call, submitting)


async def _in_the_loop(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    return await call(*args, **kwargs)


@_submits_at_the_call
def eval(*arrays: Any, queue: CommandQueue | None = None) -> Coroutine[Any, Any, Any]:  # noqa: A001 - MLX's name
    """Evaluate arrays (or trees of them) without blocking the event loop.

    Each lazy array is evaluated natively, without the GIL, on the queue that
    owns it (or on `queue`); lazy graphs built on the loop thread are
    evaluated there. Awaiting it returns the argument, or a tuple of the arguments.

    Example:
        >>> y = await ea.eval(lazy_y)
    """
    return _after(_evaluations(list(iter_arrays(arrays)), queue), lambda: arrays[0] if len(arrays) == 1 else arrays)


@_submits_at_the_call
def item(array: mx.array, /, *, queue: CommandQueue | None = None) -> Coroutine[Any, Any, Any]:
    """The value of a one-element array as a Python scalar, evaluating it first."""
    _check_array("ea.item", array)
    return _after(_evaluations([array], queue), array.item)


@_submits_at_the_call
def to_numpy(array: mx.array, /, *, queue: CommandQueue | None = None) -> Coroutine[Any, Any, np.ndarray]:
    """A NumPy copy of `array`, evaluating it first."""
    _check_array("ea.to_numpy", array)
    return _after(_evaluations([array], queue), lambda: np.array(array, copy=True))


@_submits_at_the_call
def synchronize(device: DeviceLike = None, *, queue: CommandQueue | None = None) -> JobFuture:
    """Wait for the work queued on `queue` (default: the current queue for `device`)."""
    return route((), queue, device, runtime=get_runtime).synchronize()


@_submits_at_the_call
def run(fn: Any, /, *args: Any, queue: CommandQueue | None = None, **kwargs: Any) -> JobFuture:
    """``queue.run`` on the routed queue: explicit, owner of a lazy input, bound, default."""
    target = route(iter_arrays((args, kwargs)), queue, runtime=get_runtime)
    return target.run(fn, *args, **kwargs)


def _check_array(call: str, array: Any) -> None:
    if not isinstance(array, mx.array):
        raise InvalidArgumentType(f"{call} takes an mx.array, got {type(array).__name__}")


def _evaluations(flat: list[mx.array], queue: CommandQueue | None) -> list:
    """Submit the evaluation of `flat`'s lazy arrays: on `queue`, or each on the queue that owns
    it (the loop thread's own are evaluated here; a foreign one is a clear error)."""
    if queue is not None:
        return [queue.eval(*flat)]
    return prepare_inputs(get_runtime().channel, flat, None)


async def _after(pending: list, value: Callable[[], Any]) -> Any:
    if pending:
        await wait_all(pending)
    return value()


def current_queue(device: DeviceLike = None) -> CommandQueue:
    """The queue work from this task goes to: the bound one, else the runtime's default.

    With `device`, a bound queue on another device is skipped in favour of the
    default queue of `device`.
    """
    return route((), device=device, runtime=get_runtime)
