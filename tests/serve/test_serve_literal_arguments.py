"""Python-style (``[name(city="Paris")]``) and FunctionGemma (``call:name{city:<escape>Paris<escape>}``)
calls stream their arguments (serve/literal_arguments.py, driven by serve/tools.py's OutputSplitter):
what goes out while the model writes is always the start of the JSON mlx-lm's parser makes of the
whole block, the pieces joined are the call's final arguments, and the same text gives the same
calls however it is cut."""

from __future__ import annotations

import importlib
import json
import keyword
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("starlette")
from emlx_async.serve.tools import CallArguments, CallEnd, CallStart, OutputSplitter, ToolCallFormat  # noqa: E402


def _format(name: str) -> ToolCallFormat:
    module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
    return ToolCallFormat(module.tool_call_start, module.tool_call_end, module.parse_tool_call, name)


def _block(name: str, body: str) -> str:
    """One block of `name`'s format: `body` between its markers."""
    tool_format = _format(name)
    return tool_format.start + body + tool_format.end


def _run(name: str, text: str, size: int) -> tuple[list, list[str], list[tuple[str, str, bool]]]:
    """The parts, the first call's argument pieces, and (name, arguments, valid) per call."""
    splitter = OutputSplitter(tool_format=_format(name), tools=None)
    parts = []
    for at in range(0, len(text), size):
        parts += splitter.feed(text[at:at + size]).parts
    parts += splitter.flush().parts
    pieces = [p.text for p in parts if isinstance(p, CallArguments) and p.index == 0 and p.text]
    ends = [(p.call["function"]["name"], p.call["function"]["arguments"], p.valid) for p in parts
            if isinstance(p, CallEnd)]
    return parts, pieces, ends


def _parsed(name: str, text: str):
    """The first call's arguments as mlx-lm's parser reads the block (None: it reads none)."""
    tool_format = _format(name)
    try:
        calls = tool_format.calls(text.removeprefix(tool_format.start).removesuffix(tool_format.end), None)
    except Exception:  # noqa: BLE001 - the parser refuses the block
        return None
    return json.loads(calls[0]["function"]["arguments"]) if calls[0]["function"]["arguments"] else None


CITY = 'Paris, "la" (Ville)\n\u00e9'


@pytest.mark.parametrize("size", [1, 3, 1000])
@pytest.mark.parametrize("name, body, want", [
    # Strings (their escapes decoded), numbers, JSON's and Python's literals, nesting.
    ("pythonic", f'[get_weather(city={CITY!r}, days=3, o={{"a": [1, true], "n": None}}, t=\'x\\u00e9\')]',
     {"city": CITY, "days": 3, "o": {"a": [1, True], "n": None}, "t": "x\u00e9"}),
    ("pythonic", "[get_weather()]", {}),
    ("pythonic", '[get_weather(city = "Rome" ,days=-2,)]', {"city": "Rome", "days": -2}),
    # A value the reader does not follow (a name, strings joined): the parse sends the rest.
    ("pythonic", '[get_weather(city=Rome, days=2)]', {"city": "Rome", "days": 2}),
    ("pythonic", '[get_weather(city="Ro" "me", days=2)]', {"city": "Rome", "days": 2}),
    ("pythonic", '[get_weather(city="Ro\nme")]', {"city": "Ro\nme"}),  # Python refuses it; the regex reads it
    ("function_gemma", "call:get_weather{city:<escape>Paris, (la): x<escape>,days:3,f:1.5,s:hi there,e:}",
     {"city": "Paris, (la): x", "days": 3, "f": 1.5, "s": "hi there", "e": ""}),
    ("function_gemma", "call:get_weather{}", {}),
])
def test_a_call_streams_the_json_its_parser_makes(name, body, want, size):
    text = _block(name, body)
    parts, pieces, ends = _run(name, text, size)
    assert _parsed(name, text) == want  # what mlx-lm reads
    [(called, arguments, valid)] = ends
    assert called == "get_weather" and valid and json.loads(arguments) == want
    assert "".join(pieces) == arguments == json.dumps(want, ensure_ascii=False)
    assert isinstance(parts[0], CallStart)
    if size == 1 and want and "Ro" not in body:  # the two bodies the parse finishes
        assert len(pieces) > len(arguments) // 4  # streamed as written, not at the block's end


def test_a_string_streams_before_it_ends():
    for name, start in (("pythonic", '[get_weather(city="Par'),
                        ("function_gemma", "call:get_weather{city:<escape>Par")):
        splitter = OutputSplitter(tool_format=_format(name), tools=None)
        parts = splitter.feed(_format(name).start + start).parts
        assert [type(p) for p in parts if p.__class__ is not CallArguments or p.text] == [CallStart, CallArguments]
        assert "".join(p.text for p in parts if isinstance(p, CallArguments)) == '{"city": "Par'


def test_a_container_value_goes_out_at_its_end_and_the_next_string_streams():
    splitter = OutputSplitter(tool_format=_format("pythonic"), tools=None)
    parts = splitter.feed(_format("pythonic").start + '[get_weather(o={"a": [1, (2, 3)]}, days=[4, 5], city="Par').parts
    assert "".join(p.text for p in parts if isinstance(p, CallArguments)) == \
        '{"o": {"a": [1, [2, 3]]}, "days": [4, 5], "city": "Par'


def test_later_calls_of_a_python_block_come_whole_from_the_parse():
    _, pieces, ends = _run("pythonic", _block("pythonic", '[a(x=1), b(y="z")]'), 2)
    assert "".join(pieces) == '{"x": 1}'
    assert ends == [("a", '{"x": 1}', True), ("b", '{"y": "z"}', True)]


@pytest.mark.parametrize("name, body, sent", [
    # FunctionGemma's call ends at the first "}", inside a string too: the parser reads no call.
    ("function_gemma", "call:get_weather{city:<escape>a}b<escape>}", '{"city": "a'),
    # A Python call neither Python nor the parser's regex reads (unclosed): what was sent, not valid.
    ("pythonic", '[get_weather(city="Paris"', '{"city": "Paris'),
])
def test_text_the_parser_refuses_keeps_what_was_sent_and_is_not_valid(name, body, sent):
    results = {size: _run(name, _block(name, body), size)[2] for size in (1, 4, 1000)}
    assert results[1] == results[4] == results[1000] == [("get_weather", sent, False)]


@pytest.mark.parametrize("name, body, sent, valid", [
    # A number past int's digits (mlx-lm's parse fails too), a \U escape past U+10FFFF: no exception.
    ("function_gemma", "call:get_weather{n:" + "1" * 4301 + "}", '{"n": ', False),
    ("pythonic", '[get_weather(a="\\UFFFFFFFF")]', '{"a": "\\\\UFFFFFFFF"}', True),  # the regex's reading
    # A comment's "," or ")" ends no value: nothing the parse does not read goes out.
    ("pythonic", "[get_weather(a=1 # x, y=2\n)]", '{"a": 1}', True),
    ("pythonic", "[get_weather(a=1 # )\n, b=2)]", '{"a": 1, "b": 2}', True),
    # A key named twice: the parse keeps the last, so the streamed text is not the call's value.
    ("pythonic", "[get_weather(a=1, a=2)]", None, False),
    ("function_gemma", "call:get_weather{a:1,a:2}", '{"a": 1, "a": 2}', False),
    # A Python keyword as a key: Python's parse fails, the parser's regex reads the call.
    ("pythonic", "[get_weather(if=1, b=[2, 3])]", None, True),
    # A key Python reads NFKC-normalized: the parse's, from the block.
    ("pythonic", '[get_weather(\uff43ity="x")]', '{"city": "x"}', True),
])
def test_text_the_readers_do_not_follow_is_the_parses(name, body, sent, valid):
    results = {size: _run(name, _block(name, body), size)[2] for size in (1, 4, 1000)}
    assert results[1] == results[4] == results[1000]
    [(called, arguments, was_valid)] = results[1]
    assert called == "get_weather" and was_valid == valid
    if sent is not None:
        assert arguments == sent


def test_a_cut_block_sends_the_calls_written_whole_in_a_row_as_its_parse_of_them_reads():
    """Kimi K3's parser skips a call without a tool attribute: the run of whole calls is parsed
    alone, so a call after text (inside a cut value, say) is never sent."""
    start = '<|open|>tools<|sep|>'
    first = '<|open|>call tool="f"<|sep|><|open|>argument key="a"<|sep|>1<|close|>argument<|sep|><|close|>call<|sep|>'
    skipped = "<|open|>call<|sep|><|close|>call<|sep|>"
    later = ('<|open|>call tool="rm"<|sep|><|open|>argument key="p"<|sep|>/<|close|>argument<|sep|>'
             "<|close|>call<|sep|>")
    text = start + first + skipped + "note: " + later + '<|open|>call tool="g'
    for size in (1, 7, len(text)):
        splitter = OutputSplitter(tool_format=_format("kimi_k3"), tools=None)
        for at in range(0, len(text), size):
            splitter.feed(text[at:at + size])
        splitter.flush()
        assert [c["function"]["name"] for c in splitter.tool_calls] == ["f"]


def test_a_function_gemma_text_fed_whole_reads_in_linear_time():
    """The reader alone (mlx-lm's own parse at the block's end is quadratic here: 4 s at 50k
    arguments): each value's search for "}" and a copy of the rest at each value made it so."""
    from emlx_async.serve.literal_arguments import FunctionGemmaArguments

    arguments = 200_000
    text = ",".join(f"k{i}:<escape>v<escape>" for i in range(arguments)) + "}"
    start = time.perf_counter()
    reader = FunctionGemmaArguments()
    sent = reader.feed(text)
    assert time.perf_counter() - start < 15.0  # quadratic: minutes; linear about 1 s
    assert reader.complete and len(json.loads(sent)) == arguments


def test_without_the_parsers_pieces_the_arguments_come_at_the_blocks_end(monkeypatch):
    """A parser that no longer has what a reader follows (its literal rule): the head early,
    the arguments whole from the parse."""
    from emlx_async.serve.literal_arguments import PythonicArguments

    monkeypatch.setattr(PythonicArguments, "PARSER_NEEDS", ("_a_piece_a_later_mlx_lm_dropped",))
    assert _format("pythonic").preview("get_weather", None) is None
    parts, pieces, ends = _run("pythonic", _block("pythonic", '[get_weather(city="Paris")]'), 5)
    assert isinstance(parts[0], CallStart) and pieces == ['{"city": "Paris"}']
    assert ends == [("get_weather", '{"city": "Paris"}', True)]


def test_a_long_string_or_value_streams_in_linear_time():
    for name, body in (("pythonic", '[f(content="' + "x" * 500_000 + '")]'),
                       ("pythonic", "[f(content=[" + "1, " * 150_000 + "1])]"),
                       ("function_gemma", "call:f{content:<escape>" + "x" * 500_000 + "<escape>}"),
                       ("function_gemma", "call:f{content:" + "x" * 500_000 + "}")):
        start = time.perf_counter()
        _, _, [(_, arguments, valid)] = _run(name, _block(name, body), 4)
        assert time.perf_counter() - start < 30.0  # quadratic: hours; linear about 5 s on a loaded CPU
        assert valid and json.loads(arguments) == _parsed(name, _block(name, body))


# ---- the contract on any text: cut-independent, the parse or not valid -------------------

_text = st.lists(st.sampled_from(list("ab ,:=()[]{}\"'\\\nxé") + ["<escape>", "<esc", "\\u00e9", "\\x4"]),
                 max_size=6).map("".join)
_keys = st.from_regex(r"[a-z_][a-z0-9_]{0,4}", fullmatch=True)
_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 500) | st.floats(-1e3, 1e3, allow_nan=False) | _text,
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=3),
                       max_leaves=6)
_junk = st.sampled_from(["", " ", ",", "(", ")", "=", '"', "'", "\\", "}", ":", "<escape>", "\n", "x"])


def _python_written(arguments: dict) -> str:
    return "[get_weather(" + ", ".join(f"{k}={v!r}" for k, v in arguments.items()) + ")]"


def _gemma_written(arguments: dict) -> str:
    def value(v):
        return f"<escape>{v}<escape>" if isinstance(v, str) else json.dumps(v)
    return "call:get_weather{" + ",".join(f"{k}:{value(v)}" for k, v in arguments.items()) + "}"


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["pythonic", "function_gemma"]), st.dictionaries(_keys, _values, max_size=4),
       st.lists(st.tuples(st.integers(0, 60), _junk), max_size=2), st.integers(1, 9), st.booleans())
def test_whatever_is_written_the_calls_do_not_depend_on_the_cuts(name, arguments, junk, size, cut):
    body = (_python_written if name == "pythonic" else _gemma_written)(arguments)
    for at, piece in junk:
        body = body[:at] + piece + body[at:]
    text = _block(name, body)
    if cut:
        text = text[:len(text) * 2 // 3]
    results = []
    for cuts in (size, len(text)):
        _, pieces, ends = _run(name, text, cuts)
        results.append(ends)
        if ends:
            assert "".join(pieces) == ends[0][1]
    assert results[0] == results[1]
    want = _parsed(name, text)
    if results[0] and results[0][0][2]:
        assert json.loads(results[0][0][1]) == want
    # Written as the format says: Python's parse reads it (no keyword as a key), or FunctionGemma's does.
    plain = not any(map(keyword.iskeyword, arguments)) if name == "pythonic" else _gemma_plain(arguments)
    if not cut and not junk and plain:
        assert results[0] and results[0][0][2] and json.loads(results[0][0][1]) == want, text


def _gemma_plain(arguments: dict) -> bool:
    """Whether FunctionGemma's parser reads `arguments` back as written: its values split at
    the first comma or brace, its strings end at the first marker or brace."""
    for value in arguments.values():
        written = value if isinstance(value, str) else json.dumps(value)
        if any(c in written for c in ",}") or "<escape>" in written or "<esc" in written:
            return False
        if not isinstance(value, str) and json.loads(written) != value:
            return False
    return True
