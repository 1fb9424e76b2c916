"""Request parsing (emlx_async.serve.protocol) is total: any JSON value gives a
request or an APIError naming the field, whose body encodes as the app sends it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
from hypothesis import given, settings
from hypothesis import strategies as st
from support.helpers import on_loops
from support.serve_bodies import FIELDS, bodies, json_values
from starlette.responses import JSONResponse

from emlx_async.serve.protocol import APIError, parse_request

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def refused(body, chat=True, **limits) -> APIError:
    with pytest.raises(APIError) as info:
        parse_request(body, chat=chat, **limits)
    error = info.value
    assert error.status == 400
    JSONResponse(error.body()).render(error.body())  # what the app sends: UTF-8 JSON
    return error


@pytest.mark.parametrize("body, param", [
    ({"messages": FRANCE, "temperature": 10**400}, "temperature"),
    ({"messages": FRANCE, "top_p": -10**400}, "top_p"),
    ({"messages": FRANCE, "temperature": 2**1024}, "temperature"),
    ({"messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": {"a": 1}, "content": "x"}]}, "messages[0].role"),
    ({"messages": FRANCE, "model": "x\ud800"}, "model"),
    ({"messages": [{"role": "user", "content": "a\udfffb"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}, "messages[0].content[0].text"),
    ({"messages": FRANCE, "stop": ["\ud800"]}, "stop"),
    ({"messages": FRANCE, "top_k": 10**400}, "top_k"),
    ({"messages": FRANCE, "seed": 10**400}, "seed"),
    ({"messages": FRANCE, "n": [1]}, "n"),
    ({"messages": FRANCE, "best_of": {"a": 1}}, "best_of"),
    ({"messages": FRANCE, "presence_penalty": "0"}, "presence_penalty"),
    ({"messages": FRANCE, "repetition_penalty": 1e-39}, "repetition_penalty"),  # logits / it: inf, NaN logprobs
    ({"messages": FRANCE, "repetition_penalty": 10**400}, "repetition_penalty"),
    ({"messages": FRANCE, "logprobs": True, "top_logprobs": 10**400}, "top_logprobs"),
    # Fields read and ignored are still checked, as OpenAI checks them.
    ({"messages": FRANCE, "user": 5}, "user"),
    ({"messages": FRANCE, "service_tier": "\ud800"}, "service_tier"),
    ({"messages": FRANCE, "store": "yes"}, "store"),
    ({"messages": FRANCE, "metadata": {"k": 1}}, "metadata"),
    ({"messages": FRANCE, "metadata": ["k"]}, "metadata"),
])
def test_hostile_fields_are_400s_naming_the_field(body, param):
    assert refused(body).param == param


@pytest.mark.parametrize("prompt, param", [
    (["a", None], "prompt[1]"),          # a list of prompts names the one that is neither
    (["a", {}], "prompt[1]"),
    ([[1, 2], []], "prompt[1]"),
    ([1, 2.5], "prompt[1]"),             # token ids name the one that is not an id
    ([1, "a"], "prompt[1]"),
    ([None], "prompt"),
    (["a", 5], "prompt[1]"),             # a list of prompts: each a string or a list of ids
    (["a", True], "prompt[1]"),
    ([[1], 2], "prompt[1]"),
])
def test_a_prompt_list_names_its_bad_item(prompt, param):
    assert refused({"prompt": prompt}, chat=False).param == param


def test_lone_surrogate_in_a_prompt_and_in_an_echo():
    assert refused({"prompt": "\ud800"}, chat=False).param == "prompt"
    error = APIError(400, "the model 'x\ud800' does not exist")
    assert "\\ud800" in error.message
    JSONResponse(error.body()).render(error.body())


def test_echoes_are_short_and_never_recurse():
    deep: list = []
    for _ in range(5000):  # repr() of this raises RecursionError
        deep = [deep]
    error = refused({"messages": FRANCE, "temperature": deep})
    assert error.param == "temperature" and len(error.message) < 200
    assert len(refused({"messages": FRANCE, "seed": "9" * 100_000}).message) < 200


def test_message_count_is_bounded_before_messages_are_read():
    many = [{"role": "user", "content": "x"}] * 11
    assert refused({"messages": many}, max_messages=10).code == "too_many_messages"
    assert len(parse_request({"messages": many[:10]}, chat=True, max_messages=10).messages) == 10
    # The count is checked first: an 11th message that is itself bad does not matter.
    assert refused({"messages": many[:10] + [7]}, max_messages=10).code == "too_many_messages"


def test_every_apis_turns_are_bounded_by_max_messages():
    """--max-messages holds on the Messages and Responses APIs and count_tokens too (30,000
    turns were encoded there: ~10 s each, on the encoder threads every request shares)."""
    from emlx_async.serve import anthropic, responses

    many = [{"role": "user", "content": "x"}] * 11
    for parse, body, param in ((anthropic.parse_prompt, {"messages": many}, "messages"),
                               (anthropic.parse_request, {"messages": many, "max_tokens": 5}, "messages"),
                               (responses.parse_request, {"input": many}, "input")):
        with pytest.raises(APIError) as refusal:
            parse(body, max_messages=10)
        assert (refusal.value.param, refusal.value.code) == (param, "too_many_messages")
        assert f"at most 10 {param} per request, got 11" in refusal.value.message
        parse({**body, next(iter(body)): many[:10]}, max_messages=10)  # ten are fine
    # Reasoning items sent back (left out of the prompt) are not counted.
    reasoning = [{"type": "reasoning", "id": f"rs_{i}", "summary": []} for i in range(2)]
    responses.parse_request({"input": [*many[:10], *reasoning]}, max_messages=10)


def test_a_stop_string_is_bounded_in_length_on_both_apis():
    """The text that may start a stop string is held back and compared at every token, so
    a 200,000-character stop string made each token cost tens of milliseconds on the loop."""
    from emlx_async.serve import anthropic
    from emlx_async.serve.protocol import MAX_STOP_CHARS

    long = "z" * (MAX_STOP_CHARS + 1)
    for stop, param in ((long, "stop[0]"), (["ok", long], "stop[1]")):
        error = refused({"messages": FRANCE, "stop": stop})
        assert error.param == param and f"at most {MAX_STOP_CHARS} characters" in error.message
    assert parse_request({"messages": FRANCE, "stop": long[1:]}, chat=True).stop == [long[1:]]
    with pytest.raises(APIError) as refusal:
        anthropic.parse_request({"messages": FRANCE, "max_tokens": 5, "stop_sequences": [long]})
    assert refusal.value.param == "stop_sequences[0]"


@on_loops("asyncio")
async def test_the_configured_max_messages_reaches_every_route():
    import httpx

    from emlx_async.serve import ServeConfig, create_app
    from support.helpers import ScriptedEngine

    app = create_app(ServeConfig(max_messages=2))
    service = app.state.service
    service.engine, service.status = ScriptedEngine(None, "{{ messages }}", ["ok"]), "ready"
    three = [{"role": "user", "content": "x"}] * 3
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        for path, body in (("/v1/chat/completions", {"messages": three}),
                           ("/v1/messages", {"messages": three, "max_tokens": 5}),
                           ("/v1/messages/count_tokens", {"messages": three}),
                           ("/v1/responses", {"input": three})):
            reply = await http.post(path, json={"model": "m", **body})
            assert reply.status_code == 400 and "at most 2" in reply.text, (path, reply.text)


@settings(max_examples=400, deadline=None)
@given(body=bodies | json_values, chat=st.booleans())
def test_any_json_gives_a_request_or_a_400_naming_a_field(body, chat):
    try:
        request = parse_request(body, chat=chat)
    except APIError as error:
        assert error.status == 400 and error.message
        assert error.param is None or error.param.split("[")[0].split(".")[0] in FIELDS
        JSONResponse(error.body()).render(error.body())
        return
    # Accepted: every text field is encodable, every number in range.
    json.dumps([request.model, request.messages, request.prompt, request.stop], ensure_ascii=False).encode("utf-8")
    assert 0 <= request.temperature <= 2 and 0 < request.top_p <= 1


def test_completion_logprobs_offsets_follow_characters_split_across_tokens():
    from emlx_async.serve.protocol import CompletionLogprobs, logprob_entry

    e_acute = "é".encode()  # two bytes, written by two tokens here
    entries = [logprob_entry(b"caf", -0.5, [(b"caf", -0.5), (b"tea", -1.5)]),
               logprob_entry(e_acute[:1], -0.25, []), logprob_entry(e_acute[1:], -0.125, []),
               logprob_entry(b"!", -1.0, [(b"?", -0.5)])]
    legacy = CompletionLogprobs()
    first, rest = legacy.body(entries[:2]), legacy.body(entries[2:])  # two chunks of one stream
    assert first["text_offset"] + rest["text_offset"] == [0, 3, 3, 4]  # "café!": é starts at 3
    # Part of a character: named by its bytes, as OpenAI's (not U+FFFD, which two would share).
    assert first["tokens"] == ["caf", "bytes:\\xc3"] and first["token_logprobs"] == [-0.5, -0.25]
    assert first["top_logprobs"][0] == {"caf": -0.5, "tea": -1.5}
    assert rest["top_logprobs"] == [{"bytes:\\xa9": -0.125}, {"?": -0.5, "!": -1.0}]  # the chosen one among them
    split = CompletionLogprobs().body([logprob_entry(b"\xe2\x80", -0.5, [(b"\xe2", -0.75), (b"\xe2\x80", -0.5)])])
    assert split["tokens"] == ["bytes:\\xe2\\x80"]
    assert split["top_logprobs"] == [{"bytes:\\xe2": -0.75, "bytes:\\xe2\\x80": -0.5}]  # both kept
    assert CompletionLogprobs().body(entries) == {key: first[key] + rest[key] for key in first}
    assert legacy.body(None) is None


def test_completion_logprobs_is_the_legacy_number():
    parsed = parse_request({"prompt": "x", "logprobs": 2}, chat=False)
    assert parsed.logprobs and parsed.top_logprobs == 2
    assert parse_request({"prompt": "x", "logprobs": 0}, chat=False).logprobs
    assert not parse_request({"prompt": "x"}, chat=False).logprobs
    assert refused({"prompt": "x", "logprobs": 6}, chat=False).param == "logprobs"
    assert refused({"prompt": "x", "logprobs": True}, chat=False).param == "logprobs"
    assert refused({"prompt": "x", "top_logprobs": 1}, chat=False).param == "top_logprobs"


def test_min_tokens_past_the_limit_names_the_limit_the_client_sent():
    for limit in ("max_tokens", "max_completion_tokens"):
        error = refused({"messages": FRANCE, limit: 2, "min_tokens": 3})
        assert error.param == "min_tokens" and f"exceeds {limit} (2)" in error.message, error.message
