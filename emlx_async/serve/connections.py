"""Connection limits and half-close handling for the servers the CLI runs.

Neither server has all of these on its own. uvicorn has no read timeout for
headers, no header size limit for httptools and no connection limit;
hypercorn has a header size limit that a whole head read at once passes, no
connection limit, an idle timer that closes incomplete headers without an
answer, and it takes the client's FIN for a disconnect. Each gets the same
behaviour here, from the same `ConnectionLimits`:

- headers not complete `header_timeout` seconds after the connection opens
  (or `keep_alive_timeout + header_timeout` after the last response, once a
  next request has begun) get 408; an idle kept-alive connection is closed
  after `keep_alive_timeout` without a word, unless a next request waits unread
  (the server was held up past the timer);
- a request line and headers over `max_header_bytes` get 431;
- past `max_connections` open connections a new one gets 503 and is closed;
- the body's read timeout is the app's, `ServeConfig.body_timeout` (408);
- a request that is not HTTP/1.1 (a bad Content-Length, chunked framing that
  breaks, garbage) gets a 400 in the app's JSON error shape, where uvicorn
  answers plain text and hypercorn an empty body.

A client that half-closes is answered. A FIN after a complete request only
means the client has nothing more to send: the connection stays open for the
response. (uvicorn's protocol let the transport close on it, asyncio's default
for `eof_received`; hypercorn's TCPServer ended the request.) A client that
closed fully cannot be told apart by its FIN; it is found by writing. A stream
writes anyway; while a non-streamed response is not started, an interim
``100 Continue`` (which HTTP/1.1 clients skip; HTTP/1.0 clients get none) is
written every `probe_interval` seconds, and a closed client resets the
connection, which cancels the request as any disconnect does (an HTTP/1.0
client that closed is found when its answer is written).

uvicorn: `protocol_class(limits)` is its httptools protocol with all of this
(pass it as ``uvicorn.Config(http=...)``).

hypercorn (its trio worker): `hypercorn_connections(limits)` serves with
`hypercorn_tcp_server(limits)`, hypercorn's TCPServer with all of this, for
HTTP/1.1 connections (HTTP/2 ones are left as hypercorn has them). hypercorn's
`serve` takes no connection class, so the subclass relies on its internals:
`check_hypercorn` refuses, at start-up, a hypercorn release it was not written
against. Its read timeout stays off: it would also end a response that takes
longer than it (the client sends nothing meanwhile).
"""

from __future__ import annotations

import asyncio
import re
import select
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .. import InvalidArgument, InvalidState

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"  # the probe of a half-closed client (see above)
_BLANK_LINE = re.compile(b"\n\r?\n")  # the end of a request's head, as h11 finds it
_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large",
            503: b"Service Unavailable"}
# What a request that is not HTTP/1.1 gets (uvicorn's words; hypercorn names no cause).
INVALID_HTTP = "Invalid HTTP request received."


# The least max_header_bytes: a real client's request line and headers (method, path, Host,
# User-Agent, Content-Type, Content-Length, Authorization) take a few hundred bytes; below
# this every request would get 431.
MIN_HEADER_BYTES = 1024


@dataclass
class ConnectionLimits:
    header_timeout: float = 10.0      # seconds from a connection (or the last response) to complete headers
    max_header_bytes: int = 16384     # request line and headers
    max_connections: int = 1024       # open connections; past it a new one gets 503 and is closed
    keep_alive_timeout: float = 5.0   # idle seconds between requests on one connection
    probe_interval: float = 1.0       # seconds between probes of a half-closed client (see above)

    def __post_init__(self) -> None:
        for name in ("header_timeout", "keep_alive_timeout", "probe_interval"):
            value = getattr(self, name)
            if not value > 0:
                raise InvalidArgument(f"{name} must be positive, got {value!r}")
        for name in ("max_header_bytes", "max_connections"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{name} must be a positive int, got {value!r}")
        if self.max_header_bytes < MIN_HEADER_BYTES:
            raise InvalidArgument(f"max_header_bytes must be at least {MIN_HEADER_BYTES} (a request line and "
                                  f"headers take that much), got {self.max_header_bytes!r}")


def error_body(message: str) -> bytes:
    """The app's JSON error shape, for answers the servers give before the app sees a request."""
    import json

    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": None}}).encode()


def error_bytes(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection, in the app's JSON error shape."""
    body = error_body(message)
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % (status, _REASONS[status], len(body))) + body


class _HeadersTooLarge(Exception):
    pass


def _unread(sock: Any) -> bool:
    """Whether bytes (or the client's FIN) wait unread on `sock`. A loop held up past a
    timer (an encode holding the GIL, a busy machine) may run the timer before the read
    that would have stopped it, when both are due: trio and uvloop do."""
    try:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no socket (a test's transport), or closed
        return False


def protocol_class(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with `limits` and half-close support (pass as ``uvicorn.Config(http=...)``)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self._timer: asyncio.TimerHandle | None = None
            self._reading_headers = True
            self._header_bytes = 0        # exact, from the parser's callbacks
            self._unparsed_bytes = 0      # raw bytes read while the headers are incomplete
            self._half_closed = False

        # ---- timers ---------------------------------------------------------------

        def _arm(self, seconds: float, status: int, message: str) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._refuse, status, message)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _refuse(self, status: int, message: str) -> None:
            """Answer `status` (unless a response has started) and close the connection."""
            self._timer = None
            if self.transport.is_closing():
                return
            cycle = self.cycle  # after a response, still that response's
            if cycle is None or not cycle.response_started or cycle.response_complete:
                self.transport.write(error_bytes(status, message))
            self.transport.close()

        # ---- connection -----------------------------------------------------------

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                self._refuse(503, f"the server has {limits.max_connections} connections open; retry later")
                return
            self._arm(limits.header_timeout, 408, "the request headers did not arrive in time")

        def timeout_keep_alive_handler(self) -> None:
            # A next request that came in time is read now (the header timer still bounds it).
            if not _unread(self.transport.get_extra_info("socket")):
                super().timeout_keep_alive_handler()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._reading_headers:
                self._unparsed_bytes += len(data)
            super().data_received(data)
            # A header line that never ends never reaches on_header: bound the raw bytes too.
            if self._reading_headers and self._unparsed_bytes > limits.max_header_bytes \
                    and not self.transport.is_closing():
                self._refuse(431, f"the request headers exceed {limits.max_header_bytes} bytes")

        def send_400_response(self, msg: str) -> None:
            if self._header_bytes > limits.max_header_bytes:  # raised by on_url / on_header below
                self._refuse(431, f"the request headers exceed {limits.max_header_bytes} bytes")
            else:  # uvicorn's answer is plain text: clients parse the app's JSON shape
                self._refuse(400, msg)

        def _count(self, size: int) -> None:
            self._header_bytes += size
            if self._header_bytes > limits.max_header_bytes:
                raise _HeadersTooLarge  # the parser stops; data_received answers through send_400_response

        def on_message_begin(self) -> None:
            self._header_bytes = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._reading_headers, self._unparsed_bytes = False, 0
            self._disarm()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            # Bytes from here on are the next request's (a body the app did not
            # read, after a 413, still arrives before this).
            self._reading_headers, self._unparsed_bytes = True, 0
            super().on_message_complete()

        def on_response_complete(self) -> None:
            if self._half_closed:  # no further request can come
                self.transport.close()
                return
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm(limits.keep_alive_timeout + limits.header_timeout, 408,
                          "the request headers did not arrive in time")

        # ---- half-close -----------------------------------------------------------

        def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio's contract: True keeps it open
            cycle = self.cycle
            if cycle is None or cycle.response_complete or cycle.more_body:
                return None  # idle, or a request cut short: close as before
            self._half_closed = True
            if not cycle.response_started and self.scope["http_version"] == "1.1":  # no 1xx to HTTP/1.0
                self.loop.call_later(limits.probe_interval, self._probe, cycle)
            return True  # keep the transport open for writing

        def _probe(self, cycle) -> None:
            if cycle is not self.cycle or cycle.response_started or cycle.response_complete \
                    or self.transport.is_closing():
                return
            self.transport.write(CONTINUE)
            self.loop.call_later(limits.probe_interval, self._probe, cycle)

    return LimitedHttpToolsProtocol


# ---- hypercorn ------------------------------------------------------------------------

# The hypercorn releases whose trio TCPServer the subclass below was written
# against (what it overrides or calls, and the H11Protocol state it reads, are
# the same in both, but for a cast); another is refused at start-up rather than
# half-handled.
HYPERCORN_VERSIONS = ((0, 17), (0, 18))


def check_hypercorn() -> None:
    """Raise InvalidState (a RuntimeError) unless the installed hypercorn is one `hypercorn_connections` supports."""
    import importlib.metadata

    import hypercorn.trio.run as run
    import hypercorn.trio.tcp_server as tcp_server

    version = importlib.metadata.version("hypercorn")
    found = re.match(r"(\d+)\.(\d+)", version)
    advice = ("emlx_async's connection handling (half-closes, connection and header limits) extends "
              "hypercorn's trio TCPServer; install a supported hypercorn "
              f"({', '.join('%d.%d' % v for v in HYPERCORN_VERSIONS)}) or use --server uvicorn")
    if found is None or (int(found[1]), int(found[2])) not in HYPERCORN_VERSIONS:
        raise InvalidState(f"hypercorn {version} is not supported: {advice}")
    server = getattr(tcp_server, "TCPServer", None)
    missing = [name for name in ("run", "_read_data", "_idle_timeout", "_initiate_server_close", "_close",
                                 "protocol_send") if not callable(getattr(server, name, None))]
    import hypercorn.protocol as protocol
    from hypercorn.protocol.h11 import H11Protocol

    missing += [f"H11Protocol.{name}" for name in ("_send_error_response", "_send_h11_event")
                if not callable(getattr(H11Protocol, name, None))]
    if "H11Protocol" not in protocol.ProtocolWrapper.__init__.__code__.co_names:
        missing.append("ProtocolWrapper building H11Protocol by name")
    if (missing or getattr(run, "TCPServer", None) is not server
            or "TCPServer" not in run.worker_serve.__code__.co_names):
        raise InvalidState(f"hypercorn {version} does not have the trio worker it should "
                           f"(missing: {', '.join(missing) or 'worker_serve building TCPServer'}): {advice}")


@contextmanager
def hypercorn_connections(limits: ConnectionLimits) -> Iterator[None]:
    """hypercorn's trio worker serves its connections with `limits` and half-close support while inside.

    hypercorn's `serve` takes no connection class: its `worker_serve` builds
    each connection from the module's `TCPServer`, which is replaced meanwhile.
    """
    check_hypercorn()
    import hypercorn.trio.run as run

    import hypercorn.protocol as protocol

    original, original_protocol = run.TCPServer, protocol.H11Protocol
    run.TCPServer = hypercorn_tcp_server(limits)  # type: ignore[misc, assignment]
    protocol.H11Protocol = json_error_h11_protocol()  # type: ignore[misc]  # ProtocolWrapper builds it by name
    try:
        yield
    finally:
        run.TCPServer = original  # type: ignore[misc]
        protocol.H11Protocol = original_protocol  # type: ignore[misc]


def json_error_h11_protocol() -> type:
    """hypercorn's H11Protocol whose error answer (a request that is not HTTP/1.1, or an
    upgrade it refuses) has a body in the app's JSON shape, where hypercorn's is empty, and
    that reads nothing after a client's last request, and whose answer begun before the
    request's body is in says it closes the connection."""
    import h11
    from hypercorn.protocol.h11 import H11Protocol

    class LastRequestConnection(h11.Connection):
        """h11's connection that leaves unread the bytes after a client's last request
        (Connection: close, HTTP/1.0), as uvicorn does: h11 refuses them, and hypercorn
        then answers 400 and closes while the request's own answer is on its way."""

        def next_event(self):
            if self.their_state is h11.MUST_CLOSE and self.trailing_data[0]:
                return h11.ConnectionClosed() if self.trailing_data[1] else h11.NEED_DATA
            return super().next_event()

    class JSONErrorH11Protocol(H11Protocol):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.connection = LastRequestConnection(h11.SERVER,
                                                    max_incomplete_event_size=self.config.h11_max_incomplete_size)

        async def _send_h11_event(self, event) -> None:
            # An answer begun before the client has sent its whole body (a 413, a 401 that reads
            # none) ends the connection: hypercorn keeps one only after a whole request. Say so,
            # or a client reuses it and its next request meets the closed socket unanswered.
            if isinstance(event, h11.Response) and self.connection.their_state is h11.SEND_BODY:
                event = h11.Response(status_code=event.status_code, reason=event.reason,
                                     http_version=event.http_version,
                                     headers=[*event.headers, (b"connection", b"close")])
            await super()._send_h11_event(event)

        async def _send_error_response(self, status_code: int) -> None:
            reason = _REASONS.get(status_code, b"")
            body = error_body(INVALID_HTTP if status_code == 400 else f"HTTP {status_code} {reason.decode()}".strip())
            await self._send_h11_event(h11.Response(status_code=status_code, headers=[
                (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                (b"connection", b"close"), *self.config.response_headers("h11")]))
            await self._send_h11_event(h11.Data(data=body))
            await self._send_h11_event(h11.EndOfMessage())

    return JSONErrorH11Protocol


def hypercorn_tcp_server(limits: ConnectionLimits) -> type:
    """hypercorn's trio TCPServer with `limits` and half-close support (see the module's docstring)."""
    from math import inf

    import h11
    import trio
    from hypercorn.events import Closed, RawData
    from hypercorn.protocol.h11 import H11Protocol
    from hypercorn.trio.tcp_server import MAX_RECV, TCPServer

    gone = (trio.BrokenResourceError, trio.ClosedResourceError)

    class LimitedTCPServer(TCPServer):
        open_connections = 0  # this server's, counted across its connections
        _closed: trio.Event
        _idle_timeouts = 0    # of this connection: the first runs from its start, the others after a response

        async def run(self) -> None:
            self._closed = trio.Event()
            cls = type(self)
            if cls.open_connections >= limits.max_connections:
                with trio.move_on_after(limits.header_timeout):  # a client that never reads cannot hold it
                    try:
                        await self.stream.send_all(error_bytes(
                            503, f"the server has {limits.max_connections} connections open; retry later"))
                    except gone:
                        pass
                await self._close()
                return
            cls.open_connections += 1
            try:
                await super().run()
            finally:
                cls.open_connections -= 1

        def _h11(self) -> h11.Connection | None:
            """The connection's HTTP/1.1 state machine (None for HTTP/2 and websockets, left as hypercorn has them)."""
            protocol = getattr(self.protocol, "protocol", None)
            connection = getattr(protocol, "connection", None) if isinstance(protocol, H11Protocol) else None
            return connection if isinstance(connection, h11.Connection) else None

        # ---- reading: header size and half-close ---------------------------------------

        async def _read_data(self) -> None:
            # hypercorn's loop, with two checks; hypercorn treats the client's FIN as the end.
            while True:
                try:
                    with trio.fail_after(self.config.read_timeout or inf):
                        data = await self.stream.receive_some(MAX_RECV)
                except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                    break
                if self._headers_too_large(data):
                    await self._refuse(431, f"the request headers exceed {limits.max_header_bytes} bytes")
                    break
                if data and self._client_done():
                    continue  # bytes after a last request: h11 would refuse them while its answer is being sent
                await self.protocol.handle(RawData(bytes(data)))
                if data == b"":
                    await self._answer_half_closed()
                    break
            await self.protocol.handle(Closed())
            # The client is gone or done: the header or keep-alive timer has nothing left
            # to time, and while it ran the connection stayed open and counted
            # (a client that closed mid-headers held its slot for the whole timeout).
            await self.idle_task.stop()

        def _client_done(self) -> bool:
            """The client's last request is complete (Connection: close, or HTTP/1.0): the
            connection closes after its answer, and nothing the client sends is read."""
            connection = self._h11()
            return connection is not None and connection.their_state in (h11.MUST_CLOSE, h11.CLOSED)

        async def protocol_send(self, event) -> None:
            try:
                await super().protocol_send(event)
            except trio.BusyResourceError:  # hypercorn's close sends its EOF outside the send lock: it is going
                await self.protocol.handle(Closed())

        def _headers_too_large(self, data: bytes | bytearray) -> bool:
            # h11's own bound (h11_max_incomplete_size) checks only headers that are
            # still incomplete after a read, so a whole 60 KB head read at once passes it.
            connection = self._h11()
            if connection is None or connection.their_state is not h11.IDLE:
                return False
            head = connection.trailing_data[0] + data
            end = _BLANK_LINE.search(head)
            return (len(head) if end is None else end.end()) > limits.max_header_bytes

        def _response_pending(self) -> bool:
            connection, protocol = self._h11(), self.protocol.protocol
            return (connection is not None and isinstance(protocol, H11Protocol) and protocol.stream is not None
                    and connection.our_state in (h11.SEND_RESPONSE, h11.SEND_BODY))

        async def _answer_half_closed(self) -> None:
            """The client sent its request and shut its side: keep the connection for the answer.

            Returns when the answer is complete (hypercorn closes the connection),
            or a probe finds the client gone (the caller's Closed then cancels the
            request, as any disconnect does).
            """
            connection = self._h11()
            while connection is not None and self._response_pending() and not self._closed.is_set():
                with trio.move_on_after(limits.probe_interval):
                    await self._closed.wait()
                if not self._response_pending() or self._closed.is_set():
                    return
                if connection.their_http_version != b"1.1":  # no 1xx to HTTP/1.0
                    continue
                async with self.send_lock:
                    if connection.our_state is not h11.SEND_RESPONSE:  # started: its own writes find a closed client
                        continue
                    try:
                        with trio.CancelScope(shield=True):
                            await self.stream.send_all(CONTINUE)
                    except gone:
                        return

        async def _close(self) -> None:
            self._closed.set()
            await super()._close()

        # ---- header timeout ------------------------------------------------------------

        async def _idle_timeout(self) -> None:
            # hypercorn runs this from the connection's start and after each response,
            # and cancels it once a request's headers are complete: a header timer.
            self._idle_timeouts += 1
            fresh = self._idle_timeouts == 1
            status = None
            with trio.move_on_after(limits.header_timeout if fresh else limits.keep_alive_timeout):
                await self.context.terminated.wait()
            if not self.context.terminated.is_set():
                connection = self._h11()
                begun = connection is not None and (connection.trailing_data[0] != b""
                                                    or _unread(self.stream.socket))
                if fresh:
                    status = 408
                elif begun:  # a next request has started: it gets the header timeout too
                    with trio.move_on_after(limits.header_timeout):
                        await self.context.terminated.wait()
                    status = None if self.context.terminated.is_set() else 408
            with trio.CancelScope(shield=True):
                if status is not None:
                    await self._refuse(status, "the request headers did not arrive in time")
                await self._initiate_server_close()

        async def _refuse(self, status: int, message: str) -> None:
            """Answer `status` unless a response has started (the caller closes the connection)."""
            connection = self._h11()
            async with self.send_lock:
                if connection is not None and connection.our_state is h11.IDLE:
                    try:
                        await self.stream.send_all(error_bytes(status, message))
                    except gone:
                        pass

    return LimitedTCPServer


def hypercorn_settings(limits: ConnectionLimits) -> dict[str, Any]:
    """The hypercorn Config settings that go with `hypercorn_connections(limits)` (its timers are the subclass's)."""
    return {"h11_max_incomplete_size": limits.max_header_bytes}
