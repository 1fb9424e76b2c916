"""Who may call the service, and a line for every call: API keys, CORS and the access log.

Plain ASGI middleware (no task of its own, no event-loop API), so it runs
the same under uvicorn and hypercorn's trio worker. Outermost first:

- the access log: one INFO line on ``emlx_async.serve.access`` per request,
  written when the app has sent its last byte, so a stream is logged when it
  ends or its client leaves. It names the method, the path (escaped), the
  status, the tokens of the generations the request ran, their model, and the duration;
  never the query string or any text of the request.
- CORS (Starlette's CORSMiddleware), outside the key check: a preflight
  carries no key, and a browser must be able to read a 401.
- the API key: ``Authorization: Bearer KEY``, on the Anthropic endpoints
  also ``x-api-key: KEY`` (what Anthropic's client sends). It is checked
  before the app sees the request, so a request without a valid key reads
  no body, is never admitted and takes no slot. ``/health`` stays open, and
  ``/metrics`` too unless ``metrics_auth``.
"""

from __future__ import annotations

import hmac
import json
import logging
import string
import time
import urllib.parse
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

from .. import InvalidArgument
from .protocol import APIError

access_logger = logging.getLogger("emlx_async.serve.access")

API_KEY_ENV = "EMLX_API_KEY"
OPEN_PATHS = ("/health",)
METRICS_PATH = "/metrics"
# The Messages API's paths (anthropic.py's routes), answered in Anthropic's shape.
ANTHROPIC_PREFIX = "/v1/messages"

_KEY_CHARACTERS = frozenset(string.ascii_letters + string.digits + string.punctuation)


# ---- settings -------------------------------------------------------------------------

def api_key(value: str) -> str:
    """`value` if it can be sent in a header as is (printable ASCII, no space); ValueError otherwise."""
    if not value:
        raise InvalidArgument("an API key must not be empty")
    if not set(value) <= _KEY_CHARACTERS:
        raise InvalidArgument("an API key may hold only printable ASCII characters other than space")
    return value


def api_keys(flags: Iterable[str] = (), environ: str | None = None) -> tuple[str, ...]:
    """The allowed keys: `flags` (each given once) and `environ`, the
    value of $EMLX_API_KEY (one key, or several separated by commas)."""
    keys = list(flags)
    if environ:
        keys += [key.strip() for key in environ.split(",") if key.strip()]
    return tuple(dict.fromkeys(api_key(key) for key in keys))


def origins(values: Iterable[str] = ()) -> tuple[str, ...]:
    """CORS origins from flags that may each hold several, separated by commas."""
    return tuple(dict.fromkeys(o.strip() for value in values for o in value.split(",") if o.strip()))


# ---- the key check --------------------------------------------------------------------

def _header(scope: dict, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return value
    return None


class APIKeyCheck:
    """Refuses (401) a request that presents none of `keys`, in its API's error shape."""

    def __init__(self, app, keys: Iterable[str], *, metrics_auth: bool = False):
        self.app = app
        self.keys = [api_key(key).encode() for key in keys]
        if not self.keys:
            raise InvalidArgument("APIKeyCheck needs at least one key")
        self.open_paths = OPEN_PATHS if metrics_auth else (*OPEN_PATHS, METRICS_PATH)

    def _valid(self, presented: bytes | None) -> bool:
        if presented is None:
            return False
        # Compare with every key, not up to the first match: the time taken
        # tells nothing about which key matched or how much of one.
        matches = [hmac.compare_digest(presented, key) for key in self.keys]
        return any(matches)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        anthropic = scope["path"] == ANTHROPIC_PREFIX or scope["path"].startswith(ANTHROPIC_PREFIX + "/")
        presented = []
        authorization = _header(scope, b"authorization")
        if authorization is not None:
            scheme, _, token = authorization.partition(b" ")
            if scheme.lower() == b"bearer":
                presented.append(token.strip())
        if anthropic and (key := _header(scope, b"x-api-key")) is not None:
            presented.append(key.strip())
        if any(self._valid(key) for key in presented):
            await self.app(scope, receive, send)
            return
        await self._refuse(send, anthropic, given=bool(presented))

    @staticmethod
    async def _refuse(send, anthropic: bool, given: bool) -> None:
        if anthropic:
            header = "'x-api-key: KEY' or 'Authorization: Bearer KEY'"
        else:
            header = "'Authorization: Bearer KEY'"
        message = ("the API key is not valid" if given
                   else f"no API key was given: send it as {header}")
        if anthropic:  # Anthropic's error shape (anthropic.error_body's)
            body: dict[str, Any] = {"type": "error", "error": {"type": "authentication_error", "message": message}}
        else:
            body = APIError(401, message, code="invalid_api_key").body()
        payload = json.dumps(body).encode()  # ASCII: the message holds nothing of the request
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": payload, "more_body": False})


# ---- the access log -------------------------------------------------------------------

# The generations the current request ran (and the names of models it only
# counted tokens with), for its access-log line; None
# outside a logged request. A contextvar, not a scope key: the service
# admits generations without seeing the request.
_generations: ContextVar[list | None] = ContextVar("emlx_async_serve_generations", default=None)


def count_tokens_of(generation) -> None:
    """Count `generation`'s tokens (its ``prompt_tokens`` and
    ``stats.generated_tokens``, read when the request ends) and name its
    ``model_name`` in the current request's access-log line; nothing outside
    a logged request."""
    generations = _generations.get()
    if generations is not None:
        generations.append(generation)


def name_model(name: str) -> None:
    """Name the model `name` in the current request's access-log line, for a request that
    generates nothing (a token count); nothing outside a logged request."""
    generations = _generations.get()
    if generations is not None:
        generations.append(name)


# Kept as is in a logged path; anything else is %-escaped (a newline, a
# quote, a space or a character outside ASCII cannot forge or break a line).
_PATH_SAFE = "/:@!$&'()*+,;=-._~"


def escaped(text: str) -> str:
    return urllib.parse.quote(text, safe=_PATH_SAFE, errors="backslashreplace")


class AccessLog:
    """Writes one line per HTTP request once the app is done with it."""

    def __init__(self, app, logger: logging.Logger = access_logger):
        self.app, self.logger = app, logger

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None
        generations: list = []
        token = _generations.set(generations)

        async def send_noted(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        failed = False
        try:
            await self.app(scope, receive, send_noted)
        except Exception:
            failed = True  # Starlette's outermost handler answers 500
            raise
        finally:
            _generations.reset(token)
            if status is None:  # nothing was sent: failed, or the client left (nginx's 499)
                status = 500 if failed else 499
            self._write(scope, status, generations, time.perf_counter() - started)

    def _write(self, scope, status: int, generations: list, seconds: float) -> None:
        if not self.logger.isEnabledFor(logging.INFO):
            return
        counted = [g for g in generations if not isinstance(g, str)]  # a str: name_model's
        if counted:
            prompt = str(sum(g.prompt_tokens for g in counted))
            completion = str(sum(g.stats.generated_tokens for g in counted))
        else:
            prompt = completion = "-"
        names = dict.fromkeys(g if isinstance(g, str) else g.model_name for g in generations)
        model = ",".join(escaped(name) for name in names) if names else "-"
        client = scope.get("client")
        self.logger.info("%s %s %d prompt_tokens=%s completion_tokens=%s model=%s duration_ms=%.1f client=%s",
                         escaped(scope["method"]), escaped(scope["path"]), status, prompt, completion, model,
                         seconds * 1000, escaped(str(client[0])) if client else "-")


# ---- the app ------------------------------------------------------------------------

def install(app, *, api_keys: Iterable[str] = (), metrics_auth: bool = False, cors_origins: Iterable[str] = (),
            access_log: bool = True) -> None:
    """Wrap the Starlette `app`: the access log outermost, then CORS, then the key check.

    Nothing is added for a setting that is off (no keys: every request is
    let in; no origins: no CORS headers).
    """
    from starlette.middleware.cors import CORSMiddleware

    keys = tuple(api_key(key) for key in api_keys)  # now: Starlette builds its middleware on the first request
    allowed = tuple(cors_origins)
    # add_middleware puts each one outside the ones added before it.
    if keys:
        app.add_middleware(APIKeyCheck, keys=keys, metrics_auth=metrics_auth)
    if allowed:
        # allow_headers "*": the preflight's requested headers are allowed
        # (Authorization among them, which a bare "*" would not cover).
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed), allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["*"], expose_headers=["Retry-After"])
    if access_log:
        app.add_middleware(AccessLog)
