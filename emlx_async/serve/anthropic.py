"""The Anthropic Messages API: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

A request becomes the chat GenerationRequest the service already runs
(``system`` first, then the turns, text blocks joined), so a conversation
gets the same greedy answer here as from /v1/chat/completions. Answers,
streamed events and errors take Anthropic's shapes:
``{"type": "error", "error": {"type", "message"}}``, the service's 503 as
529 ``overloaded_error``. ``max_tokens`` is required, as Anthropic's API has
it. Tool use (``tools``, ``tool_use``/``tool_result`` blocks) and extended
thinking are refused with a 400 naming the field: they need constrained
decoding the engine does not offer yet. ``metadata`` is accepted and ignored.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import DistributedError
from .service import EventStream, Generation, Service, group_broken_error, shutdown_error
from .common import (JSON, joined_text, boolean, collect, count, event, guarded, integer,
                     number, optional_object, read_object, string, string_list, type_name, wrong_type)
from .protocol import APIError, GenerationRequest, invalid

MESSAGES, COUNT_TOKENS = "/v1/messages", "/v1/messages/count_tokens"
# A documented bound (Anthropic publishes none): each one is checked after every token.
MAX_STOP_SEQUENCES = 16
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}
STOP_REASONS = {"length": "max_tokens"}  # "stop": end_turn or stop_sequence, told apart by the last delta


# ---- errors -------------------------------------------------------------------------

def error_response(error: APIError) -> Response:
    """An APIError of the service (OpenAI's shape) in Anthropic's shape and status."""
    status = 529 if error.status == 503 else error.status
    return JSON(error_body(error), status_code=status, headers=error.headers)


def error_body(error: APIError) -> dict:
    status = 529 if error.status == 503 else error.status
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    message = error.message
    if error.param and not message.startswith(error.param + ":"):
        message = f"{error.param}: {message}"  # Anthropic names the field at the head of the message
    return {"type": "error", "error": {"type": kind, "message": message}}


# ---- requests -----------------------------------------------------------------------

@dataclass
class MessagesRequest:
    generation: GenerationRequest
    stop_sequences: list[str]


# Blocks that need tool use (not offered on this API yet), refused with that reason.
_TOOL_BLOCKS = {kind: "blocks need tool use, which is not supported yet"
                for kind in ("tool_use", "tool_result", "server_tool_use")}


def _text_blocks(content, param: str) -> str:
    """A string, or a list of text blocks joined (cache_control and citations are ignored)."""
    return joined_text(content, param, text_types=("text",), noun="content block", refusals=_TOOL_BLOCKS)


def _refuse_tools(body: dict) -> None:
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise wrong_type("tools", "an array", tools)
    if tools:
        raise invalid("tools", "tools: tool use is not supported yet", "unsupported_parameter")
    choice = body.get("tool_choice")
    if choice is not None and not (isinstance(choice, dict) and choice.get("type") == "none"):
        raise invalid("tool_choice", "tool_choice: tool use is not supported yet", "unsupported_parameter")
    output_config = optional_object(body, "output_config")  # its "effort" is ignored
    if output_config is not None and output_config.get("format") is not None:
        raise invalid("output_config.format", "output_config.format: structured outputs are not supported yet",
                      "unsupported_parameter")
    thinking = body.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        raise invalid("thinking", "thinking: extended thinking is not supported", "unsupported_parameter")


def parse_conversation(body: dict) -> list[dict]:
    """`system` and `messages` as the chat messages of the engine's template."""
    _refuse_tools(body)
    out = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text_blocks(system, "system")})
    messages = body.get("messages")
    if messages is None:
        raise invalid("messages", "messages: field required", "missing_required_parameter")
    if not isinstance(messages, list):
        raise wrong_type("messages", "an array of messages", messages)
    if not messages:
        raise invalid("messages", "messages: at least one message is required")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise wrong_type(where, "a message object", message)
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise invalid(f"{where}.role", f"{where}.role: expected 'user' or 'assistant'"
                          + ("" if isinstance(role, str) else f", got {type_name(role)}"), "invalid_value")
        if "content" not in message:
            raise invalid(f"{where}.content", f"{where}.content: field required", "missing_required_parameter")
        out.append({"role": role, "content": _text_blocks(message["content"], f"{where}.content")})
    if out[-1]["role"] == "assistant":
        # Anthropic continues a final assistant turn; the chat template would close it and start another.
        raise invalid(f"messages[{len(messages) - 1}].role", f"messages[{len(messages) - 1}].role: a final "
                      "assistant message (a prefill to continue) is not supported", "unsupported_value")
    return out


def parse_request(body: dict) -> MessagesRequest:
    model = string(body, "model")
    messages = parse_conversation(body)
    max_tokens = integer(body, "max_tokens", low=1, required=True)
    optional_object(body, "metadata")  # accepted, and ignored
    stop = string_list(body, "stop_sequences", MAX_STOP_SEQUENCES)
    top_k = integer(body, "top_k", low=0)
    generation = GenerationRequest(
        chat=True, model=model, messages=messages, max_tokens=max_tokens,
        temperature=number(body, "temperature", 1.0, 0.0, 1.0),  # Anthropic's range and default
        top_p=number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=top_k or 0, stop=stop, stream=boolean(body, "stream"))
    return MessagesRequest(generation, stop)


# ---- answers ------------------------------------------------------------------------

def new_id() -> str:
    return "msg_" + uuid.uuid4().hex


def stop_reason(generation: Generation, finish_reason: str, last_token: int | None, tokens: list[int],
                stop_sequences: list[str]) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence.

    The engine says "stop" both for the end of the turn (its last delta has
    no token) and for a stop string (the token that completed it); which
    string matched is the first one found in the tokens' full text, the
    engine's own rule, since the text sent leaves the stop string out.
    """
    if finish_reason != "stop":
        return STOP_REASONS.get(finish_reason, "end_turn"), None
    if last_token is None or not stop_sequences:
        return "end_turn", None
    token_bytes = generation.engine.token_bytes
    text = b"".join(token_bytes(t) for t in tokens).decode("utf-8", errors="replace")
    found = [(text.find(s), i) for i, s in enumerate(stop_sequences) if s in text]
    return "stop_sequence", stop_sequences[min(found)[1]] if found else None


def usage(input_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def message_body(id_: str, model: str, text: str, reason: str | None, sequence: str | None, usage_: dict) -> dict:
    return {"id": id_, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}] if text or reason is not None else [],
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage_}


def _error_event(error: APIError) -> bytes:
    return event("error", error_body(error))


async def _events(request: MessagesRequest, generation: Generation, id_: str, model: str) -> AsyncIterator[bytes]:
    start = message_body(id_, model, "", None, None, usage(generation.prompt_tokens, 0))
    yield event("message_start", {"type": "message_start", "message": start})
    yield event("content_block_start", {"type": "content_block_start", "index": 0,
                                        "content_block": {"type": "text", "text": ""}})
    yield event("ping", {"type": "ping"})
    tokens: list[int] = []
    async for delta in generation.deltas():
        if delta.token is not None:
            tokens.append(delta.token)
        if delta.text:
            yield event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                "delta": {"type": "text_delta", "text": delta.text}})
        if delta.finish_reason is not None:
            reason, sequence = stop_reason(generation, delta.finish_reason, delta.token, tokens,
                                           request.stop_sequences)
            yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
            yield event("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                          "usage": usage(generation.prompt_tokens,
                                                         generation.stats.generated_tokens)})
            yield event("message_stop", {"type": "message_stop"})


# ---- routes -------------------------------------------------------------------------

def routes(service: Service) -> list[Route]:
    config = service.config

    async def messages(request: Request) -> Response:
        try:
            service.check_ready()
            parsed = parse_request(await read_object(request, config.max_body_bytes, config.body_timeout))
            generation = await service.start_generation(parsed.generation)
        except APIError as error:
            return count(service, MESSAGES, error_response(error))
        except DistributedError as exc:  # broke between the check and the engine
            return count(service, MESSAGES, error_response(group_broken_error(exc)))
        id_ = new_id()
        if parsed.generation.stream:
            events = guarded(_events(parsed, generation, id_, generation.model_name), generation, id_, _error_event)
            return count(service, MESSAGES, EventStream(events, service, generation,
                                                             lambda: _error_event(shutdown_error())))
        try:
            collected = await collect(service, generation, request, id_)
        except APIError as error:
            return count(service, MESSAGES, error_response(error))
        if collected is None:
            return count(service, MESSAGES, Response(status_code=499))  # the client is gone: nobody reads this
        reason, sequence = stop_reason(generation, generation.finish_reason, collected.last_token,
                                       collected.tokens, parsed.stop_sequences)
        body = message_body(id_, generation.model_name, collected.text, reason, sequence,
                            usage(generation.prompt_tokens, generation.stats.generated_tokens))
        return count(service, MESSAGES, JSON(body))

    async def count_tokens(request: Request) -> Response:
        try:
            service.check_ready()
            body = await read_object(request, config.max_body_bytes, config.body_timeout)
            model = string(body, "model")
            conversation = parse_conversation(body)
            async with service.model_in_use(model) as served:  # 404 for a model not served, as generations
                try:
                    # Rendering and tokenizing a long conversation takes time: off the loop.
                    ids = await anyio.to_thread.run_sync(lambda: served.engine.encode(messages=conversation))
                except (ValueError, TypeError) as exc:
                    raise invalid("messages", str(exc)) from None
        except APIError as error:
            return count(service, COUNT_TOKENS, error_response(error))
        return count(service, COUNT_TOKENS, JSON({"input_tokens": len(ids)}))

    return [Route(MESSAGES, messages, methods=["POST"]), Route(COUNT_TOKENS, count_tokens, methods=["POST"])]
