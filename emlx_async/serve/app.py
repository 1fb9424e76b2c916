"""The OpenAI-compatible HTTP app: the chat and completion endpoints, models,
health, metrics and the OpenAPI document, with the Messages and Responses
APIs (serve/anthropic.py, serve/responses.py) mounted beside them, all on
one Service (serve/service.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import DistributedError
from . import anthropic, middleware, openapi, responses
from .metrics import CONTENT_TYPE
from .protocol import MAX_CHOICES, APIError, CompletionLogprobs, GenerationRequest, call_arguments_delta, \
    call_head_delta, chunk_body, completion_body, completion_choice, new_id, parse_request, usage_chunk_body
from .service import (JSON, EventStream, Generation, ServeConfig, Service, distributed_cause, error_response,
                      grammar_error, group_broken_error, read_json, shutdown_error, sse, until_disconnected)
from .tools import CallArguments, CallStart, Content, Reasoning

logger = logging.getLogger("emlx_async.serve")


@dataclasses.dataclass
class _Written:
    """How far a chat or completion stream got: ``answer``, all of it but the closing [DONE]."""

    answer: bool = False


def create_app(config: ServeConfig | None = None) -> Starlette:
    config = config or ServeConfig()
    service = Service(config)

    def count(endpoint: str, response: Response) -> Response:
        service.metrics.requests.labels(endpoint, str(response.status_code)).inc()
        return response

    async def generate(request: Request, chat: bool) -> Response:
        endpoint = "/v1/chat/completions" if chat else "/v1/completions"
        try:
            service.check_ready()
            body = await read_json(request, config.max_body_bytes, config.body_timeout)
            parsed = await service.parse_off_loop(functools.partial(parse_request, chat=chat,
                                                                    max_messages=config.max_messages),
                                                  body, endpoint)
            generation = await service.start_generation(parsed, request.receive)
        except APIError as error:
            return count(endpoint, error_response(error))
        except DistributedError as exc:  # broke between the check and the engine
            return count(endpoint, error_response(group_broken_error(exc)))
        if generation is None:
            return count(endpoint, Response(status_code=499))  # the client left while it was admitted
        id_ = new_id(chat)
        if parsed.stream:
            written = _Written()

            def trailer() -> bytes:  # the shutdown cut the stream short: an error, unless all was written
                return (b"" if written.answer else sse(shutdown_error().body())) + sse("[DONE]")

            return count(endpoint, EventStream(_stream_events(parsed, id_, generation, written), service,
                                               generation, trailer))

        # Not streamed: still cancel the generation if the client leaves or the shutdown deadline passes.
        # Each choice's deltas: their text, and whether a token wrote it (the last may not).
        texts: list[list[tuple[str, bool]]] = [[] for _ in range(generation.n)]
        entries: list[list[dict] | None] = [[] if parsed.logprobs else None for _ in range(generation.n)]
        shutdown_scope = anyio.CancelScope()
        try:
            with service.on_cut_off(shutdown_scope.cancel), shutdown_scope:
                async with anyio.create_task_group() as group:
                    async def collect() -> None:
                        async for index, delta in generation.choice_deltas():
                            texts[index].append((delta.text, delta.token is not None))
                            kept = entries[index]
                            if kept is not None and (entry := generation.logprob_entry(delta)) is not None:
                                kept.append(entry)
                        group.cancel_scope.cancel()

                    async def watch() -> None:
                        await until_disconnected(request.receive)
                        group.cancel_scope.cancel()

                    group.start_soon(collect)
                    group.start_soon(watch)
        except Exception as exc:
            broken = distributed_cause(exc)
            if broken is None:
                failed = grammar_error(exc, parsed) if parsed.grammar is not None else None
                if failed is not None:
                    return count(endpoint, error_response(failed))
                raise
            logger.error("generation %s failed: %s", id_, broken)
            return count(endpoint, error_response(group_broken_error(broken)))
        finally:
            await generation.aclose()
        if generation.finish_reason is None:
            if shutdown_scope.cancel_called:
                return count(endpoint, error_response(shutdown_error()))
            return count(endpoint, Response(status_code=499))  # the client is gone: nobody reads this
        choices = []
        for index, (pieces, splitter) in enumerate(zip(texts, generation.splitters)):
            reasoning, calls = None, None
            finish = generation.finish_reasons[index]
            if generation.echoes is not None:  # a completion's: its prompt, then the answer
                echo = generation.echoes[index]
                pieces.insert(0, (echo.text, False))
                if echo.logprobs is not None and entries[index] is not None:
                    entries[index][:0] = echo.logprobs
            if splitter is None:
                answer = "".join(text for text, _ in pieces)
            else:  # each choice cut on its own (its own tool calls), as its stream is
                splits = [splitter.feed(text, token=token) for text, token in pieces] + [splitter.flush()]
                answer = "".join(split.content for split in splits)
                if splitter.thinking:
                    reasoning = "".join(split.reasoning for split in splits)
                calls = splitter.tool_calls or None
                finish = splitter.finish_reason(finish)
            choices.append(completion_choice(parsed, index=index, text=answer, finish_reason=finish,
                                             logprobs=entries[index], reasoning=reasoning, tool_calls=calls))
        body = completion_body(parsed, id=id_, model=generation.model_name, choices=choices,
                               prompt_tokens=generation.prompt_tokens,
                               completion_tokens=generation.stats.generated_tokens,
                               reasoning_tokens=generation.reasoning_tokens)
        return count(endpoint, JSON(body))

    async def _stream_events(parsed: GenerationRequest, id_: str, generation: Generation,
                             written: _Written) -> AsyncIterator[bytes]:
        """Chunks of every choice, each tagged with its index, interleaved as the choices make them;
        each choice ends with its finish_reason, then the usage (if asked) and one [DONE].
        `written.answer` is set once all but the [DONE] is written (the engine may still be
        letting go of the slot)."""
        created = int(time.time())
        fields = {"id": id_, "model": generation.model_name, "created": created}
        deltas = generation.choice_deltas()
        try:
            if parsed.chat:  # OpenAI opens each choice of a chat stream with the role
                for index in range(generation.n):
                    yield sse(chunk_body(parsed, **fields, text="", finish_reason=None, first=True, index=index))
            # Per choice, logprob entries of tokens not sent yet: a token whose
            # text is held back (part of a character, maybe a stop string) goes
            # out with the next chunk that has text, or with the last one.
            pending: list[list[dict] | None] = [[] if parsed.logprobs else None for _ in range(generation.n)]
            legacy = [CompletionLogprobs() for _ in range(generation.n)]  # a text completion's, per choice
            if generation.echoes is not None:  # a completion's: each choice opens with its prompt
                for index, echo in enumerate(generation.echoes):
                    yield sse(chunk_body(parsed, **fields, text=echo.text, finish_reason=None, index=index,
                                         logprobs=None if pending[index] is None else echo.logprobs,
                                         legacy=legacy[index]))
            # Per choice, whitespace content before any other: an answer of calls and whitespace has
            # content null (completion_choice), so it goes out only once text or the end says it stays.
            spaces, spoke = [""] * generation.n, [False] * generation.n
            finished = 0
            async for index, delta in deltas:
                chunk = functools.partial(chunk_body, parsed, **fields, index=index, legacy=legacy[index])
                if pending[index] is not None and (entry := generation.logprob_entry(delta)) is not None:
                    pending[index].append(entry)
                splitter = generation.splitters[index]
                if splitter is not None:
                    pieces = [splitter.feed(delta.text, token=delta.token is not None)]
                    if delta.finish_reason is not None:
                        pieces.append(splitter.flush())
                    # A call streams as it is written: its head (id, name) once the name is whole, then its
                    # arguments in pieces; its end sends nothing more (the pieces were its arguments).
                    for part in (part for piece in pieces for part in piece.parts):
                        if isinstance(part, Reasoning):
                            yield sse(chunk(text=None, reasoning=part.text, finish_reason=None))
                        elif isinstance(part, Content):
                            if not spoke[index] and not part.text.strip():
                                spaces[index] += part.text
                                continue
                            spoke[index] = True
                            yield sse(chunk(text=spaces[index] + part.text, finish_reason=None,
                                            logprobs=pending[index]))
                            spaces[index], pending[index] = "", [] if parsed.logprobs else None
                        elif isinstance(part, CallStart):
                            yield sse(chunk(text=None, tool_calls=call_head_delta(part.index, part.id, part.name),
                                            finish_reason=None))
                        elif isinstance(part, CallArguments):
                            yield sse(chunk(text=None, tool_calls=call_arguments_delta(part.index, part.text),
                                            finish_reason=None))
                elif delta.text:
                    yield sse(chunk(text=delta.text, finish_reason=None, logprobs=pending[index]))
                    pending[index] = [] if parsed.logprobs else None
                if delta.finish_reason is not None:
                    if spaces[index] and not splitter.tool_calls:  # whitespace alone is the answer's content
                        yield sse(chunk(text=spaces[index], finish_reason=None, logprobs=pending[index]))
                        pending[index] = [] if parsed.logprobs else None
                    finish = delta.finish_reason if splitter is None else splitter.finish_reason(delta.finish_reason)
                    yield sse(chunk(text=None if parsed.chat else "", finish_reason=finish,
                                    logprobs=pending[index] or None))
                    finished += 1
                    if finished == generation.n:  # every choice ended: the counts are final
                        if parsed.include_usage:
                            yield sse(usage_chunk_body(parsed, **fields, prompt_tokens=generation.prompt_tokens,
                                                       completion_tokens=generation.stats.generated_tokens,
                                                       reasoning_tokens=generation.reasoning_tokens))
                        written.answer = True
        except Exception as exc:  # noqa: BLE001 - the status line is gone; the error goes in the stream
            broken = distributed_cause(exc)
            failed = grammar_error(exc, parsed) if parsed.grammar is not None else None
            if written.answer:  # after the whole answer (letting go of the slot): logged, not sent
                logger.exception("generation %s failed after its answer was written", id_)
            elif broken is not None:
                logger.error("generation %s failed: %s", id_, broken)
                yield sse(group_broken_error(broken).body())
            elif failed is not None:
                yield sse(failed.body())
            else:
                logger.exception("generation %s failed", id_)
                yield sse(APIError(500, f"generation failed: {type(exc).__name__}: {exc}",
                                   type="server_error").body())
        finally:
            with anyio.CancelScope(shield=True):
                await deltas.aclose()
                await generation.aclose()
        yield sse("[DONE]")

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    def model_entry(name: str) -> dict:
        return {"id": name, "object": "model", "created": service.created, "owned_by": "emlx_async"}

    async def models(request: Request) -> Response:
        body = {"object": "list", "data": [model_entry(name) for name in service.models.names]}
        return count("/v1/models", JSON(body))

    async def model(request: Request) -> Response:
        try:
            served = service.models.lookup(request.path_params["name"])
        except APIError as error:
            return count("/v1/models/{name}", error_response(error))
        return count("/v1/models/{name}", JSON(model_entry(served.name)))

    async def health(request: Request) -> Response:
        # "model", "model_status", "mode" and "step": the default model's; "models": each one's state
        # (loaded or not). "mode" is the mode its engine runs, null while none is loaded: "auto" decides
        # only at load, so --mode ("configured_mode") says nothing of an unloaded model's.
        # "model_status" says why it is null: "loading" at start, "unloaded" after --idle-unload.
        default = service.models.default
        body = {"status": service.status, "model": default.name, "model_status": default.state, "mode": None,
                "configured_mode": config.mode, "models": [served.health() for served in service.models]}
        if service.engine is not None:
            body["mode"], body["step"] = service.engine.mode, service.engine.step_kind
        if service.load_error:
            body["error"] = service.load_error
        if service.broken is not None:
            body["error"] = str(service.broken)
        return count("/health", JSON(body, status_code=200 if service.status == "ready" else 503))

    async def metrics(request: Request) -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    async def openapi_json(request: Request) -> Response:
        # The bounds hold for every model: known once all are loaded, the largest of each.
        engines = [served.engine for served in service.models]
        loaded = all(engine is not None for engine in engines)
        return JSON(openapi.document(
            model_names=service.models.names, max_messages=config.max_messages,
            vocab_size=max(e.vocab_size or 0 for e in engines) or None if loaded else None,
            context_length=max(e.context_length or 0 for e in engines) or None if loaded else None,
            max_choices=min(MAX_CHOICES, config.max_concurrent)))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        # anyio, not asyncio: the app runs under uvicorn (asyncio, uvloop) and hypercorn's trio worker.
        async with anyio.create_task_group() as tasks:
            await service.start(tasks)
            try:
                yield
            finally:
                await service.close()

    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
        error = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", type=kind,
                         headers=dict(exc.headers or {}))
        path = request.url.path  # a wrong method or path under the Messages API: Anthropic's shape
        if path == middleware.ANTHROPIC_PREFIX or path.startswith(middleware.ANTHROPIC_PREFIX + "/"):
            return anthropic.error_response(error)
        return error_response(error)

    async def server_error(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return error_response(APIError(500, f"internal error: {type(exc).__name__}", type="server_error"))

    app = Starlette(routes=[
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        *anthropic.routes(service),
        *responses.routes(service),
    ], lifespan=lifespan, exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.service = service
    middleware.install(app, api_keys=config.api_keys, metrics_auth=config.metrics_auth,
                       cors_origins=config.cors_origins, access_log=config.access_log)
    return app
