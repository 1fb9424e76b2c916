"""Streamed arguments of the tool-call formats that write them as code: Python-style calls
(``[get_weather(city="Paris", days=3)]``, LFM2's; mlx-lm's ``pythonic`` parser reads them with
Python's own ``ast``) and FunctionGemma's (``call:get_weather{city:<escape>Paris<escape>,days:3}``).

Each reader takes the text after the call's name (``ToolCallFormat.first_name`` consumed the
opening bracket) and hands out the JSON that ``json.dumps`` makes of the parser's arguments,
byte for byte, as the model writes them: a string value as its characters come, any other value
once it has ended. So what was sent is always the start of the parse's JSON; where the reader
meets text it does not follow (an escape it does not decode, an expression, a second string
joined to the first) it stops, and the parse of the whole block sends the rest
(``OutputSplitter._close_block``: the parse decides, and a call whose sent start the parse
does not begin with is not valid).
"""

from __future__ import annotations

import abc
import ast
import importlib
import json
import keyword
import re
from collections.abc import Callable
from typing import Any

from .xml_arguments import _escaped, _marker_start

# json.dumps's default separators: the parse's arguments text is json.dumps(arguments).
_ITEM, _KEY = ", ", ": "
_SPACE = " \t\r\n\f\v"
# The escapes a streamed Python string decodes (one whole escape at the text's start); any
# other (octal, \N{...}, a line continuation, an unknown one) stops the reader.
_PYTHON_ESCAPE = re.compile(r'\\(?:[\\\'"abfnrtv]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})')
_LONGEST_ESCAPE = 10  # a \U escape: the backslash, U and eight hex digits


class CodeArguments(abc.ABC):
    """What both readers share: the JSON handed out, whether the call's arguments ended, and
    whether the reader stopped following the text."""

    PARSER_NEEDS: tuple[str, ...] = ()  # the parser module's pieces the reading follows

    def __init__(self) -> None:
        self._sent: list[str] = []
        self._pending = ""  # read, not yet decided (a marker's or an escape's start)
        self._stopped = False
        self._done = False
        self._items = 0  # arguments opened so far

    @classmethod
    def for_parser(cls, parse: Callable) -> CodeArguments | None:
        """A reader for the format whose parser is `parse` (None: the parser no longer has
        what this reading follows; its parse alone then decides)."""
        module = importlib.import_module(parse.__module__)
        return cls() if all(hasattr(module, name) for name in cls.PARSER_NEEDS) else None

    @property
    def sent(self) -> str:
        return "".join(self._sent)

    @property
    def complete(self) -> bool:
        """Whether the call's arguments have ended and all of them were handed out."""
        return self._done

    def feed(self, text: str) -> str:
        if self._stopped or self._done or not text:
            return ""
        out: list[str] = []
        self._read(self._pending + text, out)
        piece = "".join(out)
        if piece:
            self._sent.append(piece)
        return piece

    @abc.abstractmethod
    def _read(self, text: str, out: list[str]) -> None:
        """Read `text` (what was pending, then the new piece), appending the JSON it makes to `out`."""

    def _open_item(self, key: str, out: list[str]) -> None:
        out.append(("{" if self._items == 0 else _ITEM) + json.dumps(key, ensure_ascii=False) + _KEY)
        self._items += 1

    def _close(self, out: list[str]) -> None:
        out.append("{}" if self._items == 0 else "}")
        self._done = True

    def _stop(self) -> None:
        self._stopped, self._pending = True, ""


class PythonicArguments(CodeArguments):
    """A Python call's keyword arguments, ``city="Paris", days=3)``, as the JSON mlx-lm's
    ``pythonic`` parser makes of them (``ast.literal_eval`` of each value, JSON's true, false
    and null read as Python's). A plain quoted string streams its characters (its common
    escapes decoded); any other value is read whole at the comma or parenthesis that ends it."""

    PARSER_NEEDS = ("_JSONLiterals",)

    def __init__(self) -> None:
        super().__init__()
        self._state = "key"  # key, name, equals, value, string, string_end, bare
        self._name: list[str] = []
        self._quote = ""
        self._string_special: re.Pattern | None = None
        self._bare: list[str] = []  # a bare value's text
        self._depth = 0  # brackets open in a bare value
        self._in_quote = ""  # the quote of a string inside a bare value
        self._escaping = False

    def _read(self, text: str, out: list[str]) -> None:
        at, self._pending = 0, ""
        while at < len(text) and not (self._stopped or self._done):
            state, ch = self._state, text[at]
            if state == "string":
                at = self._read_string(text, at, out)
                continue
            if state == "bare":
                at = self._read_bare(text, at, out)
                continue
            at += 1
            if state == "key":
                if ch in _SPACE:
                    continue
                if ch == ")":
                    self._close(out)
                elif ch.isascii() and ch.isidentifier():  # Python reads others NFKC-normalized
                    self._state, self._name = "name", [ch]
                else:
                    self._stop()
            elif state == "name":
                if ch.isascii() and (ch == "_" or ch.isalnum()):
                    self._name.append(ch)
                elif ch in _SPACE or ch == "=":
                    self._state = "equals"
                    if ch == "=":
                        self._equals(out)
                else:
                    self._stop()
            elif state == "equals":
                if ch == "=":
                    self._equals(out)
                elif ch not in _SPACE:
                    self._stop()
            elif state == "value":
                if ch in _SPACE:
                    continue
                if ch in "\"'":
                    self._state, self._quote = "string", ch
                    self._string_special = re.compile("[\\\\\n" + ch + "]")
                    out.append('"')
                else:
                    self._state, self._bare, self._depth, self._in_quote = "bare", [], 0, ""
                    at -= 1  # the bare value's first character
            elif state == "string_end":
                if ch in _SPACE:
                    continue
                if ch in ",)":
                    out.append('"')
                    self._after_value(ch, out)
                else:  # another string joined to it, or an expression: the parse decides
                    self._stop()

    def _equals(self, out: list[str]) -> None:
        name = "".join(self._name)
        if keyword.iskeyword(name):  # Python's parse fails (if=1): the parser's regex reads the call
            self._stop()
            return
        self._open_item(name, out)
        self._state = "value"

    def _after_value(self, ch: str, out: list[str]) -> None:
        if ch == ")":
            self._close(out)
        else:
            self._state = "key"

    def _read_string(self, text: str, at: int, out: list[str]) -> int:
        assert self._string_special is not None
        special = self._string_special.search(text, at)
        end = len(text) if special is None else special.start()
        if end > at:
            out.append(_escaped(text[at:end]))
        if special is None:
            return end
        ch = text[end]
        if ch == self._quote:
            self._state = "string_end"
            return end + 1
        if ch == "\n":  # a newline ends no single-quoted string: Python's parse fails
            self._stop()
            return len(text)
        escape = _PYTHON_ESCAPE.match(text, end)
        if escape is None:
            if len(text) - end < _LONGEST_ESCAPE and _could_be_escape(text[end:]):
                self._pending = text[end:]  # the escape may be being written
            else:
                self._stop()
            return len(text)
        try:
            out.append(_escaped(ast.literal_eval('"' + escape.group() + '"')))
        except (SyntaxError, ValueError):  # \U past U+10FFFF: Python's parse fails too
            self._stop()
            return len(text)
        return escape.end()

    def _read_bare(self, text: str, at: int, out: list[str]) -> int:
        start = at
        while at < len(text):
            ch = text[at]
            if self._in_quote:
                if self._escaping:
                    self._escaping = False
                elif ch == "\\":
                    self._escaping = True
                elif ch == self._in_quote:
                    self._in_quote = ""
            elif ch in "\"'":
                self._in_quote = ch
            elif ch == "#":  # a comment: a "," or ")" in it ends nothing
                self._stop()
                return len(text)
            elif ch in "([{":
                self._depth += 1
            elif ch in ")]}" and self._depth > 0:
                self._depth -= 1
            elif ch in ",)" and self._depth == 0:
                self._bare.append(text[start:at])
                value = _literal("".join(self._bare))
                if value is None:
                    self._stop()
                else:
                    out.append(value)
                    self._after_value(ch, out)
                return at + 1
            at += 1
        self._bare.append(text[start:at])
        return at


def _could_be_escape(text: str) -> bool:
    """Whether `text` (from a backslash) may still become one of the escapes decoded."""
    if len(text) == 1:
        return True
    kind, digits = text[1], text[2:]
    width = {"x": 2, "u": 4, "U": 8}.get(kind)
    return width is not None and len(digits) < width and all(c in "0123456789abcdefABCDEF" for c in digits)


def _literal(text: str) -> str | None:
    """A bare value's JSON as the pythonic parser makes it (None: that parse fails)."""
    from mlx_lm.tool_parsers.pythonic import _JSONLiterals

    try:
        value = ast.literal_eval(_JSONLiterals().visit(ast.parse(text.strip(), mode="eval").body))
        return json.dumps(value, ensure_ascii=False)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


class FunctionGemmaArguments(CodeArguments):
    """FunctionGemma's arguments, ``city:<escape>Paris<escape>,days:3}``, read as mlx-lm's
    ``function_gemma`` parser reads them: a key up to its colon, taken as written; a value
    between ``<escape>`` markers a string, as its characters come (the one character after its
    closing marker skipped, as the parser skips it); any other value up to the next comma, JSON
    if it reads as JSON, else the text. The parser's call ends at the first ``}`` even inside a
    string: there the reader stops."""

    ESCAPE = "<escape>"

    def __init__(self) -> None:
        super().__init__()
        self._state = "key"  # key, value, string, skip, bare
        self._key: list[str] = []
        self._bare: list[str] = []
        self._brace: int | None = None  # where the piece's next "}" is (-1: none); None: not looked for

    def _next_brace(self, text: str, at: int) -> int:
        """The next "}" of `text` from `at`, each character searched once a piece (a whole text
        fed at once stays linear)."""
        if self._brace is None or 0 <= self._brace < at:
            self._brace = text.find("}", at)
        return self._brace

    def _read(self, text: str, out: list[str]) -> None:
        at, self._pending, self._brace = 0, "", None
        while at < len(text) and not (self._stopped or self._done):
            state = self._state
            if state == "key":
                at = self._read_key(text, at, out)
            elif state == "value":
                head = text[at:at + len(self.ESCAPE)]  # not text[at:]: a copy of the rest at each value
                if head == self.ESCAPE:
                    self._state = "string"
                    out.append('"')
                    at += len(self.ESCAPE)
                elif self.ESCAPE.startswith(head):
                    self._pending = head  # the marker may be being written (head is the text's end)
                    return
                else:
                    self._state, self._bare = "bare", []
            elif state == "string":
                at = self._read_string(text, at, out)
            elif state == "skip":  # the parser skips the character after a string's marker
                if text[at] == "}":
                    self._close(out)
                else:
                    self._state = "key"
                at += 1
            else:
                at = self._read_bare(text, at, out)

    def _read_key(self, text: str, at: int, out: list[str]) -> int:
        colon, brace = text.find(":", at), self._next_brace(text, at)
        if brace >= 0 and (colon < 0 or brace < colon):
            self._key.append(text[at:brace])
            if "".join(self._key):
                self._stop()  # a key with no value: the parser fails
            else:
                self._close(out)
            return brace + 1
        if colon < 0:
            self._key.append(text[at:])
            return len(text)
        self._key.append(text[at:colon])
        self._open_item("".join(self._key), out)
        self._key, self._state = [], "value"
        return colon + 1

    def _read_string(self, text: str, at: int, out: list[str]) -> int:
        marker, brace = text.find(self.ESCAPE, at), self._next_brace(text, at)
        if brace >= 0 and (marker < 0 or brace < marker):
            out.append(_escaped(text[at:brace]))  # as a cut before the brace would have sent
            self._stop()  # the parser's call ends here, inside the string
            return len(text)
        if marker < 0:
            keep = _marker_start(text[at:], self.ESCAPE)
            out.append(_escaped(text[at:len(text) - keep]))
            self._pending = text[len(text) - keep:]
            return len(text)
        out.append(_escaped(text[at:marker]) + '"')
        self._state = "skip"
        return marker + len(self.ESCAPE)

    def _read_bare(self, text: str, at: int, out: list[str]) -> int:
        comma, brace = text.find(",", at), self._next_brace(text, at)
        ends = [i for i in (comma, brace) if i >= 0]
        if not ends:
            self._bare.append(text[at:])
            return len(text)
        end = min(ends)
        self._bare.append(text[at:end])
        value = "".join(self._bare)
        try:
            decoded: Any = json.loads(value)
        except json.JSONDecodeError:  # the parser keeps such a value as text
            decoded = value
        except (ValueError, RecursionError):  # past int's digits, nested too deep: its parse fails too
            self._stop()
            return len(text)
        out.append(json.dumps(decoded, ensure_ascii=False))
        if text[end] == "}":
            self._close(out)
        else:
            self._state = "key"
        return end + 1


# mlx-lm's format name -> its reader.
READERS: dict[str, type[CodeArguments]] = {"pythonic": PythonicArguments, "function_gemma": FunctionGemmaArguments}
