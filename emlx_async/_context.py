"""``ea.bind``: bind a queue to a task, for the routing rule (``_routing``) to read.

Layer: above queues, below the runtime (which binds a lent queue for
``async with rt.queue()``).
"""

from __future__ import annotations

import contextvars
from typing import Any

from ._errors import InvalidArgumentType
from ._queue import CommandQueue
from ._routing import reset_bound, set_bound


class bind:
    """Bind `queue` to the current task (and the tasks it starts) for a block.

    Usable as ``with ea.bind(q):`` and ``async with ea.bind(q):``. Bindings
    live in a contextvar, so child tasks inherit them and sibling tasks are
    unaffected.
    """

    def __init__(self, queue: CommandQueue):
        if not isinstance(queue, CommandQueue):
            raise InvalidArgumentType(f"ea.bind() needs a CommandQueue, got {type(queue).__name__}")
        self.queue = queue
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> CommandQueue:
        self._tokens.append(set_bound(self.queue))
        return self.queue

    def __exit__(self, *exc_info: Any) -> None:
        reset_bound(self._tokens.pop())

    async def __aenter__(self) -> CommandQueue:
        return self.__enter__()

    async def __aexit__(self, *exc_info: Any) -> None:
        self.__exit__()
