"""/openapi.json: a valid OpenAPI 3.1 document whose request schemas agree with
the parser (the requests the tests send are documented and accepted, what the
parser refuses the schemas refuse), and whose response schemas the app's
answers follow. `make fuzz` runs schemathesis against a live server with it."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")
from emlx_async.serve import ServeConfig, create_app  # noqa: E402
from emlx_async.serve.protocol import APIError, parse_request  # noqa: E402

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
# Requests the service tests send (test_serve.py, test_serve_trio.py, test_serve_connections.py).
SENT = [
    ("ChatCompletionRequest", {"model": "SmolLM2-135M-Instruct", "messages": FRANCE, "max_tokens": 8,
                               "temperature": 0}),
    ("ChatCompletionRequest", {"messages": FRANCE, "max_tokens": 8, "temperature": 0, "logprobs": True,
                               "top_logprobs": 3, "stream": True, "stream_options": {"include_usage": True}}),
    ("ChatCompletionRequest", {"messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                               "max_completion_tokens": 2, "stop": ["a", "b"], "seed": 7, "top_p": 0.9}),
    ("CompletionRequest", {"model": "SmolLM2-135M-Instruct", "prompt": "The capital of France is",
                           "max_tokens": 4, "temperature": 0, "stop": "."}),
    ("CompletionRequest", {"prompt": [1, 2, 3], "max_tokens": 1, "top_k": 40}),
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
    ("CompletionRequest", {"prompt": "x", "guided_regex": "[0-9]+"}),
]
REFUSED = [
    ("ChatCompletionRequest", {"messages": FRANCE, "temperature": "hot"}),
    ("ChatCompletionRequest", {"messages": FRANCE, "temperature": 10**400}),
    ("ChatCompletionRequest", {"messages": FRANCE, "max_tokens": 0}),
    ("ChatCompletionRequest", {"messages": FRANCE, "n": 2}),
    ("ChatCompletionRequest", {"messages": [{"role": "tool", "content": "x"}]}),
    ("ChatCompletionRequest", {"messages": [{"role": ["user"], "content": "x"}]}),
    ("ChatCompletionRequest", {"messages": FRANCE, "stop": ["a", ""]}),
    ("ChatCompletionRequest", {"messages": []}),
    ("ChatCompletionRequest", {"messages": FRANCE, "tools": [{"type": "function", "function": {}}]}),
    ("ChatCompletionRequest", {"messages": FRANCE, "tools": [{"type": "function", "function": {"name": "f"}}],
                               "tool_choice": "sometimes"}),
    ("ChatCompletionRequest", {"messages": FRANCE, "response_format": {"type": "xml"}}),
    ("ChatCompletionRequest", {"messages": [{"role": "assistant", "content": None}]}),
    ("CompletionRequest", {"prompt": 12}),
    ("CompletionRequest", {"prompt": "x", "seed": "1"}),
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
    routes = {route.path.replace("{name:path}", "{name}") for route in app.routes}
    assert routes == set(doc["paths"])
    for name, schema in doc["components"]["schemas"].items():
        jsonschema.Draft202012Validator.check_schema(schema)
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            assert method in ("get", "post") and operation["responses"], (path, method)
            for response in operation["responses"].values():
                for media in response.get("content", {}).values():
                    ref = media["schema"].get("$ref")
                    assert ref is None or ref.rsplit("/", 1)[1] in doc["components"]["schemas"], ref


@pytest.mark.parametrize("name, body", SENT)
def test_what_the_tests_send_is_documented_and_accepted(document, name, body):
    validator(document[1], name).validate(body)
    parse_request(body, chat=name == "ChatCompletionRequest")


@pytest.mark.parametrize("name, body", REFUSED)
def test_what_the_parser_refuses_the_document_refuses(document, name, body):
    assert not validator(document[1], name).is_valid(body)
    with pytest.raises(APIError):
        parse_request(body, chat=name == "ChatCompletionRequest")


async def test_answers_follow_the_response_schemas(document):
    _, doc = document
    app = create_app(ServeConfig())  # no lifespan: it stays "loading"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        health = await client.get("/health")
        busy = await client.post("/v1/chat/completions", json={"messages": FRANCE})
        bad = await client.post("/v1/chat/completions", json={"messages": FRANCE, "temperature": 10**400})
        models = await client.get("/v1/models")
        missing = await client.get("/v1/models/gpt-4o")
    validator(doc, "Health").validate(health.json())
    for response in (busy, missing):
        validator(doc, "Error").validate(response.json())
    assert busy.status_code == 503 and missing.status_code == 404
    assert str(bad.status_code) in doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    jsonschema.Draft202012Validator(doc["paths"]["/v1/models"]["get"]["responses"]["200"]["content"]
                                    ["application/json"]["schema"] | {"components": doc["components"]}
                                    ).validate(models.json())
