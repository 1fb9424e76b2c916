"""Binding queues to tasks: the contextvar every routing decision reads.

Layer: above queues, below the runtime (which binds a lent queue for
``async with rt.queue()``) and routing.
"""

from __future__ import annotations

import contextvars
from typing import Any

from ._queue import CommandQueue

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


def set_bound(queue: CommandQueue | None) -> contextvars.Token:
    return _bound.set(queue)


def reset_bound(token: contextvars.Token) -> None:
    _bound.reset(token)
