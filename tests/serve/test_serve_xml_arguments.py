"""Qwen3-Coder's XML calls stream their arguments as JSON (serve/xml_arguments.py, driven by
serve/tools.py's OutputSplitter): what goes out while the model writes is always the start of
the JSON mlx-lm's parser makes of the whole block, and the pieces joined are the call's final
arguments, however the text is cut."""

from __future__ import annotations

import importlib
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("starlette")
from emlx_async.serve.tools import (CallArguments, CallEnd, CallStart, Content, OutputSplitter,  # noqa: E402
                                    ToolCallFormat)

PARSER = importlib.import_module("mlx_lm.tool_parsers.qwen3_coder")
QWEN3_CODER = ToolCallFormat(PARSER.tool_call_start, PARSER.tool_call_end, PARSER.parse_tool_call, "qwen3_coder")
PROPERTIES = {"city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "string", "enum": ["c", "f"]},
              "hourly": {"type": "boolean"}, "options": {"type": "object"}, "ratio": {"type": "number"},
              "untyped": {}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                                                                                  "properties": PROPERTIES}}}


def _block(parameters: list[tuple[str, str]], function: str = "get_weather") -> str:
    body = "".join(f"<parameter={name}>\n{value}\n</parameter>\n" for name, value in parameters)
    return f"<tool_call>\n<function={function}>\n{body}</function>\n</tool_call>"


def _run(text: str, size: int) -> tuple[list, OutputSplitter]:
    splitter = OutputSplitter(tool_format=QWEN3_CODER, tools=[WEATHER])
    parts = []
    for i in range(0, len(text), size):
        parts += splitter.feed(text[i:i + size]).parts
    return parts + splitter.flush().parts, splitter


def _sent(parts: list) -> str:
    return "".join(p.text for p in parts if isinstance(p, CallArguments))


def _parsed(text: str) -> dict:
    return PARSER.parse_tool_call(text.removeprefix("Hi. ").removeprefix("<tool_call>").removesuffix("</tool_call>")
                                  .strip(), [WEATHER])["arguments"]


def test_each_value_goes_out_as_the_parser_types_it():
    text = _block([("city", 'Paris, "la Ville Lumière"\n\\n {x}'), ("days", "3"), ("units", "null"),
                   ("hourly", "True"), ("options", '{"a": [1, 2]}'), ("ratio", "2.50"),
                   ("untyped", "</para and <parameter=x>"), ("other", "NULLs")])
    for size in (1, 2, 5, len(text)):
        parts, splitter = _run(text, size)
        [call] = splitter.tool_calls
        assert call["function"]["arguments"] == _sent(parts) == json.dumps(_parsed(text), ensure_ascii=False)
        assert splitter.finish_reason("stop") == "tool_calls" and parts[-1].valid


def test_a_string_streams_as_it_is_written_and_other_values_at_their_end():
    text = _block([("city", "Paris"), ("days", "12")])
    splitter = OutputSplitter(tool_format=QWEN3_CODER, tools=[WEATHER])
    sent_at = {}  # what had been sent when the text reached each length
    sent = ""
    for end in range(1, len(text) + 1):
        sent += _sent(splitter.feed(text[end - 1]).parts)
        sent_at[end] = sent
    at = text.index
    assert sent_at[at("Par") + 3] == '{"city": "Par'  # before its </parameter>
    assert sent_at[at("\n</parameter>")] == '{"city": "Paris'  # the newline before </parameter> may be the end
    assert sent_at[at("12") + 2] == '{"city": "Paris", "days": '  # an integer waits for its end
    assert sent_at[at("12") + 2 + len("\n</parameter>")] == '{"city": "Paris", "days": 12'
    assert sent + _sent(splitter.flush().parts) == '{"city": "Paris", "days": 12}'


def test_a_value_that_may_be_null_waits():
    for value, want in (("null", "null"), ("Null", "null"), ("nul", '"nul"'), ("nullable", '"nullable"')):
        text = _block([("city", value)])
        splitter = OutputSplitter(tool_format=QWEN3_CODER, tools=[WEATHER])
        close = text.index("</parameter>")
        early = "".join(_sent(splitter.feed(ch).parts) for ch in text[:close])
        assert early == '{"city": ' + (want[:-1] if value == "nullable" else "")
        rest = _sent(splitter.feed(text[close:]).parts + splitter.flush().parts)
        assert early + rest == '{"city": ' + want + "}"


def test_a_parameter_named_twice_keeps_what_was_sent_and_is_not_valid():
    """The parser keeps the last value at the first one's place, which the text sent cannot
    become: the call keeps what was sent, as a cut JSON call does, and is not "tool_calls"."""
    text = _block([("city", "Paris"), ("city", "Rome")])
    parts, splitter = _run(text, 3)
    assert [type(p) for p in parts][0] is CallStart and not parts[-1].valid
    assert splitter.tool_calls[0]["function"]["arguments"] == _sent(parts) == '{"city": "Paris"'
    assert splitter.finish_reason("stop") == "stop"


def test_a_call_cut_short_keeps_what_was_sent():
    text = _block([("city", "Paris"), ("days", "3")])
    parts, splitter = _run(text[:text.index("3")], 4)
    assert not parts[-1].valid and splitter.tool_calls[0]["function"]["arguments"] == '{"city": "Paris", "days": '
    assert splitter.finish_reason("length") == "length"


def test_a_value_the_parser_cannot_convert_stops_the_stream():
    parts, splitter = _run(_block([("days", "three"), ("city", "Paris")]), 2)
    assert not parts[-1].valid and splitter.tool_calls[0]["function"]["arguments"] == '{"days": '


def test_a_long_value_streams_in_linear_time():
    text = _block([("city", "x" * 200_000 + "\n" + "</par" * 2000)])
    start = time.perf_counter()
    parts, splitter = _run(text, 4)
    assert time.perf_counter() - start < 5.0  # quadratic: minutes
    assert splitter.tool_calls[0]["function"]["arguments"] == json.dumps(_parsed(text))
    assert len([p for p in parts if isinstance(p, CallArguments)]) > 50_000  # streamed, a piece per feed


_names = st.sampled_from(["city", "days", "units", "hourly", "options", "ratio", "untyped", "other", "a b", ""])
_values = st.one_of(
    st.lists(st.sampled_from(list("ab \n<>/=\"\\{}[]0123456789.-") + ["</parameter", "<parameter=", "null", "é"]),
             max_size=12).map("".join),
    st.sampled_from(["3", "-2.5", "true", "False", "null", "NULL", '{"k": [1]}', "[1, 2]", "", "\n", "\n\n"]))
_junk = st.sampled_from(["", "\n", " ", "text", "<parameter=", "</parameter>", "<parameter=days>4"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_names, _values, _junk), max_size=4), st.integers(1, 9), st.booleans())
def test_whatever_the_model_writes_what_was_sent_is_the_parse_or_the_call_is_not_valid(items, size, cut):
    """The contract on any text: the pieces joined are the call's arguments, and a valid
    call's arguments are exactly the JSON of mlx-lm's parse of the whole block; a parse that
    gives arguments with parameters each named once and written as the format says is valid."""
    body = "".join(f"<parameter={name}>\n{value}\n</parameter>\n{junk}" for name, value, junk in items)
    text = f"Hi. <tool_call>\n<function=get_weather>\n{body}</function>\n</tool_call>"
    if cut:
        text = text[:len(text) * 2 // 3]
    parts, splitter = _run(text, size)
    _, whole = _run(text, len(text))
    calls = splitter.tool_calls
    assert [c["function"]["arguments"] for c in calls] == [c["function"]["arguments"] for c in whole.tool_calls]
    if not calls:
        assert "".join(p.text for p in parts if isinstance(p, Content)) == text
        return
    [call] = calls
    assert call["function"]["arguments"] == _sent(parts)
    end = next(p for p in parts if isinstance(p, CallEnd))
    try:
        want = json.dumps(_parsed(text), ensure_ascii=False)
    except Exception:  # noqa: BLE001 - the parser refuses the block
        want = None
    if end.valid:
        assert call["function"]["arguments"] == want
    names = [name for name, _, _ in items]
    plain = all(junk in ("", "\n", " ", "text") for _, _, junk in items) and all(
        "</parameter" not in v and "<parameter=" not in v for _, v, _ in items)
    if want is not None and not cut and plain and len(set(names)) == len(names) and "" not in names \
            and "a b" not in names:
        assert end.valid, text


def test_other_whole_block_formats_have_no_preview():
    for name in ("minimax_m2", "glm47", "kimi_k2", "pythonic"):
        module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
        call_format = ToolCallFormat(module.tool_call_start, module.tool_call_end, module.parse_tool_call, name)
        assert call_format.preview("get_weather", [WEATHER]) is None
    assert QWEN3_CODER.preview("get_weather", [WEATHER]) is not None
