"""schemathesis hooks for the service's schema run (tests/serve/test_serve_schemathesis.py),
applied to each case just before it is sent, in every phase (a `map_body` hook
misses the coverage phase's cases); schemathesis then revalidates the case, so
whether it counts as valid follows the body actually sent.

Generated requests stay cheap on a CPU: a valid token limit above 2 (max_tokens,
max_completion_tokens, the Responses API's max_output_tokens) becomes 2 (JSON
Schema counts 5.0 as an integer, so floats too). Values past the documented
maximum (EMLX_SCHEMA_MAX_TOKENS) are left for the server to refuse.

Two rules of the Messages API no JSON Schema can say: its last message is the
user's (a final assistant message, a prefill, gets 400), and thinking's
budget_tokens is less than max_tokens. A generated final assistant message
becomes the user's, and a budget of max_tokens or more becomes max_tokens - 1
(thinking is taken out where max_tokens is 1); any other fault in the case stays.
Likewise min_tokens past the token limit (chat and completions) becomes the
limit, or 2 (the test server's default) where none is sent.

A completion's list of prompts takes one generation per prompt and choice (in
waves past the server's concurrent generations): to keep a case cheap, where the
prompts times n pass EMLX_SCHEMA_MAX_CHOICES (the document's bound on n), n and
then the list are cut to fit.

Tools, tool turns and grammars (tools, tool_choice, parallel_tool_calls, role
"tool" and assistant tool_calls in the history, json_schema and guided_*
grammars; the Messages API's tool_use and tool_result blocks, the Responses
API's function_call and function_call_output items) are taken out of
generated bodies: whether one is valid depends on JSON Schema semantics and
tool names the document cannot state (a schema the grammar engine compiles,
arguments that are JSON text of an object, a result naming an earlier call).
tests/serve/test_serve_tools.py, test_serve_api_tools.py and
test_serve_structured.py send those fields, hostile ones included. So is
logit_bias: its keys must be token ids below the model's vocabulary size, a
bound the document cannot state (tests/llm/test_llm_penalties.py sends it, bad
keys included), and the Responses API's previous_response_id, an id only the
server gives (tests/serve/test_serve_responses.py sends it)."""

import numbers
import os

import schemathesis

MAXIMUM = float(os.environ.get("EMLX_SCHEMA_MAX_TOKENS", "inf"))
MAX_CHOICES = int(os.environ.get("EMLX_SCHEMA_MAX_CHOICES", "8"))
TOKEN_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
MESSAGES_API = ("/v1/messages", "/v1/messages/count_tokens")
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
RESPONSES_API = (RESPONSES, "/v1/responses/input_tokens")
GUIDED = ("guided_json", "guided_regex", "guided_grammar")


def _without_tools(body: dict) -> None:
    """Tools, tool turns, grammars and logit_bias out of a chat or completion body (see the docstring)."""
    for name in (*GUIDED, "tools", "tool_choice", "parallel_tool_calls", "logit_bias"):
        body.pop(name, None)
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if isinstance(message, dict) and (message.get("role") == "tool" or "tool_calls" in message):
            content = message.get("content")
            messages[i] = {"role": "user", "content": content if content is not None else "x"}
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        body["response_format"] = {"type": "json_object"}


def _without_tool_turns(body: dict, path: str) -> None:
    """The Messages and Responses APIs' tools and tool turns out of a body (see the docstring)."""
    body.pop("tools", None)
    body.pop("tool_choice", None)
    if path in MESSAGES_API:
        for message in body.get("messages") if isinstance(body.get("messages"), list) else ():
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                kept = [b for b in content
                        if not (isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result"))]
                message["content"] = kept or "x"
    if path in RESPONSES_API:  # a stored response's id is the server's to give
        body.pop("previous_response_id", None)
    items = body.get("input")
    for i, item in enumerate(items if path in RESPONSES_API and isinstance(items, list) else ()):
        if isinstance(item, dict) and item.get("type") in ("function_call", "function_call_output"):
            items[i] = {"role": "user", "content": "x"}


@schemathesis.hook
def before_call(context, case, kwargs):
    body = case.body
    if not isinstance(body, dict):
        return
    for name in TOKEN_LIMITS:
        value = body.get(name)
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and 2 < value <= MAXIMUM \
                and float(value).is_integer():
            body[name] = 2
    if case.operation.path in (CHAT, "/v1/completions"):
        _without_tools(body)
        _min_tokens_within_the_limit(body)
        _prompts_within_the_generations(body)
    elif case.operation.path in (*MESSAGES_API, *RESPONSES_API):
        _without_tool_turns(body, case.operation.path)
    messages = body.get("messages")
    if case.operation.path in MESSAGES_API and isinstance(messages, list) and messages \
            and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
        messages[-1] = {**messages[-1], "role": "user"}
    if case.operation.path in MESSAGES_API:
        _budget_below_max_tokens(body)


def _min_tokens_within_the_limit(body: dict) -> None:
    """min_tokens at most the token limit (2, the server's default, where none is sent), where
    both are integers (see the docstring)."""
    value = body.get("min_tokens")
    limits = [body[name] for name in TOKEN_LIMITS if _integer(body.get(name))]
    if _integer(value) and value > (limit := int(limits[0]) if limits else 2) >= 0:
        body["min_tokens"] = limit


def _prompts_within_the_generations(body: dict) -> None:
    """A list of prompts times n at most MAX_CHOICES (see the docstring)."""
    prompts, n = body.get("prompt"), body.get("n")
    if not (isinstance(prompts, list) and prompts and all(isinstance(p, (str, list)) for p in prompts)):
        return
    choices = int(n) if _integer(n) and n >= 1 else 1  # a bad n is refused for itself
    if len(prompts) * choices <= MAX_CHOICES:
        return
    if choices > 1:
        choices = body["n"] = max(1, MAX_CHOICES // len(prompts))
    del prompts[MAX_CHOICES // choices:]


def _budget_below_max_tokens(body: dict) -> None:
    """thinking.budget_tokens under max_tokens (see the docstring), where both are integers."""
    thinking, limit = body.get("thinking"), body.get("max_tokens")
    if not isinstance(thinking, dict) or not _integer(limit) or not _integer(thinking.get("budget_tokens")):
        return
    if thinking["budget_tokens"] >= limit:
        if limit >= 2:
            body["thinking"] = {**thinking, "budget_tokens": int(limit) - 1}
        else:
            body.pop("thinking")


def _integer(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer()
