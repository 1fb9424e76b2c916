"""The Responses API's stored responses (``store``, ``previous_response_id``), in memory.

A stored response keeps its object (``GET /v1/responses/{id}`` answers it)
and its conversation as items: the conversation of the response it continued
(held by reference, not copied), then its own input and output. The input
items, the earlier conversation's and its own, are what
``GET /v1/responses/{id}/input_items`` lists. A request naming it continues
that conversation. ``instructions`` are not items, so they are not carried
over, as OpenAI's are not.

A streamed response is kept from its start, ``in_progress``, and replaced
by its end (completed, incomplete, failed, or cancelled when the client
left), unless it was deleted (or dropped) meanwhile; a collected one is kept
once answered, as its client first sees its id then. Each is
kept as JSON text, so what the store holds is about what it counts. A
response is counted with its whole conversation (the earlier responses it
holds stay in memory while it does, kept or not), so the bound holds
whatever was dropped: at most `max_responses` responses and `max_chars`
characters, the oldest out first; a response whose conversation alone is
larger is not kept. The store lives in the server's process and is gone when
the server stops.

A response streamed in the background keeps its events (an EventLog), which
``GET /v1/responses/{id}?stream=true`` replays. While it runs they are its
run's, bounded by its generation (a few events a token, at most its
max_output_tokens or the context's) and the runs by admission
(--max-concurrent plus --max-waiting); once it ended they are kept with it,
counted against the same bounds and dropped with it (not kept where the
response and its events would not fit the store together). A later response
that continues it holds its conversation, never its events.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator

import anyio

MAX_STORED_RESPONSES = 1024
MAX_STORED_CHARS = 64 << 20
# Why a response was not kept (StoredResponses.put).
TOO_LARGE = "its conversation is larger than the store"
GONE = "it was deleted, or dropped for newer ones, while it ran"


def conversation_chars(input_json: str, output_json: str, earlier: StoredResponse | None) -> int:
    """What a response's conversation counts in the store: its own input and output items (JSON
    text) and all the earlier conversation it holds."""
    return len(input_json) + len(output_json) + (earlier.conversation_chars if earlier else 0)


class EventLog:
    """A background stream's events as sent (server-sent events, a byte counted as a
    character), in order: the event of sequence number n is the n-th. Its run appends
    them and closes it at its end; each reader follows it (`after`) until then."""

    def __init__(self):
        self._events: list[bytes] = []
        self.chars = 0
        self.closed = False
        self._grown = anyio.Event()  # set, and replaced, at each event and at the close

    def append(self, event: bytes) -> None:
        self._events.append(event)
        self.chars += len(event)
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        self._grown.set()
        self._grown = anyio.Event()

    async def after(self, sequence_number: int) -> AsyncIterator[bytes]:
        """The events after `sequence_number` (-1: all of them), then each one appended, until closed."""
        index = sequence_number + 1
        while True:
            while index < len(self._events):
                yield self._events[index]
                index += 1
            if self.closed:
                return
            await self._grown.wait()


class StoredResponse:
    """One kept response: its object, and its input and output items, as JSON text."""

    __slots__ = ("response_json", "status", "background", "input_json", "_output_json", "_earlier", "chars",
                 "_cut_call_ids")

    def __init__(self, response: dict, input_json: str, output: list[dict], earlier: StoredResponse | None):
        # `input_json`: its input items as JSON text (encoded once, at the response's start).
        self.response_json = json.dumps(response)
        self.status: str = response.get("status", "completed")
        self.background: bool = bool(response.get("background"))  # only a background one can be cancelled
        self.input_json = input_json
        self._output_json = json.dumps(output)
        self._earlier = earlier
        # Its incomplete calls are not among its output items (they cannot be sent back); their
        # ids are kept so that a result answering one is told why.
        self._cut_call_ids = frozenset(
            item["call_id"] for item in response.get("output") or ()
            if item.get("type") == "function_call" and item.get("status") == "incomplete")
        # Its own text and all its conversation holds (the earlier responses stay while it does).
        self.chars = len(self.response_json) + conversation_chars(input_json, self._output_json, earlier)

    @property
    def conversation_chars(self) -> int:
        return self.chars - len(self.response_json)

    def _chain(self) -> list[StoredResponse]:
        chain, stored = [], self
        while stored is not None:
            chain.append(stored)
            stored = stored._earlier
        return chain[::-1]

    def items(self) -> list[dict]:
        """The conversation's items, oldest first: each response's input, then its output
        (parsed anew: the caller may change them)."""
        return [item for stored in self._chain()
                for text in (stored.input_json, stored._output_json) for item in json.loads(text)]

    def cut_call_ids(self) -> frozenset[str]:
        """The call_ids of the incomplete function_call items (arguments cut short) of the
        conversation's responses, which its items leave out."""
        return frozenset().union(*(stored._cut_call_ids for stored in self._chain()))

    def input_items(self) -> list[dict]:
        """The items its answer was generated from: the earlier conversation, then its own input."""
        earlier = self._earlier.items() if self._earlier is not None else []
        return earlier + json.loads(self.input_json)


class StoredResponses:
    """Responses by id, bounded; read by parsers off the event loop, so guarded by a lock."""

    def __init__(self, max_responses: int = MAX_STORED_RESPONSES, max_chars: int = MAX_STORED_CHARS):
        self.max_responses, self.max_chars = max_responses, max_chars
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()
        # Background streams' events by their responses' ids (keep_events), counted in _chars too.
        self._events: dict[str, EventLog] = {}
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._responses)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            return self._responses.get(response_id)

    def put(self, response: dict, input_json: str, output: list[dict] = (),
            earlier: StoredResponse | None = None, *, replacing: bool = False) -> str | None:
        """Keep `response` (its id is its key) with its input items (`input_json`, JSON text)
        and `output` items, after the conversation of `earlier`. `replacing`: a response's
        end, kept only in place of its start (not where that was deleted or dropped
        meanwhile). Returns why it was not kept (None: kept)."""
        stored = StoredResponse(response, input_json, list(output), earlier)
        with self._lock:
            if replacing and not self._drop(response["id"]):
                return GONE
            if stored.chars > self.max_chars:
                return TOO_LARGE
            self._drop(response["id"])
            self._responses[response["id"]] = stored
            self._chars += stored.chars
            self._drop_oldest()
        return None

    def keep_events(self, response_id: str, events: EventLog) -> str | None:
        """Keep `events`, a background stream's once it ended, with its stored response, counted
        against the same bounds. Returns why they were not kept (None: kept)."""
        with self._lock:
            stored = self._responses.get(response_id)
            if stored is None:
                return GONE
            if stored.chars + events.chars > self.max_chars:
                return TOO_LARGE
            self._events[response_id] = events
            self._chars += events.chars
            self._drop_oldest()
        return None

    def events(self, response_id: str) -> EventLog | None:
        """The events kept with a stored response (None: none were)."""
        with self._lock:
            return self._events.get(response_id)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._drop(response_id)

    def _drop_oldest(self) -> None:
        while len(self._responses) > self.max_responses or self._chars > self.max_chars:
            self._drop(next(iter(self._responses)))

    def _drop(self, response_id: str) -> bool:
        stored = self._responses.pop(response_id, None)
        if stored is None:
            return False
        events = self._events.pop(response_id, None)
        self._chars -= stored.chars + (events.chars if events is not None else 0)
        return True


__all__ = ["GONE", "MAX_STORED_CHARS", "MAX_STORED_RESPONSES", "TOO_LARGE", "EventLog", "StoredResponse",
           "StoredResponses", "conversation_chars"]
