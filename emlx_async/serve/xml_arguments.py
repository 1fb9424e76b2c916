"""The arguments of a call in Qwen3-Coder's XML format, sent as JSON while the model writes them.

Qwen3-Coder (and Qwen3.5, Qwen3-Next) write a call as::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

mlx-lm's parser (``mlx_lm.tool_parsers.qwen3_coder``) reads a whole block and types each
value from the tool's schema. `Qwen3CoderArguments` reads the block as it comes and hands out
the start of the JSON text that parser will make of it (``json.dumps`` of its arguments): each
key once its name is whole, a string's characters as they are written (an untyped parameter's
too), any other value once its ``</parameter>`` has come, converted by mlx-lm's own function.
The closing brace is left to the parse of the whole block, which is the call's truth: what was
handed out is a prefix of it whenever the model wrote the format as its parser reads it. A
parameter named twice (the parser keeps the last value at the first one's place) or a block
the parser reads otherwise makes what was sent no prefix; the call is then not valid, as a
streamed JSON call cut short is not.
"""

from __future__ import annotations

import importlib
import json
from types import ModuleType

PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"
_NAME_ENDS = set("<>")  # and whitespace: the parser's names are [^\s<>]+
_LONGEST_NAME = 256
_NULL = "null"  # any case: the parser makes it None whatever the type


def _parser() -> ModuleType | None:
    """mlx-lm's qwen3_coder parser, if it still has the private pieces this reader uses."""
    try:
        module = importlib.import_module("mlx_lm.tool_parsers.qwen3_coder")
    except ImportError:
        return None
    needed = ("_convert_param_value", "_get_arguments_config", "_string_types")
    return module if all(hasattr(module, name) for name in needed) else None


class Qwen3CoderArguments:
    """One qwen3_coder call's arguments, read from the text after ``<function=NAME>``."""

    def __init__(self, name: str, tools: list[dict] | None, parser: ModuleType) -> None:
        self._parser = parser
        self._config = parser._get_arguments_config(name, tools)
        self._text = ""
        self._at = 0  # where reading resumes in _text
        self._state = "between"  # "between" parameters, in a parameter's "name", in its "value"
        self._key = ""
        self._value_start = 0
        self._keys: set[str] = set()
        self._search = 0  # where ``</parameter>`` is sought next
        self._opened = False  # a string value's opening quote was sent
        self._streamed = 0  # where a string value's unsent characters begin in _text
        self._frozen = False  # read something the JSON so far cannot follow: send nothing more
        self._sent: list[str] = []

    @property
    def sent(self) -> str:
        """The JSON text handed out."""
        return "".join(self._sent)

    @classmethod
    def for_call(cls, name: str, tools: list[dict] | None) -> Qwen3CoderArguments | None:
        parser = _parser()
        return None if parser is None else cls(name, tools, parser)

    def feed(self, text: str) -> str:
        """Read more of the call's text; the JSON text it adds to what was sent."""
        self._text += text
        before = len(self._sent)
        while not self._frozen and self._step():
            pass
        return "".join(self._sent[before:])

    def _step(self) -> bool:
        """Read as far as the text allows in the current state; whether the state changed."""
        if self._state == "between":
            at = self._text.find(PARAMETER_OPEN, self._at)
            if at < 0:
                self._at = max(self._at, len(self._text) - len(PARAMETER_OPEN) + 1)
                return False
            self._at, self._state = at + len(PARAMETER_OPEN), "name"
            return True
        if self._state == "name":
            return self._read_name()
        return self._read_value()

    def _read_name(self) -> bool:
        head = self._text[self._at:self._at + _LONGEST_NAME]
        start = len(head) - len(head.lstrip())
        end = start
        while end < len(head) and not (head[end].isspace() or head[end] in _NAME_ENDS):
            end += 1
        if end == len(head):
            self._frozen = len(head) == _LONGEST_NAME  # no schema names one so long; it is not followed
            return False  # the name may go on
        if end == start:
            self._frozen = True  # no name: the parser skips this parameter, a case not followed here
            return False
        key = head[start:end]
        if key in self._keys:
            self._frozen = True  # named twice: the parser keeps the last value at the first place
            return False
        self._keys.add(key)
        self._key, self._state = key, "value"
        self._value_start = self._search = self._at + end + (head[end] == ">")
        self._send(("{" if not self._sent else ", ") + json.dumps(key, ensure_ascii=False) + ": ")
        return True

    def _read_value(self) -> bool:
        text, start = self._text, self._value_start
        if start == len(text):
            return False  # the first character tells whether a newline is dropped
        if text[start] == "\n":
            start += 1
        close = text.find(PARAMETER_CLOSE, max(start, self._search))
        if close >= 0:
            end = close - (close > start and text[close - 1] == "\n")
            self._end_value(start, end)
            self._at, self._state, self._opened = close + len(PARAMETER_CLOSE), "between", False
            return True
        self._search = len(text) - len(PARAMETER_CLOSE) + 1  # a marker cut here begins after this
        if self._is_string():
            tail = text[max(start, len(text) - len(PARAMETER_CLOSE) - 1):]
            self._stream(text, start, len(text) - _held_back(tail))
        return False

    def _is_string(self) -> bool:
        """Whether the parser keeps this parameter's text as it is (unless it reads "null")."""
        schema = self._config.get(self._key, False)
        if not schema:
            return True
        return "type" in schema and str(schema["type"]).strip().lower() in self._parser._string_types

    def _stream(self, text: str, start: int, ready: int) -> None:
        """Send a string value's characters text[start:ready] (all of it that cannot yet be its end)."""
        if not self._opened:
            if _NULL.startswith(text[start:ready].lower()):
                return  # may still be "null", which is no string
            self._opened, self._streamed = True, start
            self._send('"')
        if ready > self._streamed:
            self._send(_escaped(text[self._streamed:ready]))
            self._streamed = ready

    def _end_value(self, start: int, end: int) -> None:
        if self._opened:
            self._send(_escaped(self._text[self._streamed:end]) + '"')
            return
        try:
            converted = self._parser._convert_param_value(self._text[start:end], self._key, self._config)
            self._send(json.dumps(converted, ensure_ascii=False))
        except Exception:  # noqa: BLE001 - the parse will fail on it too: the call is not valid
            self._frozen = True

    def _send(self, text: str) -> None:
        self._sent.append(text)


def _escaped(text: str) -> str:
    """`text` as it reads inside a JSON string (json.dumps escapes each character alone, so
    pieces escaped apart join to the whole's escape)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _held_back(raw: str) -> int:
    """How many of a value's last characters may yet be its end: the start of ``</parameter>``,
    after the one newline the parser drops before it."""
    for n in range(min(len(raw), len(PARAMETER_CLOSE)), 0, -1):
        if PARAMETER_CLOSE.startswith(raw[-n:]):
            return n + (raw[:-n].endswith("\n"))
    return 1 if raw.endswith("\n") else 0
