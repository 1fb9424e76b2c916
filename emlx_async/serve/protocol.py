"""OpenAI request parsing and response shapes, independent of the web framework.

Every request field is checked here, by type and range, before the engine
sees it, so a bad field gets a 400 that names it (`param`). Parsing is
total: no JSON value makes it raise anything but APIError, and an error
message shows user input only through `show()` (short, ASCII, never a
container's contents, so no recursion and nothing that cannot be encoded).
What the engine still refuses (a prompt past the context, special-token
text in a role) is a ValueError that the app also turns into a 400.
"""

from __future__ import annotations

import math
import numbers
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

# OpenAI's own limits on stop sequences and top_logprobs.
MAX_STOP_SEQUENCES = 4
MAX_TOP_LOGPROBS = 20
# Chat messages per request unless the service sets its own bound (`emlx-async serve --max-messages`).
DEFAULT_MAX_MESSAGES = 1024
# Seeds and top_k are reduced by the engine; past these they are surely a mistake.
_INT64 = 1 << 63
_SHOW_CHARS = 60
_CHAT_ROLES = {"system", "developer", "user", "assistant"}


class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        # The response is UTF-8 JSON: a lone surrogate that reached a message anyway is escaped.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(param: str | None, message: str, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def show(value: Any) -> str:
    """User input as an error message may echo it: short and ASCII. Containers
    show only their kind (their repr recurses, and a body nested a few
    hundred levels deep is valid JSON)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"  # str() of a big int is slow, and limited
    text = ascii(value)
    return text if len(text) <= _SHOW_CHARS else text[:_SHOW_CHARS - 3] + "..."


def _text(value: Any, param: str) -> str:
    """`value` if it is text the tokenizer and the JSON response can hold (no lone surrogates)."""
    if not isinstance(value, str):
        raise invalid(param, f"'{param}' must be a string, got {show(value)}", "invalid_type")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise invalid(param, f"'{param}' is not valid Unicode: a lone surrogate at position {exc.start}",
                          "invalid_value") from None
    return value


@dataclass
class GenerationRequest:
    """One parsed /v1/chat/completions or /v1/completions request."""

    chat: bool
    model: str | None
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    max_tokens: int | None = None
    temperature: float = 1.0   # OpenAI's default; 0 is greedy
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False     # chat only
    top_logprobs: int = 0

    def sampling(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


def _is_int(value: Any) -> bool:
    """An integer as JSON Schema counts them: 2.0 is one (the caller converts with int())."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _optional(body: dict, name: str) -> Any:
    """The field's value; an explicit JSON null counts as absent, as OpenAI treats it."""
    return body.get(name)


def _number(body: dict, name: str, default: float, low: float, high: float, *, low_open: bool = False) -> float:
    value = _optional(body, name)
    if value is None:
        return default
    if not _is_number(value):
        raise invalid(name, f"'{name}' must be a number, got {show(value)}", "invalid_type")
    bracket = "(" if low_open else "["
    out_of_range = invalid(name, f"'{name}' must be in {bracket}{low:g}, {high:g}], got {show(value)}")
    try:
        number = float(value)  # an integer past float's range overflows
    except OverflowError:
        raise out_of_range from None
    if not math.isfinite(number) or number < low or number > high or (low_open and number == low):
        raise out_of_range
    return number


def _int(body: dict, name: str, low: int, high: int) -> int | None:
    value = _optional(body, name)
    if value is None:
        return None
    if not _is_int(value):
        raise invalid(name, f"'{name}' must be an integer, got {show(value)}", "invalid_type")
    if not low <= value <= high:
        raise invalid(name, f"'{name}' must be in [{low}, {high}], got {show(value)}")
    return int(value)


def _reject_unsupported(body: dict, chat: bool) -> None:
    """Fields we cannot honour are refused, not silently ignored."""
    for name in ("n", "best_of"):
        value = _optional(body, name)
        if value is not None and (not _is_int(value) or value != 1):
            raise invalid(name, f"only {name}=1 is supported, got {name}={show(value)}", "unsupported_value")
    for name in ("tools", "functions"):
        if _optional(body, name):
            raise invalid(name, f"'{name}' (tool and function calling) is not supported", "unsupported_parameter")
    for name in ("tool_choice", "function_call"):
        value = _optional(body, name)
        if value is not None and value != "none":
            raise invalid(name, f"'{name}' (tool and function calling) is not supported", "unsupported_parameter")
    if not chat and _optional(body, "logprobs") is not None:  # the legacy int form
        raise invalid("logprobs", "'logprobs' is supported on /v1/chat/completions only", "unsupported_parameter")
    if _optional(body, "logit_bias"):
        raise invalid("logit_bias", "'logit_bias' is not supported", "unsupported_parameter")
    for name in ("presence_penalty", "frequency_penalty"):
        value = _optional(body, name)
        if value is not None and (not _is_number(value) or value != 0):
            raise invalid(name, f"'{name}' is not supported (only 0)", "unsupported_parameter")
    response_format = _optional(body, "response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise invalid("response_format", "only response_format {'type': 'text'} is supported",
                      "unsupported_parameter")
    if not chat:
        if _optional(body, "echo"):
            raise invalid("echo", "'echo' is not supported", "unsupported_parameter")
        if _optional(body, "suffix"):
            raise invalid("suffix", "'suffix' is not supported", "unsupported_parameter")


def _message_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return _text(content, param)
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(f"{param}[{i}]", "only text content parts ({'type': 'text', 'text': ...}) "
                              "are supported", "unsupported_value")
            parts.append(_text(part["text"], f"{param}[{i}].text"))
        return "".join(parts)
    raise invalid(param, f"message content must be a string or a list of text parts, got {show(content)}",
                  "invalid_type")


def _parse_messages(body: dict, max_messages: int) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "'messages' must be a non-empty list of {'role', 'content'} objects",
                      "invalid_type" if messages is not None else "missing_required_parameter")
    # Checked before any message is looked at: encoding costs time per message.
    if len(messages) > max_messages:
        raise invalid("messages", f"at most {max_messages} messages per request, got {len(messages)}",
                      "too_many_messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages[{i}]", f"messages[{i}] must be an object, got {show(message)}", "invalid_type")
        role = message.get("role")
        if not isinstance(role, str) or role not in _CHAT_ROLES:
            raise invalid(f"messages[{i}].role", f"messages[{i}].role must be one of "
                          f"{sorted(_CHAT_ROLES)}, got {show(role)}", "unsupported_value")
        if message.get("tool_calls"):
            raise invalid(f"messages[{i}].tool_calls", "tool calls are not supported", "unsupported_parameter")
        # The template knows system, user and assistant; "developer" is OpenAI's new name for system.
        out.append({"role": "system" if role == "developer" else role,
                    "content": _message_text(message.get("content"), f"messages[{i}].content")})
    return out


def _parse_prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid("prompt", "'prompt' is required", "missing_required_parameter")
    # One prompt: a string or token ids; a list holding exactly one of those is the same.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _text(prompt, "prompt")
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return [int(t) for t in prompt]
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise invalid("prompt", "only one prompt per request is supported", "unsupported_value")
    raise invalid("prompt", "'prompt' must be a string or a list of token ids", "invalid_type")


def parse_request(body: Any, *, chat: bool, max_messages: int = DEFAULT_MAX_MESSAGES) -> GenerationRequest:
    """The request in `body` (parsed JSON), or APIError (400) naming the first bad field."""
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object", "invalid_type")
    _reject_unsupported(body, chat)
    model = _optional(body, "model")
    request = GenerationRequest(chat=chat, model=None if model is None else _text(model, "model"))
    if chat:
        request.messages = _parse_messages(body, max_messages)
    else:
        request.prompt = _parse_prompt(body)

    # max_completion_tokens is the newer name (chat); max_tokens the older one. One of them, not both.
    if _optional(body, "max_tokens") is not None and _optional(body, "max_completion_tokens") is not None:
        raise invalid("max_completion_tokens", "give 'max_completion_tokens' or 'max_tokens', not both",
                      "unsupported_value")
    for name in ("max_tokens", "max_completion_tokens"):
        value = _optional(body, name)
        if value is None:
            continue
        if not _is_int(value):
            raise invalid(name, f"'{name}' must be an integer, got {show(value)}", "invalid_type")
        if value < 1:
            raise invalid(name, f"'{name}' must be at least 1, got {show(value)}")
        request.max_tokens = int(value)

    request.temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    request.top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _int(body, "top_k", -1, _INT64 - 1)  # -1 (and 0): every token
    if top_k is not None:
        request.top_k = max(top_k, 0)
    request.seed = _int(body, "seed", -_INT64, (1 << 64) - 1)

    stop = _optional(body, "stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise invalid("stop", "'stop' must be a non-empty string or a list of them", "invalid_type")
        if len(stop) > MAX_STOP_SEQUENCES:
            raise invalid("stop", f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(stop)}")
        request.stop = [_text(s, "stop") for s in stop]

    if chat:
        logprobs = _optional(body, "logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise invalid("logprobs", f"'logprobs' must be a boolean, got {show(logprobs)}", "invalid_type")
        request.logprobs = bool(logprobs)
        top = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if top:
            if not request.logprobs:
                raise invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true")
            request.top_logprobs = top
    elif _optional(body, "top_logprobs") is not None:
        raise invalid("top_logprobs", "'top_logprobs' is supported on /v1/chat/completions only",
                      "unsupported_parameter")

    stream = _optional(body, "stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("stream", f"'stream' must be a boolean, got {show(stream)}", "invalid_type")
    request.stream = bool(stream)
    options = _optional(body, "stream_options")
    if options is not None:
        if not request.stream:
            raise invalid("stream_options", "'stream_options' is only allowed when 'stream' is true")
        if not isinstance(options, dict):
            raise invalid("stream_options", "'stream_options' must be an object", "invalid_type")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise invalid("stream_options.include_usage", "'include_usage' must be a boolean", "invalid_type")
        request.include_usage = include_usage
    return request


# ---- responses ------------------------------------------------------------------

def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def logprob_entry(text_bytes: bytes, logprob: float, top: list[tuple[bytes, float]]) -> dict:
    """One token of a chat choice's ``logprobs.content``, in OpenAI's shape.

    `token` is the token's text (a token that is part of a UTF-8 character
    shows U+FFFD; `bytes` has its exact bytes).
    """
    def entry(raw: bytes, value: float) -> dict:
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": value, "bytes": list(raw)}

    return {**entry(text_bytes, logprob), "top_logprobs": [entry(raw, value) for raw, value in top]}


def choice_logprobs(entries: list[dict] | None) -> dict | None:
    return None if entries is None else {"content": entries, "refusal": None}


def completion_body(request: GenerationRequest, *, id: str, model: str, text: str, finish_reason: str | None,
                    prompt_tokens: int, completion_tokens: int, logprobs: list[dict] | None = None) -> dict:
    if request.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": choice_logprobs(logprobs), "finish_reason": finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": id, "object": obj, "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}


def chunk_body(request: GenerationRequest, *, id: str, model: str, created: int, text: str | None,
               finish_reason: str | None, first: bool = False, logprobs: list[dict] | None = None) -> dict:
    """One streamed chunk with a single choice (`logprobs`: the entries of this chunk's tokens)."""
    if request.chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": choice_logprobs(logprobs),
                  "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    body = {"id": id, "object": obj, "created": created, "model": model, "choices": [choice]}
    if request.include_usage:
        body["usage"] = None  # every chunk but the last, as OpenAI sends them
    return body


def usage_chunk_body(request: GenerationRequest, *, id: str, model: str, created: int,
                     prompt_tokens: int, completion_tokens: int) -> dict:
    obj = "chat.completion.chunk" if request.chat else "text_completion"
    return {"id": id, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}
