"""/openapi.json: a valid OpenAPI 3.1 document whose request schemas agree with
the parser (the requests the tests send are documented and accepted, what the
parser refuses the schemas refuse), and whose response schemas the app's
answers (and, streamed, each event's data) follow. `make fuzz` runs schemathesis
against a live server with it."""

from __future__ import annotations

import json

import pytest
from support.helpers import ServerProcess, needs_model, on_loops

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")
from emlx_async.serve import ServeConfig, create_app  # noqa: E402
from emlx_async.serve import anthropic, openapi, responses  # noqa: E402
from emlx_async.serve.protocol import MAX_PROMPTS, APIError, parse_request  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
# Each request schema and the parser that enforces it.
PARSERS = {
    "ChatCompletionRequest": lambda body: parse_request(body, chat=True),
    "CompletionRequest": lambda body: parse_request(body, chat=False),
    "MessagesRequest": anthropic.parse_request,
    "CountTokensRequest": anthropic.parse_prompt,
    "ResponsesRequest": responses.parse_request,
}
MESSAGES = {"model": MODEL, "max_tokens": 8, "messages": FRANCE}
TURNS = [{"role": "user", "content": [{"type": "text", "text": "Hi!"}]},
         {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
         {"role": "user", "content": "What is the capital of France?"}]
# Requests the service tests send (test_serve.py, test_serve_trio.py, test_serve_connections.py).
SENT = [
    ("ChatCompletionRequest", {"model": "SmolLM2-135M-Instruct", "messages": FRANCE, "max_tokens": 8,
                               "temperature": 0}),
    ("ChatCompletionRequest", {"messages": FRANCE, "max_tokens": 8, "temperature": 0, "logprobs": True,
                               "top_logprobs": 3, "stream": True, "stream_options": {"include_usage": True}}),
    ("ChatCompletionRequest", {"messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                               "max_completion_tokens": 2, "stop": ["a", "b"], "seed": 7, "top_p": 0.9,
                               "reasoning_effort": "low"}),
    ("CompletionRequest", {"model": "SmolLM2-135M-Instruct", "prompt": "The capital of France is",
                           "max_tokens": 4, "temperature": 0, "stop": "."}),
    ("CompletionRequest", {"prompt": [1, 2, 3], "max_tokens": 1, "top_k": 40}),
    ("CompletionRequest", {"prompt": ["The capital of France is", [1, 2, 3]], "n": 2, "max_tokens": 2}),
    ("CompletionRequest", {"prompt": "The capital of France is", "max_tokens": 0, "echo": True, "logprobs": 1}),
    # test_serve_anthropic.py
    ("MessagesRequest", {**MESSAGES, "temperature": 0}),
    ("MessagesRequest", {**MESSAGES, "system": "You are a geography teacher.", "temperature": 0}),
    ("MessagesRequest", {**MESSAGES, "messages": TURNS, "temperature": 0, "stream": True}),
    ("MessagesRequest", {**MESSAGES, "max_tokens": 12, "stop_sequences": [" Paris", "xyz"], "top_k": 10**12,
                         "top_p": 0.5, "metadata": {"user_id": "u"}, "tools": [], "tool_choice": {"type": "none"},
                         "thinking": {"type": "disabled"}, "output_config": {"effort": "low"}}),
    ("MessagesRequest", {**MESSAGES, "max_tokens": 64, "thinking": {"type": "enabled", "budget_tokens": 32}}),
    ("MessagesRequest", {**MESSAGES, "thinking": {"type": "adaptive"}}),
    ("MessagesRequest", {**MESSAGES, "thinking": {"type": "adaptive"}, "tool_choice": {"type": "any"},
                         "tools": [{"name": "f", "input_schema": {"type": "object"}}]}),
    ("MessagesRequest", {**MESSAGES, "max_tokens": 8.0, "system": [{"type": "text", "text": "Be brief."}]}),
    ("CountTokensRequest", {"model": MODEL, "messages": FRANCE}),
    ("CountTokensRequest", {"model": MODEL, "messages": FRANCE, "system": "You are a geography teacher."}),
    # test_serve_responses.py
    ("ResponsesRequest", {"model": MODEL, "input": "What is the capital of France?", "max_output_tokens": 8,
                          "temperature": 0}),
    ("ResponsesRequest", {"model": MODEL, "input": FRANCE, "max_output_tokens": 3, "temperature": 0,
                          "stream": True}),
    ("ResponsesRequest", {"model": MODEL, "instructions": "You are a geography teacher.", "temperature": 0,
                          "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi!"}]},
                                    {"type": "message", "role": "assistant",
                                     "content": [{"type": "output_text", "text": "Hello."}]},
                                    {"role": "developer", "content": "Be brief."}],
                          "metadata": {"k": "v"}, "store": True, "tool_choice": "auto", "tools": [],
                          "text": {"format": {"type": "text"}}, "truncation": "auto", "top_logprobs": 0,
                          "include": [], "parallel_tool_calls": False, "user": "u", "background": False}),
    ("ResponsesRequest", {"input": "x", "max_output_tokens": 2.0, "text": {"format": None}, "reasoning": None}),
    ("ResponsesRequest", {"input": "x", "background": True, "store": True, "stream": False}),
    ("ResponsesRequest", {"input": "x", "background": True, "stream": True}),
    # test_serve_tools.py, test_serve_structured.py
    ("ChatCompletionRequest", {"messages": [*FRANCE, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Paris"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": False,
        "chat_template_kwargs": {"enable_thinking": False}}),
    ("ChatCompletionRequest", {"messages": FRANCE, "response_format": {"type": "json_schema", "json_schema": {
        "name": "out", "schema": {"type": "object"}, "strict": True}}}),
    ("ChatCompletionRequest", {"messages": FRANCE, "response_format": {"type": "json_object"}}),
    ("ResponsesRequest", {"input": "x", "text": {"format": {"type": "json_schema", "name": "out", "strict": True,
                                                            "schema": {"type": "object"}, "description": "d"}}}),
    ("ResponsesRequest", {"input": "x", "text": {"format": {"type": "json_object"}}}),
    ("ResponsesRequest", {"input": [{"role": "user", "content": "x"}, {"type": "reasoning", "summary": []}],
                          "reasoning": {"effort": "none", "summary": "auto"}}),
    ("MessagesRequest", {**MESSAGES, "output_config": {"format": {"type": "json_schema", "schema": {
        "type": "object"}}, "effort": "low"}}),
    ("CompletionRequest", {"prompt": "x", "guided_regex": "[0-9]+"}),
    # test_serve_api_tools.py
    ("MessagesRequest", {**MESSAGES, "tools": [{"name": "get_weather", "description": "The weather in a city",
                                                "input_schema": {"type": "object"}}, {"type": "custom", "name": "g",
                                                                                        "input_schema": {}}],
                         "tool_choice": {"type": "tool", "name": "g", "disable_parallel_tool_use": True},
                         "messages": [*FRANCE, {"role": "assistant", "content": [
                             {"type": "text", "text": "Let me look."},
                             {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "P"}}]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                           "content": [{"type": "text", "text": "18 C"}],
                                                           "is_error": False}, {"type": "text", "text": "And?"}]}]}),
    ("CountTokensRequest", {"messages": FRANCE, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                            "tool_choice": {"type": "any"}}),
    ("ResponsesRequest", {"input": [{"role": "user", "content": "x"},
                                    {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}",
                                     "id": "fc_1", "status": "completed"},
                                    {"type": "function_call_output", "call_id": "call_1", "output": "4"}],
                          "tools": [{"type": "function", "name": "f", "description": "F.",
                                     "parameters": {"type": "object"}, "strict": True}],
                          "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": False}),
    ("ResponsesRequest", {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": None}],
                          "tool_choice": "required"}),
]
REFUSED = [
    ("CompletionRequest", {"prompt": "x", "max_tokens": 0}),  # 0 only with echo
    ("CompletionRequest", {"prompt": "x", "max_completion_tokens": 0, "echo": True}),  # max_tokens alone
    ("CompletionRequest", {"prompt": ["x"] * 65}),
    ("CompletionRequest", {"prompt": ["x", []]}),
    ("ChatCompletionRequest", {"messages": FRANCE, "temperature": "hot"}),
    ("ChatCompletionRequest", {"messages": FRANCE, "chat_template_kwargs": {"\x93\xd7;\x8d": ""}}),
    ("ChatCompletionRequest", {"messages": FRANCE, "chat_template_kwargs": {"add_generation_prompt": False}}),
    ("ChatCompletionRequest", {"messages": FRANCE, "temperature": 10**400}),
    ("ChatCompletionRequest", {"messages": FRANCE, "max_tokens": 0}),
    ("ChatCompletionRequest", {"messages": FRANCE, "n": 17}),
    ("ChatCompletionRequest", {"messages": [{"role": "tool", "content": "x"}]}),
    ("ChatCompletionRequest", {"messages": [{"role": ["user"], "content": "x"}]}),
    ("ChatCompletionRequest", {"messages": FRANCE, "stop": ["a", ""]}),
    ("ChatCompletionRequest", {"messages": []}),
    ("ChatCompletionRequest", {"messages": FRANCE, "tools": [{"type": "function", "function": {}}]}),
    ("ChatCompletionRequest", {"messages": FRANCE, "tools": [{"type": "function", "function": {"name": "f"}}],
                               "tool_choice": "sometimes"}),
    ("ChatCompletionRequest", {"messages": FRANCE, "response_format": {"type": "xml"}}),
    ("ChatCompletionRequest", {"messages": [{"role": "assistant", "content": None}]}),
    ("ChatCompletionRequest", {"messages": [*FRANCE, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}]}]}),
    ("CompletionRequest", {"prompt": 12}),
    ("CompletionRequest", {"prompt": "x", "seed": "1"}),
    # test_serve_anthropic.py
    ("MessagesRequest", {"messages": FRANCE}),
    ("MessagesRequest", {**MESSAGES, "max_tokens": None}),
    ("MessagesRequest", {**MESSAGES, "max_tokens": 8.5}),
    ("MessagesRequest", {**MESSAGES, "max_tokens": 0}),
    ("MessagesRequest", {**MESSAGES, "temperature": 1.5}),
    ("MessagesRequest", {**MESSAGES, "top_p": 0}),
    ("MessagesRequest", {**MESSAGES, "top_k": -1}),
    ("MessagesRequest", {**MESSAGES, "stop_sequences": "."}),
    ("MessagesRequest", {**MESSAGES, "stop_sequences": [".", ""]}),
    ("MessagesRequest", {**MESSAGES, "stop_sequences": ["a"] * (anthropic.MAX_STOP_SEQUENCES + 1)}),
    ("MessagesRequest", {**MESSAGES, "metadata": []}),
    ("MessagesRequest", {**MESSAGES, "metadata": {"user_id": 5}}),
    ("MessagesRequest", {**MESSAGES, "system": [{"type": "image"}]}),
    ("MessagesRequest", {**MESSAGES, "messages": []}),
    ("MessagesRequest", {**MESSAGES, "messages": [{"role": "tool", "content": "x"}]}),
    ("MessagesRequest", {**MESSAGES, "messages": [{"role": "user"}]}),
    ("MessagesRequest", {**MESSAGES, "messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}),
    ("MessagesRequest", {**MESSAGES, "messages": [{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "4"}]}, *FRANCE]}),
    ("MessagesRequest", {**MESSAGES, "tools": [{"name": "f"}]}),
    ("MessagesRequest", {**MESSAGES, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                         "tool_choice": {"type": "sometimes"}}),
    ("MessagesRequest", {**MESSAGES, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                         "tool_choice": {"type": "tool"}}),
    ("MessagesRequest", {**MESSAGES, "thinking": {"type": "enabled"}}),
    ("MessagesRequest", {**MESSAGES, "thinking": {"type": "sometimes"}}),
    ("MessagesRequest", {**MESSAGES, "max_tokens": 64, "thinking": {"type": "enabled", "budget_tokens": 32},
                         "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"}}),
    ("MessagesRequest", {**MESSAGES, "output_config": {"format": {"type": "json_schema"}}}),
    ("MessagesRequest", {**MESSAGES, "output_config": {"format": {"type": "json_object", "schema": {}}}}),
    ("CountTokensRequest", {"model": MODEL}),
    ("CountTokensRequest", {"messages": FRANCE, "tools": [{"name": "f"}]}),
    # test_serve_responses.py
    ("ResponsesRequest", {"model": MODEL}),
    ("ResponsesRequest", {"input": []}),
    ("ResponsesRequest", {"input": 5}),
    ("ResponsesRequest", {"input": [{"role": None, "content": "x"}]}),
    ("ResponsesRequest", {"input": [{"role": "user", "content": {"a": 1}}]}),
    ("ResponsesRequest", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
    ("ResponsesRequest", {"input": [{"type": "computer_call", "action": {}}]}),
    ("ResponsesRequest", {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}),
    ("ResponsesRequest", {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}),
    ("ResponsesRequest", {"input": "x", "instructions": ["be brief"]}),
    ("ResponsesRequest", {"input": "x", "max_output_tokens": 2.5}),
    ("ResponsesRequest", {"input": "x", "temperature": 2.5}),
    ("ResponsesRequest", {"input": "x", "metadata": {"k": 1}}),
    ("ResponsesRequest", {"input": "x", "text": {"verbosity": "huge"}}),
    ("ResponsesRequest", {"input": "x", "metadata": {str(i): "v" for i in range(17)}}),
    ("ResponsesRequest", {"input": "x", "metadata": {"k" * 65: "v"}}),
    ("ResponsesRequest", {"input": "x", "metadata": {"k": "v" * 513}}),
    ("ResponsesRequest", {"input": "x", "previous_response_id": 5}),
    ("ResponsesRequest", {"input": "x", "conversation": "conv_1"}),
    ("ResponsesRequest", {"input": "x", "reasoning": {"effort": "extreme"}}),
    ("ResponsesRequest", {"input": [{"type": "reasoning"}]}),
    ("ChatCompletionRequest", {"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"}),
    ("ResponsesRequest", {"input": "x", "tools": [{"type": "web_search"}]}),
    ("ResponsesRequest", {"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": "sometimes"}),
    ("ResponsesRequest", {"input": "x", "text": {"format": {"type": "yaml"}}}),
    ("ResponsesRequest", {"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}),
    ("ResponsesRequest", {"input": "x", "top_logprobs": 21}),
    ("ResponsesRequest", {"input": "x", "background": True, "store": False}),
    ("ResponsesRequest", {"input": "x", "include": "x"}),
    ("ResponsesRequest", {"input": "x", "truncation": "sometimes"}),
    ("ResponsesRequest", {"input": "x", "parallel_tool_calls": "yes"}),
]


@pytest.fixture(scope="module")
def document():
    import asyncio

    async def fetch():
        app = create_app(ServeConfig())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            response = await client.get("/openapi.json")
        assert response.status_code == 200
        return app, response.json()

    return asyncio.run(fetch())


def validator(doc: dict, name: str):
    return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": doc["components"]})


def test_the_document_is_openapi_3_1_and_covers_every_route(document):
    app, doc = document
    assert doc["openapi"] == "3.1.0"
    routes: dict[str, set[str]] = {}
    for route in app.routes:
        routes.setdefault(route.path.replace("{name:path}", "{name}"), set()).update(
            m.lower() for m in route.methods - {"HEAD"})
    assert routes == {path: set(operations) for path, operations in doc["paths"].items()}
    for name, schema in doc["components"]["schemas"].items():
        jsonschema.Draft202012Validator.check_schema(schema)
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            assert method in ("get", "post", "delete") and operation["responses"], (path, method)
            for response in operation["responses"].values():
                for media in response.get("content", {}).values():
                    ref = media["schema"].get("$ref")
                    assert ref is None or ref.rsplit("/", 1)[1] in doc["components"]["schemas"], ref


def test_a_completions_prompts_are_bounded_by_the_parsers_limit(document):
    listed = document[1]["components"]["schemas"]["CompletionRequest"]["properties"]["prompt"]["oneOf"][2]
    assert listed["maxItems"] == MAX_PROMPTS  # past the concurrent generations too: they run in waves
    assert MAX_PROMPTS > ServeConfig().max_concurrent


@pytest.mark.parametrize("name, body", SENT)
def test_what_the_tests_send_is_documented_and_accepted(document, name, body):
    validator(document[1], name).validate(body)
    PARSERS[name](body)


@pytest.mark.parametrize("name, body", REFUSED)
def test_what_the_parser_refuses_the_document_refuses(document, name, body):
    assert not validator(document[1], name).is_valid(body)
    with pytest.raises(APIError):
        PARSERS[name](body)


def test_the_messages_apis_stop_sequence_bound_is_the_parsers(document):
    # The document repeats it: anthropic.py sits above openapi.py.
    schema = document[1]["components"]["schemas"]["MessagesRequest"]["properties"]["stop_sequences"]["anyOf"][0]
    assert schema["maxItems"] == openapi.ANTHROPIC_MAX_STOP_SEQUENCES == anthropic.MAX_STOP_SEQUENCES


@on_loops("asyncio", "uvloop")
async def test_answers_follow_the_response_schemas(document):
    _, doc = document
    app = create_app(ServeConfig())  # no lifespan: it stays "loading"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        health = await client.get("/health")
        busy = await client.post("/v1/chat/completions", json={"messages": FRANCE})
        bad = await client.post("/v1/chat/completions", json={"messages": FRANCE, "temperature": 10**400})
        models = await client.get("/v1/models")
        missing = await client.get("/v1/models/gpt-4o")
        overloaded = await client.post("/v1/messages", json=MESSAGES)
        uncounted = await client.post("/v1/messages/count_tokens", json={"messages": FRANCE})
        unready = await client.post("/v1/responses", json={"input": "x"})
    validator(doc, "Health").validate(health.json())
    for response in (overloaded, uncounted):
        assert response.status_code == 529
        validator(doc, "AnthropicError").validate(response.json())
    assert unready.status_code == 503
    validator(doc, "Error").validate(unready.json())
    for response in (busy, missing):
        validator(doc, "Error").validate(response.json())
    assert busy.status_code == 503 and missing.status_code == 404
    assert str(bad.status_code) in doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    jsonschema.Draft202012Validator(doc["paths"]["/v1/models"]["get"]["responses"]["200"]["content"]
                                    ["application/json"]["schema"] | {"components": doc["components"]}
                                    ).validate(models.json())


def events(response) -> list[tuple[str, dict]]:
    """A stream's named server-sent events: (name, data)."""
    out = []
    for block in response.text.split("\n\n"):
        if block and not block.startswith(":"):  # not a keep-alive comment
            lines = dict(line.split(": ", 1) for line in block.split("\n"))
            out.append((lines["event"], json.loads(lines["data"])))
    return out


@pytest.mark.model
@needs_model
@pytest.mark.timeout(300)
def test_the_new_apis_answers_and_events_follow_the_schemas():
    """schemathesis checks the JSON answers; the streamed events' data it cannot read."""
    with ServerProcess("--log-level", "warning") as server, \
            httpx.Client(base_url=server.url, timeout=120) as http:
        doc = http.get("/openapi.json").json()
        paths = doc["paths"]
        for path, body, answer in (("/v1/messages", {**MESSAGES, "stop_sequences": ["Paris"]}, "Message"),
                                   ("/v1/responses", {"input": FRANCE, "max_output_tokens": 3}, "Response")):
            validator(doc, answer).validate(http.post(path, json=body).json())
            streamed = http.post(path, json={**body, "stream": True})
            assert streamed.headers["content-type"].startswith("text/event-stream")
            stream_schema = paths[path]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
            data = validator(doc, stream_schema["properties"]["data"]["contentSchema"]["$ref"].rsplit("/", 1)[1])
            received = events(streamed)
            assert len(received) > 5
            for name, fields in received:
                assert name == fields["type"]
                data.validate(fields)
        counted = http.post("/v1/messages/count_tokens", json={"messages": FRANCE})
        jsonschema.Draft202012Validator(paths["/v1/messages/count_tokens"]["post"]["responses"]["200"]["content"]
                                        ["application/json"]["schema"]).validate(counted.json())
        refused = http.post("/v1/messages", json={**MESSAGES, "messages": [*FRANCE, {"role": "assistant",
                                                                                       "content": "The"}]})
        assert refused.status_code == 400
        validator(doc, "AnthropicError").validate(refused.json())
        assert "Traceback" not in server.output()
