"""The XML-like tool-call formats stream their arguments as JSON (serve/xml_arguments.py, driven
by serve/tools.py's OutputSplitter): Qwen3-Coder's, GLM-4.7's, LongCat's, MiniMax-M2's, MiniCPM5's
and Kimi K3's. What goes out
while the model writes is always the start of the JSON mlx-lm's parser makes of the whole block,
and the pieces joined are the call's final arguments, however the text is cut."""

from __future__ import annotations

import importlib
import json
import time
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("starlette")
from emlx_async.serve.tools import (CallArguments, CallEnd, CallStart, Content, OutputSplitter,  # noqa: E402
                                    ToolCallFormat)

PROPERTIES = {"city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "string", "enum": ["c", "f"]},
              "hourly": {"type": "boolean"}, "options": {"type": "object"}, "ratio": {"type": "number"},
              "untyped": {}, "note": {"type": ["string", "null"]}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                                                                                  "properties": PROPERTIES}}}


@dataclass(frozen=True)
class Format:
    """One of mlx-lm's XML-like formats: how its model writes a block, and its parser."""

    name: str
    parameter: str  # a parameter as the format writes it, {k} and {v} (and {t}, its type, where it says one)
    call: str  # the block between its markers, {name} and {body}
    tags: tuple[str, ...]  # the format's own tags, which a value holding them confuses

    @property
    def parser(self):
        return importlib.import_module(f"mlx_lm.tool_parsers.{self.name}")

    @property
    def tool_format(self) -> ToolCallFormat:
        p = self.parser
        return ToolCallFormat(p.tool_call_start, p.tool_call_end, p.parse_tool_call, self.name)

    def block(self, parameters: list[tuple[str, str]], function: str = "get_weather", junk=None) -> str:
        junk = junk or [""] * len(parameters)
        body = "".join(self.parameter.format(k=k, v=v, t=_written_type(k)) + j for (k, v), j in zip(parameters, junk))
        p = self.parser
        return p.tool_call_start + self.call.format(name=function, body=body) + p.tool_call_end

    def close(self, text: str, at: int) -> int:
        """Where the value written at `at` is closed in `text`."""
        return text.index(self.tags[-1], at)

    def parsed(self, text: str) -> dict:
        p = self.parser
        inner = text.removeprefix("Hi. ").removeprefix(p.tool_call_start).removesuffix(p.tool_call_end)
        parsed = p.parse_tool_call(inner.strip(), [WEATHER])
        return (parsed[0] if isinstance(parsed, list) else parsed)["arguments"]  # the first call's


def _written_type(key: str) -> str:
    """A parameter's type as a model that writes types (Kimi K3) writes it: the schema's, else "string"."""
    written = PROPERTIES.get(key, {}).get("type", "string")
    return written if isinstance(written, str) else written[0]


FORMATS = {f.name: f for f in (
    Format("qwen3_coder", "<parameter={k}>\n{v}\n</parameter>\n", "\n<function={name}>\n{body}</function>\n",
           ("<function=", "</function>", "<parameter=", "</parameter>")),
    Format("glm47", "<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n", "{name}\n{body}",
           ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")),
    Format("minimax_m2", '<parameter name="{k}">{v}</parameter>\n', '\n<invoke name="{name}">\n{body}</invoke>\n',
           ("<invoke name=", "</invoke>", "<parameter name=", "</parameter>")),
    Format("longcat", "<longcat_arg_key>{k}</longcat_arg_key>\n<longcat_arg_value>{v}</longcat_arg_value>\n",
           "{name}\n{body}", ("<longcat_arg_key>", "</longcat_arg_key>", "<longcat_arg_value>", "</longcat_arg_value>")),
    Format("minicpm5", '<param name="{k}">{v}</param>', '"{name}">{body}',
           ("<function name=", "</function>", "<![CDATA[", "]]>", "<param name=", "</param>")),
    Format("kimi_k3", '<|open|>argument key="{k}" type="{t}"<|sep|>{v}<|close|>argument<|sep|>\n',
           '\n<|open|>call tool="{name}" index="1"<|sep|>\n{body}<|close|>call<|sep|>\n',
           ("<|open|>call", "<|close|>call<|sep|>", "<|open|>json", "<|close|>json<|sep|>", "<|open|>argument",
            "<|close|>argument<|sep|>")),
)}
KEEPS_WHITESPACE = ("qwen3_coder", "kimi_k3")  # whose parsers strip no value (qwen3_coder: but one newline)
each_format = pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=list(FORMATS))


def _run(fmt: Format, text: str, size: int) -> tuple[list, OutputSplitter]:
    splitter = OutputSplitter(tool_format=fmt.tool_format, tools=[WEATHER])
    parts = []
    for i in range(0, len(text), size):
        parts += splitter.feed(text[i:i + size]).parts
    return parts + splitter.flush().parts, splitter


def _sent(parts: list) -> str:
    return "".join(p.text for p in parts if isinstance(p, CallArguments))


@each_format
def test_each_value_goes_out_as_the_parser_types_it(fmt):
    text = fmt.block([("city", 'Paris, "la Ville Lumière"\n\\n {x}'), ("days", "3"), ("units", "null"),
                      ("hourly", "True"), ("options", '{"a": [1, 2]}'), ("ratio", "2.50"),
                      ("untyped", "</para and <x=y> \t"), ("other", "NULLs"), ("note", " None ")])
    for size in (1, 2, 5, len(text)):
        parts, splitter = _run(fmt, text, size)
        [call] = splitter.tool_calls
        assert call["function"]["arguments"] == _sent(parts) == json.dumps(fmt.parsed(text), ensure_ascii=False)
        assert splitter.finish_reason("stop") == "tool_calls" and parts[-1].valid


@each_format
def test_a_string_streams_as_it_is_written_and_other_values_at_their_end(fmt):
    text = fmt.block([("city", "Paris"), ("days", "12")])
    splitter = OutputSplitter(tool_format=fmt.tool_format, tools=[WEATHER])
    sent_at = {}  # what had been sent when the text reached each length
    sent = ""
    for end in range(1, len(text) + 1):
        sent += _sent(splitter.feed(text[end - 1]).parts)
        sent_at[end] = sent
    at = text.index
    assert sent_at[at("Par") + 3] == '{"city": "Par'  # before its closing tag
    assert sent_at[at("Paris") + 5] == '{"city": "Paris'
    days = at("12") + 2
    assert sent_at[days] == '{"city": "Paris", "days": '  # an integer waits for its end
    assert sent_at[fmt.close(text, days) + len(fmt.tags[-1])] == '{"city": "Paris", "days": 12'
    assert sent + _sent(splitter.flush().parts) == '{"city": "Paris", "days": 12}'


@each_format
def test_whitespace_the_parser_trims_is_held_until_more_follows(fmt):
    """Most parsers strip a value; Qwen3-Coder's drops one newline at each end, Kimi K3's keeps it all."""
    text = fmt.block([("city", "  New   York \n ")])
    splitter = OutputSplitter(tool_format=fmt.tool_format, tools=[WEATHER])
    cut = text.index("York") + 4 + 3
    sent = "".join(_sent(splitter.feed(ch).parts) for ch in text[:cut])
    early = "  New   York \\n " if fmt.name in KEEPS_WHITESPACE else "New   York"  # JSON-escaped
    assert sent == '{"city": "' + early
    if fmt.name == "qwen3_coder":  # the newline before </parameter> may be the one it drops
        newline = text.index("York \n \n") + 7
        assert "".join(_sent(splitter.feed(ch).parts) for ch in text[cut:newline + 1]) == ""
        cut = newline + 1
    rest = _sent(splitter.feed(text[cut:]).parts + splitter.flush().parts)
    assert sent + rest == json.dumps(fmt.parsed(text))


# The words each parser reads as None in a string parameter ("city") and, in MiniMax's, one
# that may be null ("note": the others do not read its type list as a string); any other text
# stays the string.
NONE_WORDS = {"qwen3_coder": {"city": {"null"}}, "glm47": {"city": set()}, "longcat": {"city": set()},
              "minimax_m2": {"city": {"null"}, "note": {"null", "none", "nil"}},
              "minicpm5": {"city": {"null"}, "note": {"null", "none", "nil"}}, "kimi_k3": {"city": set()}}


@each_format
def test_a_value_that_may_be_a_word_of_none_waits(fmt):
    for key, words in NONE_WORDS[fmt.name].items():
        for value in ("null", "Null", "None", "nil", "nul", "nullable", "no"):
            text = fmt.block([(key, value)])
            want = "null" if value.lower() in words else json.dumps(value)
            assert json.dumps(fmt.parsed(text)[key]) == want
            splitter = OutputSplitter(tool_format=fmt.tool_format, tools=[WEATHER])
            close = fmt.close(text, text.index(value))
            early = "".join(_sent(splitter.feed(ch).parts) for ch in text[:close])
            if any(w.startswith(value.lower()) for w in words):
                assert early == f'{{"{key}": '  # held: it may still be (or is) None
            else:
                assert early == f'{{"{key}": ' + want[:-1]  # streamed: the closing quote comes at the end
            rest = _sent(splitter.feed(text[close:]).parts + splitter.flush().parts)
            assert early + rest == f'{{"{key}": {want}}}'


@each_format
def test_a_parameter_named_twice_keeps_what_was_sent_and_is_not_valid(fmt):
    """The parsers keep the last value at the first one's place, which the text sent cannot
    become: the call keeps what was sent, as a cut JSON call does, and is not "tool_calls"."""
    text = fmt.block([("city", "Paris"), ("city", "Rome")])
    parts, splitter = _run(fmt, text, 3)
    assert [type(p) for p in parts][0] is CallStart and not parts[-1].valid
    assert splitter.tool_calls[0]["function"]["arguments"] == _sent(parts) == '{"city": "Paris"'
    assert splitter.finish_reason("stop") == "stop"


@each_format
def test_a_call_cut_short_keeps_what_was_sent(fmt):
    text = fmt.block([("city", "Paris"), ("days", "3")])
    parts, splitter = _run(fmt, text[:text.index("3")], 4)
    assert not parts[-1].valid and splitter.tool_calls[0]["function"]["arguments"] == '{"city": "Paris", "days": '
    assert splitter.finish_reason("length") == "length"


def test_a_value_the_parser_cannot_convert_stops_the_stream():
    fmt = FORMATS["qwen3_coder"]  # the one parser that refuses a value (an integer's "three")
    parts, splitter = _run(fmt, fmt.block([("days", "three"), ("city", "Paris")]), 2)
    assert not parts[-1].valid and splitter.tool_calls[0]["function"]["arguments"] == '{"days": '


def test_a_minimax_call_ends_at_its_invoke():
    """MiniMax-M2 writes several calls in one block, an <invoke> each: the first call's arguments
    stream, the others come whole from the parse."""
    fmt = FORMATS["minimax_m2"]
    one, two = fmt.block([("city", "Paris")]), fmt.block([("city", "Rome"), ("days", "2")])
    inner = lambda t: t.removeprefix(fmt.parser.tool_call_start).removesuffix(fmt.parser.tool_call_end)  # noqa: E731
    text = fmt.parser.tool_call_start + inner(one) + inner(two) + fmt.parser.tool_call_end
    for size in (1, 3, len(text)):
        parts, splitter = _run(fmt, text, size)
        assert [c["function"]["name"] for c in splitter.tool_calls] == ["get_weather", "get_weather"]
        assert [c["function"]["arguments"] for c in splitter.tool_calls] == ['{"city": "Paris"}',
                                                                             '{"city": "Rome", "days": 2}']
        assert all(p.valid for p in parts if isinstance(p, CallEnd))
        if size == 1:
            first = [p.text for p in parts if isinstance(p, CallArguments) and p.index == 0 and p.text]
            assert len(first) > 3  # streamed


@pytest.mark.parametrize("rest", ["", '\n<invoke name="get_weather">\n<parameter name="city">Lon'])
def test_a_minimax_block_cut_after_whole_invokes_gives_each_of_them(rest):
    """max_tokens ends the block without its end marker: each invoke written whole is a call
    (MiniMax's parser reads an invoke only up to its </invoke>), the cut one none."""
    fmt = FORMATS["minimax_m2"]
    inner = lambda t: t.removeprefix(fmt.parser.tool_call_start).removesuffix(fmt.parser.tool_call_end)  # noqa: E731
    text = fmt.parser.tool_call_start + inner(fmt.block([("city", "Paris")])) + inner(
        fmt.block([("city", "Rome"), ("days", "2")])) + rest
    for size in (1, 3, len(text)):
        parts, splitter = _run(fmt, text, size)
        assert [(c["function"]["arguments"], p.valid) for c, p in zip(
            splitter.tool_calls, [p for p in parts if isinstance(p, CallEnd)])] == \
            [('{"city": "Paris"}', True), ('{"city": "Rome", "days": 2}', True)]
        assert splitter.finish_reason("length") == "length"


def test_a_kimi_k3_block_cut_after_a_whole_call_gives_it():
    fmt = FORMATS["kimi_k3"]
    text = _kimi_k3(_kimi_k3_argument("city", "Paris"), _kimi_k3_argument("city", "Rome"))
    text = text[:text.index("<|close|>tools")] + '<|open|>call tool="get_time"<|sep|>'  # a third call, cut
    for size in (1, len(text)):
        assert [(name, json.loads(arguments), valid) for name, arguments, valid in _calls(fmt, text, [WEATHER], size)] \
            == [("get_weather", {"city": "Paris"}, True), ("get_weather", {"city": "Rome"}, True)]


@each_format
def test_a_long_value_streams_in_linear_time(fmt):
    tail = fmt.tags[-1][:5]
    text = fmt.block([("city", "x" * 200_000 + "\n" + f"{tail} " * 2000 + " " * 50_000 + "y")])
    start = time.perf_counter()
    parts, splitter = _run(fmt, text, 4)
    assert time.perf_counter() - start < 15.0  # quadratic: minutes; linear 1-3 s
    assert splitter.tool_calls[0]["function"]["arguments"] == json.dumps(fmt.parsed(text))
    assert len([p for p in parts if isinstance(p, CallArguments)]) > 50_000  # streamed, a piece per feed


_names = st.sampled_from(["city", "days", "units", "hourly", "options", "ratio", "untyped", "note", "other", "a b", ""])
_values = st.one_of(
    st.lists(st.sampled_from(list("ab \n\t<>/=\"\\{}[]0123456789.-") + ["null", "None", "é"]
                             + [tag for f in FORMATS.values() for tag in f.tags]), max_size=12).map("".join),
    st.sampled_from(["3", "-2.5", "true", "False", "null", "NULL", "nil", '{"k": [1]}', "[1, 2]", "(1, 2)", "",
                     "\n", "\n\n", "  x  "]))
_junk = st.sampled_from(["", "\n", " ", "text", "<"] + [tag for f in FORMATS.values() for tag in f.tags])


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(list(FORMATS.values())), st.lists(st.tuples(_names, _values, _junk), max_size=4),
       st.integers(1, 9), st.booleans())
def test_whatever_the_model_writes_what_was_sent_is_the_parse_or_the_call_is_not_valid(fmt, items, size, cut):
    """The contract on any text: the pieces joined are the call's arguments, and a valid
    call's arguments are exactly the JSON of mlx-lm's parse of the whole block; a parse that
    gives arguments with parameters each named once and written as the format says is valid."""
    text = "Hi. " + fmt.block([(k, v) for k, v, _ in items], junk=[j for _, _, j in items])
    if cut:
        text = text[:len(text) * 2 // 3]
    parts, splitter = _run(fmt, text, size)
    _, whole = _run(fmt, text, len(text))
    calls = splitter.tool_calls
    assert [c["function"]["arguments"] for c in calls] == [c["function"]["arguments"] for c in whole.tool_calls]
    if not calls:
        assert "".join(p.text for p in parts if isinstance(p, Content)) == text
        return
    assert "".join(p.text for p in parts if isinstance(p, CallArguments)) == "".join(
        c["function"]["arguments"] for c in calls)
    end = next(p for p in parts if isinstance(p, CallEnd))
    try:
        want = json.dumps(fmt.parsed(text), ensure_ascii=False)
    except Exception:  # noqa: BLE001 - the parser refuses the block
        want = None
    if end.valid:
        assert calls[0]["function"]["arguments"] == want
    names = [name for name, _, _ in items]
    plain = all(junk in ("", "\n", " ", "text") for _, _, junk in items) and all(
        not any(tag in v for tag in fmt.tags) and "<" not in v[-1:] for _, v, _ in items)
    if want is not None and not cut and plain and len(set(names)) == len(names) and "" not in names \
            and "a b" not in names:
        assert end.valid, text


def test_every_whole_block_format_whose_head_goes_early_streams_its_arguments():
    """Each of mlx-lm's formats that names its first call early has a reader of its arguments
    (the XML-like ones here, Kimi K2's and Gemma 4's JSON, the Python-style and FunctionGemma's)."""
    from emlx_async.serve.tools import _FIRST_NAMES

    for name in _FIRST_NAMES:
        module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
        call_format = ToolCallFormat(module.tool_call_start, module.tool_call_end, module.parse_tool_call, name)
        assert call_format.preview("get_weather", [WEATHER]) is not None, name
    for fmt in FORMATS.values():
        assert fmt.tool_format.preview("get_weather", [WEATHER]) is not None


def _odd_tool(schema) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                        "properties": {"x": schema}}}}


@pytest.mark.parametrize("schema", [True, ["integer"], {"type": "object"}])
def test_a_parameter_schema_the_parser_cannot_read_neither_raises_nor_depends_on_the_cuts(schema):
    """JSON Schema allows `true` as a property's schema; mlx-lm's qwen3_coder converter raises
    on it (caught: the call is not valid), and reads a list as no type. NaN from a JSON object
    is no JSON: not valid either."""
    fmt = FORMATS["qwen3_coder"]
    text = fmt.block([("x", "NaN" if schema == {"type": "object"} else "5")], "f")
    valid = schema == ["integer"]  # read untyped: the string "5"
    results = set()
    for size in (1, 3, len(text)):
        splitter = OutputSplitter(tool_format=fmt.tool_format, tools=[_odd_tool(schema)])
        parts = []
        for i in range(0, len(text), size):
            parts += splitter.feed(text[i:i + size]).parts
        parts += splitter.flush().parts
        [call] = splitter.tool_calls
        assert call["function"]["arguments"] == _sent(parts) and parts[-1].valid == valid
        results.add(call["function"]["arguments"])
    assert len(results) == 1 and (not valid or results == {'{"x": "5"}'})


def test_a_name_as_the_parser_reads_it():
    """Qwen3-Coder's parser reads names as [^\\s<>]+ with its own (regex module's) whitespace:
    "f<x" is no early head (the parse gives one call, f), and "\\x1c" is part of a name."""
    fmt = FORMATS["qwen3_coder"]
    tools = [_odd_tool({"type": "string"}), WEATHER]
    for text, want in ((fmt.block([("x", "v")], "f<x"), ("f", {"x": "v"})),
                       (fmt.block([("a\x1c", "1")]), ("get_weather", {"a\x1c": "1"}))):
        for size in (1, len(text)):
            splitter = OutputSplitter(tool_format=fmt.tool_format, tools=tools)
            parts = []
            for i in range(0, len(text), size):
                parts += splitter.feed(text[i:i + size]).parts
            parts += splitter.flush().parts
            [call] = splitter.tool_calls
            assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == want
            assert parts[-1].valid


def _calls(fmt: Format, text: str, tools: list[dict], size: int = 1) -> list[tuple[str, str, bool]]:
    splitter = OutputSplitter(tool_format=fmt.tool_format, tools=tools)
    parts = []
    for i in range(0, len(text), size):
        parts += splitter.feed(text[i:i + size]).parts
    parts += splitter.flush().parts
    valid = [p.valid for p in parts if isinstance(p, CallEnd)]
    return [(c["function"]["name"], c["function"]["arguments"], v) for c, v in zip(splitter.tool_calls, valid)]


@pytest.mark.parametrize("schema", [True, False])
def test_a_glm_call_with_a_schema_its_parser_cannot_read_does_not_raise(schema):
    """mlx-lm's glm47 reads each property's schema as a dict; `true` and `false` are valid JSON
    Schema (the API takes them): the reader is off, the parse decides (it fails: not valid)."""
    fmt = FORMATS["glm47"]
    for size in (1, 1000):
        [(name, _, valid)] = _calls(fmt, fmt.block([("x", "5")], "f"), [_odd_tool(schema)], size)
        assert name == "f" and not valid


def test_minimax_blocks_read_as_its_parser_reads_them():
    fmt = FORMATS["minimax_m2"]
    string_s = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string"}, "x": {"type": "object"}}}}}]
    start, end = fmt.parser.tool_call_start, fmt.parser.tool_call_end
    cases = [
        # A parameter's name running into </invoke>: no parameter; the next invoke is its own call.
        (f'{start}\n<invoke name="f">\n<parameter name=a</invoke>\n<invoke name="f">\n'
         f'<parameter name="s">v</parameter>\n</invoke>\n{end}', [("f", "{}", True), ("f", '{"s": "v"}', True)]),
        # An invoke whose value no JSON can hold (a set) is not valid; its sibling is.
        (f'{start}\n<invoke name="f">\n<parameter name="x">{{"a": 1}}</parameter>\n</invoke>\n<invoke name="f">\n'
         f'<parameter name="x">{{1, 2}}</parameter>\n</invoke>\n{end}', [("f", '{"x": {"a": 1}}', True), ("f", "", False)]),
        # The parser's name ends at the first ">".
        (f'{start}\n<invoke name="a>b">\n<parameter name="s">v</parameter>\n</invoke>\n{end}', [('"a', '{"s": "v"}', True)]),
    ]
    for text, want in cases:
        for size in (1, 3, len(text)):
            assert _calls(fmt, text, string_s, size) == want


def test_glm_tags_are_apart_only_by_what_its_parser_reads_as_whitespace():
    """Between </arg_key> and <arg_value> GLM's parser allows \\s of the regex module and "\\n"
    written out; \\x1c (whitespace to Python's isspace) is neither, so no argument is read."""
    fmt = FORMATS["glm47"]
    for sep, want in (("\\n \t", '{"city": "Paris"}'), ("\x1c", "{}")):
        text = f"<tool_call>get_weather\n<arg_key>city</arg_key>{sep}<arg_value>Paris</arg_value>\n</tool_call>"
        for size in (1, len(text)):
            assert _calls(fmt, text, [WEATHER], size) == [("get_weather", want, True)]


def test_a_minicpm5_cdata_value_streams_what_is_inside_it():
    """MiniCPM5 wraps a value holding "<", "&" or newlines in CDATA: the text inside goes out as it
    is written (its whitespace kept), a "]]>" held until what follows shows it is not the end."""
    fmt = FORMATS["minicpm5"]
    text = fmt.block([("city", "<![CDATA[ a <b> & ]]x\n]]> "), ("days", "<![CDATA[3]]>")])
    splitter = OutputSplitter(tool_format=fmt.tool_format, tools=[WEATHER])
    sent_at, sent = {}, ""
    for end in range(1, len(text) + 1):
        sent += _sent(splitter.feed(text[end - 1]).parts)
        sent_at[end] = sent
    at = text.index
    assert sent_at[at("<b>") + 3] == '{"city": " a <b>'
    assert sent_at[at("]]x") + 2] == '{"city": " a <b> & '  # "]]" may begin the end
    assert sent_at[at("]]x") + 3] == '{"city": " a <b> & ]]x'
    assert sent_at[at("</param>")] == '{"city": " a <b> & ]]x\\n'  # "]]> " held: it may be the end
    assert sent + _sent(splitter.flush().parts) == json.dumps(fmt.parsed(text)) == '{"city": " a <b> & ]]x\\n", "days": 3}'


def test_a_minicpm5_cdata_that_never_closes_is_not_valid_however_cut():
    """The parser then keeps the whole text, "<![CDATA[" too, which the characters streamed
    cannot become: what was sent stays, the same for every cut."""
    fmt = FORMATS["minicpm5"]
    text = fmt.block([("city", "<![CDATA[Paris")])
    for size in (1, 4, len(text)):
        [(_, arguments, valid)] = _calls(fmt, text, [WEATHER], size)
        assert (arguments, valid) == ('{"city": "Paris', False)


def test_minicpm5_calls_each_in_their_own_block_all_stream():
    fmt = FORMATS["minicpm5"]
    text = fmt.block([("city", "Paris")]) + "\n" + fmt.block([("city", "Rome"), ("days", "2")])
    parts, splitter = _run(fmt, text, 1)
    assert [c["function"]["arguments"] for c in splitter.tool_calls] == ['{"city": "Paris"}',
                                                                         '{"city": "Rome", "days": 2}']
    assert all(p.valid for p in parts if isinstance(p, CallEnd))
    for index in (0, 1):
        assert len([p for p in parts if isinstance(p, CallArguments) and p.index == index]) > 3


def _kimi_k3(*calls: str) -> str:
    fmt = FORMATS["kimi_k3"]
    body = "".join(f'<|open|>call tool="get_weather" index="{i}"<|sep|>{c}<|close|>call<|sep|>'
                   for i, c in enumerate(calls))
    return fmt.parser.tool_call_start + body + fmt.parser.tool_call_end


def _kimi_k3_argument(key: str, value: str, kind: str | None = "string") -> str:
    written = "" if kind is None else f' type="{kind}"'
    return f'<|open|>argument key="{key}"{written}<|sep|>{value}<|close|>argument<|sep|>'


def test_kimi_k3_types_each_value_as_the_model_wrote_its_type():
    """Kimi K3's parser reads the type the model wrote, not the schema's (no type: a string)."""
    fmt = FORMATS["kimi_k3"]
    text = _kimi_k3(_kimi_k3_argument("days", "3", "string") + _kimi_k3_argument("city", "7", "integer")
                    + _kimi_k3_argument("note", "[1, 2]", None) + _kimi_k3_argument("ratio", "x", "number"))
    for size in (1, 3, len(text)):
        [(_, arguments, valid)] = _calls(fmt, text, [WEATHER], size)
        assert arguments == '{"days": "3", "city": 7, "note": "[1, 2]", "ratio": "x"}' and valid


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_kimi_k3_json_arguments_stream_as_the_model_writes_them(size):
    """A JSON block's object goes out as written (its spacing too), the parse compared by value;
    the block's other calls come whole from the parse."""
    fmt = FORMATS["kimi_k3"]
    own = '{"city":"Paris, \\"la\\" {Ville}","days":3}'
    text = _kimi_k3(f'\n<|open|>json type="object"<|sep|> {own}\n<|close|>json<|sep|>\n',
                    '<|open|>json<|sep|>{"city": "Rome"}<|close|>json<|sep|>')
    parts, splitter = _run(fmt, text, size)
    assert [c["function"]["arguments"] for c in splitter.tool_calls] == [own, '{"city": "Rome"}']
    assert all(p.valid for p in parts if isinstance(p, CallEnd))
    first = [p.text for p in parts if isinstance(p, CallArguments) and p.index == 0]
    assert "".join(first) == own and (size > 1 or len(first) > 10)


def test_kimi_k3_arguments_before_a_json_block_are_not_the_call():
    """The parser takes a JSON block over the arguments: those sent before it make the call not valid."""
    fmt = FORMATS["kimi_k3"]
    text = _kimi_k3(_kimi_k3_argument("city", "Paris") + '<|open|>json<|sep|>{"days": 2}<|close|>json<|sep|>')
    for size in (1, len(text)):
        [(_, arguments, valid)] = _calls(fmt, text, [WEATHER], size)
        assert (arguments, valid) == ('{"city": "Paris"', False)
        assert fmt.parsed(text) == {"days": 2}


@pytest.mark.parametrize("value", ["<![CDATA[" + "x" * 1_000_000 + "]]" * 1000 + "]]>", "y" * 1_000_000])
def test_a_long_minicpm5_value_streams_in_linear_time(value):
    fmt = FORMATS["minicpm5"]
    text = fmt.block([("city", value)])
    start = time.perf_counter()
    parts, splitter = _run(fmt, text, 4)
    assert time.perf_counter() - start < 30.0  # quadratic: hours; linear about 5 s on a loaded CPU
    assert splitter.tool_calls[0]["function"]["arguments"] == json.dumps(fmt.parsed(text))


def test_a_long_kimi_k3_json_object_streams_in_linear_time():
    fmt = FORMATS["kimi_k3"]
    own = json.dumps({"city": "x" * 1_000_000})
    text = _kimi_k3(f"<|open|>json<|sep|>{own}<|close|>json<|sep|>")
    start = time.perf_counter()
    parts, splitter = _run(fmt, text, 4)
    assert time.perf_counter() - start < 30.0  # quadratic: hours; linear about 12 s on a loaded CPU
    assert splitter.tool_calls[0]["function"]["arguments"] == own
    assert len([p for p in parts if isinstance(p, CallArguments)]) > 200_000  # streamed, a piece per feed
