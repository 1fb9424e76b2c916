"""The routing rule: which queue runs a call, and how its inputs become usable there.

Which queue (``route``), first match wins:

1. an explicit ``queue=``;
2. ``device=`` (mlx's ``stream=`` arrives as its device: ``stream_device``):
   the bound queue if it is on that device, else the runtime's default queue
   of that device; the inputs' owners do not count (the call is promoted);
3. the queue that owns a lazy input (a lazy array built on queue Q continues
   on Q);
4. the queue bound to the current task (``ea.bind``, ``rt.queue()``);
5. the runtime's default queue.

A closing bound queue is skipped. How the inputs become usable on the chosen
queue (``prepare_inputs``): graphs it owns stay as they are; graphs owned by
another queue are evaluated there first (the call waits for them, keeping
its place); graphs built on the loop thread are evaluated on the loop; a
graph from any other thread is refused (``ForeignLazyArrayError``), as MLX
streams are thread-local.

Layer: above the completion channel, below queues, so that a queue makes
its own inputs usable with the same rule. The runtime is not importable
here; ``route`` is given a function returning the running loop's runtime
(``get_runtime``) and calls it only when no explicit queue decides.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import mlx.core as mx

from . import _interop
from ._devices import DeviceLike, device_type, native_device
from ._errors import ForeignLazyArrayError
from ._native import lib

if TYPE_CHECKING:
    from ._channel import CompletionChannel
    from ._queue import CommandQueue
    from ._runtime import Runtime

Owners = dict[tuple[int, int], "CommandQueue"]  # a channel's (native device, stream index) -> queue

_bound: contextvars.ContextVar[CommandQueue | None] = contextvars.ContextVar(
    "emlx_async_bound_queue", default=None)


def bound_queue() -> CommandQueue | None:
    """The queue bound to the current task, or None."""
    return _bound.get()


def set_bound(queue: CommandQueue | None) -> contextvars.Token:
    return _bound.set(queue)


def reset_bound(token: contextvars.Token) -> None:
    _bound.reset(token)


def owner_of(owners: Owners, array: mx.array) -> CommandQueue | None:
    """The queue owning a lazy `array`, or None if it is evaluated or no queue of `owners` owns it."""
    state = _interop.array_state(array)
    return _owner(owners, state) if state.state == _interop.LAZY else None


# The owners map is keyed here only: a queue by its device and stream, a lazy
# array by the stream its graph was built on.
def add_owner(owners: Owners, queue: CommandQueue) -> None:
    """Route lazy arrays built on `queue`'s stream to `queue`."""
    owners[(native_device(queue.device), queue.stream_index)] = queue


def remove_owner(owners: Owners, queue: CommandQueue) -> None:
    owners.pop((native_device(queue.device), queue.stream_index), None)


def _owner(owners: Owners, state: _interop.ArrayState) -> CommandQueue | None:
    return owners.get((state.device_type, state.stream_index))


def route(arrays: Iterable[mx.array], queue: CommandQueue | None = None, device: DeviceLike = None, *,
          runtime: Callable[[], Runtime]) -> CommandQueue:
    """The queue a call on `arrays` runs on, by the rule above.

    `runtime`: returns the running loop's runtime (``get_runtime``); called
    at most once, and not at all for an explicit `queue`.
    """
    if queue is not None:
        return queue
    loop_runtime = runtime()
    if device is None:
        owners = loop_runtime.channel.owners
        for array in arrays:
            owner = owner_of(owners, array)
            if owner is not None:
                return owner
    bound = _bound.get()
    if bound is not None and not bound._closing and (device is None or bound.device == device_type(device)):
        return bound
    return loop_runtime.default_queue(device)


def _is_this_threads_stream(state: _interop.ArrayState) -> bool:
    return lib.emlx_thread_stream_index(state.device_type) == state.stream_index


def _eval_here(arrays: list[mx.array]) -> None:
    """Evaluate `arrays` on this thread; a node of another thread's stream, at the top
    or deep in the graph, is a ForeignLazyArrayError naming that stream."""
    _interop.check_evaluable(arrays, "eval")
    try:
        mx.eval(arrays)
    except RuntimeError as exc:
        foreign = re.fullmatch(r"There is no (Stream\(.*\)) in current thread\.?", str(exc))
        if foreign is None:
            raise
        raise ForeignLazyArrayError(
            f"a lazy array built on {foreign.group(1)}, in the graph given, belongs to another thread (no queue "
            "of this runtime owns it); evaluate it where it was built (mx.eval on that thread, or ea.eval under the runtime "
            "whose queue built it) before passing it in") from None


def prepare_inputs(channel: CompletionChannel, arrays: list[mx.array],
                   target: CommandQueue | None) -> list:
    """Make lazy inputs usable on `target`'s thread (None: on the loop thread, for ``ea.eval``).

    Graphs built on the loop thread are evaluated here (cheap for inputs;
    big graphs belong on a queue). Graphs owned by another queue are
    submitted for evaluation there: the returned futures must finish first.
    """
    if not arrays:
        return []
    on_loop: list[mx.array] = []
    other_streams: list[mx.array] = []  # this thread's other streams, or foreign
    elsewhere: dict[CommandQueue, list[mx.array]] = {}
    array_state, lazy = _interop.array_state, _interop.LAZY
    for array in arrays:
        state = array_state(array)
        if state.state != lazy:
            continue
        owner = _owner(channel.owners, state)
        if owner is not None and owner is target:
            continue
        if owner is not None:
            elsewhere.setdefault(owner, []).append(array)
        elif _is_this_threads_stream(state):
            on_loop.append(array)
        else:
            other_streams.append(array)
    if on_loop:
        _eval_here(on_loop)
    for array in other_streams:
        # A stream of this thread (mx.new_stream) evaluates here; MLX refuses another
        # thread's stream when its evaluation reaches it (what came before may have run).
        _eval_here([array])
    return [owner.eval(*group) for owner, group in elsewhere.items()]


__all__ = ["add_owner", "bound_queue", "owner_of", "prepare_inputs", "remove_owner", "reset_bound", "route",
           "set_bound"]
