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

import codecs
import json
import math
import numbers
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

# OpenAI's own limits on stop sequences and top_logprobs.
MAX_STOP_SEQUENCES = 4
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions' `logprobs`
# Choices per request (`n`): the engine's bound, emlx_async.llm.MAX_CHOICES (a test keeps them equal;
# the engine is imported only when a request runs). The server's --max-concurrent bounds n too.
MAX_CHOICES = 16
# Prompts per completion request (a list of them); past the server's --max-concurrent they run in waves.
MAX_PROMPTS = 64
# Characters per stop sequence: the text that may begin one is held back and compared with it at
# every token (llm.text.stop_prefix_len), so a longer one costs every token more; OpenAI states no bound.
MAX_STOP_CHARS = 1024
# stop_token_ids (vLLM's extension) per request.
MAX_STOP_TOKEN_IDS = 256
# Chat messages per request unless the service sets its own bound (`emlx-async serve --max-messages`).
DEFAULT_MAX_MESSAGES = 1024
# Seeds and top_k are reduced by the engine; past these they are surely a mistake.
_INT64 = 1 << 63
_SHOW_CHARS = 60
_CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}
# /v1/completions' grammar fields (vllm's names): at most one per request.
GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_grammar")
_TOOL_CHOICES = ("auto", "none", "required")


# Not an EMLXError, and not in emlx_async/_errors.py: an HTTP answer (status,
# type, code) that the service's handlers raise to their own app, which turns
# it into the response. It never reaches a library caller.
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


def type_name(value: Any) -> str:
    """The JSON type of a parsed value, for messages that must not echo the value ("an empty
    string" where a string is there but empty)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, numbers.Integral):
        return "integer"
    if isinstance(value, numbers.Real):
        return "number"
    if isinstance(value, str):
        return "string" if value else "an empty string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


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


# Nesting of a tool call's arguments in the history: the template renders them recursively
# (a few hundred levels ran past Python's stack there, a 400 that named no field).
MAX_ARGUMENT_DEPTH = 64


# Properties in one JSON schema (a tool's parameters, a response_format schema). The grammar
# engine's time grows faster than their count: the first token mask of a schema of 2,000
# took 1.3 s on a 2-core CPU, of 4,000 6.9 s, of 8,000 27 s (and its check while parsing
# 7 s more); past some size its parser fails after the first token, a 500 from the decode.
MAX_SCHEMA_PROPERTIES = 2000


def checked_json(value: Any, param: str, *, max_depth: int | None = MAX_ARGUMENT_DEPTH, schema: bool = False) -> Any:
    """`value`, a JSON value of a request that reaches the prompt or a grammar (a call's
    arguments, a tool's schema), refused naming `param` unless it is JSON the response
    and the tokenizer can hold: every string, keys too, valid Unicode, no NaN or
    infinity (Python's parser takes them; JSON has none), and at most `max_depth`
    levels deep (None: any depth; a grammar bounds its own). A `schema` has at most
    MAX_SCHEMA_PROPERTIES properties in all. Walked without recursion."""
    pending, properties = [(value, 1)], 0
    while pending:
        item, depth = pending.pop()
        if max_depth is not None and depth > max_depth:
            raise invalid(param, f"'{param}' is nested more than {max_depth} levels deep")
        if isinstance(item, str):
            if not item.isascii() and not _encodable(item):
                raise invalid(param, f"'{param}' holds text that is not valid Unicode (a lone surrogate)")
        elif isinstance(item, float) and not math.isfinite(item):
            raise invalid(param, f"'{param}' holds {item}, which JSON does not have")
        elif isinstance(item, dict):
            if schema and isinstance(item.get("properties"), dict):
                properties += len(item["properties"])
                if properties > MAX_SCHEMA_PROPERTIES:
                    raise invalid(param, f"'{param}' has more than {MAX_SCHEMA_PROPERTIES} properties: the grammar "
                                  "engine would take minutes over it", "schema_too_large")
            for key, child in item.items():
                pending += [(key, depth), (child, depth + 1)]
        elif isinstance(item, list):
            pending += [(child, depth + 1) for child in item]
    return value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass
class GenerationRequest:
    """One parsed /v1/chat/completions or /v1/completions request."""

    chat: bool
    model: str | None
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    # A completion that sent several prompts (then `prompt` is None): each is answered as `prompt` is,
    # its n choices at indices j * n .. j * n + n - 1 (OpenAI's order).
    prompts: list[str | list[int]] | None = None
    max_tokens: int | None = None
    max_tokens_field: str = "max_tokens"  # the name the client sent it under, which errors name
    temperature: float = 1.0   # OpenAI's default; 0 is greedy
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)  # vLLM's extension; the vocabulary is the service's check
    ignore_eos: bool = False   # vLLM's extension: decode past end-of-sequence to max_tokens (fixed-length benchmarks)
    n: int = 1                 # choices, each sampled on its own from one prefill
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    echo: bool = False         # completions: the prompt comes first in the answer (with logprobs, scored)
    grammar: Any = None        # an llm.grammar.Grammar the output must match
    grammar_param: str | None = None  # the field that gave it (errors name it)
    tools: list[dict] | None = None   # chat: function tools the template shows (None: none, or tool_choice "none")
    tool_choice: str = "auto"  # "auto", "required" or "function" (then tool_name)
    tool_name: str | None = None
    parallel_tool_calls: bool = True
    max_tool_calls: int | None = None  # Responses' max_tool_calls: calls past it are read and dropped
    # Responses' truncation "auto": the oldest turns go while the prompt does not fit the context.
    drop_old_turns: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs
    # Tokens the reasoning of a template that thinks may take (None: REASONING_SHARE of max_tokens
    # under a grammar, unbounded without one); the Messages API's thinking.budget_tokens.
    reasoning_budget: int | None = None
    # The penalty, logit_bias and min_p fields that were sent (Engine.generate's options).
    penalties: dict[str, Any] = field(default_factory=dict)

    def sampling(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, **self.penalties}


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


def _number(body: dict, name: str, default: float, low: float, high: float, *, low_open: bool = False,
            param: str | None = None) -> float:
    """body[name] as a float in the bounds; errors name `param` (default: the field itself)."""
    value = _optional(body, name)
    if value is None:
        return default
    param = param or name
    what = name if param == name else f"{param}[{show(name)}]"
    if not _is_number(value):
        raise invalid(param, f"'{what}' must be a number, got {show(value)}", "invalid_type")
    bracket = "(" if low_open else "["
    bounds = f"in {bracket}{low:g}, {high:g}]" if math.isfinite(high) else f"{'>' if low_open else '>='} {low:g}"
    out_of_range = invalid(param, f"'{what}' must be {bounds}, got {show(value)}")
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


# OpenAI's bounds on the penalties and on a logit bias, the engine's too (llm/penalties.py's
# MAX_PENALTY, MAX_BIAS and MIN_/MAX_REPETITION; a test holds them equal: this module does
# not import the engine). repetition_penalty and min_p ([0, 1]) are extensions with mlx-lm's
# meanings; repetition_penalty is bounded where the step's division stays finite.
PENALTY_BOUND = 2.0
LOGIT_BIAS_BOUND = 100.0
REPETITION_BOUNDS = (0.01, 100.0)
_TOKEN_ID_DIGITS = 19  # a token id past int64 is surely a mistake


def _parse_penalties(body: dict) -> dict[str, Any]:
    """The penalty, logit-bias, min-p and min-tokens fields that were sent, checked for type and
    range (whether a logit_bias id is in the vocabulary is the engine's to say)."""
    out: dict[str, Any] = {}
    for name in ("presence_penalty", "frequency_penalty"):
        if _optional(body, name) is not None:
            out[name] = _number(body, name, 0.0, -PENALTY_BOUND, PENALTY_BOUND)
    if _optional(body, "repetition_penalty") is not None:
        out["repetition_penalty"] = _number(body, "repetition_penalty", 1.0, *REPETITION_BOUNDS)
    if _optional(body, "min_p") is not None:
        out["min_p"] = _number(body, "min_p", 0.0, 0.0, 1.0)
    bias = _optional(body, "logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise invalid("logit_bias", f"'logit_bias' must be an object of token ids to biases, got {show(bias)}",
                          "invalid_type")
        parsed = {}
        for key, value in bias.items():
            # JSON keys are strings: OpenAI's are token ids in decimal ("123").
            if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= _TOKEN_ID_DIGITS):
                raise invalid("logit_bias", f"'logit_bias' keys must be token ids (decimal integer strings), "
                              f"got {show(key)}")
            parsed[int(key)] = _number(bias, key, 0.0, -LOGIT_BIAS_BOUND, LOGIT_BIAS_BOUND, param="logit_bias")
        out["logit_bias"] = parsed
    min_tokens = _int(body, "min_tokens", 0, _INT64 - 1)
    if min_tokens:
        out["min_tokens"] = min_tokens
    return out


def _reject_unsupported(body: dict, chat: bool) -> None:
    """Fields we cannot honour are refused, not silently ignored."""
    value = _optional(body, "best_of")
    if value is not None and (not _is_int(value) or value != 1):
        raise invalid("best_of", f"only best_of=1 is supported, got best_of={show(value)}", "unsupported_value")
    if _optional(body, "functions"):
        raise invalid("functions", "'functions' (the legacy function calling) is not supported: use 'tools'",
                      "unsupported_parameter")
    value = _optional(body, "function_call")
    if value is not None and value != "none":
        raise invalid("function_call", "'function_call' (the legacy function calling) is not supported: "
                      "use 'tool_choice'", "unsupported_parameter")
    if not chat:
        for name in ("tools", "tool_choice", "parallel_tool_calls", "response_format", "chat_template_kwargs",
                     "reasoning_effort", "thinking_token_budget"):
            if _optional(body, name) is not None:
                raise invalid(name, f"'{name}' is supported on /v1/chat/completions only", "unsupported_parameter")
    elif any(_optional(body, name) is not None for name in GUIDED_FIELDS):
        name = next(name for name in GUIDED_FIELDS if _optional(body, name) is not None)
        raise invalid(name, f"'{name}' is supported on /v1/completions only: use 'response_format'",
                      "unsupported_parameter")
    if not chat:
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


def check_stop_lengths(stop: list[str], param: str) -> list[str]:
    """`stop`, refused naming `param` (and the index) if one is longer than MAX_STOP_CHARS."""
    for i, text in enumerate(stop):
        if len(text) > MAX_STOP_CHARS:
            raise invalid(f"{param}[{i}]", f"{param}[{i}]: at most {MAX_STOP_CHARS} characters, got {len(text)}")
    return stop


def check_message_count(items: list, param: str, max_messages: int) -> None:
    """--max-messages, on every API's list of turns (chat's messages, Messages' messages,
    Responses' input), before any is looked at: encoding costs time per message."""
    if len(items) > max_messages:
        raise invalid(param, f"at most {max_messages} {param} per request, got {len(items)}", "too_many_messages")


def _parse_messages(body: dict, max_messages: int) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "'messages' must be a non-empty list of {'role', 'content'} objects",
                      "invalid_type" if messages is not None else "missing_required_parameter")
    check_message_count(messages, "messages", max_messages)
    out = []
    calls = ToolCallIds(per_turn=True)
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages[{i}]", f"messages[{i}] must be an object, got {show(message)}", "invalid_type")
        role = message.get("role")
        if not isinstance(role, str) or role not in _CHAT_ROLES:
            raise invalid(f"messages[{i}].role", f"messages[{i}].role must be one of "
                          f"{sorted(_CHAT_ROLES)}, got {show(role)}", "unsupported_value")
        # The template knows system, user and assistant; "developer" is OpenAI's new name for system.
        parsed: dict[str, Any] = {"role": "system" if role == "developer" else role}
        history_calls = message.get("tool_calls")
        if history_calls is not None and (role != "assistant" or history_calls != []):
            if role != "assistant":
                raise invalid(f"messages[{i}].tool_calls", "only assistant messages have 'tool_calls'")
            parsed["tool_calls"] = _parse_history_calls(history_calls, f"messages[{i}].tool_calls")
            calls.made([call.get("id") for call in parsed["tool_calls"]],
                       [f"messages[{i}].tool_calls[{j}].id" for j in range(len(parsed["tool_calls"]))])
        elif role != "tool":
            calls.made([], [])  # a turn between a call and its result: the call can no longer be answered
        content = message.get("content")
        # An assistant message that calls tools may have no content (OpenAI sends null).
        parsed["content"] = "" if content is None and "tool_calls" in parsed else \
            _message_text(content, f"messages[{i}].content")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise invalid(f"messages[{i}].tool_call_id", f"a tool message needs 'tool_call_id' (a string), "
                              f"got {show(call_id)}", "invalid_type" if call_id is not None
                              else "missing_required_parameter")
            parsed["tool_call_id"] = _text(call_id, f"messages[{i}].tool_call_id")
            calls.answered(call_id, f"messages[{i}].tool_call_id")
        out.append(parsed)
    return out


class ToolCallIds:
    """The tool-call ids of a conversation's history: no id is used by two calls, and each
    result answers, once, a call of the assistant turn just before it (with `any_earlier`:
    of any turn before it, as the Responses API's items may). With `per_turn` (chat
    completions) an id need only be unique within its turn: clients that number each turn's
    calls from 0 reuse ids across turns. Anthropic's tool_use ids are unique in the whole
    conversation. `call` is what a call is named in the API's errors."""

    def __init__(self, call: str = "tool call", *, any_earlier: bool = False, per_turn: bool = False):
        self._call, self._any_earlier, self._per_turn = call, any_earlier, per_turn
        self._seen: set[str] = set()     # every call's id so far
        self._open: dict[str, None] = {}  # those a result may still answer, in order
        self._answered: set[str] = set()

    def made(self, ids: list[str | None], params: list[str]) -> None:
        """An assistant turn (or, with no ids, any other turn that is not a result) and the
        ids of its calls (None: a call without an id), each named by its param."""
        if not self._any_earlier:
            self._open = {}
        if self._per_turn:
            self._seen, self._answered = set(), set()
        for call_id, param in zip(ids, params):
            if call_id is None:
                continue
            if call_id in self._seen:
                raise invalid(param, f"{param}: the id {show(call_id)} is already used by another {self._call}; "
                              f"every {self._call} needs its own id", "duplicate_tool_call_id")
            self._seen.add(call_id)
            self._open[call_id] = None

    def answered(self, call_id: str, param: str) -> None:
        """A result naming `call_id`."""
        if call_id in self._answered:
            raise invalid(param, f"{param}: the {self._call} {show(call_id)} already has a result",
                          "duplicate_tool_call_id")
        if call_id not in self._open:
            before = "before" if self._any_earlier else "of the assistant turn just before"
            raise invalid(param, f"{param}: no {self._call} {before} has the id {show(call_id)}",
                          "unknown_tool_call_id")
        self._answered.add(call_id)

    def unanswered(self) -> list[str]:
        """The ids of the calls a result may answer that none has yet, in order."""
        return [call_id for call_id in self._open if call_id not in self._answered]


def _parse_history_calls(calls: Any, param: str) -> list[dict]:
    """An assistant message's earlier tool calls, for the template: arguments as a dict
    (Hugging Face's templates read them so), the id kept."""
    if not isinstance(calls, list):
        raise invalid(param, f"'tool_calls' must be a list, got {show(calls)}", "invalid_type")
    out = []
    for j, call in enumerate(calls):
        where = f"{param}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or call.get("type", "function") != "function" or not isinstance(function, dict):
            raise invalid(where, "a tool call must be {'id', 'type': 'function', 'function': {'name', "
                          "'arguments'}}", "invalid_type")
        name = _text(function.get("name"), f"{where}.function.name")
        at = f"{where}.function.arguments"
        arguments = function.get("arguments")
        if arguments is None:  # required by OpenAI's API: a call without them was never written so
            raise invalid(at, f"'{at}' is required: the JSON text of the call's arguments",
                          "missing_required_parameter")
        if not isinstance(arguments, str):  # OpenAI's API refuses an object too: the model wrote JSON text
            raise invalid(at, f"'arguments' must be a string of JSON text, got {show(arguments)}", "invalid_type")
        try:
            arguments = json.loads(_text(arguments, at))
        except (json.JSONDecodeError, RecursionError):
            arguments = None
        if not isinstance(arguments, dict):
            raise invalid(at, "'arguments' must be JSON text of an object")
        checked_json(arguments, at)
        call_id = call.get("id")
        parsed = {"type": "function", "function": {"name": name, "arguments": arguments}}
        if call_id is not None:
            parsed["id"] = _text(call_id, f"{where}.id")
        out.append(parsed)
    return out


def _grammar_error(param: str, exc: Exception) -> APIError:
    return invalid(param, f"'{param}': {exc}", "invalid_grammar")


def schema_grammar(schema: Any, param: str, *, strict: bool = True):
    """The Grammar of a JSON schema a request sent at `param` (every API's structured output
    ends here). `strict`: keywords the grammar cannot enforce are refused; otherwise they are
    ignored (the schema's warnings say which)."""
    from emlx_async.llm.grammar import Grammar, GrammarError

    if not isinstance(schema, dict):
        raise invalid(param, f"'{param}' must be a JSON schema object", "invalid_type")
    checked_json(schema, param, max_depth=None, schema=True)
    try:
        return Grammar.json_schema(schema, lenient=not strict)
    except (GrammarError, RecursionError) as exc:  # a schema nested past Python's stack
        raise _grammar_error(param, exc) from None


def json_object_grammar():
    """The Grammar of any JSON object (every API's "json_object" format)."""
    from emlx_async.llm.grammar import Grammar

    return Grammar.json_object()


def constrain_answer(request: GenerationRequest, grammar, param: str) -> None:
    """The answer follows `grammar` (None: free text), a structured output sent at `param`."""
    if grammar is None:
        return
    if request.grammar is not None:
        raise invalid(param, f"'{param}' cannot be combined with a tool_choice that forces a call",
                      "unsupported_value")
    request.grammar, request.grammar_param = grammar, param


def _parse_response_format(body: dict):
    """response_format as a Grammar (None: free text)."""
    value = _optional(body, "response_format")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("response_format", f"'response_format' must be an object, got {show(value)}", "invalid_type")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise invalid("response_format.json_schema", "'json_schema' must be an object with a 'name' "
                          "(and a 'schema')", "invalid_type")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise invalid("response_format.json_schema.strict", "'strict' must be a boolean", "invalid_type")
        return schema_grammar(spec.get("schema", {}), "response_format.json_schema.schema", strict=bool(strict))
    raise invalid("response_format.type", f"'response_format.type' must be 'text', 'json_object' or "
                  f"'json_schema', got {show(kind)}", "unsupported_value")


def _parse_guided(body: dict):
    """/v1/completions' grammar field: guided_json (a schema), guided_regex, guided_grammar (Lark)."""
    from emlx_async.llm.grammar import Grammar, GrammarError

    given = [name for name in GUIDED_FIELDS if _optional(body, name) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise invalid(given[1], f"give one of {', '.join(GUIDED_FIELDS)}, not {' and '.join(given)}",
                      "unsupported_value")
    name = given[0]
    value = body[name]
    try:
        if name == "guided_json":
            if not isinstance(value, (dict, str)):
                raise invalid(name, f"'{name}' must be a JSON schema (an object or JSON text)", "invalid_type")
            if isinstance(value, dict):
                checked_json(value, name, max_depth=None, schema=True)
            return Grammar.json_schema(value)
        return (Grammar.regex if name == "guided_regex" else Grammar.lark)(_text(value, name))
    except (GrammarError, RecursionError) as exc:
        raise _grammar_error(name, exc) from None


TOOL_NAME_MAX = 128
TOOL_NAME = re.compile(rf"[A-Za-z0-9_.:-]{{1,{TOOL_NAME_MAX}}}")


def checked_tool(name: Any, description: Any, parameters: Any, names: set[str], where: dict[str, str]) -> dict:
    """One function tool in the chat shape the template and the call grammar read, from
    any API's fields; `where` names each field for errors (keys name, description,
    parameters) and `names` gathers the names seen so far (two tools may not share one).
    A schema llguidance cannot read at all is refused here, whatever tool_choice says."""
    if not isinstance(name, str) or not name:
        raise invalid(where["name"], f"a tool needs a 'name' (a string), got {show(name)}",
                      "missing_required_parameter" if name is None else "invalid_type")
    if not TOOL_NAME.fullmatch(name):
        # The name is written into the prompt and the call grammar as it is: quotes, newlines or
        # `</tool_call>` in it would change both, and OpenAI's and Anthropic's rule refuses them too.
        raise invalid(where["name"], f"a tool's name must be 1 to {TOOL_NAME_MAX} letters, digits, '_', '-', "
                      f"'.' or ':', got {show(name)}")
    if name in names:
        raise invalid(where["name"], f"two tools are named {show(name)}")
    names.add(_text(name, where["name"]))
    entry: dict[str, Any] = {"name": name}
    if description is not None:
        entry["description"] = _text(description, where["description"])
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise invalid(where["parameters"], f"'{where['parameters']}' must be a JSON schema object",
                          "invalid_type")
        checked_json(parameters, where["parameters"], max_depth=None, schema=True)
        _check_schema(parameters, where["parameters"])
        entry["parameters"] = parameters
    return {"type": "function", "function": entry}


def _check_schema(schema: dict, param: str) -> None:
    """Refuse a schema that is not one (lenient: keywords a grammar would not enforce pass)."""
    from emlx_async.llm.grammar import Grammar, GrammarError

    try:
        Grammar.json_schema(schema, lenient=True)
    except ImportError:  # no llguidance: only a forced call (which needs it) checks the schema
        return
    except (GrammarError, RecursionError) as exc:
        raise _grammar_error(param, exc) from None


def choose_tools(request: GenerationRequest, tools: list[dict], choice: str, name: str | None = None,
                 *, param: str = "tool_choice", said: str | None = None) -> None:
    """Set the request's tools and tool_choice ("auto", "none", "required", or "function"
    with `name`), with the grammar a forced call needs; every API's tool fields end here.
    `said`: the choice as the API spells it (Messages' "any"), for errors."""
    from emlx_async.llm.grammar import GrammarError

    from .tools import call_grammar

    if choice == "none":
        return  # the model answers in text: the tools are not shown
    request.tool_choice, request.tool_name = choice, name
    request.tools = tools or None
    if request.tools is None:
        if choice != "auto":
            raise invalid(param, f"tool_choice {show(said or choice)} needs at least one tool")
        return
    if choice != "auto":
        try:
            request.grammar = call_grammar(tools, name=name,
                                           parallel=request.parallel_tool_calls and choice != "function"
                                           and request.max_tool_calls != 1)
            request.grammar_param = "tool_choice"
        except (GrammarError, RecursionError) as exc:
            raise _tool_schema_error(tools, exc) from None


def _tool_schema_error(tools: list[dict], exc: Exception) -> APIError:
    """The call grammar failed: name the tool whose parameters fail alone, with the schema's own
    error (the combined grammar's message quotes the whole generated grammar)."""
    from emlx_async.llm.grammar import Grammar, GrammarError

    for i, tool in enumerate(tools):
        parameters = tool["function"].get("parameters")
        if parameters is None:
            continue
        try:
            Grammar.json_schema(parameters)
        except (GrammarError, RecursionError) as alone:
            # tools[i] is the same tool on every API (its schema's field name is not).
            return invalid(f"tools[{i}]", f"tools[{i}] ({show(tool['function']['name'])}): its parameters' "
                           f"schema cannot constrain a call: {alone}", "invalid_grammar")
    return _grammar_error("tools", exc)


def _parse_tools(body: dict, request: GenerationRequest) -> None:
    tools = _optional(body, "tools")
    parallel = _optional(body, "parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", f"'parallel_tool_calls' must be a boolean, got {show(parallel)}",
                      "invalid_type")
    request.parallel_tool_calls = parallel is not False
    choice = _optional(body, "tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise invalid("tool_choice", "'tool_choice' needs 'tools'")
        return
    if not isinstance(tools, list):
        raise invalid("tools", f"'tools' must be a list of function tools, got {show(tools)}", "invalid_type")
    parsed, names = [], set()
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise invalid(f"tools[{i}]", "a tool must be {'type': 'function', 'function': {'name', ...}}",
                          "invalid_type")
        where = {key: f"tools[{i}].function.{key}" for key in ("name", "description", "parameters")}
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):  # a schema follows it or not: no third way
            raise invalid(f"tools[{i}].function.strict", f"'strict' must be a boolean, got {show(strict)}",
                          "invalid_type")
        parsed.append(checked_tool(function.get("name"), function.get("description"), function.get("parameters"),
                                   names, where))
    name = None
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise invalid("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or "
                          "{'type': 'function', 'function': {'name'}}", "invalid_type")
        if name not in names:
            raise invalid("tool_choice.function.name", f"'tool_choice' names {show(name)}, which is not in "
                          "'tools'", "unknown_tool")
        choice = "function"
    elif choice not in _TOOL_CHOICES:
        raise invalid("tool_choice", f"'tool_choice' must be one of {list(_TOOL_CHOICES)} or a named "
                      f"function, got {show(choice)}", "unsupported_value")
    choose_tools(request, parsed, choice, name)


# What the template reads besides the options, which a chat_template_kwargs key would replace:
# what the service passes it, render()'s own "self", the helpers the engine's renderer adds
# (llm/text.py) and Jinja's globals (jinja2.defaults.DEFAULT_NAMESPACE; a test holds both equal).
# A template calling namespace() got 1 instead: a TypeError, a 400 that named no field.
TEMPLATE_RESERVED = ("messages", "tools", "add_generation_prompt", "self", "raise_exception", "strftime_now",
                     "range", "dict", "lipsum", "cycler", "joiner", "namespace")


# OpenAI's reasoning efforts: chat's reasoning_effort, Responses' reasoning.effort.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def think_for_effort(request: GenerationRequest, effort: Any, param: str) -> str | None:
    """A reasoning effort onto the template: on a template that thinks, "none" turns its
    thinking off (enable_thinking false) and any other on; chat_template_kwargs' own
    enable_thinking wins. There are no degrees of effort: the reasoning runs until the
    model closes it or a budget ends it. The effort, checked."""
    if effort is None:
        return None
    if effort not in REASONING_EFFORTS:
        raise invalid(param, f"{param} must be one of {list(REASONING_EFFORTS)}, got {show(effort)}",
                      "unsupported_value")
    request.template_kwargs.setdefault("enable_thinking", effort != "none")
    return effort


def _thinking_budget(body: dict) -> int | None:
    """Chat's ``thinking_token_budget`` (vllm's name): on a template that thinks, the reasoning
    takes at most this many tokens, then its end marker is forced and the answer follows;
    a template that does not think has no reasoning to bound."""
    value = _optional(body, "thinking_token_budget")
    if value is None:
        return None
    if not _is_int(value):
        raise invalid("thinking_token_budget", f"'thinking_token_budget' must be an integer, got {show(value)}",
                      "invalid_type")
    if value < 1:
        raise invalid("thinking_token_budget", f"'thinking_token_budget' must be at least 1, got {show(value)}")
    return int(value)


def _parse_template_kwargs(body: dict) -> dict[str, Any]:
    value = _optional(body, "chat_template_kwargs")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid("chat_template_kwargs", "'chat_template_kwargs' must be an object", "invalid_type")
    for key, item in value.items():
        # Plain values only: the template renders them, and a reserved name would replace what it renders.
        if key in TEMPLATE_RESERVED or not (key.isascii() and key.isidentifier()):
            raise invalid(f"chat_template_kwargs.{show(key)}", f"{show(key)} cannot be set", "unsupported_value")
        if not isinstance(item, (bool, int, float, str)) or (isinstance(item, int) and item.bit_length() > 64):
            raise invalid(f"chat_template_kwargs.{key}", "template options must be booleans, numbers or strings",
                          "invalid_type")
        if isinstance(item, str):
            _text(item, f"chat_template_kwargs.{key}")
        elif isinstance(item, float) and not math.isfinite(item):
            raise invalid(f"chat_template_kwargs.{key}", f"template options must be finite, got {item}")
    return dict(value)


def _parse_prompt(body: dict) -> list[str | list[int]]:
    """The completion's prompts: one (a string or token ids), or a list of them."""
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid("prompt", "'prompt' is required", "missing_required_parameter")
    if isinstance(prompt, str):
        return [_text(prompt, "prompt")]
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return [[int(t) for t in prompt]]
    if isinstance(prompt, list) and prompt and _is_int(prompt[0]):  # token ids, one of them not
        bad = next(i for i, t in enumerate(prompt) if not _is_int(t))
        raise invalid(f"prompt[{bad}]", f"'prompt[{bad}]' must be a token id (an integer), got "
                      f"{type_name(prompt[bad])}", "invalid_type")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) > MAX_PROMPTS:
            raise invalid("prompt", f"'prompt' holds {len(prompt)} prompts; at most {MAX_PROMPTS} per request")
        prompts = []
        for i, one in enumerate(prompt):
            if isinstance(one, str):
                prompts.append(_text(one, f"prompt[{i}]"))
            elif isinstance(one, list) and one and all(_is_int(t) for t in one):
                prompts.append([int(t) for t in one])
            else:
                raise invalid(f"prompt[{i}]", f"'prompt[{i}]' must be a string or a non-empty list of token ids",
                              "invalid_type")
        return prompts
    raise invalid("prompt", "'prompt' must be a string, a list of token ids, or a list of those", "invalid_type")


# OpenAI's fields that change nothing on this server (no accounts, tiers, stored chat completions
# or shared prompt caches): checked and read, so the ignored-fields warning keeps to the fields
# nothing knows (a misspelt one), not those clients send on every request.
NO_EFFECT_TEXT_FIELDS = ("user", "service_tier", "prompt_cache_key", "safety_identifier")


def _check_no_effect_fields(body: dict, chat: bool) -> None:
    for name in NO_EFFECT_TEXT_FIELDS if chat else ("user",):
        value = _optional(body, name)
        if value is not None:
            _text(value, name)
    if not chat:
        return
    store = _optional(body, "store")
    if store is not None and not isinstance(store, bool):
        raise invalid("store", f"'store' must be a boolean, got {show(store)}", "invalid_type")
    metadata = _optional(body, "metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise invalid("metadata", "'metadata' must be an object of strings", "invalid_type")


def parse_request(body: Any, *, chat: bool, max_messages: int = DEFAULT_MAX_MESSAGES) -> GenerationRequest:
    """The request in `body` (parsed JSON), or APIError (400) naming the first bad field."""
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object", "invalid_type")
    _reject_unsupported(body, chat)
    model = _optional(body, "model")
    request = GenerationRequest(chat=chat, model=None if model is None else _text(model, "model"))
    if chat:
        request.messages = _parse_messages(body, max_messages)
        _parse_tools(body, request)
        constrain_answer(request, _parse_response_format(body), "response_format")
        request.template_kwargs = _parse_template_kwargs(body)
        think_for_effort(request, _optional(body, "reasoning_effort"), "reasoning_effort")
        request.reasoning_budget = _thinking_budget(body)
    else:
        prompts = _parse_prompt(body)
        request.prompt, request.prompts = (prompts[0], None) if len(prompts) == 1 else (None, prompts)
        request.grammar = _parse_guided(body)
        request.grammar_param = next((n for n in GUIDED_FIELDS if _optional(body, n) is not None), None)
        echo = _optional(body, "echo")
        if echo is not None and not isinstance(echo, bool):
            raise invalid("echo", f"'echo' must be a boolean, got {show(echo)}", "invalid_type")
        request.echo = bool(echo)

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
        # 0 with echo (legacy completions): the prompt alone, scored with logprobs; nothing generated.
        if value < 1 and not (value == 0 and name == "max_tokens" and request.echo):
            raise invalid(name, f"'{name}' must be at least 1{'' if chat else ' (0 only with echo)'}, "
                          f"got {show(value)}")
        request.max_tokens, request.max_tokens_field = int(value), name

    request.temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    request.top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _int(body, "top_k", -1, _INT64 - 1)  # -1 (and 0): every token
    if top_k is not None:
        request.top_k = max(top_k, 0)
    request.seed = _int(body, "seed", -_INT64, (1 << 64) - 1)
    request.penalties = _parse_penalties(body)
    min_tokens = request.penalties.get("min_tokens", 0)
    if request.max_tokens is not None and min_tokens > request.max_tokens:
        raise invalid("min_tokens", f"'min_tokens' ({min_tokens}) exceeds {request.max_tokens_field} "
                      f"({request.max_tokens})")

    request.n = _int(body, "n", 1, MAX_CHOICES) or 1
    ids = _optional(body, "stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(_is_int(t) and t >= 0 for t in ids):
            raise invalid("stop_token_ids", "'stop_token_ids' must be a list of token ids (integers >= 0)",
                          "invalid_type")
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise invalid("stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} stop token ids, got {len(ids)}")
        request.stop_token_ids = [int(t) for t in ids]
    ignore_eos = _optional(body, "ignore_eos")
    if ignore_eos is not None and not isinstance(ignore_eos, bool):
        raise invalid("ignore_eos", f"'ignore_eos' must be a boolean, got {show(ignore_eos)}", "invalid_type")
    request.ignore_eos = bool(ignore_eos)

    stop = _optional(body, "stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise invalid("stop", "'stop' must be a non-empty string or a list of them", "invalid_type")
        if len(stop) > MAX_STOP_SEQUENCES:
            raise invalid("stop", f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(stop)}")
        request.stop = check_stop_lengths([_text(s, "stop") for s in stop], "stop")

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
    else:
        if _optional(body, "top_logprobs") is not None:
            raise invalid("top_logprobs", "'top_logprobs' is supported on /v1/chat/completions only: on "
                          "/v1/completions 'logprobs' is the number of most likely tokens", "unsupported_parameter")
        # The legacy form: how many of the most likely tokens to list beside each chosen one.
        top = _int(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
        if top is not None:
            request.logprobs, request.top_logprobs = True, top

    _check_no_effect_fields(body, chat)
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


def usage(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None = None) -> dict:
    """OpenAI's usage; a chat's also says how many completion tokens were reasoning."""
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens}
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def _answer_usage(request: GenerationRequest, prompt_tokens: int, completion_tokens: int,
                  reasoning_tokens: int) -> dict:
    """An answer's usage: a chat's says its reasoning tokens, a completion's has no such field."""
    return usage(prompt_tokens, completion_tokens, reasoning_tokens if request.chat else None)


def logprob_entry(text_bytes: bytes, logprob: float | None, top: list[tuple[bytes, float]]) -> dict:
    """One token of a chat choice's ``logprobs.content``, in OpenAI's shape.

    `token` is the token's text (a token that is part of a UTF-8 character
    shows U+FFFD; `bytes` has its exact bytes). An echoed prompt's first token
    has no logprob (None): nothing precedes it.
    """
    def entry(raw: bytes, value: float) -> dict:
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": value, "bytes": list(raw)}

    return {**entry(text_bytes, logprob), "top_logprobs": [entry(raw, value) for raw, value in top]}


def choice_logprobs(entries: list[dict] | None) -> dict | None:
    return None if entries is None else {"content": entries, "refusal": None}


class CompletionLogprobs:
    """A text completion choice's ``logprobs`` in OpenAI's legacy shape, from the entries
    ``logprob_entry`` makes, a chunk at a time: each token's text and logprob, its most
    likely alternatives with the chosen token among them (so up to logprobs + 1, as
    OpenAI's), and ``text_offset``, where its text starts in the choice's text: a token
    that ends a UTF-8 character starts where that character does. A token that is part of
    a character is named by its bytes, as OpenAI's (``bytes:\\xe2\\x80``): two such
    alternatives would otherwise share the key U+FFFD."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._offset = 0

    def body(self, entries: list[dict] | None) -> dict | None:
        if entries is None:
            return None
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for entry in entries:
            out["text_offset"].append(self._offset)
            self._offset += len(self._decoder.decode(bytes(entry["bytes"])))
            token = _legacy_token(entry)
            out["tokens"].append(token)
            out["token_logprobs"].append(entry["logprob"])
            if entry["logprob"] is None:  # an echoed prompt's first token (OpenAI's null)
                out["top_logprobs"].append(None)
                continue
            top = {_legacy_token(alt): alt["logprob"] for alt in entry["top_logprobs"]}
            top.setdefault(token, entry["logprob"])
            out["top_logprobs"].append(top)
        return out


def _legacy_token(entry: dict) -> str:
    """A legacy logprobs token's name: its text, or ``bytes:`` and its bytes escaped where
    they are not whole UTF-8 characters."""
    raw = bytes(entry["bytes"])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)


def completion_choice(request: GenerationRequest, *, index: int = 0, text: str, finish_reason: str | None,
                      logprobs: list[dict] | None = None, reasoning: str | None = None,
                      tool_calls: list[dict] | None = None) -> dict:
    """One choice of a non-streamed answer (its finish_reason as the stream ends it:
    OutputSplitter.finish_reason says "tool_calls")."""
    if not request.chat:
        return {"index": index, "text": text, "logprobs": CompletionLogprobs().body(logprobs),
                "finish_reason": finish_reason}
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if tool_calls:
        # OpenAI's shape: content null when the answer is only calls.
        message["tool_calls"] = tool_calls
        message["content"] = text if text.strip() else None
    return {"index": index, "message": message, "logprobs": choice_logprobs(logprobs),
            "finish_reason": finish_reason}


def completion_body(request: GenerationRequest, *, id: str, model: str, choices: list[dict],
                    prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0) -> dict:
    """A non-streamed answer: its choices (``completion_choice``); usage counts the prompt once
    and the completion tokens of every choice, as OpenAI does (a chat's reasoning tokens too)."""
    obj = "chat.completion" if request.chat else "text_completion"
    return {"id": id, "object": obj, "created": int(time.time()), "model": model, "choices": choices,
            "usage": _answer_usage(request, prompt_tokens, completion_tokens, reasoning_tokens)}


def chunk_body(request: GenerationRequest, *, id: str, model: str, created: int, text: str | None,
               finish_reason: str | None, first: bool = False, logprobs: list[dict] | None = None,
               reasoning: str | None = None, tool_calls: list[dict] | None = None, index: int = 0,
               legacy: CompletionLogprobs | None = None) -> dict:
    """One streamed chunk with a single choice, choice `index` (`logprobs`: the entries of this
    chunk's tokens, a text completion's in the shape its choice's `legacy` gives them;
    `tool_calls`: delta entries, ``call_head_delta`` and ``call_arguments_delta``)."""
    if request.chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        if reasoning is not None:
            delta["reasoning_content"] = reasoning
        if tool_calls is not None:
            delta["tool_calls"] = tool_calls
        choice = {"index": index, "delta": delta, "logprobs": choice_logprobs(logprobs),
                  "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "",
                  "logprobs": None if legacy is None else legacy.body(logprobs), "finish_reason": finish_reason}
        obj = "text_completion"
    body = {"id": id, "object": obj, "created": created, "model": model, "choices": [choice]}
    if request.include_usage:
        body["usage"] = None  # every chunk but the last, as OpenAI sends them
    return body


def call_head_delta(index: int, call_id: str, name: str) -> list[dict]:
    """A streamed call's first delta.tool_calls, as OpenAI sends it: index, id and name (arguments "")."""
    return [{"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]


def call_arguments_delta(index: int, text: str) -> list[dict]:
    """A piece of call `index`'s arguments: the pieces joined are its arguments."""
    return [{"index": index, "function": {"arguments": text}}]


def usage_chunk_body(request: GenerationRequest, *, id: str, model: str, created: int,
                     prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0) -> dict:
    obj = "chat.completion.chunk" if request.chat else "text_completion"
    return {"id": id, "object": obj, "created": created, "model": model, "choices": [],
            "usage": _answer_usage(request, prompt_tokens, completion_tokens, reasoning_tokens)}
