"""What the Messages and the Responses APIs share on top of the service.

Each API parses its own body into a GenerationRequest and formats its own answers
(a ``Reply``); this module holds the parts they have in common: field
checks whose errors name the field and never echo a value (a repr of a
deeply nested value can itself fail), the route that admits a request and answers it collected or
streamed (a disconnect or the shutdown deadline may cut either short),
an answer cut into text and tool calls (``AnswerParts``), and streams of
named server-sent events (``event: NAME``), which both APIs use where chat
sends bare ``data:`` lines.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import DistributedError
from . import middleware
from .service import (JSON, EventStream, Generation, Service, distributed_cause, encode_json, grammar_error,
                      group_broken_error, read_json, shutdown_error, until_disconnected)
# An integer as JSON Schema (and so the OpenAPI document) counts them: 8.0 is one.
from .protocol import _is_int as is_int
from .protocol import APIError, GenerationRequest, invalid, type_name
from .tools import CallArguments, CallEnd, CallStart, Content, Reasoning

logger = logging.getLogger("emlx_async.serve")


def event(name: str, data: dict) -> bytes:
    """One named server-sent event."""
    return b"event: " + name.encode() + b"\ndata: " + encode_json(data) + b"\n\n"


# ---- field checks -------------------------------------------------------------------

def wrong_type(param: str, expected: str, value: Any) -> APIError:
    return invalid(param, f"{param}: expected {expected}, got {type_name(value)}", "invalid_type")


def integer(body: dict, name: str, *, low: int, high: int | None = None, required: bool = False,
            param: str | None = None) -> int | None:
    """body[name], an integer in the bounds; errors name `param` (default: `name`)."""
    value = body.get(name)
    name = param or name
    if value is None:
        if required:
            raise invalid(name, f"{name}: field required", "missing_required_parameter")
        return None
    if not is_int(value):
        raise wrong_type(name, "an integer", value)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        # The value is an int here: its digits are bounded by the JSON parser.
        raise invalid(name, f"{name}: must be {bound}, got {value}")
    return int(value)


def number(body: dict, name: str, default: float, low: float, high: float, *, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value or abs(value) == float("inf"):
        raise wrong_type(name, "a finite number", value)
    bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
    try:
        value = float(value)
    except OverflowError:  # an integer past any float
        raise invalid(name, f"{name}: must be in {bounds}") from None
    if value < low or value > high or (low_open and value == low):
        raise invalid(name, f"{name}: must be in {bounds}, got {value:g}")
    return value


def boolean(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise wrong_type(name, "a boolean", value)
    return bool(value)


def string(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise wrong_type(name, "a string", value)
    return value


def string_list(body: dict, name: str, max_items: int) -> list[str]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise wrong_type(name, "an array of strings", value)
    if len(value) > max_items:
        raise invalid(name, f"{name}: at most {max_items} items, got {len(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise invalid(f"{name}[{i}]", f"{name}[{i}]: expected a non-empty string, got {type_name(item)}",
                          "invalid_type")
        checked_text(item, f"{name}[{i}]")
    return value


def checked_text(value: str, param: str) -> str:
    """`value`, refused if it holds a lone surrogate (JSON allows one; a tokenizer cannot encode it)."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise invalid(param, f"{param}: the text is not valid Unicode (a lone surrogate at {exc.start})") from None
    return value


def required_text(item: dict, name: str, where: str) -> str:
    """``item[name]``, a non-empty string (the field is named ``where.name``)."""
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise invalid(f"{where}.{name}", f"{where}.{name}: expected a non-empty string, got {type_name(value)}",
                      "invalid_type" if value is not None else "missing_required_parameter")
    return checked_text(value, f"{where}.{name}")


def joined_text(content, param: str, *, text_types: tuple[str, ...], noun: str,
                refusals: dict[str, str] | None = None) -> str:
    """A string, or an array of `noun` objects whose type is one of `text_types`
    (their texts joined; other keys such as cache_control are ignored). A type
    in `refusals` is refused with its reason; any other with the types allowed."""
    if isinstance(content, str):
        return checked_text(content, param)
    if not isinstance(content, list):
        raise wrong_type(param, f"a string or an array of {noun}s", content)
    texts = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise wrong_type(where, f"a {noun} object", part)
        kind = part.get("type")
        if kind not in text_types:
            if not isinstance(kind, str):
                raise wrong_type(f"{where}.type", "a string", kind)
            reason = (refusals or {}).get(kind)
            raise invalid(f"{where}.type", f"{where}.type: '{kind}' {reason}" if reason else
                          f"{where}.type: only {' and '.join(repr(t) for t in text_types)} {noun}s are supported",
                          "unsupported_value")
        text = part.get("text")
        if not isinstance(text, str):
            raise wrong_type(f"{where}.text", "a string", text)
        texts.append(checked_text(text, f"{where}.text"))
    return "".join(texts)


def optional_object(body: dict, name: str) -> dict | None:
    value = body.get(name)
    if value is not None and not isinstance(value, dict):
        raise wrong_type(name, "an object", value)
    return value


async def read_object(request: Request, limit: int, timeout: float) -> dict:
    """The request's JSON object (413 past `limit` bytes, 408 past `timeout` seconds,
    400 for anything but an object)."""
    try:
        body = await read_json(request, limit, timeout)
    except RecursionError:  # nested past the parser's depth
        raise APIError(400, "the request body is nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid(None, f"the request body must be a JSON object, got {type_name(body)}", "invalid_type")
    return body


# ---- running a generation -----------------------------------------------------------

@dataclass
class Collected:
    """A finished generation's text, the ids of its tokens, and the token of
    its last delta (None when the engine ended it, not a token)."""

    text: str
    tokens: list[int] = field(default_factory=list)
    last_token: int | None = None
    pieces: list[str] = field(default_factory=list)  # the deltas' texts, in order
    # With the request's logprobs: each delta's logprob entry (None for a delta of no token).
    logprobs: list[dict | None] = field(default_factory=list)


def failure(exc: Exception, id_: str, request: GenerationRequest | None = None) -> APIError:
    """The error to report for a generation that raised mid-way."""
    broken = distributed_cause(exc)
    if broken is not None:
        logger.error("generation %s failed: %s", id_, broken)
        return group_broken_error(broken)
    failed = grammar_error(exc, request) if request is not None and request.grammar is not None else None
    if failed is not None:  # that request's grammar alone
        return failed
    logger.exception("generation %s failed", id_, exc_info=exc)
    return APIError(500, f"generation failed: {type(exc).__name__}", type="server_error")


async def collect(service: Service, generation: Generation, receive: Callable | None, id_: str,
                  parsed: GenerationRequest | None = None) -> Collected | None:
    """Run a generation to its end; None when the client left first (`receive`, the request's
    ASGI receive, says so; None: a background run, which has no client to watch).

    Raises APIError when the shutdown deadline or a failure ended it.
    """
    text: list[str] = []
    tokens: list[int] = []
    last: list = [None]
    entries: list[dict | None] = []
    logprobs = parsed is not None and parsed.logprobs
    shutdown_scope = anyio.CancelScope()
    try:
        with service.on_cut_off(shutdown_scope.cancel), shutdown_scope:
            async with anyio.create_task_group() as group:
                async def run() -> None:
                    async for delta in generation.deltas():
                        text.append(delta.text)
                        if delta.token is not None:
                            tokens.append(delta.token)
                        last[0] = delta.token
                        if logprobs:
                            entries.append(generation.logprob_entry(delta))
                    group.cancel_scope.cancel()

                async def watch() -> None:
                    await until_disconnected(receive)
                    group.cancel_scope.cancel()

                group.start_soon(run)
                if receive is not None:
                    group.start_soon(watch)
    except Exception as exc:  # noqa: BLE001 - reported in the API's own shape
        raise failure(exc, id_, parsed) from None
    finally:
        await generation.aclose()
    if generation.finish_reason is None:
        if shutdown_scope.cancel_called:
            raise shutdown_error()
        return None
    return Collected("".join(text), tokens, last[0], text, entries)


async def guarded(answer: Reply, generation: Generation,
                  request: GenerationRequest | None = None) -> AsyncIterator[bytes]:
    """`answer`'s events, ended by its `failed` event if they raise (the status line is gone
    by then); the answer is told when it ended early, and the generation is closed however
    they end."""
    events = answer.events()
    ended = False
    try:
        async for chunk in events:
            yield chunk
        ended = True
    except Exception as exc:  # noqa: BLE001 - the error goes in the stream
        ended = True
        closing = last_event(answer, failure(exc, answer.id, request))
        if closing:  # (none after its end: the engine failed letting go of the slot)
            yield closing
    finally:
        if not ended:  # the client left (a shutdown's trailer, sent after this, says why instead)
            answer.ended_early(None)
        with anyio.CancelScope(shield=True):
            await events.aclose()  # type: ignore[attr-defined]
            await generation.aclose()


def last_event(answer: Reply, error: APIError) -> bytes:
    """The event that ends `answer`'s stream that `error` cut short, the answer told so;
    nothing where its end was already made (the engine still letting go of the slot after
    the last token: a completed answer gets no error after it)."""
    if answer.ended:
        return b""
    answer.ended_early(error)
    return answer.failed(error)


def count(service: Service, endpoint: str, response: Response) -> Response:
    service.metrics.requests.labels(endpoint, str(response.status_code)).inc()
    return response


# ---- the route both APIs share ----------------------------------------------------

class Parsed(Protocol):
    generation: GenerationRequest


class Reply(Protocol):
    """One API's answer to one admitted request."""

    id: str

    @property
    def ended(self) -> bool:
        """Whether its end has been made: its last event or body, or a failure's event (a stream's
        last event is made as it is written: a single write takes no checkpoint to be cut off at)."""

    def events(self) -> AsyncIterator[bytes]:
        """The streamed answer: the API's named events."""

    def failed(self, error: APIError) -> bytes:
        """The event that ends a stream `error` cut short."""

    def body(self, collected: Collected) -> dict:
        """The collected answer."""

    def ended_early(self, error: APIError | None) -> None:
        """The answer ended before its last event or body: `error` ended it, or (None) the
        client left. An answer that is kept (a stored response) keeps how it ended."""


async def _parsed(service: Service, request: Request, parse: Callable[[dict], Any], path: str) -> Any:
    """The request's body read and parsed (APIError: not ready, or a bad body)."""
    service.check_ready()
    config = service.config
    body = await read_object(request, config.max_body_bytes, config.body_timeout)
    # Off the loop: a tool schema's grammar is compiled and checked while parsing.
    return await service.parse_off_loop(parse, body, path)


async def collected_body(service: Service, answer: Reply, generation: Generation, parsed: GenerationRequest,
                         receive: Callable | None = None) -> dict | None:
    """`answer`'s body once its generation ran to its end (`collect`; None: the client left
    first), the answer told however it ended early. Raises collect's APIError."""
    try:
        collected = await collect(service, generation, receive, answer.id, parsed)
        body = None if collected is None else answer.body(collected)
    except APIError as error:
        answer.ended_early(error)
        raise
    except Exception as exc:  # a fault past collect's (it reports its own): not left in progress
        answer.ended_early(APIError(500, f"the answer failed: {type(exc).__name__}", type="server_error"))
        raise
    except BaseException:  # cancelled
        answer.ended_early(None)
        raise
    if body is None:
        answer.ended_early(None)
    return body


def generation_route(service: Service, path: str, parse: Callable[[dict], Parsed],
                     reply: Callable[[Parsed, Generation], Reply],
                     error_response: Callable[[APIError], Response],
                     background: Callable[[Parsed, Reply, Generation], Awaitable[Response | None]] | None = None
                     ) -> Route:
    """POST `path`: parse the body, admit it, and answer with `reply`, streamed or
    collected; every error in the API's own shape (`error_response`). `background`, given
    the admitted request, answers at once one that runs on past its request (None: it
    runs here)."""

    async def endpoint(request: Request) -> Response:
        try:
            parsed = await _parsed(service, request, parse, path)
            generation = await service.start_generation(parsed.generation, request.receive)
        except APIError as error:
            return count(service, path, error_response(error))
        except DistributedError as exc:  # broke between the check and the engine
            return count(service, path, error_response(group_broken_error(exc)))
        if generation is None:
            return count(service, path, Response(status_code=499))  # the client left while it was admitted
        answer = reply(parsed, generation)
        if background is not None:
            started = await background(parsed, answer, generation)
            if started is not None:
                return count(service, path, started)
        if parsed.generation.stream:
            events = guarded(answer, generation, parsed.generation)
            return count(service, path, EventStream(events, service, generation,
                                                    lambda: last_event(answer, shutdown_error())))
        try:
            body = await collected_body(service, answer, generation, parsed.generation, request.receive)
        except APIError as error:
            return count(service, path, error_response(error))
        if body is None:
            return count(service, path, Response(status_code=499))  # the client is gone: nobody reads this
        return count(service, path, JSON(body))

    return Route(path, endpoint, methods=["POST"])


def prompt_tokens_route(service: Service, path: str, parse: Callable[[dict], GenerationRequest],
                        answer: Callable[[int], dict], error_response: Callable[[APIError], Response]) -> Route:
    """POST `path`: the tokens the prompt of the request `parse` reads takes (``answer(count)``),
    as a generation's usage would say (truncation included), or the 400 a generation would get
    where the context cannot hold the prompt and its answer; nothing is generated."""

    async def endpoint(request: Request) -> Response:
        try:
            parsed = await _parsed(service, request, parse, path)
            async with service.model_in_use(parsed.model) as served:  # 404 for a model not served, as generations
                middleware.name_model(served.name)  # nothing generated: the access log names it this way
                ids, _ = await service.encode_to_fit(served, parsed)
                service.answer_tokens(served, parsed, len(ids))
        except APIError as error:
            return count(service, path, error_response(error))
        return count(service, path, JSON(answer(len(ids))))

    return Route(path, endpoint, methods=["POST"])


# ---- text and tool calls ------------------------------------------------------------

class TextLogprobs:
    """Which text of an answer cut into parts each token's logprob entry goes with: the first
    text its own delta writes, or, when that delta writes nothing yet (part of a character,
    whitespace held back), the next text; a token that writes reasoning or a call before any
    text, or is one of the reasoning's (its markers too), has none. Entries left at the end
    (an end-of-sequence token writes nothing) go with the answer's last text, if it ends in
    text."""

    def __init__(self):
        self._pending: list[dict] = []

    def take(self, entry: dict | None, parts: list, reasoning: bool = False) -> list[dict]:
        """The entries that go with the first text of `parts`, what the delta of `entry` made
        (none when it made no text); `reasoning`: its token was one of the reasoning's."""
        if reasoning:
            self._pending = []
            return []
        if entry is not None:
            self._pending.append(entry)
        if any(isinstance(part, str) for part in parts):
            out, self._pending = self._pending, []
            return out
        if parts:  # reasoning or a call came first
            self._pending = []
        return []

    def left(self) -> list[dict]:
        out, self._pending = self._pending, []
        return out


class AnswerParts:
    """A chat answer cut into text and tool calls, in order, as it streams, for the APIs
    whose answers are a list of blocks (the Messages API's content, the Responses API's
    output); a collected answer is cut from the same pieces, so it is the stream's.

    Without tools the text is the engine's, as it comes. With tools the
    service's OutputSplitter cuts it, the chat endpoint's own parser (one
    call format per template, calls past the one allowed when parallel calls
    are off dropped, a call streamed as it is written: its CallStart, its
    CallArguments pieces, its CallEnd); whitespace that ends a text is held
    until more text follows it, so no text ends in the newline before a call;
    the reasoning of a template that thinks comes as Reasoning parts of its
    own (a thinking block, a reasoning item), its markers left out.
    """

    def __init__(self, generation: Generation):
        self._splitter = generation.splitter  # None: no tools, and a template that does not think
        self._held = ""
        self.calls: list[dict] = []  # the calls that ended
        self.text_logprobs: list[list[dict]] = []  # whole()'s texts' logprob entries
        self._logprobs = TextLogprobs()
        self.taken: list[dict] = []  # the entries for the first text the last feed gave

    @property
    def reasoning_tokens(self) -> int:
        """Tokens written inside the reasoning block (OutputSplitter.reasoning_tokens)."""
        return 0 if self._splitter is None else self._splitter.reasoning_tokens

    @property
    def split(self) -> bool:
        """Whether the answer is cut into blocks (tools, or reasoning of its own): else it is one text."""
        return self._splitter is not None

    def finish_reason(self, reason: str | None) -> str | None:
        """Chat's finish_reason for the answer (OutputSplitter.finish_reason): "tool_calls" once it
        stopped after whole calls."""
        return reason if self._splitter is None else self._splitter.finish_reason(reason)

    def feed(self, text: str, final: bool = False, *, token: bool = True,
             logprob: dict | None = None) -> list[str | Reasoning | CallStart | CallArguments | CallEnd]:
        """What `text` adds, in order: texts, reasoning, and the calls' events; `final`: the
        answer ends here; `token`: a token wrote `text` (the engine's last delta may not);
        `logprob`: that token's logprob entry, which ``taken`` then holds with the others
        that go with the first of these texts (TextLogprobs)."""
        reasoning_tokens = self.reasoning_tokens
        parts = self._parts(text, final, token)
        self.taken = self._logprobs.take(logprob, parts, reasoning=self.reasoning_tokens > reasoning_tokens)
        return parts

    def left_logprobs(self) -> list[dict]:
        """The entries no text took by the answer's end (TextLogprobs.left)."""
        return self._logprobs.left()

    def _parts(self, text: str, final: bool,
               token: bool) -> list[str | Reasoning | CallStart | CallArguments | CallEnd]:
        if self._splitter is None:
            return [text] if text else []
        splits = [self._splitter.feed(text, token=token)]
        if final:
            splits.append(self._splitter.flush())
        out: list[str | Reasoning | CallStart | CallArguments | CallEnd] = []
        for split in splits:
            for part in split.parts:
                if isinstance(part, Reasoning):
                    if part.text:
                        out.append(part)
                    continue
                if isinstance(part, Content):
                    self._text(out, part.text)
                    continue
                if isinstance(part, CallStart):
                    self._held = ""  # the whitespace before a call
                elif isinstance(part, CallEnd):
                    self.calls.append(part.call)
                out.append(part)
        if final and self._held and not self.calls:  # nothing but text: all of it
            if out and isinstance(out[-1], str):
                out[-1] += self._held
            else:
                out.append(self._held)
            self._held = ""
        return out

    def _text(self, out: list, text: str) -> None:
        """Add `text`, its whitespace at the end held back."""
        if not text:
            return
        text = self._held + text
        kept = text.rstrip()
        self._held = text[len(kept):]
        if kept:
            if out and isinstance(out[-1], str):
                out[-1] += kept
            else:
                out.append(kept)

    def whole(self, collected: Collected) -> list[str | Reasoning | CallEnd]:
        """A collected answer as the stream would cut it: texts joined, reasoning joined,
        and each call as its CallEnd. With logprobs, ``text_logprobs`` then holds each
        text's entries, in order (TextLogprobs says which)."""
        out: list[str | Reasoning | CallEnd] = []
        self.text_logprobs = []
        pieces = collected.pieces or [""]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            parts = self.feed(piece, final=last, token=not last or collected.last_token is not None,
                              logprob=collected.logprobs[i] if collected.logprobs else None)
            entries = self.taken
            for part in parts:
                if isinstance(part, str):
                    if out and isinstance(out[-1], str):
                        out[-1] += part
                        self.text_logprobs[-1] += entries
                    else:
                        out.append(part)
                        self.text_logprobs.append(entries)
                    entries = []
                elif isinstance(part, Reasoning) and out and isinstance(out[-1], Reasoning):
                    out[-1] = Reasoning(out[-1].text + part.text)
                elif isinstance(part, (Reasoning, CallEnd)):
                    out.append(part)
        left = self.left_logprobs()
        if out and isinstance(out[-1], str):
            self.text_logprobs[-1] += left
        elif left and not out and not self.split:  # no text at all: the one text a stream opens at once
            out.append("")
            self.text_logprobs.append(left)
        return out
