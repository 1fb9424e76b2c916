"""Tool calling and reasoning for the chat API: what the model is told, and what
its answer is split into.

- Tools reach the model through its chat template (Hugging Face's
  ``tools=`` convention). A template that does not render tools (SmolLM2's)
  gets ``fallback_messages``: a system-prompt block that lists the tools and
  asks for Hermes-style calls, ``<tool_call>{"name": ..., "arguments": ...}
  </tool_call>``; assistant tool calls and tool results in the history are
  written the same way.
- ``ToolCallFormat``: where a call starts and ends in the output and how its
  text parses, from mlx-lm's ``tool_parsers`` (chosen from the template as
  mlx-lm chooses), Hermes JSON otherwise.
- ``call_grammar``: for ``tool_choice`` "required" or a named function, a
  grammar that only lets the model write valid calls of the given tools.
- ``OutputSplitter``: the streamed text cut into reasoning (``<think>``),
  content and tool calls.
"""

from __future__ import annotations

import importlib
import json
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

THINK_START, THINK_END = "<think>", "</think>"
HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"

FALLBACK_INSTRUCTIONS = (
    "You can call functions. The available functions, as JSON schemas:\n{tools}\n"
    "To call a function, answer with one block per call, exactly:\n"
    "<tool_call>\n{{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}}\n</tool_call>"
)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def template_renders_tools(chat_template: str | None) -> bool:
    """Whether the template reads ``tools`` (Hugging Face's convention); else the fallback block is used."""
    return bool(chat_template) and "tools" in chat_template


def template_thinks(chat_template: str | None) -> bool:
    return bool(chat_template) and THINK_START in chat_template and THINK_END in chat_template


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


@dataclass(frozen=True)
class ToolCallFormat:
    """How one template's model writes a tool call: start and end markers and a parser
    (``parse(text, tools) -> {"name", "arguments"}`` or a list of them)."""

    start: str
    end: str
    parse: Any
    name: str = "json_tools"

    @classmethod
    def for_template(cls, chat_template: str | None) -> ToolCallFormat:
        if not template_renders_tools(chat_template):
            return cls.hermes()
        # mlx-lm's own choice from the template text; private there, hence guarded.
        try:
            from mlx_lm.tokenizer_utils import _infer_tool_parser

            name = _infer_tool_parser(SimpleNamespace(chat_template=chat_template, get_vocab=dict))
        except Exception:  # noqa: BLE001 - any failure here just means Hermes
            name = None
        if name is None:
            return cls.hermes()
        module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
        return cls(module.tool_call_start, module.tool_call_end, module.parse_tool_call, name)

    @classmethod
    def hermes(cls) -> ToolCallFormat:
        from mlx_lm.tool_parsers import json_tools

        return cls(json_tools.tool_call_start, json_tools.tool_call_end, json_tools.parse_tool_call)

    def calls(self, text: str, tools: list[dict] | None) -> list[dict]:
        """The calls in one block's text, in OpenAI's shape (arguments as JSON text); ValueError if none parse."""
        parsed = self.parse(text, tools)
        parsed = parsed if isinstance(parsed, list) else [parsed]
        out = []
        for call in parsed:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise ValueError(f"a tool call without a name: {text[:60]!r}")
            arguments = call.get("arguments", {})
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            out.append({"id": new_call_id(), "type": "function",
                        "function": {"name": call["name"], "arguments": arguments}})
        return out


def call_grammar(tools: list[dict], *, name: str | None, parallel: bool):
    """A Grammar whose outputs are Hermes calls (``<tool_call>`` JSON ``</tool_call>``) of `tools`
    (of the one named `name`); one call, or one or more when `parallel`."""
    from emlx_async.llm.grammar import Grammar

    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    variants = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                 "properties": {"name": {"const": f["name"]},
                                "arguments": f.get("parameters") or {"type": "object"}}} for f in chosen]
    schema = dict(variants[0]) if len(variants) == 1 else {"anyOf": variants}
    # One canonical JSON layout, as Grammar.json_schema has it: with free whitespace
    # a weak model can write newlines inside the call until max_tokens.
    schema["x-guidance"] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    repeat = ' ("\\n" call)*' if parallel else ""
    text = (f'start: call{repeat}\n'
            f'call: "{HERMES_START}\\n" body "\\n{HERMES_END}"\n'
            f'body: %json {json.dumps(schema)}\n')
    return Grammar.lark(text)


def json_pieces(text: str, piece_chars: int = 16) -> list[str]:
    """A call's arguments (JSON text) in the pieces a stream sends them in."""
    return [text[i:i + piece_chars] for i in range(0, len(text), piece_chars)] or [""]


def allowed_calls(calls: list[dict], parallel: bool, already: int = 0) -> list[dict]:
    """The calls a request lets through, `already` sent: one in all when parallel calls are off."""
    return calls if parallel else calls[:max(0, 1 - already)]


@dataclass
class Split:
    """What one piece of output text adds: reasoning, answer text, finished tool calls."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)


class OutputSplitter:
    """Cuts a chat answer, as it streams, into reasoning, content and tool calls.

    `thinking`: the answer may open with ``<think>`` (or the prompt already
    opened it: `in_reasoning`), and everything up to ``</think>`` is
    reasoning. `tool_format`: blocks between its markers are tool calls
    (held back until the block ends, then parsed; a block that does not
    parse stays content). A marker split across pieces is held back until
    it is whole, so nothing of it leaks into content.
    """

    def __init__(self, *, thinking: bool = False, in_reasoning: bool = False,
                 tool_format: ToolCallFormat | None = None, tools: list[dict] | None = None):
        self.thinking = thinking
        self._in_reasoning = in_reasoning
        self._may_open = thinking and not in_reasoning  # <think> only at the start
        self._format = tool_format
        self._tools = tools
        self._pending = ""  # text not yet assigned
        self._call: str | None = None  # inside a tool-call block: its text so far
        self.tool_calls: list[dict] = []

    def feed(self, text: str) -> Split:
        self._pending += text
        return self._drain(final=False)

    def flush(self) -> Split:
        return self._drain(final=True)

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
                out.reasoning += done
                self._pending = rest
                if not found:
                    break
                self._in_reasoning = False
                self._pending = self._pending.lstrip("\n") if self._pending.strip() else self._pending
                continue
            if self._call is not None:
                assert self._format is not None
                done, rest, found = _cut(self._pending, self._format.end, final)
                self._call += done
                self._pending = rest
                if not found:
                    break
                self._close_call(out, complete=True)
                continue
            if self._format is None:
                out.content += self._pending
                self._pending = ""
                break
            done, rest, found = _cut(self._pending, self._format.start, final)
            out.content += done
            self._pending = rest
            if not found:
                break
            self._call = ""
        if final and self._call is not None:  # an unfinished block: the model stopped mid-call
            self._close_call(out, complete=False)
        return out

    def _close_call(self, out: Split, complete: bool) -> None:
        assert self._format is not None
        text, self._call = self._call or "", None
        try:
            calls = self._format.calls(text, self._tools)
        except Exception:  # noqa: BLE001 - parsers raise what they like; unparsed text stays text
            end = self._format.end if complete else ""
            out.content += self._format.start + text + end
            return
        out.tool_calls += calls
        self.tool_calls += calls


def _cut(text: str, marker: str, final: bool) -> tuple[str, str, bool]:
    """(text before `marker`, text after it, found). Not found: a tail that may
    begin the marker is kept back (unless `final`)."""
    at = text.find(marker)
    if at >= 0:
        return text[:at], text[at + len(marker):], True
    if final:
        return text, "", False
    keep = 0
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            keep = n
            break
    return text[:len(text) - keep], text[len(text) - keep:], False
