"""The Responses API's stored responses (``store``, ``previous_response_id``), in memory.

A stored response keeps its object (``GET /v1/responses/{id}`` answers it)
and its conversation as input items: the input it was given (after the
conversation of its ``previous_response_id``, if any) and its output. A
request naming it continues that conversation. ``instructions`` are not
items, so they are not carried over, as OpenAI's are not.

The store is bounded, oldest first out: at most `max_responses` responses
and `max_chars` characters of their JSON; one larger than that alone is not
kept. It lives in the server's process and is gone when the server stops.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

MAX_STORED_RESPONSES = 1024
MAX_STORED_CHARS = 64 << 20


@dataclass(frozen=True)
class StoredResponse:
    response: dict        # the response object as it was answered
    items: tuple          # its conversation: input items, then its output items
    chars: int            # what it holds, for the bound


class StoredResponses:
    """Responses by id, bounded; read by parsers off the event loop, so guarded by a lock."""

    def __init__(self, max_responses: int = MAX_STORED_RESPONSES, max_chars: int = MAX_STORED_CHARS):
        self.max_responses, self.max_chars = max_responses, max_chars
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._responses)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            return self._responses.get(response_id)

    def put(self, response: dict, items: list[dict]) -> None:
        """Keep `response` (its id is its key) with its conversation's `items`."""
        chars = len(json.dumps(response)) + len(json.dumps(items))
        if chars > self.max_chars:
            return
        stored = StoredResponse(response, tuple(items), chars)
        with self._lock:
            self._drop(response["id"])
            self._responses[response["id"]] = stored
            self._chars += chars
            while len(self._responses) > self.max_responses or self._chars > self.max_chars:
                self._drop(next(iter(self._responses)))

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        stored = self._responses.pop(response_id, None)
        if stored is None:
            return False
        self._chars -= stored.chars
        return True


__all__ = ["MAX_STORED_CHARS", "MAX_STORED_RESPONSES", "StoredResponse", "StoredResponses"]
