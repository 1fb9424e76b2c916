"""The arguments of a call in an XML-like tool-call format, sent as JSON while the model writes them.

Six of mlx-lm's formats write each argument between tags of their own::

    qwen3_coder (Qwen3-Coder, Qwen3.5, Qwen3-Next)   <parameter=city>\\nParis\\n</parameter>
    glm47 (GLM-4.5 to 4.7, Laguna)                   <arg_key>city</arg_key><arg_value>Paris</arg_value>
    longcat (LongCat)                                <longcat_arg_key>city</longcat_arg_key><longcat_arg_value>...
    minimax_m2 (MiniMax-M2)                          <parameter name="city">Paris</parameter>
    minicpm5 (MiniCPM5)                              <param name="city"><![CDATA[Paris]]></param>
    kimi_k3 (Kimi K3's XTML)                         <|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>

Kimi K3 may instead carry the arguments as one JSON object (``<|open|>json ...<|sep|>{...}``): that
object goes out as the model writes it, read by the JSON reader the caller gives (tools'
``_JsonArguments``), and the parse compares it by value.

mlx-lm's parsers (``mlx_lm.tool_parsers.<format>``) read a whole block and type each value
from the tool's schema. A `TaggedArguments` reads the block as it comes and hands out the
start of the JSON text that parser will make of it (``json.dumps`` of its arguments): each key
once its name is whole, a string's characters as they are written, any other value once its
closing tag has come, converted by the parser's own function. Whether a parameter is a string
is asked of that function too (`_keeps_text`), so no typing rule is copied here. The closing
brace is left to the parse of the whole block, which is the call's truth: what was handed out
is a prefix of it whenever the model wrote the format as its parser reads it. A parameter
named twice (the parsers keep the last value at the first one's place) or a block the parser
reads otherwise makes what was sent no prefix; the call is then not valid, as a streamed JSON
call cut short is not.
"""

from __future__ import annotations

import abc
import functools
import importlib
import json
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

_LONGEST_NAME = 256
# Texts a string parameter keeps as they are; a converter that changes any of them types the
# parameter otherwise (a number, a boolean, JSON, a Python literal), so it is not streamed.
_STRING_PROBES = ("12", "-1.5", "1e3", "true", "False", "0", "yes", "off", "{}", "[1]", "'a'", "(1,)", "x y")
_NONE_WORDS = ("null", "none", "nil")  # any case: the words a parser may read as None


class ObjectReader(Protocol):
    """A reader of a JSON object's text as the model writes it (tools' ``_JsonArguments``)."""

    sent: str
    complete: bool  # the object has ended

    def feed(self, text: str) -> str:
        """Read more text; the part of it that is the object's, to send."""


class TaggedArguments(abc.ABC):
    """One call's arguments, read from the text after the call's name (``ToolCallFormat.first_name``)."""

    FORMAT: str  # mlx-lm's name of the format (its parser's module)
    OPEN: str  # a parameter's opening tag, before its name
    CLOSE: str  # the tag ending its value
    STOP: str | None = None  # a tag ending the call (its parameters after it are not the call's)
    # How the parser trims a value: "strip" its whitespace, one "newline" at each end, or "none".
    TRIM = "strip"
    PARSER_NEEDS: tuple[str, ...] = ()  # the parser module's private names this reader uses

    def __init__(self, name: str, tools: list[dict] | None, parser: ModuleType,
                 json_object: Callable[[], ObjectReader] | None = None) -> None:
        self._parser = parser
        self._json_object = json_object
        self._config = self._configure(name, tools)
        self._text = ""
        self._at = 0  # where reading resumes in _text
        self._state = "between"  # "between" parameters, in a parameter's "name", in its "value"
        self._key = ""
        self._value_start = 0
        self._keys: set[str] = set()
        self._string_keys: dict[str, bool] = {}
        self._search = 0  # where a closing tag is sought next
        self._opened = False  # a string value's opening quote was sent
        self._streamed = 0  # where a string value's unsent characters begin in _text
        self._scan = 0  # where a value's characters not yet looked at begin in _text
        self._first_solid: int | None = None  # a stripped value's first character not whitespace
        self._last_solid = 0  # and the end of its last one looked at
        self._frozen = False  # read something the JSON so far cannot follow: send nothing more
        self._sent: list[str] = []
        self._ends = (self.CLOSE,) if self.STOP is None else (self.CLOSE, self.STOP)
        self._end_starts = {end[:n] for end in self._ends for n in range(1, len(end))}
        self._longest_end = max(map(len, self._ends))

    @classmethod
    def for_call(cls, name: str, tools: list[dict] | None,
                 json_object: Callable[[], ObjectReader] | None = None) -> TaggedArguments | None:
        parser = _parser(cls.FORMAT, cls.PARSER_NEEDS)
        if parser is None:
            return None
        try:
            return cls(name, tools, parser, json_object)
        except Exception:  # noqa: BLE001 - the parser cannot read these tools (a schema of `true`): the parse decides
            return None

    @property
    def sent(self) -> str:
        """The JSON text handed out."""
        return "".join(self._sent)

    @property
    def complete(self) -> bool:
        """Whether what was sent is a whole JSON object as the model wrote it (to be compared
        with the parse by value); the tagged parameters' closing brace is the parse's."""
        return False

    def feed(self, text: str) -> str:
        """Read more of the call's text; the JSON text it adds to what was sent."""
        if self._frozen:
            return ""  # nothing more is sent: the text need not be kept
        self._text += text
        before = len(self._sent)
        while not self._frozen and self._step():
            pass
        self._forget_read()
        return "".join(self._sent[before:])

    def _forget_read(self) -> None:
        """Drop the text read and no longer needed, so that a long call is not copied whole at
        every piece (a value being converted at its end is kept: it is needed whole)."""
        if self._state != "value":
            keep = self._at
        elif self._opened:
            keep = min(self._streamed, self._search, self._scan)
        else:
            keep = self._value_start
        if keep < 1 << 16 or keep < len(self._text) // 2:
            return  # amortized: each character is dropped once
        self._text = self._text[keep:]
        self._at, self._value_start, self._search = self._at - keep, self._value_start - keep, self._search - keep
        self._streamed, self._scan, self._last_solid = self._streamed - keep, self._scan - keep, self._last_solid - keep
        if self._first_solid is not None:
            self._first_solid -= keep

    # What each format says for itself.

    @abc.abstractmethod
    def _configure(self, name: str, tools: list[dict] | None) -> Any:
        """What the parser knows of the call's parameters, from the tools."""

    @abc.abstractmethod
    def _convert(self, value: str, key: str) -> Any:
        """The parser's value for a parameter's (trimmed) text."""

    @abc.abstractmethod
    def _name_at(self, at: int) -> tuple[str, int] | None | bool:
        """The parameter's name written from `at`, and where its value begins; None: not yet
        known; False: not a name this reader follows."""

    # The reading, common to the formats.

    def _step(self) -> bool:
        """Read as far as the text allows in the current state; whether the state changed."""
        if self._state == "between":
            at = self._text.find(self.OPEN, self._at)
            stop = -1 if self.STOP is None else self._text.find(self.STOP, self._at, None if at < 0 else at)
            if stop >= 0:
                self._frozen = True  # the call ended: its parameters are all sent
                return False
            if at < 0:
                self._at = max(self._at, len(self._text) - max(map(len, self._ends + (self.OPEN,))) + 1)
                return False
            self._at, self._state = at + len(self.OPEN), "name"
            return True
        if self._state == "name":
            return self._read_name()
        return self._read_value()

    def _read_name(self) -> bool:
        named = self._name_at(self._at)
        if named is None:
            return False
        if named is False:
            self._frozen = True  # the parser skips such a parameter, or reads it another way
            return False
        key, self._value_start = named
        if key in self._keys:
            self._frozen = True  # named twice: the parser keeps the last value at the first place
            return False
        self._keys.add(key)
        self._key, self._state, self._search = key, "value", self._value_start
        self._scan, self._first_solid, self._last_solid = self._value_start, None, self._value_start
        self._send(("{" if not self._sent else ", ") + json.dumps(key, ensure_ascii=False) + ": ")
        return True

    def _read_value(self) -> bool:
        text = self._text
        close = text.find(self.CLOSE, self._search)
        stop = -1 if self.STOP is None else text.find(self.STOP, self._search, None if close < 0 else close)
        if stop >= 0:  # the call ends inside the value: the parser drops the parameter
            if self._is_string(self._key):
                self._stream(stop)  # what a cut just before the tag would have sent, whatever the cuts
            self._frozen = True
            return False
        if close >= 0:
            if self._is_string(self._key):
                self._stream(close)  # as a cut before the tag would have: the same whatever the cuts
            self._end_value(close)
            self._at, self._state, self._opened = close + len(self.CLOSE), "between", False
            return True
        self._search = max(self._value_start, len(text) - max(map(len, self._ends)) + 1)
        if self._is_string(self._key):
            self._stream()
        return False

    def _trimmed(self, start: int, close: int) -> tuple[int, int] | None:
        """Where the value's text, trimmed as the parser trims it, begins and ends, from `start`
        (its start, or where its unsent characters begin) to its closing tag at `close` (None:
        the parser does not read it as it was streamed)."""
        raw = self._text[start:close]
        if self.TRIM == "strip":
            lead = 0 if self._opened else len(raw) - len(raw.lstrip())
            return start + lead, max(start + lead, start + len(raw.rstrip()))
        if self.TRIM == "none":
            return start, close
        start += not self._opened and raw.startswith("\n")
        return start, close - (close > start and raw.endswith("\n"))

    def _unfinished(self, end: int | None = None) -> tuple[int, int] | None:
        """(start, ready) of a value whose closing tag has not come: where its text begins, as
        the parser trims it, and up to where nothing can be its end any more; None: it has not
        begun; `end`: the text ends there. Each character is looked at once (a long value or run
        of whitespace stays linear)."""
        text = self._text
        # Characters after `limit` may begin a closing tag.
        limit = end if end is not None else len(text) - self._tag_start()
        if self.TRIM != "strip":
            self._scan = max(self._scan, limit)
            if self.TRIM == "none":
                start = self._streamed if self._opened else self._value_start
                return start, max(start, limit)
            if self._opened:
                start = self._streamed
            elif limit <= self._value_start:
                return None  # its first character says whether a newline is dropped
            else:
                start = self._value_start + (text[self._value_start] == "\n")
            return start, max(start, limit - (limit > start and text[limit - 1] == "\n"))
        new = text[self._scan:limit]
        solid = len(new.rstrip())
        if solid:  # the whitespace the parser strips at the end is held back until more follows
            if self._first_solid is None:
                self._first_solid = self._scan + len(new) - len(new.lstrip())
            self._last_solid = self._scan + solid
        elif self._first_solid is None:
            self._value_start = max(self._value_start, limit)  # the parser strips it: need not be kept
        self._scan = max(self._scan, limit)
        return None if self._first_solid is None else (self._first_solid, self._last_solid)

    def _tag_start(self) -> int:
        """How many of the text's last characters begin a closing tag."""
        text = self._text
        for n in range(min(len(text), self._longest_end - 1), 0, -1):
            if text[-n:] in self._end_starts:
                return n
        return 0

    def _is_string(self, key: str) -> bool:
        """Whether the parser keeps this parameter's text as it is (unless a word of None)."""
        if key not in self._string_keys:
            self._string_keys[key] = all(self._keeps_text(probe, key) for probe in _STRING_PROBES)
        return self._string_keys[key]

    def _keeps_text(self, text: str, key: str) -> bool:
        try:
            return self._convert(text, key) == text
        except Exception:  # noqa: BLE001 - a typed parameter's converter refused the text
            return False

    def _stream(self, end: int | None = None) -> None:
        """Send the string value's characters that cannot yet be its end (before `end`)."""
        bounds = self._unfinished(end)
        if bounds is None:
            return
        start, ready = bounds
        if not self._opened:
            so_far = self._text[start:ready].lower() if ready - start <= max(map(len, _NONE_WORDS)) else "-"
            if any(word.startswith(so_far) and self._keeps_none(word) for word in _NONE_WORDS):
                return  # may still be a word the parser reads as None, which is no string
            self._opened, self._streamed = True, start
            self._send('"')
        if ready > self._streamed:
            self._send(_escaped(self._text[self._streamed:ready]))
            self._streamed = ready

    def _keeps_none(self, word: str) -> bool:
        """Whether the parser reads `word` as None for this parameter."""
        try:
            return self._convert(word, self._key) is None
        except Exception:  # noqa: BLE001 - a converter refusing the word does not make it None
            return False

    def _end_value(self, close: int) -> None:
        """Send the rest of the value closed at `close`: a string's last characters, else the
        parser's value for the whole text."""
        bounds = self._trimmed(self._streamed if self._opened else self._value_start, close)
        if bounds is None:  # the parser reads the value otherwise than it was streamed
            self._frozen = True
            return
        start, end = bounds
        if self._opened:
            self._send(_escaped(self._text[start:end]) + '"')
            return
        try:
            self._send(json.dumps(self._convert(self._text[start:end], self._key), ensure_ascii=False))
        except Exception:  # noqa: BLE001 - the parse will fail on it too: the call is not valid
            self._frozen = True

    def _send(self, text: str) -> None:
        self._sent.append(text)


class Qwen3CoderArguments(TaggedArguments):
    """``<parameter=NAME>\\nVALUE\\n</parameter>``, typed by mlx-lm's ``_convert_param_value``."""

    FORMAT = "qwen3_coder"
    OPEN, CLOSE, TRIM = "<parameter=", "</parameter>", "newline"
    PARSER_NEEDS = ("_convert_param_value", "_get_arguments_config", "_name_regex")

    def _configure(self, name, tools):
        return self._parser._get_arguments_config(name, tools)

    def _convert(self, value, key):
        return self._parser._convert_param_value(value, key, self._config)

    def _name_at(self, at):
        head = self._text[at:at + _LONGEST_NAME]
        named = self._parser._name_regex.match(head)  # the parser's own: \s*([^\s<>]+)>?
        if named is None:  # whitespace, then "<", ">" or nothing yet
            return False if len(head) == _LONGEST_NAME or "<" in head or ">" in head else None
        if named.end(1) == len(head):
            return False if len(head) == _LONGEST_NAME else None  # the name may go on; none is so long
        return named.group(1), at + named.end()


class Glm47Arguments(TaggedArguments):
    """``<arg_key>NAME</arg_key><arg_value>VALUE</arg_value>``: a declared string kept, any other
    value read by mlx-lm's ``_deserialize`` (JSON, a Python literal, else the text)."""

    FORMAT = "glm47"
    OPEN, CLOSE = "<arg_key>", "</arg_value>"
    KEY_END, VALUE_OPEN = "</arg_key>", "<arg_value>"
    PARSER_NEEDS = ("_get_string_arg_names", "_deserialize")

    def _configure(self, name, tools):
        return self._parser._get_string_arg_names(name, tools)

    def _convert(self, value, key):
        return value if key in self._config else self._parser._deserialize(value)

    def _name_at(self, at):
        text = self._text
        end = text.find(self.KEY_END, at, at + _LONGEST_NAME + len(self.KEY_END))
        if end < 0:
            return False if len(text) - at >= _LONGEST_NAME + len(self.KEY_END) else None
        # Between the tags the parser allows whitespace and the two characters "\n".
        i = end + len(self.KEY_END)
        while i < len(text) and (_regex_space(text[i]) or text.startswith("\\n", i)):
            i += 2 if text[i] == "\\" else 1
            if i - end > _LONGEST_NAME:
                return False  # read again at every piece, a long run would be quadratic
        rest = text[i:i + len(self.VALUE_OPEN)]
        if rest == self.VALUE_OPEN:
            return text[at:end].strip(), i + len(self.VALUE_OPEN)
        return None if self.VALUE_OPEN.startswith(rest) or rest == "\\" else False


class MiniMaxArguments(TaggedArguments):
    """``<parameter name="NAME">VALUE</parameter>`` inside ``<invoke name="...">...</invoke>``,
    typed by mlx-lm's ``_convert_param_value_with_types`` from the schema's types."""

    FORMAT = "minimax_m2"
    OPEN, CLOSE, STOP = "<parameter name=", "</parameter>", "</invoke>"
    PARSER_NEEDS = ("_convert_param_value_with_types", "_get_param_types_from_config", "_extract_name")

    def _configure(self, name, tools):
        for tool in tools or []:
            function = tool.get("function") or {}
            if function.get("name") == name:
                return (function.get("parameters") or {}).get("properties", {})
        return {}

    def _convert(self, value, key):
        types = self._parser._get_param_types_from_config(key, self._config)
        return self._parser._convert_param_value_with_types(value, types)

    def _name_at(self, at):
        text = self._text
        end = text.find(">", at, at + _LONGEST_NAME)
        if end < 0:
            return False if len(text) - at >= _LONGEST_NAME else None
        raw, tagged = text[at:end], text[at:end + 1]  # with its ">": a closing tag may end there
        if not raw or self.CLOSE in tagged or self.STOP in tagged:
            return False  # the parser reads no name here
        return self._parser._extract_name(raw), end + 1


class LongCatArguments(Glm47Arguments):
    """GLM's shape with LongCat's tags, ``<longcat_arg_key>NAME</longcat_arg_key><longcat_arg_value>
    VALUE</longcat_arg_value>``: a declared string kept (mlx-lm's ``_is_string_type``), any other
    value read by its ``_deserialize``."""

    FORMAT = "longcat"
    OPEN, CLOSE = "<longcat_arg_key>", "</longcat_arg_value>"
    KEY_END, VALUE_OPEN = "</longcat_arg_key>", "<longcat_arg_value>"
    PARSER_NEEDS = ("_is_string_type", "_deserialize")

    def _configure(self, name, tools):
        return name, tools

    def _convert(self, value, key):
        name, tools = self._config
        return value if self._parser._is_string_type(name, key, tools) else self._parser._deserialize(value)


class MiniCpm5Arguments(MiniMaxArguments):
    """``<param name="NAME">VALUE</param>``, the value wrapped in ``<![CDATA[...]]>`` where it holds
    ``<``, ``&`` or newlines (kept as written inside, else stripped: mlx-lm's ``_param_value``),
    typed as MiniMax's are (mlx-lm's minicpm5 imports that converter). Each call is a block of
    its own (``<function name=...>``), so nothing inside one ends the call."""

    FORMAT = "minicpm5"
    OPEN, CLOSE, STOP = "<param", "</param>", None
    CDATA_OPEN, CDATA_CLOSE = "<![CDATA[", "]]>"
    PARSER_NEEDS = ("_param_regex", "_cdata_regex", "_extract_name", "_convert_param_value_with_types",
                    "_get_param_types_from_config")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._head = _head_regex(self._parser._param_regex, "(?P<value>")
        self._cdata: bool | None = None  # whether the value being streamed is CDATA (None: not known yet)

    def _name_at(self, at):
        # The parser's own regex up to the value, matched where it may still be cut short.
        start = at - len(self.OPEN)
        window = self._text[start:start + _LONGEST_NAME]
        named = self._head.match(window, partial=True)
        if named is None:
            return False
        if named.partial:
            return False if len(window) == _LONGEST_NAME else None
        self._cdata = None
        return self._parser._extract_name(named.group("name")), start + named.end()

    def _unfinished(self, end=None):
        bounds = super()._unfinished(end)  # stripped, as a value without CDATA is
        if bounds is None or self._cdata is False:
            return bounds
        start, ready = bounds  # from its first character that is not whitespace
        text = self._text
        if self._cdata is None:
            head = text[start:ready]
            if len(head) < len(self.CDATA_OPEN) and self.CDATA_OPEN.startswith(head):
                return None  # CDATA or not, its first characters say
            self._cdata = text.startswith(self.CDATA_OPEN, start)
            if not self._cdata:
                return bounds
        start += len(self.CDATA_OPEN)
        # The end's "]]>" (the whitespace after it is held already) may be being written;
        # what was sent is never its end.
        floor = self._streamed if self._opened else start
        for n in range(len(self.CDATA_CLOSE), 0, -1):
            if text.endswith(self.CDATA_CLOSE[:n], floor, ready):
                ready -= n
                break
        return start, max(floor, ready)

    def _trimmed(self, start, close):
        if not self._opened:  # read whole: the parser's own reading of it
            cdata = self._parser._cdata_regex.match(self._text[start:close])
            return (start + cdata.start(1), start + cdata.end(1)) if cdata is not None \
                else super()._trimmed(start, close)
        if not self._cdata:
            return super()._trimmed(start, close)
        end = start + len(self._text[start:close].rstrip())
        if not self._text.endswith(self.CDATA_CLOSE, start, end):
            return None  # the CDATA never closed: the parser keeps the whole text, its opening too
        return start, end - len(self.CDATA_CLOSE)


class KimiK3Arguments(TaggedArguments):
    """Kimi K3's XTML, ``<|open|>argument key="NAME" type="TYPE"<|sep|>VALUE<|close|>argument<|sep|>``
    inside ``<|open|>call ...<|sep|>...<|close|>call<|sep|>``: the value kept as written, typed by
    mlx-lm's ``_decode_value`` from the type the model wrote (the schema is not read). Or the
    arguments as one JSON object, ``<|open|>json type="object"<|sep|>{...}<|close|>json<|sep|>``,
    which the parser takes over any argument: streamed by the JSON reader the caller gives."""

    FORMAT = "kimi_k3"
    OPEN, CLOSE, STOP, TRIM = "<|open|>", "<|close|>argument<|sep|>", "<|close|>call<|sep|>", "none"
    SEP, ARGUMENT, JSON = "<|sep|>", "argument", "json"  # what follows OPEN: an argument, or the object
    PARSER_NEEDS = ("_parse_attrs", "_decode_value")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._object: ObjectReader | None = None  # the arguments' JSON object, once its block opened

    @property
    def complete(self) -> bool:
        return self._object is not None and self._object.complete

    def _configure(self, name, tools):
        return {}  # each argument's type as the model wrote it, filled as they come

    def _convert(self, value, key):
        return self._parser._decode_value(value, self._config[key])

    def _step(self):
        if self._object is not None:
            self._send(self._object.feed(self._text[self._at:]))
            self._at = len(self._text)
            return False
        if self._state == "name" and self._text.startswith(self.JSON, self._at):
            return self._open_object()
        return super()._step()

    def _open_object(self) -> bool:
        at = self._at + len(self.JSON)
        sep = self._attributes_end(at)
        if sep is None or sep is False:
            self._frozen = sep is False
            return False
        if self._sent or self._json_object is None:
            self._frozen = True  # the parse takes the object, not the arguments sent before it
            return False
        self._object, self._at = self._json_object(), sep + len(self.SEP)
        return True

    def _name_at(self, at):
        text = self._text
        if not text.startswith(self.ARGUMENT, at):
            cut = any(len(text) - at < len(tag) and tag.startswith(text[at:]) for tag in (self.ARGUMENT, self.JSON))
            return None if cut else False  # another block: the parser skips it
        start = at + len(self.ARGUMENT)
        sep = self._attributes_end(start)
        if sep is None or sep is False:
            return sep
        attributes = self._parser._parse_attrs(text[start:sep])
        if "key" not in attributes:
            return False  # the parser drops the whole call
        self._config[attributes["key"]] = attributes.get("type", "string")  # the parser's default
        return attributes["key"], sep + len(self.SEP)

    def _attributes_end(self, at: int) -> int | None | bool:
        """Where a block's attributes, written from `at`, end (at its <|sep|>); None: not yet
        known; False: none the parser reads in this call."""
        sep = self._text.find(self.SEP, at, at + _LONGEST_NAME + len(self.SEP))
        if sep < 0:
            return False if len(self._text) - at >= _LONGEST_NAME + len(self.SEP) else None
        return False if self.STOP in self._text[at:sep + len(self.SEP)] else sep


_READERS = {reader.FORMAT: reader for reader in (Qwen3CoderArguments, Glm47Arguments, MiniMaxArguments,
                                                 LongCatArguments, MiniCpm5Arguments, KimiK3Arguments)}


def arguments_reader(format_name: str, name: str, tools: list[dict] | None,
                     json_object: Callable[[], ObjectReader] | None = None) -> TaggedArguments | None:
    """A reader of call `name`'s arguments in mlx-lm's format `format_name` (None: the format
    has none, or its parser lacks what the reader uses); `json_object` reads arguments that a
    format writes as one JSON object (Kimi K3's may)."""
    reader = _READERS.get(format_name)
    return None if reader is None else reader.for_call(name, tools, json_object)


@functools.cache
def _head_regex(pattern: Any, up_to: str) -> Any:
    """The start of a parser's regex, up to the group `up_to` (its value), compiled alike by the
    regex module (mlx-lm's), whose matches may be partial."""
    import regex

    return regex.compile(pattern.pattern[:pattern.pattern.index(up_to)], pattern.flags)


def _parser(format_name: str, needed: tuple[str, ...]) -> ModuleType | None:
    """mlx-lm's parser of the format, if it still has the private pieces a reader uses."""
    try:
        module = importlib.import_module(f"mlx_lm.tool_parsers.{format_name}")
    except ImportError:
        return None
    return module if all(hasattr(module, name) for name in needed) else None


def _regex_space(ch: str) -> bool:
    """Whether the parsers' regex module reads `ch` as whitespace (\\s): Python's isspace also
    takes the separators \\x1c-\\x1f."""
    return ch.isspace() and ch not in "\x1c\x1d\x1e\x1f"


def _escaped(text: str) -> str:
    """`text` as it reads inside a JSON string (json.dumps escapes each character alone, so
    pieces escaped apart join to the whole's escape)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _marker_start(text: str, marker: str) -> int:
    """How many of `text`'s last characters begin `marker` (it may be being written)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[len(text) - n:]):
            return n
    return 0
