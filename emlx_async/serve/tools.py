"""Tool calling and reasoning for the chat API: what the model is told, and what
its answer is split into.

- Tools reach the model through its chat template (Hugging Face's
  ``tools=`` convention). A template that does not render tools (SmolLM2's)
  gets ``fallback_messages``: a system-prompt block that lists the tools and
  asks for Hermes-style calls, ``<tool_call>{"name": ..., "arguments": ...}
  </tool_call>``; assistant tool calls and tool results in the history are
  written the same way.
- ``ToolCallFormat``: where a call starts and ends in the output and how its
  text parses, from mlx-lm's ``tool_parsers`` (the one mlx-lm's loader chose for
  the model; for a GGUF's tokenizer, from the template as mlx-lm chooses); Llama 3's bare JSON (no markers: an answer that is a call
  object), which mlx-lm has no parser for; Hermes JSON otherwise.
- ``call_grammar``: for ``tool_choice`` "required" or a named function, a
  grammar that only lets the model write valid calls of the given tools.
- ``after_reasoning``: on a template that thinks, a constrained request's
  grammar applies after the reasoning (at most REASONING_SHARE of max_tokens).
- ``OutputSplitter``: the streamed text cut into reasoning (``<think>``),
  content and tool calls, a JSON call (Hermes, Llama 3's, Mistral's) streamed as the model
  writes it (its name first, then its arguments in pieces; ``JsonScanner``
  checks them); other formats' first call names itself early (``first_name``), and its
  arguments stream where a reader knows the format (``preview``: the XML-like ones in
  ``xml_arguments``, Kimi K2's JSON, Gemma 4's read as JSON); the rest come when the block ends.
"""

from __future__ import annotations

import abc
import importlib
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from .. import InvalidArgument
from . import literal_arguments
from .xml_arguments import TaggedArguments, _escaped, _marker_start, arguments_reader

# emlx_async.llm.text's markers, whose PromptEncoder.thinks reads them (the service imports
# no model code before a model loads; a test keeps them equal).
THINK_START, THINK_END = "<think>", "</think>"
HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
# Llama 3.1 to 3.3's templates ask for calls as a bare JSON answer, in these words; a model
# may write its tool-call token first, and separates several calls with ";".
LLAMA3_ASKS = '"parameters": dictionary of argument name and its value'
LLAMA3_PYTHON_TAG = "<|python_tag|>"

FALLBACK_INSTRUCTIONS = (
    "You can call functions. The available functions, as JSON schemas:\n{tools}\n"
    "To call a function, answer with one block per call, exactly:\n"
    "<tool_call>\n{{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}}\n</tool_call>"
)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# Under a grammar the reasoning may take at most this share of max_tokens (Grammar.after_free_text's
# bound): then "</think>" is forced and the constrained answer has the rest.
REASONING_SHARE = 0.5


def reasoning_state(thinks: bool, prompt_text: str) -> str | None:
    """Where a chat prompt leaves the answer of a template that thinks (`thinks`: the engine's
    ``text.thinks``): "open" (the prompt ends inside ``<think>``, as Qwen3's does), "closed"
    (the template wrote the whole block itself: ``enable_thinking`` false) or "may_open" (the
    model may open one); None: it does not think."""
    if not thinks:
        return None
    tail = prompt_text.rstrip()
    return "open" if tail.endswith(THINK_START) else "closed" if tail.endswith(THINK_END) else "may_open"


def after_reasoning(grammar, state: str | None, max_tokens: int, tokenizer=None, budget: int | None = None):
    """`grammar` as it applies to the answer of a template that thinks: the model reasons first
    (in a block it may open, or the one the prompt opened), up to `budget` tokens (default:
    REASONING_SHARE of `max_tokens`), then writes what `grammar` allows (None: any text, so a
    budget bounds a free answer's reasoning too). Unchanged where the template does not think
    or the prompt already closed the reasoning. The markers may also come as `tokenizer`'s own
    tokens, where it has them (Qwen3's)."""
    if state not in ("open", "may_open"):
        return grammar
    from emlx_async.llm.grammar import Grammar, token_of

    if grammar is None:
        grammar = Grammar.any_text()
    may_open = state == "may_open"
    cap = budget if budget is not None else max(1, int(max_tokens * REASONING_SHARE))
    return grammar.after_free_text(
        THINK_END, start=THINK_START if may_open else None, max_tokens=cap,
        start_token=token_of(tokenizer, THINK_START) if may_open and tokenizer is not None else None,
        end_token=token_of(tokenizer, THINK_END) if tokenizer is not None else None)


def fallback_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """`messages` for a template without tool support: the tools in a system block,
    tool calls and results as text (role "tool" becomes "user")."""
    out = []
    for message in messages:
        if message["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"})
        elif message.get("tool_calls"):
            calls = "\n".join(f"{HERMES_START}\n" + json.dumps({"name": c["function"]["name"],
                                                                "arguments": c["function"]["arguments"]})
                              + f"\n{HERMES_END}" for c in message["tool_calls"])
            text = message["content"]
            out.append({"role": "assistant", "content": f"{text}\n{calls}" if text else calls})
        else:
            out.append({"role": message["role"], "content": message["content"]})
    if tools:
        block = FALLBACK_INSTRUCTIONS.format(tools="\n".join(json.dumps(t["function"]) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


# A call's arguments member: "arguments" (Hermes, OpenAI) or "parameters", as Llama 3's
# templates ask for and models trained on them write; the first one a call has counts.
ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass(frozen=True)
class ToolCallFormat:
    """How one template's model writes a tool call: start and end markers and a parser
    (``parse(text, tools) -> {"name", "arguments"}`` or a list of them)."""

    start: str
    end: str
    parse: Any
    name: str = "json_tools"

    @classmethod
    def for_model(cls, tokenizer: Any, chat_template: str | None, *,
                  renders_tools: bool | None = None) -> ToolCallFormat:
        """The format of the model whose tokenizer is `tokenizer` (the engine's): the parser
        mlx-lm's loader gave its TokenizerWrapper (the checkpoint's ``tool_parser_type``, else
        the template's, else the vocabulary's: Kimi K3's XTML tokens, LFM2.5's pythonic call
        tokens), or for any other tokenizer (a GGUF's) the template's (``for_template``). A
        template that does not render tools gets the fallback block, hence Hermes
        (`renders_tools`: the engine's ``text.renders_tools``, which knows templates written
        in Python; None: the Jinja template's text says)."""
        from mlx_lm.tokenizer_utils import TokenizerWrapper

        from emlx_async.llm.text import jinja_renders_tools

        if renders_tools is None:
            renders_tools = jinja_renders_tools(chat_template)
        if not isinstance(tokenizer, TokenizerWrapper) or not renders_tools:
            return cls.for_template(chat_template)
        if tokenizer.tool_parser is None:
            return cls._without_parser(chat_template)
        return cls._of_parser(tokenizer.tool_parser, tokenizer.tool_call_start, tokenizer.tool_call_end)

    @classmethod
    def for_template(cls, chat_template: str | None) -> ToolCallFormat:
        """The format mlx-lm infers from the template's text alone."""
        from emlx_async.llm.text import jinja_renders_tools

        if not jinja_renders_tools(chat_template):
            return cls.hermes()
        # mlx-lm's own choice from the template text; private there, hence guarded.
        try:
            from mlx_lm.tokenizer_utils import _infer_tool_parser

            name = _infer_tool_parser(SimpleNamespace(chat_template=chat_template, get_vocab=dict))
        except Exception:  # noqa: BLE001 - any failure here just means Hermes
            name = None
        if name is None:
            return cls._without_parser(chat_template)
        module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
        return cls._of_parser(module.parse_tool_call, module.tool_call_start, module.tool_call_end)

    @classmethod
    def _of_parser(cls, parse: Callable, start: str, end: str) -> ToolCallFormat:
        # The parser's own module names the format, which picks the readers: laguna's
        # checkpoints name "laguna", whose module re-exports glm47's parser.
        return cls(start, end, parse, parse.__module__.rpartition(".")[2])

    @classmethod
    def _without_parser(cls, chat_template: str | None) -> ToolCallFormat:
        """A template that renders tools but names no format mlx-lm has a parser for."""
        return cls.bare_json() if chat_template and LLAMA3_ASKS in chat_template else cls.hermes()

    @property
    def first_name(self) -> re.Pattern | None:
        """Where a whole-block format's first call names itself in the block (group 1: the
        name, once nothing can lengthen it), so that call's head goes out before the block
        ends; None: the head waits for the block's parse."""
        return _FIRST_NAMES.get(self.name)

    @property
    def streams(self) -> bool:
        """Whether a call streams as it is written (JSON arguments: OutputSplitter reads them
        as they come). mlx-lm's other parsers read a whole block (XML-like tags, Python
        calls, a format's own separators): their first call's head (``first_name``) and
        arguments (``preview``) go out as written, the block's other calls once it has ended."""
        return self.name in ("json_tools", "llama3_json", "mistral")

    def preview(self, name: str, tools: list[dict] | None
                ) -> TaggedArguments | _JsonArguments | literal_arguments.CodeArguments | None:
        """A whole-block format's reader of a call's arguments, from the text after the call's
        name (``first_name``), as it is written (None: the arguments go out once the block has
        ended and parsed)."""
        if self.name in _JSON_ARGUMENTS:
            return _JSON_ARGUMENTS[self.name].for_parser(self.parse)
        if self.name in literal_arguments.READERS:
            return literal_arguments.READERS[self.name].for_parser(self.parse)
        return arguments_reader(self.name, name, tools, json_object=_JsonArguments)

    def cut_block_calls(self, text: str, tools: list[dict] | None) -> list[dict]:
        """The calls of a block cut short (max_tokens) that were written whole, one after
        another from the block's start (the head's first), so that they can be sent: a format
        whose parse reads a call only to its own end (``_CUT_BLOCK_CALLS``), its parse of that
        run alone. A call the parser finds further on may be text inside the cut call (a
        string holding ``call:rm{...}``): it is none. Another format's cut block sends only
        its head's call ([])."""
        pattern = _CUT_BLOCK_CALLS.get(self.name)
        regex = getattr(importlib.import_module(self.parse.__module__), pattern, None) if pattern else None
        if regex is None:
            return []
        text, end = text.strip(), 0  # the parse reads the stripped block (calls)
        for match in regex.finditer(text):
            if text[end:match.start()].strip():
                break  # text between: what follows may be inside a call left open
            end = match.end()
        try:
            return self.calls(text[:end], tools) if end else []
        except Exception:  # noqa: BLE001 - parsers raise what they like
            return []

    def scanner(self) -> _StreamedCall | _HeaderCall | None:
        """A reader of one call as it streams (None: the format does not stream)."""
        if self.name == "mistral":
            return _HeaderCall()
        return _StreamedCall() if self.streams else None

    @property
    def markerless(self) -> bool:
        """Calls have no markers: an answer that opens with a JSON object is a call (Llama 3's)."""
        return not self.start

    @classmethod
    def bare_json(cls) -> ToolCallFormat:
        """Llama 3's calls: the answer is ``{"name": ..., "parameters": {...}}`` (``;`` between
        several), perhaps after ``<|python_tag|>``."""
        return cls("", "", _parse_bare_json, "llama3_json")

    @classmethod
    def hermes(cls) -> ToolCallFormat:
        from mlx_lm.tool_parsers import json_tools

        return cls(json_tools.tool_call_start, json_tools.tool_call_end, json_tools.parse_tool_call)

    def calls(self, text: str, tools: list[dict] | None) -> list[dict]:
        """The calls in one block's text, in OpenAI's shape (arguments as JSON text); ValueError if none parse."""
        parsed = self.parse(text.strip(), tools)  # qwen3_coder's ends at </function>, no whitespace after
        parsed = parsed if isinstance(parsed, list) else [parsed]
        out, readable = [], False
        for call in parsed:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise InvalidArgument(f"a tool call without a name: {text[:60]!r}")
            # The first of them in the text, as the streamed reader takes it.
            arguments = next((value for key, value in call.items() if key in ARGUMENT_KEYS), {})
            if not isinstance(arguments, str):
                try:
                    arguments = json.dumps(arguments, ensure_ascii=False)
                except (TypeError, ValueError):  # a Python literal JSON cannot hold (a set, bytes)
                    arguments = ""  # this call is not valid; the block's others may be
            readable = readable or bool(arguments)
            out.append({"id": new_call_id(), "type": "function",
                        "function": {"name": call["name"], "arguments": arguments}})
        if out and not readable:
            raise InvalidArgument(f"no tool call's arguments are JSON: {text[:60]!r}")
        return out


# The first call's name in a block of mlx-lm's whole-block formats, each ending at what follows
# the name (a longer name cannot match early), searched for in the block's first
# _NAME_WINDOW characters only (a regex run over a long block at every piece is quadratic).
_NAME_WINDOW = 512
_FIRST_NAMES = {name: re.compile(pattern) for name, pattern in {
    "qwen3_coder": r"^\s*<function=([^\s<>]+)>",
    "minimax_m2": r'^\s*<invoke name="([^">]+)">',  # the parser's name ends at the first ">"
    "minicpm5": r'^\s*"([^"]+)"\s*>',
    "glm47": r"^\s*([^\s<]+)\s*(?=<arg_key>)",  # its reader reads from <arg_key>
    "longcat": r"^\s*([^\s<{][^\s<]*)\s*(?=<longcat_arg_key>)",  # its parser reads text opening with "{" as JSON
    # The name once the call's attributes have ended (a later tool="..." would be the parser's),
    # none that the parser would unescape.
    "kimi_k3": r'^\s*<\|open\|>call\s+tool="([^"&]+)"(?:\s+(?!tool=)\w+="[^"<]*")*\s*<\|sep\|>',
    "kimi_k2": r"^\s*<\|tool_call_begin\|>\s*(?:functions\.)?([^\s:<]+):\d+\s*<\|tool_call_argument_begin\|>",
    "gemma4": r"^\s*call:([\w-]+)\{",  # the parsers' own name classes
    "function_gemma": r"^\s*call:(\w+)\{",
    "pythonic": r"^\s*\[([A-Za-z_][\w.]*)\(",
}.items()}


# Formats whose parser reads a call of several in a block only up to that call's end (mlx-lm's
# regexes: minimax_m2's <invoke ...</invoke>, kimi_k2's <|tool_call_begin|>...<|tool_call_end|>,
# kimi_k3's <|open|>call...<|close|>call<|sep|>, gemma4's balanced braces). Kimi K2's reads a cut
# call only where no call ended, as the block's one call (named "<|tool_call_begin|>functions.NAME",
# which is not the head's: that call is not valid).
_CUT_BLOCK_CALLS = {"minimax_m2": "_invoke_complete_regex", "kimi_k2": "_tool_call_split_regex",
                    "kimi_k3": "_call_regex", "gemma4": "_tool_call_regex"}  # format -> its parser's call regex


def _parse_bare_json(text: str, tools: list[dict] | None) -> dict:
    call = json.loads(text)
    if not isinstance(call, dict) or not _names_a_tool(call.get("name"), tools):
        raise InvalidArgument("a bare call is a JSON object naming one of the tools")
    return call


def _names_a_tool(name: Any, tools: list[dict] | None) -> bool:
    """Whether a bare object's "name" is a tool's: without markers, JSON that merely has a
    "name" member ({"name": "Alice", "age": 30}) is an answer, not a call."""
    return isinstance(name, str) and (tools is None or any(t["function"]["name"] == name for t in tools))


def call_grammar(tools: list[dict], *, name: str | None, parallel: bool):
    """A Grammar whose outputs are Hermes calls (``<tool_call>`` JSON ``</tool_call>``) of `tools`
    (of the one named `name`); one call, or one or more when `parallel`."""
    from emlx_async.llm.grammar import Grammar

    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    # Each tool's parameters live under $defs, their own "#..." references moved there with
    # them: nested in the call's schema, "#/$defs/Item" (pydantic's nested models) would
    # point at the call's root, where nothing is.
    parameters = {f"tool{i}": _rebased(closed_objects(f.get("parameters") or {"type": "object"}),
                                       f"#/$defs/tool{i}")
                  for i, f in enumerate(chosen)}
    variants = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                 "properties": {"name": {"const": f["name"]}, "arguments": {"$ref": f"#/$defs/tool{i}"}}}
                for i, f in enumerate(chosen)]
    schema = dict(variants[0]) if len(variants) == 1 else {"anyOf": variants}
    schema["$defs"] = parameters
    # One canonical JSON layout, as Grammar.json_schema has it: with free whitespace
    # a weak model can write newlines inside the call until max_tokens.
    schema["x-guidance"] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    repeat = ' ("\\n" call)*' if parallel else ""
    text = (f'start: call{repeat}\n'
            f'call: "{HERMES_START}\\n" body "\\n{HERMES_END}"\n'
            f'body: %json {json.dumps(schema)}\n')
    return Grammar.lark(text)


# Keywords whose subschemas add to the object they sit in: where one is used, an object
# closed on its own would refuse members they allow, so nothing is closed.
_MERGING = frozenset(("if", "then", "else", "dependentSchemas", "dependencies", "unevaluatedProperties",
                      "$dynamicRef"))
# Two of these at one level describe one object together (a base and its variants).
_COMBINED = ("properties", "$ref", "allOf", "anyOf", "oneOf")
_OPENS = ("additionalProperties", "patternProperties")  # an object that says itself what else it allows
# Where subschemas sit (not "not" or "contains": closing inside them would widen or narrow
# what the schema allows).
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties")


def closed_objects(schema: Any) -> Any:
    """A tool's parameters with every object that names its members (``properties``) and
    says nothing of others closed to them (``additionalProperties: false``), as
    xgrammar's strict mode and OpenAI's strict tools have it. JSON Schema's default lets
    a forced call's arguments hold keys the tool never named, and a small model sampled
    freely writes such keys until max_tokens. Schemas that merge subschemas into one
    object (``allOf`` of several, members beside ``anyOf`` or a ``$ref``, a ``$ref``
    beside variants, ``if``/``then``, ...) are kept as sent, and so is an object whose
    ``required`` names a member it does not list or whose ``minProperties`` asks for
    more members than it lists."""
    if _merges(schema):
        return schema
    return _close(schema)


def _mapped(key: str, value: Any, each: Callable[[Any], Any]) -> Any:
    """`value` of keyword `key` with `each` applied to every subschema it holds (the one
    place that says where subschemas sit); other values as they are."""
    if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
        return {name: each(sub) for name, sub in value.items()}
    if key in _SUBSCHEMA_LISTS and isinstance(value, list):
        return [each(sub) for sub in value]
    if key in _SUBSCHEMA_ONE:
        return each(value)
    return value


def _merges(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    if any(key in schema for key in _MERGING):
        return True
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        return True
    if sum(key in schema for key in _COMBINED) > 1:
        return True
    subschemas: list = []
    for key, value in schema.items():
        _mapped(key, value, subschemas.append)
    return any(_merges(sub) for sub in subschemas)


def _close(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    out = {key: _mapped(key, value, _close) for key, value in schema.items()}
    members = schema.get("properties")
    required = schema.get("required", [])
    least = schema.get("minProperties", 0)
    if (isinstance(members, dict) and not any(key in schema for key in _OPENS)
            and isinstance(required, list) and all(name in members for name in required)
            and not (isinstance(least, (int, float)) and least > len(members))):
        out["additionalProperties"] = False
    return out


def _rebased(schema: Any, root: str) -> Any:
    """`schema` with each local reference ("#", "#/...") pointing below `root` instead."""
    if isinstance(schema, dict):
        return {key: (root + value[1:] if key == "$ref" and isinstance(value, str) and value.startswith("#")
                      else _rebased(value, root)) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_rebased(value, root) for value in schema]
    return schema


# ---- a call's JSON, read as it is written ---------------------------------------------

_WHITESPACE = frozenset(" \t\n\r")
_DIGITS = frozenset("0123456789")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_ESCAPED = frozenset('"\\/bfnrt')
_LITERALS = {"t": "true", "f": "false", "n": "null"}
# A number's states (JSON's grammar): where a digit, ".", "e" or a sign may lead, and which may end it.
_NUMBER_STEPS = {
    "minus": {"0": "zero", "digit": "int"},
    "zero": {".": "dot", "e": "e"},
    "int": {"digit": "int", ".": "dot", "e": "e"},
    "dot": {"digit": "frac"},
    "frac": {"digit": "frac", "e": "e"},
    "e": {"sign": "exp_sign", "digit": "exp"},
    "exp_sign": {"digit": "exp"},
    "exp": {"digit": "exp"},
}
_NUMBER_ENDS = frozenset({"zero", "int", "frac", "exp"})


class JsonScanner:
    """Checks JSON text as it arrives, one character at a time, and says where its
    values begin and end: a pushdown automaton, so each character is read once and
    whatever it has accepted is the start of some valid JSON text.

    ``push(ch)`` returns the events `ch` causes, in order: ``("start", depth)``, a
    value begins with `ch`; ``("end", depth, True)``, `ch` was a value's last
    character; ``("end", depth, False)``, a number ended just before `ch` (a number's
    end shows only at the character after it); ``("key", depth, raw)``, the text of
    an object's key (still escaped) is whole. `depth` counts the containers around
    the value (the top value's is 0, its members' 1). A character JSON cannot have
    there sets `failed`, and nothing more is read; `complete`: the top value ended.
    """

    def __init__(self) -> None:
        # Per open container: "{" or "[", and what it expects next: "key_or_close",
        # "key", "colon", "value", "value_or_close" or "comma_or_close".
        self._stack: list[list[str]] = []
        self._scalar: str | None = None  # inside "string", "key", "number" or "literal"
        self._state = ""  # the number's state; the literal's remaining letters
        self._escape = 0  # in a string: 1 after a backslash, 2..5 reading \u's hex digits
        self._key: list[str] = []
        self.complete = False
        self.failed = False

    def push(self, ch: str) -> list[tuple]:
        if self.failed:
            return []
        events: list[tuple] = []
        if self._scalar is not None:
            if not self._scalar_char(ch, events):
                return events  # `ch` was the scalar's
            if self.failed:
                return events
        if ch in _WHITESPACE:
            return events
        if not self._stack:
            if self.complete:
                self.failed = True  # text after the top value
            else:
                self._begin_value(ch, events)
            return events
        top = self._stack[-1]
        kind, expect = top
        if expect in ("value", "value_or_close"):
            if ch == "]" and expect == "value_or_close":
                self._close(events)
            else:
                self._begin_value(ch, events)
        elif expect in ("key_or_close", "key"):
            if ch == '"':
                self._scalar, self._escape, self._key = "key", 0, []
            elif ch == "}" and expect == "key_or_close":
                self._close(events)
            else:
                self.failed = True
        elif expect == "colon":
            if ch == ":":
                top[1] = "value"
            else:
                self.failed = True
        else:  # comma_or_close
            if ch == ",":
                top[1] = "key" if kind == "{" else "value"
            elif ch == ("}" if kind == "{" else "]"):
                self._close(events)
            else:
                self.failed = True
        return events

    def _begin_value(self, ch: str, events: list[tuple]) -> None:
        depth = len(self._stack)
        if ch == "{" or ch == "[":
            events.append(("start", depth))
            self._stack.append([ch, "key_or_close" if ch == "{" else "value_or_close"])
        elif ch == '"':
            events.append(("start", depth))
            self._scalar, self._escape = "string", 0
        elif ch == "-" or ch in _DIGITS:
            events.append(("start", depth))
            self._scalar = "number"
            self._state = "minus" if ch == "-" else "zero" if ch == "0" else "int"
        elif ch in _LITERALS:
            events.append(("start", depth))
            self._scalar, self._state = "literal", _LITERALS[ch][1:]
        else:
            self.failed = True

    def _close(self, events: list[tuple]) -> None:
        self._stack.pop()
        events.append(("end", len(self._stack), True))
        self._value_done()

    def _value_done(self) -> None:
        if self._stack:
            self._stack[-1][1] = "comma_or_close"
        else:
            self.complete = True

    def _scalar_char(self, ch: str, events: list[tuple]) -> bool:
        """Read `ch` inside a scalar; True when it is not the scalar's (a number ended
        before it) and is still to be read as structure."""
        kind = self._scalar
        if kind in ("string", "key"):
            if self._escape == 1:
                if ch == "u":
                    self._escape = 2
                elif ch in _ESCAPED:
                    self._escape = 0
                else:
                    self.failed = True
            elif self._escape:
                if ch not in _HEX_DIGITS:
                    self.failed = True
                self._escape = 0 if self._escape == 5 else self._escape + 1
            elif ch == "\\":
                self._escape = 1
            elif ch == '"':
                self._scalar = None
                if kind == "key":
                    events.append(("key", len(self._stack), "".join(self._key)))
                    self._stack[-1][1] = "colon"
                    return False
                events.append(("end", len(self._stack), True))
                self._value_done()
                return False
            elif ch < " ":
                self.failed = True  # JSON strings hold no raw control characters
            if kind == "key":
                self._key.append(ch)
            return False
        if kind == "literal":
            if not self._state.startswith(ch):
                self.failed = True
                return False
            self._state = self._state[1:]
            if not self._state:
                self._scalar = None
                events.append(("end", len(self._stack), True))
                self._value_done()
            return False
        # A number.
        step = "digit" if ch in _DIGITS and not (self._state == "minus" and ch == "0") else \
            "e" if ch in "eE" else "sign" if ch in "+-" else ch
        following = _NUMBER_STEPS[self._state].get(step)
        if following is not None:
            self._state = following
            return False
        self._scalar = None
        if self._state not in _NUMBER_ENDS:
            self.failed = True
            return False
        events.append(("end", len(self._stack), False))
        self._value_done()
        return True


class _Arguments(abc.ABC):
    """A streamed call's arguments: the raw JSON read so far and what was handed out, as
    lists of pieces (appending to a str attribute copies it, which made a long value
    quadratic). A value that is a string (JSON text inside a string, as some models write
    it; mlx-lm's parsers take it as the arguments' text) is handed out whole, decoded,
    once it has ended."""

    name: str | None

    def __init__(self) -> None:
        self._arguments: list[str] = []
        self._taken = 0  # pieces of _arguments handed out
        self._sent: list[str] = []

    @property
    @abc.abstractmethod
    def _arguments_done(self) -> bool:
        """Whether the arguments' value has ended (each reader knows where)."""

    def take_arguments(self) -> str:
        """The arguments' text not handed out yet (nothing before the name is known)."""
        if self.name is None:
            return ""
        if self._arguments and self._arguments[0] == '"':
            text = json.loads("".join(self._arguments)) if self._arguments_done and not self._sent else ""
        else:
            text = "".join(self._arguments[self._taken:])
            self._taken = len(self._arguments)
        if text:
            self._sent.append(text)
        return text

    @property
    def sent(self) -> str:
        """The arguments handed out: the call's arguments text."""
        return "".join(self._sent)


class _StreamedCall(_Arguments):
    """One Hermes call block's JSON, ``{"name": ..., "arguments": {...}}``, read as it
    arrives: the name once its string is whole, then the arguments' text as the model
    writes it, every character checked (JsonScanner), so what has been handed out is
    always the start of valid JSON and, once the value has ended, all of it.

    Text that is no JSON object is ``opaque`` and left to the format's parser at the
    block's end.
    """

    def __init__(self) -> None:
        super().__init__()
        self._json = JsonScanner()
        self.opaque = False
        self.name: str | None = None
        self.object_done = False  # the call's object closed
        self._key: str | None = None
        self._member: str | None = None  # the top-level member whose value is being read
        self._raw: list[str] = []  # the name's raw text while it is read
        self.arguments_done = False

    @property
    def reading(self) -> bool:
        """Still inside the call's JSON object: a marker here may be a string's text."""
        return not (self.opaque or self._json.failed or self._json.complete)

    def feed(self, text: str) -> int:
        """Read `text`; how many of its characters the JSON took (all, while it is still
        open; up to its last character once it ends; before the one that is no JSON)."""
        for used, ch in enumerate(text):
            if not self.reading:
                return used  # what follows the object (or a fault in it) changes nothing already read
            events = self._json.push(ch)
            if self._json.failed:
                return used  # not JSON: `ch` is not sent, nor anything after it
            keep = self._member is not None
            for event in events:
                if event[0] == "start" and event[1] == 0 and ch != "{":
                    self.opaque = True
                    return used
                if event[0] == "key" and event[1] == 1:
                    self._key = _decoded_key(event[2])
                elif event[0] == "start" and event[1] == 1:
                    self._member, keep = ("arguments" if self._key in ARGUMENT_KEYS else self._key), True
                    if self._member == "arguments" and (self._arguments or self.arguments_done):
                        self._member = "duplicate"  # the first one counts: it may have been sent
                elif event[0] == "end" and event[1] == 1:
                    if event[2]:
                        self._take(ch)
                    self._end_member()
                    keep = False
                elif event[0] == "end" and event[1] == 0:
                    self.object_done = True
            if keep:
                self._take(ch)
        return len(text)

    def _take(self, ch: str) -> None:
        if self._member == "name":
            self._raw.append(ch)
        elif self._member == "arguments":
            self._arguments.append(ch)

    def _end_member(self) -> None:
        if self._member == "name" and self.name is None:
            value = json.loads("".join(self._raw))
            if isinstance(value, str):
                self.name = value
        elif self._member == "arguments":
            self.arguments_done = True
        self._member, self._raw = None, []

    @property
    def _arguments_done(self) -> bool:
        return self.arguments_done

    def final_arguments(self) -> tuple[str, bool]:
        """What remains to hand out at the block's end, and whether the call is whole: its
        arguments a complete JSON object (none at all, in a closed object: ``{}``)."""
        rest = self.take_arguments()
        if not self._arguments:
            if self.object_done and self.name is not None:
                self._sent = ["{}"]
                return "{}", True
            return rest, False
        if not self.arguments_done:
            return rest, False
        return rest, _is_object(self.sent)


class _JsonArguments:
    """A call's arguments written as a JSON object after its name (Kimi K2's
    ``functions.NAME:0<|tool_call_argument_begin|>{...}``), handed out as the model writes
    them, every character checked (JsonScanner): the model's own text, as a Hermes call's
    is. The parse of the whole block decides (`OutputSplitter._close_block`)."""

    def __init__(self) -> None:
        self._json = JsonScanner()
        self._stopped = False  # read no object, or read past its end
        self._sent: list[str] = []

    @classmethod
    def for_parser(cls, parse: Callable) -> _JsonArguments | None:
        """A reader for the format whose parser is `parse` (None: it is not the one this reads)."""
        return cls()

    @property
    def sent(self) -> str:
        return "".join(self._sent)

    @property
    def complete(self) -> bool:
        """Whether the object has ended."""
        return self._json.complete and bool(self._sent)

    def feed(self, text: str) -> str:
        out: list[str] = []
        for ch in text:
            if self._stopped or self._json.complete:
                break
            events = self._json.push(ch)
            if self._json.failed or any(e[:2] == ("start", 0) for e in events) and ch != "{":
                self._stopped = True  # no JSON object (a Python literal, say): the parse decides
                break
            if self._sent or out or ch not in _WHITESPACE:
                out.append(ch)
        piece = "".join(out)
        if piece:
            self._sent.append(piece)
        return piece


class _Gemma4Arguments(_JsonArguments):
    """Gemma 4's arguments, ``{city:<|"|>Paris<|"|>,days:3}`` (after ``call:NAME``), read as
    the JSON that mlx-lm's parser makes of them (``_gemma4_args_to_json``: each ``<|"|>`` string
    a JSON string, each bare key right after "{" or "," quoted) as the model writes them, then
    checked and sent as Kimi K2's JSON is; the parse of the whole block is compared by value,
    so a reading that differs from the parser's makes the call not valid, never another call.
    Each character is read once (a long string or key stays linear)."""

    QUOTE = '<|"|>'  # the format's string delimiter
    PARSER_NEEDS = "_gemma4_args_to_json"  # what this reading follows; gone, the parse alone decides

    def __init__(self) -> None:
        import regex  # mlx-lm's parsers' regex module: its \w is the key rule's

        super().__init__()
        self._word = regex.compile(r"\w+")
        self._pending = ""  # read, not yet turned into JSON: a key that may go on, a delimiter's start
        self._in_string = False
        self._before = "{"  # the last character outside strings ("\x00" after one, as the parser sees it)
        self._word_known = 0  # how many of _pending's first characters are a word's
        self._opening = "{"  # consumed with the name (ToolCallFormat.first_name)

    @classmethod
    def for_parser(cls, parse):
        module = importlib.import_module(parse.__module__)
        return cls() if hasattr(module, cls.PARSER_NEEDS) else None

    def feed(self, text: str) -> str:
        if self._stopped or self._json.complete:
            return ""
        pending, at, out = self._pending + text, 0, [self._opening]
        self._opening = ""
        while at < len(pending):
            if self._in_string:
                end = pending.find(self.QUOTE, at)
                if end < 0:  # the delimiter's start may be being written
                    keep = _marker_start(pending[at:], self.QUOTE)
                    out.append(_escaped(pending[at:len(pending) - keep]))
                    at = len(pending) - keep
                    break
                out.append(_escaped(pending[at:end]) + '"')
                at, self._in_string, self._before = end + len(self.QUOTE), False, "\x00"
                continue
            if pending.startswith(self.QUOTE, at):
                out.append('"')
                at, self._in_string = at + len(self.QUOTE), True
                continue
            if self.QUOTE.startswith(pending[at:]):
                break
            if self._before in "{,":
                end = at + (self._word_known if at == 0 else 0)
                word = self._word.match(pending, end)
                end = word.end() if word is not None else end
                if end == len(pending):
                    self._word_known = end - at
                    break  # a key, if ":" follows it
                self._word_known = 0
                if end > at and pending[end] == ":":
                    out.append(json.dumps(pending[at:end], ensure_ascii=False) + ":")
                    at, self._before = end + 1, ":"
                    continue
            out.append(pending[at])
            self._before = pending[at]
            at += 1
        self._pending = pending[at:]
        return super().feed("".join(out))


# Whole-block formats whose call's arguments are a JSON object (or read as one) written after its name.
_JSON_ARGUMENTS: dict[str, type[_JsonArguments]] = {"kimi_k2": _JsonArguments, "gemma4": _Gemma4Arguments}


def _same_json(a: str, b: str) -> bool:
    """Whether two JSON texts hold the same value: a key named twice (readers keep the first or
    the last) is none, and true, 1 and 1.0 differ (Python's == has them equal)."""
    try:
        return _strict(json.loads(a, parse_constant=_no_constant, object_pairs_hook=_unique_keys)) == \
            _strict(json.loads(b, parse_constant=_no_constant, object_pairs_hook=_unique_keys))
    except (ValueError, RecursionError):
        return False


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise InvalidArgument("a key named twice")
    return out


def _strict(value: Any) -> Any:
    """`value` with each scalar tagged by its type, so == tells true, 1 and 1.0 apart."""
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict(v) for v in value]
    return type(value).__name__, value


_HEADER = re.compile(r"\s*([\w-]+)\s*\[ARGS\]")
_HEADER_SO_FAR = re.compile(r"\s*[\w-]*\s*(?:\[(?:A(?:R(?:G(?:S)?)?)?)?)?")
_LONGEST_HEADER = 256  # longer is no call: the header is matched again at each character


class _HeaderCall(_Arguments):
    """One Mistral call, ``name[ARGS]{...}``, read as it arrives (``_StreamedCall``'s
    interface): the name once ``[ARGS]`` follows it, then the arguments' JSON as the
    model writes it, every character checked. Text that is no such header (the older
    ``[{"name": ...}]`` list) is ``opaque``: left to mlx-lm's parser at the answer's end."""

    def __init__(self) -> None:
        super().__init__()
        self._json = JsonScanner()
        self._header = ""
        self.opaque = False
        self.name: str | None = None

    @property
    def object_done(self) -> bool:
        return self._json.complete

    @property
    def reading(self) -> bool:
        return not (self.opaque or self._json.failed or self._json.complete)

    def feed(self, text: str) -> int:
        for used, ch in enumerate(text):
            if not self.reading:
                return used
            if self.name is None:
                self._header += ch
                named = _HEADER.fullmatch(self._header)
                if named is not None:
                    self.name = named.group(1)
                elif len(self._header) > _LONGEST_HEADER or _HEADER_SO_FAR.fullmatch(self._header) is None:
                    self.opaque = True
                    return used
                continue
            events = self._json.push(ch)
            if self._json.failed or ("end", 0, False) in events:
                return used  # no JSON (or a top-level number ended before it): `ch` is not the arguments'
            if self._arguments or events:
                self._arguments.append(ch)
        return len(text)

    @property
    def _arguments_done(self) -> bool:
        return self._json.complete

    def final_arguments(self) -> tuple[str, bool]:
        rest = self.take_arguments()
        return rest, self._json.complete and _is_object(self.sent)


def _decoded_key(raw: str) -> str:
    return json.loads(f'"{raw}"')


def _is_object(text: str) -> bool:
    """Whether `text` is a JSON object (NaN and Infinity, which Python writes and reads, are no JSON)."""
    try:
        return isinstance(json.loads(text, parse_constant=_no_constant), dict)
    except (ValueError, RecursionError):
        return False


def _no_constant(name: str):
    raise InvalidArgument(f"{name} is not JSON")


# ---- the answer, cut as it streams ----------------------------------------------------

@dataclass(frozen=True)
class Reasoning:
    """Reasoning text (between ``<think>`` and ``</think>``), markers left out."""

    text: str


@dataclass(frozen=True)
class Content:
    """Answer text."""

    text: str


@dataclass(frozen=True)
class CallStart:
    """A tool call's head, sent as soon as its name is known: `index` counts the answer's calls."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    """More of call `index`'s arguments text (the pieces joined are the call's arguments)."""

    index: int
    text: str


@dataclass(frozen=True)
class CallEnd:
    """Call `index` is over: `call` in OpenAI's shape (its arguments the CallArguments
    joined). `valid`: its arguments are a whole JSON object; a call that max_tokens
    cut, or whose arguments the model wrote wrong, has what was sent of them."""

    index: int
    call: dict
    valid: bool


Part = Reasoning | Content | CallStart | CallArguments | CallEnd


@dataclass
class Split:
    """What one piece of output text adds, in order: reasoning, answer text, and
    tool calls (their heads, pieces of their arguments, their ends)."""

    parts: list[Part] = field(default_factory=list)

    def add(self, part: Part) -> None:
        """Append `part`, joined to the last part when both are text of one kind or pieces of
        one call's arguments; empty text is dropped."""
        if isinstance(part, (Reasoning, Content, CallArguments)) and not part.text:
            return
        last = self.parts[-1] if self.parts else None
        if isinstance(part, (Reasoning, Content)) and type(last) is type(part):
            self.parts[-1] = type(part)(last.text + part.text)
        elif isinstance(part, CallArguments) and isinstance(last, CallArguments) and last.index == part.index:
            self.parts[-1] = CallArguments(part.index, last.text + part.text)
        else:
            self.parts.append(part)

    @property
    def reasoning(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, Reasoning))

    @property
    def content(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, Content))

    @property
    def tool_calls(self) -> list[dict]:
        """The calls that ended in this piece."""
        return [p.call for p in self.parts if isinstance(p, CallEnd)]


@dataclass
class _Block:
    """One tool-call block being read: its text, and its call once it has a head."""

    pieces: list[str] = field(default_factory=list)  # its text, joined when read (a long block is not copied per piece)
    length: int = 0
    scanner: _StreamedCall | None = None
    index: int | None = None  # the call's, once its head was sent
    id: str = ""
    name: str = ""
    dropped: bool = False  # past the calls allowed (parallel calls off): its call is not sent
    lead: str = ""  # a bare call's text before its object (whitespace, ";", the call token)
    # A whole block's arguments as they are written.
    preview: TaggedArguments | _JsonArguments | literal_arguments.CodeArguments | None = None
    marked: bool = True  # opened by the start marker (not a call after a Mistral call)

    @property
    def text(self) -> str:
        if len(self.pieces) > 1:
            self.pieces[:] = ["".join(self.pieces)]
        return self.pieces[0] if self.pieces else ""

    def add(self, text: str) -> None:
        self.pieces.append(text)
        self.length += len(text)


class OutputSplitter:
    """Cuts a chat answer, as it streams, into reasoning, content and tool calls.

    `thinking`: the answer may open with ``<think>`` (or the prompt already
    opened it: `in_reasoning`), and everything up to ``</think>`` is
    reasoning. `tool_format`: blocks between its markers are tool calls. A
    marker split across pieces is held back until it is whole, so nothing of
    it leaks into content.

    A call streams as it is written where its format allows it (JSON arguments:
    Hermes, Llama 3's, Mistral's; ``ToolCallFormat.streams``): its head (id and
    name) once the name is whole, then its arguments' text as it comes, checked character by
    character, so the pieces sent are always the start of valid JSON and the
    call's final arguments are exactly the pieces joined (the model's own text,
    its whitespace included). Formats whose arguments cannot be cut while
    incomplete (mlx-lm's other tool parsers) send their first call's head once
    its name is written (``ToolCallFormat.first_name``), and the rest when the
    block ends and parses; a block that does not parse, and has sent nothing,
    stays content, as does anything before a name is whole. The XML-like formats'
    calls (``xml_arguments``) also send their arguments as the JSON their parser
    will make of them, while they are written, and Kimi K2's (and a Kimi K3 JSON
    block's, and Gemma 4's read as JSON) as the model writes the JSON
    (``ToolCallFormat.preview``); the parse at
    the block's end sends the rest, or, where what was sent is not its start (its
    value, for JSON the model wrote), leaves the call not `valid`.

    What was sent cannot be taken back: a block that has sent its head is a call
    whatever follows. If it ends without whole arguments (max_tokens cut it, the
    model stopped or wrote something that is not JSON), it keeps the arguments
    text sent so far and is not `valid`; `finish_reason` then stays the engine's
    ("stop" or "length") rather than "tool_calls", which promises calls to run.
    Text after the arguments' end inside the block (a missing closing brace, a
    stray key) does not unmake a call whose name and arguments are whole.

    A format without an end marker (Mistral's) ends a call where its JSON ends (or
    breaks off); another call may follow, after its own marker or not, and any
    other text after the calls is the answer's.

    `max_calls`: calls past it (parallel calls off: 1) are read and dropped, whole
    or not, once they have named themselves.
    `forced_name`: a grammar makes the answer open with a call of this name
    (a named tool_choice, or "required" with one tool): its head is sent with
    the answer's first piece (after any reasoning), before the model has
    written it.
    `calls_only`: a grammar lets the answer hold calls alone (tool_choice "required" or
    named): text outside them (whitespace, a marker that max_tokens cut) is no content.
    """

    def __init__(self, *, thinking: bool = False, in_reasoning: bool = False,
                 tool_format: ToolCallFormat | None = None, tools: list[dict] | None = None,
                 max_calls: int | None = None, forced_name: str | None = None, calls_only: bool = False):
        self.thinking = thinking
        self._in_reasoning = in_reasoning
        self._may_open = thinking and not in_reasoning  # <think> only at the start
        self._after_reasoning = False
        self._format = tool_format
        self._tools = tools
        self._max_calls = max_calls
        self._forced_name = forced_name if tool_format is not None else None
        self._calls_only = calls_only and tool_format is not None
        self._awaiting: _Block | None = None  # a forced call's block, its head sent, before its marker
        self._pending = ""  # text not yet assigned
        self._block: _Block | None = None  # inside a tool-call block
        self._started = 0  # call heads sent
        # A format without markers (Llama 3's): a call may open only where the answer starts
        # or after a call; once the answer is text, it stays text.
        self._bare_opens = True
        self._after_call = False
        self.tool_calls: list[dict] = []  # the calls that ended
        self._all_valid = True
        # Tokens written inside the reasoning block, the one that completes its opening marker
        # and its end marker included (chat's completion_tokens_details, Responses'
        # output_tokens_details); pieces of a marker written in several tokens are held before
        # it is whole, so only its last counts.
        self.reasoning_tokens = 0

    def feed(self, text: str, *, token: bool = True) -> Split:
        """What `text` adds; `token`: a token wrote it (the engine's last delta may not), counted
        in `reasoning_tokens` when it is inside the block or opens it."""
        inside = self._in_reasoning
        self._pending += text
        split = self._drain(final=False)
        if token and (inside or self._in_reasoning):
            self.reasoning_tokens += 1
        return split

    def flush(self) -> Split:
        return self._drain(final=True)

    @property
    def reasoning(self) -> bool:
        """Inside the reasoning block (its end marker not yet read)."""
        return self._in_reasoning

    def finish_reason(self, reason: str | None) -> str | None:
        """Chat's finish_reason for an answer the engine ended with `reason`: "tool_calls"
        when it stopped after calls that are all whole."""
        if reason == "stop" and self.tool_calls and self._all_valid:
            return "tool_calls"
        return reason

    def _drain(self, final: bool) -> Split:
        out = Split()
        while self._pending:
            if self._may_open:
                stripped = self._pending.lstrip()
                if stripped.startswith(THINK_START):
                    self._pending = stripped[len(THINK_START):]
                    self._in_reasoning, self._may_open = True, False
                    continue
                if THINK_START.startswith(stripped) and not final:
                    break  # maybe the start of <think>
                self._may_open = False
            if self._in_reasoning:
                done, rest, found = _cut(self._pending, THINK_END, final)
                out.add(Reasoning(done))
                self._pending = rest
                if not found:
                    break
                self._in_reasoning, self._after_reasoning = False, True
                continue
            if self._after_reasoning:  # the newlines after </think> are no answer (all of it, if nothing else)
                stripped = self._pending.lstrip("\n")
                if not stripped and not final:
                    break
                self._pending, self._after_reasoning = stripped or self._pending, False
            if self._forced_name is not None:  # the answer begins: the grammar writes this call
                self._awaiting = self._head(_Block(), self._forced_name, out)
                self._forced_name = None
            if self._block is not None:
                assert self._format is not None
                scanner = self._block.scanner
                if scanner is not None and scanner.reading:
                    # Inside the call's JSON the end marker may be a string's text ("</tool_call>"
                    # in arguments that are code): the block can end only after the object.
                    used = self._read_block(self._pending, out)
                    self._pending = self._pending[used:]
                    continue
                if self._format.markerless:  # the object ended (or was no JSON): so did the call
                    block = self._block
                    self._close_block(out, complete=True)
                    # A call (one dropped, past the calls allowed, too) may be followed by more;
                    # an object that is no call made the answer text.
                    self._after_call = block.index is not None or (
                        block.dropped and _names_a_tool(block.scanner.name, self._tools))
                    self._bare_opens = self._after_call
                    continue
                if not self._format.end:  # no end marker (Mistral's): a call ends where its JSON does
                    block = self._block
                    if scanner is not None and (block.index is not None or scanner.name is not None):
                        # Its JSON ended or broke off (a call past those allowed too): another call
                        # may follow, with or without the start marker, or the answer's text.
                        self._close_block(out, complete=True)
                        self._open_block(_Block(marked=False))
                        continue
                    if scanner is not None and scanner.opaque and not block.marked:
                        # No call after a call: the answer's text, in which a marker opens a block again.
                        self._pending, self._block = block.text + self._pending, None
                        continue
                    # After the start marker, no header: the older [{"name": ...}] list, read to the end.
                    self._read_block(self._pending, out)
                    self._pending = ""
                    break
                done, rest, found = _cut(self._pending, self._format.end, final)
                self._pending = rest
                self._read_block(done, out)
                if not found:
                    break
                self._close_block(out, complete=True)
                continue
            if self._format is None or (self._format.markerless and not self._bare_opens):
                out.add(Content(self._pending))
                self._pending = ""
                break
            if self._format.markerless:
                opened = self._bare_call_opens(final)
                if opened is None:
                    break  # only whitespace, or the start of the call token, so far
                self._bare_opens = opened
                continue
            if self._awaiting is not None:  # the grammar writes the forced call's marker first
                start = self._format.start
                if self._pending.startswith(start):
                    self._pending = self._pending[len(start):]
                    self._open_block(self._awaiting)
                    self._awaiting = None
                    continue
                if start.startswith(self._pending):
                    if not final:
                        break
                    self._pending = ""  # cut before the marker was whole: the marker was the call's
                self._end_call(self._awaiting, out)  # it never came
                self._awaiting = None
                continue
            done, rest, found = _cut(self._pending, self._format.start, final)
            if not self._calls_only:
                out.add(Content(done))
            self._pending = rest
            if not found:
                break
            self._open_block(_Block())
        if final:
            if self._forced_name is not None and not self.thinking:  # nothing at all was written
                self._awaiting = self._head(_Block(), self._forced_name, out)
                self._forced_name = None
            if self._block is not None:  # an unfinished block: the model stopped mid-call
                self._close_block(out, complete=False)
            if self._awaiting is not None:  # nothing at all was written
                self._end_call(self._awaiting, out)
                self._awaiting = None
        return out

    def _bare_call_opens(self, final: bool) -> bool | None:
        """At a place a bare call may open: open its block (True), or say the rest is text
        (False); None: too little text yet to tell."""
        text = self._pending.lstrip()
        if self._after_call and text.startswith(";"):
            text = text[1:].lstrip()
        if text.startswith(LLAMA3_PYTHON_TAG):
            text = text[len(LLAMA3_PYTHON_TAG):].lstrip()
        if text.startswith("{"):
            lead, self._pending = self._pending[:len(self._pending) - len(text)], text
            self._open_block(_Block(lead=lead))
            return True
        if not final and (not text or LLAMA3_PYTHON_TAG.startswith(text)):
            return None
        return False

    def _room(self) -> int:
        return 1 << 30 if self._max_calls is None else self._max_calls - self._started

    def _open_block(self, block: _Block) -> None:
        assert self._format is not None
        if block.index is None and self._room() <= 0:
            block.dropped = True
        # Even a dropped call is read: a bare call's block (and a Mistral call's) ends where
        # its JSON does, and a broken one is dropped, not sent as text, once it has named itself.
        block.scanner = self._format.scanner()
        self._block = block

    def _head(self, block: _Block, name: str, out: Split) -> _Block:
        block.index, block.id, block.name = self._started, new_call_id(), name
        self._started += 1
        out.add(CallStart(block.index, block.id, name))
        return block

    def _read_block(self, text: str, out: Split) -> int:
        """Read block text: all of it, or (a scanner still reading) what its JSON took; how much."""
        block = self._block
        assert block is not None
        scanner = block.scanner
        if scanner is None:
            block.add(text)
            new_text = text  # what the block's preview has not read
            early = self._format.first_name if self._format is not None else None
            seeking = block.length - len(text) < _NAME_WINDOW
            if early is not None and block.index is None and not block.dropped and seeking:
                named = early.search(block.text[:_NAME_WINDOW])
                if named is not None:
                    self._head(block, named.group(1), out)
                    block.preview = self._format.preview(block.name, self._tools)
                    new_text = block.text[named.end():]
            if block.preview is not None:
                out.add(CallArguments(block.index, block.preview.feed(new_text)))
            return len(text)
        reading = scanner.reading
        used = scanner.feed(text)
        if not reading:
            used = len(text)
        block.add(text[:used])
        assert self._format is not None
        if block.index is None and scanner.name is not None and not block.dropped and (
                not self._format.markerless or _names_a_tool(scanner.name, self._tools)):
            self._head(block, scanner.name, out)
        if block.index is not None:
            out.add(CallArguments(block.index, scanner.take_arguments()))
        return used

    def _close_block(self, out: Split, complete: bool) -> None:
        """The block ends (`complete`: at its end marker, else where the answer stopped)."""
        assert self._format is not None
        block, self._block = self._block, None
        assert block is not None
        if block.dropped and self._named_a_call(block):
            return  # past the calls allowed: read and dropped, whole or not
        if block.index is not None and block.scanner is None:  # a whole block whose first name went early
            calls = self._parsed(block) or []
            sent = block.preview.sent if block.preview is not None else ""
            first = calls.pop(0)["function"] if calls else None  # the head's call, whatever its name
            arguments = first["arguments"] if first is not None and first["name"] == block.name else None
            if arguments is not None and block.preview is not None and block.preview.complete \
                    and _same_json(sent, arguments):
                self._finish(block, sent, _is_object(sent), out)  # the model's own JSON, as the parse reads it
            elif arguments is not None and arguments.startswith(sent):
                out.add(CallArguments(block.index, arguments[len(sent):]))
                self._finish(block, arguments, _is_object(arguments), out)
            else:  # sent is sent: a call with what was sent of its arguments, not valid
                self._finish(block, sent, False, out)
            if complete:
                self._whole_calls(calls, out)
            else:  # the head's call was the first of those written whole, if any were
                self._whole_calls(self._format.cut_block_calls(block.text, self._tools)[1:], out)
            return
        if block.index is not None:  # its head was sent: a call, whole or not
            self._end_call(block, out)
            return
        calls = self._parsed(block)
        if calls is None:  # unparsed text stays text (under a grammar of calls alone, a call cut before its name)
            start = self._format.start if block.marked else ""
            if not self._calls_only:
                out.add(Content(block.lead + start + block.text + (self._format.end if complete else "")))
            return
        self._whole_calls(calls, out)

    def _named_a_call(self, block: _Block) -> bool:
        """Whether a streamed block's JSON named its call (a tool's, where the format has no
        markers): a call, whatever follows the name."""
        assert self._format is not None
        name = block.scanner.name if block.scanner is not None else None
        return name is not None and (not self._format.markerless or _names_a_tool(name, self._tools))

    def _parsed(self, block: _Block) -> list[dict] | None:
        """The calls the format's parser reads in the block's text (None: it reads none)."""
        assert self._format is not None
        try:
            return self._format.calls(block.text, self._tools)
        except Exception:  # noqa: BLE001 - parsers raise what they like
            return None

    def _whole_calls(self, calls: list[dict], out: Split) -> None:
        """Send parsed calls whole (head, arguments, end), as many as the calls allowed leave room for."""
        for call in calls[:max(0, self._room())]:
            whole = self._head(_Block(), call["function"]["name"], out)
            arguments = call["function"]["arguments"]
            out.add(CallArguments(whole.index, arguments))
            self._finish(whole, arguments, _is_object(arguments), out)

    def _end_call(self, block: _Block, out: Split) -> None:
        """End a call whose head was sent, with what its text holds."""
        scanner = block.scanner
        rest, valid = scanner.final_arguments() if scanner is not None else ("", False)
        out.add(CallArguments(block.index, rest))
        # A forced name that the model did not write after all is not the call it was sent as.
        valid = valid and scanner is not None and scanner.name == block.name
        self._finish(block, scanner.sent if scanner is not None else "", valid, out)

    def _finish(self, block: _Block, arguments: str, valid: bool, out: Split) -> None:
        call = {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}
        self.tool_calls.append(call)
        self._all_valid = self._all_valid and valid
        out.add(CallEnd(block.index, call, valid))


def _cut(text: str, marker: str, final: bool) -> tuple[str, str, bool]:
    """(text before `marker`, text after it, found). Not found: a tail that may
    begin the marker is kept back (unless `final`)."""
    at = text.find(marker)
    if at >= 0:
        return text[:at], text[at + len(marker):], True
    if final:
        return text, "", False
    keep = _marker_start(text, marker)
    return text[:len(text) - keep], text[len(text) - keep:], False
