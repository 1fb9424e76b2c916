"""The Anthropic Messages API: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

A request becomes the chat GenerationRequest the service already runs
(``system`` first, then the turns, text blocks joined), so a conversation
gets the same greedy answer here as from /v1/chat/completions. Answers,
streamed events and errors take Anthropic's shapes:
``{"type": "error", "error": {"type", "message"}}``, the service's 503 as
529 ``overloaded_error``. ``max_tokens`` is required, as Anthropic's API has
it. ``metadata`` is accepted and ignored; server tools are refused with a
400 naming the field.

On a template that thinks the reasoning is a ``thinking`` block (streamed as
``thinking_delta`` events); ``thinking`` turns the template's thinking on or
off and its ``budget_tokens`` bounds it ("enabled" with a forced tool_choice,
any or tool, is Anthropic's 400); ``output_config.format`` constrains
the answer to a JSON schema with the chat endpoint's grammar.

Tools run on the chat endpoint's machinery (serve/tools.py): ``tools``
(name, description, input_schema) become function tools, ``tool_choice``
auto, any, tool (by name) and none map to chat's auto, required, a named
function and none (any and tool are constrained by the call grammar), and
``disable_parallel_tool_use`` to parallel_tool_calls false. In the history an
assistant's ``tool_use`` blocks are its tool calls and a user's
``tool_result`` blocks (each naming a tool_use of the assistant turn
before) are tool messages, rendered by the template as chat renders them.
An answer's calls are ``tool_use`` blocks with stop_reason "tool_use";
streamed, each is a content_block_start with the id and name as soon as the
name is written, then its input in ``input_json_delta`` pieces as the model
writes them (serve/tools.py's OutputSplitter), then its content_block_stop. A
call whose input is not a whole object (cut by max_tokens, or written wrong
under tool_choice auto) keeps what was streamed and stops with max_tokens or
end_turn, not tool_use.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.responses import Response
from starlette.routing import Route

from .service import Generation, Service
from .common import (JSON, AnswerParts, Collected, boolean, checked_text, event, generation_route, integer,
                     joined_text, number, optional_object, prompt_tokens_route, required_text, string, string_list,
                     wrong_type)
from .protocol import (DEFAULT_MAX_MESSAGES, APIError, GenerationRequest, ToolCallIds, check_message_count,
                       check_stop_lengths,
                       checked_json, checked_tool, choose_tools, constrain_answer, invalid, schema_grammar, show,
                       type_name)
from .tools import CallArguments, CallEnd, CallStart, Reasoning

MESSAGES, COUNT_TOKENS = "/v1/messages", "/v1/messages/count_tokens"
# A documented bound (Anthropic publishes none): each one is checked after every token.
MAX_STOP_SEQUENCES = 16
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
               415: "invalid_request_error",
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
    if error.param:
        # Anthropic names the field at the head of the message, unquoted.
        message = message.removeprefix(f"'{error.param}': ")
        if not message.startswith(error.param + ":"):
            message = f"{error.param}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


# ---- requests -----------------------------------------------------------------------

@dataclass
class MessagesRequest:
    generation: GenerationRequest
    stop_sequences: list[str]


# What Anthropic's tool_choice types are in chat's terms.
_TOOL_CHOICES = {"auto": "auto", "any": "required", "tool": "function", "none": "none"}


def _parse_thinking(body: dict, generation: GenerationRequest) -> None:
    """`thinking` onto the chat request: on a template that thinks, "disabled" turns its
    thinking off (enable_thinking false), "enabled" and "adaptive" on; "enabled"'s
    budget_tokens bounds the reasoning (then the grammar closes it). Whatever the model
    reasons comes back as thinking blocks."""
    thinking = optional_object(body, "thinking")
    if thinking is None:
        return
    kind = thinking.get("type")
    if kind not in ("enabled", "adaptive", "disabled"):
        raise invalid("thinking.type", "thinking.type: expected 'enabled', 'adaptive' or 'disabled', got "
                      f"{show(kind) if isinstance(kind, str) else type_name(kind)}", "unsupported_value")
    generation.template_kwargs["enable_thinking"] = kind != "disabled"
    # Anthropic's rule: manual thinking ("enabled") with a forced call (any, tool) is a 400;
    # adaptive thinking may be forced.
    if kind == "enabled" and generation.tool_choice in ("required", "function"):
        raise invalid("thinking", "Thinking may not be enabled when tool_choice forces tool use.",
                      "unsupported_value")
    if kind == "enabled":
        generation.reasoning_budget = integer(thinking, "budget_tokens", low=1, required=True,
                                              param="thinking.budget_tokens")


def parse_tools(body: dict, request: GenerationRequest) -> None:
    """`tools` and `tool_choice` onto the chat request (serve/protocol.py's checks and grammar)."""
    tools = body.get("tools")
    if tools is None:
        tools = []
    elif not isinstance(tools, list):
        raise wrong_type("tools", "an array of tools", tools)
    parsed, names = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise wrong_type(where, "a tool object", tool)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise invalid(f"{where}.type", f"{where}.type: only custom tools (name, description, input_schema) "
                          f"are supported, got {show(kind)} (server tools are not)", "unsupported_value")
        if tool.get("input_schema") is None:
            raise invalid(f"{where}.input_schema", f"{where}.input_schema: field required",
                          "missing_required_parameter")
        parsed.append(checked_tool(tool.get("name"), tool.get("description"), tool["input_schema"], names,
                                   {"name": f"{where}.name", "description": f"{where}.description",
                                    "parameters": f"{where}.input_schema"}))
    choice = optional_object(body, "tool_choice") or {"type": "auto"}
    kind = choice.get("type")
    if not isinstance(kind, str) or kind not in _TOOL_CHOICES:  # a list or an object is not hashable
        raise invalid("tool_choice.type", f"tool_choice.type: expected one of {list(_TOOL_CHOICES)}, got "
                      f"{show(kind) if isinstance(kind, str) else type_name(kind)}", "unsupported_value")
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise wrong_type("tool_choice.disable_parallel_tool_use", "a boolean", disable)
    request.parallel_tool_calls = not disable
    name = None
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise wrong_type("tool_choice.name", "the name of a tool", name)
        if name not in names:
            raise invalid("tool_choice.name", f"tool_choice.name: {show(name)} is not one of the tools",
                          "unknown_tool")
    choose_tools(request, parsed, _TOOL_CHOICES[kind], name, param="tool_choice", said=kind)


def _text_blocks(content, param: str) -> str:
    """A string, or a list of text blocks joined (cache_control and citations are ignored)."""
    return joined_text(content, param, text_types=("text",), noun="content block")



def _turn(role: str, content, where: str, ids: ToolCallIds) -> list[dict]:
    """One message as chat messages: an assistant's text and tool calls (their ids go to
    `ids`), or a user's tool results (each a tool message, answering a tool_use of the
    assistant turn before, once) and then its text."""
    if not isinstance(content, list):
        if role == "assistant":
            ids.made([], [])
        return [{"role": role, "content": _text_blocks(content, where)}]
    texts, calls, results, params = [], [], [], []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(block, dict):
            raise wrong_type(at, "a content block object", block)
        kind = block.get("type")
        if kind == "text" or not isinstance(kind, str):
            texts.append(_one_text(block, at))
        elif kind == "tool_use" and role == "assistant":
            arguments = block.get("input")
            if not isinstance(arguments, dict):
                raise wrong_type(f"{at}.input", "an object", arguments)
            checked_json(arguments, f"{at}.input")
            calls.append({"type": "function", "id": required_text(block, "id", at),
                          "function": {"name": required_text(block, "name", at), "arguments": arguments}})
            params.append(f"{at}.id")
        elif kind == "tool_result" and role == "user":
            call_id = required_text(block, "tool_use_id", at)
            ids.answered(call_id, f"{at}.tool_use_id")
            is_error = block.get("is_error")
            if is_error is not None and not isinstance(is_error, bool):
                raise wrong_type(f"{at}.is_error", "a boolean", is_error)
            text = _text_blocks(block.get("content", ""), f"{at}.content")
            results.append({"role": "tool", "tool_call_id": call_id,
                            "content": f"Error: {text}" if is_error else text})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # an earlier turn's reasoning: the template leaves it out of the prompt, as Anthropic does
        elif kind in ("tool_use", "tool_result"):
            raise invalid(f"{at}.type", f"{at}.type: '{kind}' blocks belong in "
                          f"{'assistant' if kind == 'tool_use' else 'user'} messages", "unsupported_value")
        else:
            raise invalid(f"{at}.type", f"{at}.type: only 'text', 'tool_use', 'tool_result' and (an assistant's) "
                          "'thinking' content blocks are supported", "unsupported_value")
    text = "".join(texts)
    if role == "assistant":
        ids.made([call["id"] for call in calls], params)
    if calls:
        return [{"role": "assistant", "content": text, "tool_calls": calls}]
    return [*results, {"role": role, "content": text}] if text or not results else results


def _one_text(block: dict, at: str) -> str:
    kind = block.get("type")
    if not isinstance(kind, str):
        raise wrong_type(f"{at}.type", "a string", kind)
    text = block.get("text")
    if not isinstance(text, str):
        raise wrong_type(f"{at}.text", "a string", text)
    return checked_text(text, f"{at}.text")


def parse_conversation(body: dict, max_messages: int = DEFAULT_MAX_MESSAGES) -> list[dict]:
    """`system` and `messages` as the chat messages of the engine's template."""
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
    check_message_count(messages, "messages", max_messages)
    ids = ToolCallIds("tool_use block")
    asked: tuple[int, list[str]] | None = None  # an assistant turn's index and its tool_use ids
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
        if message["content"] in ("", []):  # Anthropic's rule and words (a final assistant turn is refused below)
            raise invalid(f"{where}.content", f"{where}.content: all messages must have non-empty content except "
                          "for the optional final assistant message")
        out += _turn(role, message["content"], f"{where}.content", ids)
        if asked is not None:  # Anthropic's rule: the message after tool_use blocks holds a result of each
            missing = ids.unanswered() if role == "user" else asked[1]
            if missing:
                raise invalid(f"messages[{asked[0]}]", f"messages[{asked[0]}]: tool_use ids were found without "
                              f"tool_result blocks immediately after: {', '.join(show(m) for m in missing)}. Each "
                              "tool_use block must have a corresponding tool_result block in the next message.",
                              "missing_tool_result")
        calls = ids.unanswered() if role == "assistant" else []
        asked = (i, calls) if calls else None
        if role == "user":
            ids.made([], [])  # its results answered the turn before; the next answers the next one
    if messages[-1]["role"] == "assistant":
        # Anthropic continues a final assistant turn; the chat template would close it and start another.
        raise invalid(f"messages[{len(messages) - 1}].role", f"messages[{len(messages) - 1}].role: a final "
                      "assistant message (a prefill to continue) is not supported", "unsupported_value")
    return out


def parse_prompt(body: dict, max_messages: int = DEFAULT_MAX_MESSAGES) -> GenerationRequest:
    """What /v1/messages/count_tokens reads (and /v1/messages first): the model, the
    conversation and the tools, as a chat request without a token limit."""
    generation = GenerationRequest(chat=True, model=string(body, "model"),
                                   messages=parse_conversation(body, max_messages))
    parse_tools(body, generation)
    _parse_output_format(body, generation)
    _parse_thinking(body, generation)
    return generation


def _parse_output_format(body: dict, generation: GenerationRequest) -> None:
    """`output_config.format`, Anthropic's structured outputs (what client.messages.parse
    sends): the answer's text is an instance of its JSON schema. Its "effort" is ignored."""
    output_config = optional_object(body, "output_config")
    fmt = None if output_config is None else output_config.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise wrong_type("output_config.format", "an object", fmt)
    if fmt.get("type") != "json_schema":
        raise invalid("output_config.format.type", f"output_config.format.type must be 'json_schema', got "
                      f"{show(fmt.get('type'))}", "unsupported_value")
    if "schema" not in fmt:
        raise invalid("output_config.format.schema", "output_config.format.schema is required",
                      "missing_required_parameter")
    # Strict, as Anthropic's are: a keyword the grammar cannot enforce is a 400 naming it.
    constrain_answer(generation, schema_grammar(fmt["schema"], "output_config.format.schema"), "output_config.format")


MAX_USER_ID = 256  # metadata.user_id's characters, as Anthropic's API allows


def parse_request(body: dict, max_messages: int = DEFAULT_MAX_MESSAGES) -> MessagesRequest:
    generation = parse_prompt(body, max_messages)
    max_tokens = integer(body, "max_tokens", low=1, required=True)
    metadata = optional_object(body, "metadata")  # accepted, and ignored; checked as Anthropic's API checks it
    user_id = None if metadata is None else metadata.get("user_id")
    if user_id is not None:
        if not isinstance(user_id, str):
            raise wrong_type("metadata.user_id", "a string", user_id)
        if len(user_id) > MAX_USER_ID:
            raise invalid("metadata.user_id", f"metadata.user_id: at most {MAX_USER_ID} characters, got {len(user_id)}")
    string(body, "service_tier")  # accepted, and ignored: one tier here
    stop = check_stop_lengths(string_list(body, "stop_sequences", MAX_STOP_SEQUENCES), "stop_sequences")
    top_k = integer(body, "top_k", low=0)
    generation.max_tokens, generation.stop, generation.top_k = max_tokens, stop, top_k or 0
    if generation.reasoning_budget is not None and generation.reasoning_budget >= max_tokens:
        raise invalid("thinking.budget_tokens", f"thinking.budget_tokens ({generation.reasoning_budget}) must be "
                      f"less than max_tokens ({max_tokens})")
    generation.temperature = number(body, "temperature", 1.0, 0.0, 1.0)  # Anthropic's range and default
    generation.top_p = number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    generation.stream = boolean(body, "stream")
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


def message_body(id_: str, model: str, content: list[dict], reason: str | None, sequence: str | None,
                 usage_: dict) -> dict:
    return {"id": id_, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage_}


def text_block(text: str) -> dict:
    return {"type": "text", "text": text}


def thinking_block(text: str) -> dict:
    """The reasoning of a template that thinks, markers left out (its signature is empty)."""
    return {"type": "thinking", "thinking": text, "signature": ""}


def tool_use_block(call: dict) -> dict:
    """A chat tool call as a tool_use block. Its input is an object: a call whose arguments
    are none (max_tokens cut it, or the model wrote no JSON object) has what they hold of one,
    which is nothing: {}."""
    try:
        value = json.loads(call["function"]["arguments"])
    except (ValueError, RecursionError):
        value = None
    return {"type": "tool_use", "id": tool_use_id(call["id"]), "name": call["function"]["name"],
            "input": value if isinstance(value, dict) else {}}


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _error_event(error: APIError) -> bytes:
    return event("error", error_body(error))


class MessagesReply:
    """The answer to one admitted Messages API request (common.Reply)."""

    def __init__(self, request: MessagesRequest, generation: Generation):
        self.request, self.generation = request, generation
        self.model = generation.model_name
        self.id = new_id()
        self.parts = AnswerParts(generation)
        self.ended = False  # its message_stop written, or its error made (common.Reply; a stream's only)

    def failed(self, error: APIError) -> bytes:
        return _error_event(error)

    def ended_early(self, error: APIError | None) -> None:
        """Nothing of a Messages API answer is kept: only a failure's end is recorded."""
        self.ended = self.ended or error is not None

    def _stop(self, finish_reason: str, last_token: int | None, tokens: list[int]) -> tuple[str, str | None]:
        if self.parts.finish_reason(finish_reason) == "tool_calls":  # whole calls: the client runs them
            return "tool_use", None
        return stop_reason(self.generation, finish_reason, last_token, tokens, self.request.stop_sequences)

    def _usage(self) -> dict:
        return usage(self.generation.prompt_tokens, self.generation.stats.generated_tokens)

    def body(self, collected: Collected) -> dict:
        content = [text_block(part) if isinstance(part, str) else thinking_block(part.text)
                   if isinstance(part, Reasoning) else tool_use_block(part.call)
                   for part in self.parts.whole(collected)]
        content = content or [text_block("")]  # an answer has a block, if only an empty text
        reason, sequence = self._stop(self.generation.finish_reason, collected.last_token, collected.tokens)
        return message_body(self.id, self.model, content, reason, sequence, self._usage())

    async def events(self) -> AsyncIterator[bytes]:
        generation = self.generation
        start = message_body(self.id, self.model, [], None, None, usage(generation.prompt_tokens, 0))
        yield event("message_start", {"type": "message_start", "message": start})
        index, text_open, thinking_open = 0, False, False
        answered = False  # a block was opened

        def block_start(block: dict) -> bytes:
            return event("content_block_start", {"type": "content_block_start", "index": index,
                                                 "content_block": block})

        def block_delta(delta: dict) -> bytes:
            return event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

        def block_stop() -> bytes:
            return event("content_block_stop", {"type": "content_block_stop", "index": index})

        def close_thinking() -> list[bytes]:
            nonlocal index, thinking_open
            # No signature: nothing here checks one when a client sends the block back.
            events = [block_delta({"type": "signature_delta", "signature": ""}), block_stop()]
            index, thinking_open = index + 1, False
            return events

        if not self.parts.split:  # one text block, open from the start (else it opens at the first text)
            yield block_start(text_block(""))
            text_open = answered = True
        yield event("ping", {"type": "ping"})
        tokens: list[int] = []
        async for delta in generation.deltas():
            if delta.token is not None:
                tokens.append(delta.token)
            final = delta.finish_reason is not None
            for part in self.parts.feed(delta.text, final, token=delta.token is not None):
                if isinstance(part, Reasoning):
                    if not thinking_open:
                        yield block_start(thinking_block(""))
                        thinking_open = answered = True
                    yield block_delta({"type": "thinking_delta", "thinking": part.text})
                    continue
                if thinking_open:  # the reasoning ended: its block closes before the answer's
                    for chunk in close_thinking():
                        yield chunk
                if isinstance(part, str):
                    if not text_open:
                        yield block_start(text_block(""))
                        text_open = answered = True
                    yield block_delta({"type": "text_delta", "text": part})
                    continue
                if isinstance(part, CallStart):
                    if text_open:
                        yield block_stop()
                        index, text_open = index + 1, False
                    yield block_start({"type": "tool_use", "id": tool_use_id(part.id), "name": part.name,
                                       "input": {}})
                    answered = True
                elif isinstance(part, CallArguments):
                    yield block_delta({"type": "input_json_delta", "partial_json": part.text})
                elif isinstance(part, CallEnd):
                    yield block_stop()
                    index += 1
            if final:
                if thinking_open:  # it ended thinking
                    for chunk in close_thinking():
                        yield chunk
                if not answered:  # no block at all: one empty text block, as unstreamed
                    yield block_start(text_block(""))
                    text_open = True
                if text_open:
                    yield block_stop()
                reason, sequence = self._stop(delta.finish_reason, delta.token, tokens)
                yield event("message_delta", {"type": "message_delta",
                                              "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                              "usage": self._usage()})
                yield event("message_stop", {"type": "message_stop"})
                self.ended = True  # written: a shutdown's cut-off from here adds no error


# ---- routes -------------------------------------------------------------------------

def routes(service: Service) -> list[Route]:
    config = service.config
    parse = functools.partial(parse_request, max_messages=config.max_messages)
    parse_count = functools.partial(parse_prompt, max_messages=config.max_messages)
    return [generation_route(service, MESSAGES, parse, MessagesReply, error_response),
            prompt_tokens_route(service, COUNT_TOKENS, parse_count, lambda tokens: {"input_tokens": tokens},
                                error_response)]
