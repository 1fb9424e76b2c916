"""OpenAI's Responses API, for what it shares with chat: ``POST /v1/responses``.

``input`` (a string, or messages with input_text/output_text parts) and
``instructions`` become the chat GenerationRequest the service already
runs, so a conversation gets the same greedy answer as from
/v1/chat/completions. The answer is a response object with one output
message; a generation cut off by ``max_output_tokens`` is ``incomplete``
with ``incomplete_details.reason`` "max_output_tokens" (streamed, its last
event is ``response.incomplete``, as OpenAI sends it). Errors keep OpenAI's
shape. Nothing is stored: ``store`` is ignored and ``previous_response_id``
and ``conversation`` are refused (send the whole conversation in
``input``). Tools, reasoning, structured ``text.format``, logprobs and
background runs are refused with a 400 naming the field.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import DistributedError
from .service import EventStream, Generation, Service, group_broken_error, shutdown_error
from .common import (JSON, checked_text, joined_text, boolean, collect, count, event, guarded, integer, number,
                     optional_object, read_object, string, type_name, wrong_type)
from .protocol import MAX_TOP_LOGPROBS, APIError, GenerationRequest, invalid

RESPONSES = "/v1/responses"
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")


# The service names the chat request's fields; these are their names here.
_FIELD_NAMES = {"max_tokens": "max_output_tokens", "messages": "input"}


def error_response(error: APIError) -> Response:
    if error.param in _FIELD_NAMES:
        error.param = _FIELD_NAMES[error.param]
    return JSON(error.body(), status_code=error.status, headers=error.headers)


# ---- requests -----------------------------------------------------------------------

@dataclass
class ResponsesRequest:
    generation: GenerationRequest
    # Echoed in the response object, as OpenAI does.
    echo: dict = field(default_factory=dict)


def _unsupported(param: str, what: str) -> APIError:
    return invalid(param, f"{param}: {what} is not supported", "unsupported_parameter")


def _refuse_unsupported(body: dict) -> None:
    for name, what in (("previous_response_id", "a stored response (nothing is stored: send the whole "
                        "conversation in 'input')"), ("conversation", "a stored conversation (nothing is "
                        "stored: send the whole conversation in 'input')"), ("prompt", "a stored prompt"),
                       ("reasoning", "reasoning (this model does not reason)")):
        if body.get(name) is not None:
            raise _unsupported(name, what)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise wrong_type("tools", "an array", tools)
    if tools:
        raise _unsupported("tools", "tool calling (not yet)")
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("none", "auto"):
        raise _unsupported("tool_choice", "tool calling (not yet)")
    if boolean(body, "background"):
        raise _unsupported("background", "a background response")
    top_logprobs = integer(body, "top_logprobs", low=0, high=MAX_TOP_LOGPROBS)
    if top_logprobs:
        raise _unsupported("top_logprobs", "logprobs in responses")
    text = optional_object(body, "text")
    if text is not None:
        fmt = text.get("format")
        if fmt is not None and fmt != {"type": "text"}:
            raise _unsupported("text.format", "a format other than {'type': 'text'}")
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(i, str) for i in include)):
        raise wrong_type("include", "an array of strings", include)
    truncation = body.get("truncation")
    if truncation is not None and truncation not in ("auto", "disabled"):
        raise invalid("truncation", "truncation: expected 'auto' or 'disabled'")


def _content(content, param: str) -> str:
    return joined_text(content, param, text_types=_TEXT_PARTS, noun="content part")


def parse_input(body: dict) -> list[dict]:
    """`instructions` and `input` as the chat messages of the engine's template."""
    messages = []
    instructions = string(body, "instructions")
    if instructions is not None:
        messages.append({"role": "system", "content": checked_text(instructions, "instructions")})
    items = body.get("input")
    if items is None:
        raise invalid("input", "input: field required", "missing_required_parameter")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": checked_text(items, "input")}]
    if not isinstance(items, list):
        raise wrong_type("input", "a string or an array of input items", items)
    if not items:
        raise invalid("input", "input: at least one item is required")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise wrong_type(where, "an input item object", item)
        kind = item.get("type", "message")
        if kind != "message":
            if not isinstance(kind, str):
                raise wrong_type(f"{where}.type", "a string", kind)
            what = "tool calls (not yet)" if "call" in kind else f"'{kind}' items"
            raise invalid(f"{where}.type", f"{where}.type: {what}: only messages are supported",
                          "unsupported_value")
        role = item.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise invalid(f"{where}.role", f"{where}.role: expected one of {sorted(_ROLES)}"
                          + ("" if isinstance(role, str) else f", got {type_name(role)}"))
        if "content" not in item:
            raise invalid(f"{where}.content", f"{where}.content: field required", "missing_required_parameter")
        messages.append({"role": _ROLES[role], "content": _content(item["content"], f"{where}.content")})
    return messages


def parse_request(body: dict) -> ResponsesRequest:
    _refuse_unsupported(body)
    model = string(body, "model")
    messages = parse_input(body)
    metadata = optional_object(body, "metadata")
    if metadata is not None and not all(isinstance(v, str) for v in metadata.values()):
        raise invalid("metadata", "metadata: values must be strings", "invalid_type")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise wrong_type("parallel_tool_calls", "a boolean", parallel)
    for name in ("user", "safety_identifier", "prompt_cache_key", "service_tier"):
        string(body, name)  # accepted, and ignored
    generation = GenerationRequest(
        chat=True, model=model, messages=messages, max_tokens=integer(body, "max_output_tokens", low=1),
        temperature=number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=number(body, "top_p", 1.0, 0.0, 1.0, low_open=True), stream=boolean(body, "stream"))
    echo = {"instructions": body.get("instructions"), "metadata": metadata or {},
            "max_output_tokens": generation.max_tokens, "temperature": generation.temperature,
            "top_p": generation.top_p, "parallel_tool_calls": True if parallel is None else parallel,
            "truncation": body.get("truncation") or "disabled"}
    return ResponsesRequest(generation, echo)


# ---- answers ------------------------------------------------------------------------

def usage(input_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(id_: str, status: str, content: list[dict]) -> dict:
    return {"type": "message", "id": id_, "status": status, "role": "assistant", "content": content}


@dataclass
class Answer:
    """One response's ids and state, from which each of its shapes is built."""

    request: ResponsesRequest
    model: str
    id: str = field(default_factory=lambda: "resp_" + uuid.uuid4().hex)
    message_id: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex)
    created_at: int = field(default_factory=lambda: int(time.time()))
    sequence_number: int = 0

    def body(self, status: str, output: list[dict], usage_: dict | None = None,
             error: dict | None = None) -> dict:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "model": self.model, "output": output, "usage": usage_, "error": error,
                "incomplete_details": incomplete, "tool_choice": "none", "tools": [],
                "text": {"format": {"type": "text"}}, "reasoning": None, "store": False,
                "previous_response_id": None, **self.request.echo}

    def finished(self, finish_reason: str | None, text: str, usage_: dict) -> dict:
        status = "incomplete" if finish_reason == "length" else "completed"
        return self.body(status, [message_item(self.message_id, status, [output_text(text)])], usage_)

    def event(self, kind: str, **fields) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return event(kind, data)

    def failed(self, error: APIError) -> bytes:
        return self.event("response.failed", response=self.body(
            "failed", [], error={"code": "server_error", "message": error.message}))


async def _events(answer: Answer, generation: Generation) -> AsyncIterator[bytes]:
    where = {"item_id": answer.message_id, "output_index": 0, "content_index": 0}
    yield answer.event("response.created", response=answer.body("in_progress", []))
    yield answer.event("response.in_progress", response=answer.body("in_progress", []))
    yield answer.event("response.output_item.added", output_index=0,
                       item=message_item(answer.message_id, "in_progress", []))
    yield answer.event("response.content_part.added", **where, part=output_text(""))
    text = []
    async for delta in generation.deltas():
        if delta.text:
            text.append(delta.text)
            yield answer.event("response.output_text.delta", **where, delta=delta.text, logprobs=[])
        if delta.finish_reason is not None:
            full = "".join(text)
            done = answer.finished(delta.finish_reason, full, usage(generation.prompt_tokens,
                                                                    generation.stats.generated_tokens))
            yield answer.event("response.output_text.done", **where, text=full, logprobs=[])
            yield answer.event("response.content_part.done", **where, part=output_text(full))
            yield answer.event("response.output_item.done", output_index=0, item=done["output"][0])
            yield answer.event("response.incomplete" if done["status"] == "incomplete" else "response.completed",
                               response=done)


# ---- routes -------------------------------------------------------------------------

def routes(service: Service) -> list[Route]:
    config = service.config

    async def responses(request: Request) -> Response:
        try:
            service.check_ready()
            parsed = parse_request(await read_object(request, config.max_body_bytes, config.body_timeout))
            generation = await service.start_generation(parsed.generation)
        except APIError as error:
            return count(service, RESPONSES, error_response(error))
        except DistributedError as exc:  # broke between the check and the engine
            return count(service, RESPONSES, error_response(group_broken_error(exc)))
        answer = Answer(parsed, generation.model_name)
        if parsed.generation.stream:
            events = guarded(_events(answer, generation), generation, answer.id, answer.failed)
            return count(service, RESPONSES, EventStream(events, service, generation,
                                                              lambda: answer.failed(shutdown_error())))
        try:
            collected = await collect(service, generation, request, answer.id)
        except APIError as error:
            return count(service, RESPONSES, error_response(error))
        if collected is None:
            return count(service, RESPONSES, Response(status_code=499))  # the client is gone: nobody reads this
        body = answer.finished(generation.finish_reason, collected.text,
                               usage(generation.prompt_tokens, generation.stats.generated_tokens))
        return count(service, RESPONSES, JSON(body))

    return [Route(RESPONSES, responses, methods=["POST"])]
