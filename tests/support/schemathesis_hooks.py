"""schemathesis hooks for the service's schema run (tests/serve/test_serve_schemathesis.py),
applied to each case just before it is sent, in every phase (a `map_body` hook
misses the coverage phase's cases); schemathesis then revalidates the case, so
whether it counts as valid follows the body actually sent.

Generated requests stay cheap on a CPU: a valid token limit above 2 (max_tokens,
max_completion_tokens, the Responses API's max_output_tokens) becomes 2 (JSON
Schema counts 5.0 as an integer, so floats too). Values past the documented
maximum (EMLX_SCHEMA_MAX_TOKENS) are left for the server to refuse.

One rule of the Messages API no JSON Schema can say: its last message is the
user's (a final assistant message, a prefill, gets 400). A generated final
assistant message becomes the user's; any other fault in the case stays.

Tools, tool turns and grammars (tools, tool_choice, parallel_tool_calls, role
"tool" and assistant tool_calls in the history, json_schema and guided_*
grammars) are taken out of generated chat and completion bodies: whether one
is valid depends on JSON Schema semantics and tool names the document cannot
state (a schema the grammar engine compiles, arguments that are JSON text of
an object). tests/serve/test_serve_tools.py and test_serve_structured.py send those
fields, hostile ones included."""

import numbers
import os

import schemathesis

MAXIMUM = float(os.environ.get("EMLX_SCHEMA_MAX_TOKENS", "inf"))
TOKEN_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
MESSAGES_API = ("/v1/messages", "/v1/messages/count_tokens")
CHAT = "/v1/chat/completions"
GUIDED = ("guided_json", "guided_regex", "guided_grammar")


def _without_tools(body: dict) -> None:
    """Tools, tool turns and grammars out of a chat or completion body (see the docstring)."""
    for name in (*GUIDED, "tools", "tool_choice", "parallel_tool_calls"):
        body.pop(name, None)
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if isinstance(message, dict) and (message.get("role") == "tool" or "tool_calls" in message):
            content = message.get("content")
            messages[i] = {"role": "user", "content": content if content is not None else "x"}
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        body["response_format"] = {"type": "json_object"}


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
    messages = body.get("messages")
    if case.operation.path in MESSAGES_API and isinstance(messages, list) and messages \
            and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
        messages[-1] = {**messages[-1], "role": "user"}
