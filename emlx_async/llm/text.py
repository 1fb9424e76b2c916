"""Text: prompts to token ids (chat rendering with special-token safety), token ids
back to text as it streams, and stop strings.

In chat messages only the template makes control tokens; special-token text a
user types stays text. A raw prompt is the caller's own template, so its
special-token text is parsed.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
from collections.abc import Sequence
from typing import Any, NamedTuple

from mlx_lm.tokenizer_utils import (BPEStreamingDetokenizer, NaiveStreamingDetokenizer, StreamingDetokenizer,
                                    TokenizerWrapper)
# GPT-2's byte table; private in mlx-lm, which has no public name for it.
from mlx_lm.tokenizer_utils import _byte_decoder as _mlx_lm_byte_decoder
from tokenizers import Tokenizer, decoders

from .. import InvalidArgument, InvalidArgumentType
from .. import SpecialTokenText as SpecialTokenText
from .types import brief, is_int


# The reasoning block of templates that think (Qwen3's, DeepSeek-R1's).
THINK_START, THINK_END = "<think>", "</think>"


def jinja_renders_tools(chat_template: str | None) -> bool:
    """Whether a Jinja template reads ``tools`` (Hugging Face's convention)."""
    return bool(chat_template) and "tools" in chat_template


def jinja_thinks(chat_template: str | None) -> bool:
    """Whether a Jinja template's model reasons in think blocks: it names both markers."""
    return bool(chat_template) and THINK_START in chat_template and THINK_END in chat_template


# Hugging Face's apply_chat_template keywords that are not the template's (a Python template's
# options arrive as keywords beside them).
_TOKENIZER_OPTIONS = frozenset({"chat_template", "tokenize", "return_dict", "return_tensors", "padding", "truncation",
                                "max_length", "continue_final_message", "return_assistant_tokens_mask",
                                "tokenizer_kwargs", "documents", "conversation", "add_generation_prompt", "messages"})


def _arguments_as_text(message: dict) -> dict:
    """`message` with its tool calls' arguments as JSON text, as OpenAI sends them and a chat
    template written in Python reads them (DeepSeek-V3.2's ``json.loads`` them); Jinja
    templates get the object, Hugging Face's convention."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    def as_text(call: Any) -> Any:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or isinstance(function.get("arguments", ""), str):
            return call
        return {**call, "function": {**function, "arguments": json.dumps(function["arguments"], ensure_ascii=False)}}
    return {**message, "tool_calls": [as_text(call) for call in calls]}


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids from a `tokenizers.Tokenizer` or a Hugging Face one.

    A `tokenizers.Tokenizer` encodes through `encode_batch`: the same ids as
    `encode`, but `encode` holds the GIL for the whole call (a 1 MB text:
    ~0.6 s in which the event loop cannot run) where `encode_batch` lets
    go of it. Hugging Face's fast tokenizers already encode that way.
    """
    try:
        if isinstance(tokenizer, Tokenizer):
            return tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
        out = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:
        # A lone surrogate ("\ud800", which JSON's escapes can spell) has no UTF-8 form: the
        # tokenizers refuse it as "TextEncodeInput must be Union[...]", naming nothing.
        _check_utf8(text)
        raise
    return list(getattr(out, "ids", out))


def _check_utf8(text: Any) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"the text has no UTF-8 form: {text[exc.start]!r} (a lone surrogate) at index "
                              f"{exc.start}") from None
    except AttributeError:  # not a str: the tokenizer's own TypeError stands
        pass


class Detokenizer:
    """One generation's text as it streams, through mlx-lm's streaming detokenizers.

    `tokenizer` is mlx-lm's TokenizerWrapper (its own ``detokenizer``, which
    mlx-lm chose for the model: BPE, SPM or naive), a Hugging Face tokenizer
    or a ``tokenizers.Tokenizer`` (BPE for a byte-level decoder, else the
    naive one); `prototype` (from ``PromptEncoder.detokenizer``) saves
    rebuilding its token map per generation.

    Never splits a multi-byte character: mlx-lm's BPE and SPM detokenizers
    hold bytes back until they complete one, the naive one while the text
    ends in U+FFFD. The text is the tokenizer's decode of the tokens:
    mlx-lm's BPE detokenizer drops the first text's leading space, which a
    completion needs ("... is" + " Paris"), so it starts primed with one
    plain token whose text is not passed on. A tokenizer with only
    ``decode`` gets a window of recent tokens decoded each step.
    """

    def __init__(self, tokenizer, prototype: _Prototype | None = None):
        prototype = prototype or _prototype(tokenizer)
        self._window = _DecodeWindow(tokenizer) if prototype is None else None
        self._stream: StreamingDetokenizer | None = None
        if prototype is not None:
            self._stream = copy.copy(prototype.stream)  # shares the token map; reset() makes its own state
            self._stream.reset()
            if prototype.primer is not None:
                self._stream.add_token(prototype.primer)
                self._stream.last_segment  # noqa: B018 - read past the primer's text

    @property
    def streaming(self) -> StreamingDetokenizer | None:
        """The mlx-lm detokenizer underneath (None: the decode window)."""
        return self._stream

    def add(self, token: int) -> str:
        """The text that `token` completes (often "", or a word)."""
        if self._window is not None:
            return self._window.add(token)
        assert self._stream is not None
        self._stream.add_token(token)
        return self._stream.last_segment

    def flush(self) -> str:
        """At the end of the stream: the text held back (a lone space, say)."""
        if self._stream is None:
            return ""
        self._stream.finalize()
        return self._stream.last_segment


class _Prototype(NamedTuple):
    stream: StreamingDetokenizer  # copied per generation
    primer: int | None  # BPE: a token whose text is one plain letter


def _prototype(tokenizer) -> _Prototype | None:
    """mlx-lm's streaming detokenizer for `tokenizer`, or None where it has none (decode only)."""
    if isinstance(tokenizer, TokenizerWrapper):
        stream = tokenizer.detokenizer
    else:
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if not hasattr(backend, "id_to_token"):
            return None
        hf = tokenizer if hasattr(tokenizer, "convert_ids_to_tokens") else None
        # mlx-lm's own choice (tokenizer_utils.load): BPE for a byte-level decoder.
        if isinstance(getattr(backend, "decoder", None), decoders.ByteLevel):
            stream = BPEStreamingDetokenizer(hf or _Vocabulary(backend))
        else:
            if hf is None:  # the naive one encodes and decodes as a Hugging Face tokenizer does
                from transformers import PreTrainedTokenizerFast

                hf = PreTrainedTokenizerFast(tokenizer_object=backend)
            stream = NaiveStreamingDetokenizer(hf)
    primer = None
    if isinstance(stream, BPEStreamingDetokenizer) and "a" in stream.tokenmap:
        primer = stream.tokenmap.index("a")
    return _Prototype(stream, primer)


class _Vocabulary:
    """What mlx-lm's BPE detokenizer reads of a ``tokenizers.Tokenizer`` (a GGUF's):
    its size and token strings. A Hugging Face wrapper would do, at a second's
    copying on the loop."""

    def __init__(self, backend):
        self._backend = backend

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self._backend.id_to_token(i) for i in ids]


class _DecodeWindow:
    """For a tokenizer with only ``decode``: the text of tokens[prefix:read] is
    already out, tokens[read:] not yet; an incomplete character waits."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.tokens: list[int] = []
        self._prefix = 0
        self._read = 0

    def _decode(self, start: int, end: int | None = None) -> str:
        return self._tokenizer.decode(self.tokens[start:end], skip_special_tokens=True)

    def add(self, token: int) -> str:
        self.tokens.append(token)
        done = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix)
        if len(text) <= len(done) or text.endswith("\ufffd"):  # incomplete UTF-8: wait
            return ""
        self._prefix, self._read = self._read, len(self.tokens)
        return text[len(done):]


def byte_decoder() -> dict[str, int]:
    """Byte-level BPE's printable character for each byte, inverted (GPT-2's
    bytes_to_unicode): mlx-lm's table, the one its BPE detokenizer reads."""
    return _mlx_lm_byte_decoder()


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback: one byte a piece


def _sentencepiece_decoder(backend) -> bool:
    """Whether `backend` decodes as SentencePiece does: "▁" for a space, <0xNN> pieces for bytes
    (Llama 2, Mistral, Gemma: a Metaspace decoder, or a sequence with a Replace of "▁" or ByteFallback)."""
    decoder = getattr(backend, "decoder", None)
    if not isinstance(decoder, decoders.Decoder):
        return False
    description = json.loads(decoder.__getstate__())
    parts = description.get("decoders", []) if description.get("type") == "Sequence" else [description]
    return any(part.get("type") in ("Metaspace", "ByteFallback")
               or (part.get("type") == "Replace" and part.get("pattern") == {"String": "▁"}) for part in parts)


class PromptEncoder:
    """A model's prompts as token ids: raw text, ids, or chat messages through its template.

    Ids past the embedding crash MLX's gather (SIGSEGV), so every prompt is
    checked against `vocab_size`.
    """

    def __init__(self, tokenizer, *, bos_id: int | None, chat_template: str | None, vocab_size: int | None):
        self.tokenizer = tokenizer
        self.bos_id = bos_id
        self.chat_template = chat_template
        # mlx-lm's chat templates written in Python (a checkpoint's or a model's
        # ``chat_template_type``: DeepSeek-V3.2 ships no Jinja template), or a tokenizer
        # class's own renderer: mlx-lm's TokenizerWrapper renders those itself.
        self.python_template = (not chat_template and isinstance(tokenizer, TokenizerWrapper)
                                and bool(tokenizer.has_chat_template))
        self._renders_tools: bool | None = None
        self._tools_need_system = False  # a Python template that writes tools in a system message only
        self.vocab_size = vocab_size
        self._plain_tokenizer: Any = None  # encodes special-token text as plain text
        self._template: Any = None  # the compiled chat template
        self._token_bytes: dict[int, bytes] = {}
        self._added_token_ids: frozenset[int] | None = None
        self._detokenizer: _Prototype | None = None  # built on the first generation
        self._special_ids: frozenset[int] | None = None

    @property
    def special_ids(self) -> frozenset[int]:
        """The tokenizer's special tokens (control tokens such as ``<|im_start|>``)."""
        if self._special_ids is None:
            backend = getattr(self.tokenizer, "backend_tokenizer", self.tokenizer)
            added = backend.get_added_tokens_decoder() if hasattr(backend, "get_added_tokens_decoder") else {}
            self._special_ids = frozenset(i for i, token in added.items() if token.special)
        return self._special_ids

    def detokenizer(self) -> Detokenizer:
        """A fresh streaming detokenizer for one generation."""
        if self._detokenizer is None:
            self._detokenizer = _prototype(self.tokenizer)
        return Detokenizer(self.tokenizer, self._detokenizer)

    def encode(self, prompt: str | list[int] | None = None, messages: Sequence[dict] | None = None, *,
               tools: Sequence[dict] | None = None, template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Token ids for a raw prompt (text or ids) or chat messages (see Engine.encode).

        With messages, `tools` (OpenAI function tools) and `template_kwargs`
        (``enable_thinking``, ...) reach the template as Hugging Face's
        ``apply_chat_template`` passes them.
        """
        if (prompt is None) == (messages is None):
            raise InvalidArgument("give exactly one of prompt= or messages=")
        if messages is not None:
            ids = self._encode_chat(messages, tools, template_kwargs or {})
        elif isinstance(prompt, (list, tuple)):  # already token ids
            # A bool is no token id (True reached the model as a bool index, which MLX refuses);
            # numpy's integers are ids like any int.
            bad = next((i for i, t in enumerate(prompt) if not is_int(t)), None)
            if bad is not None:
                raise InvalidArgumentType(f"prompt token ids must be ints, got {type(prompt[bad]).__name__} "
                                          f"at index {bad}")
            ids = [int(t) for t in prompt]
        elif isinstance(prompt, str):
            ids = encode_text(self.tokenizer, prompt)
        else:
            raise InvalidArgumentType(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        if not ids:
            raise InvalidArgument("the prompt is empty")
        self._check_ids(ids)
        return ids

    def _check_ids(self, ids: list[int]) -> None:
        if self.vocab_size is None:
            return
        low, high = min(ids), max(ids)
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise InvalidArgument(f"token id {brief(bad)} is outside the vocabulary [0, {self.vocab_size})")

    def render_chat(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> str:
        """The chat template's text for `messages` (special-token text in it is not escaped)."""
        return self._render(self._check_messages(messages), self._check_tools(tools), template_kwargs or {})

    def _check_tools(self, tools: Sequence[dict] | None) -> list[dict] | None:
        if tools is None:
            return None
        if not isinstance(tools, (list, tuple)) or not all(isinstance(t, dict) for t in tools):
            raise InvalidArgument("tools must be a list of dicts")
        return [copy.deepcopy(t) for t in tools]

    def _check_messages(self, messages: Sequence[dict]) -> list[dict]:
        if not isinstance(messages, (list, tuple)) or not messages:
            raise InvalidArgument("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                    or not isinstance(message.get("content"), str):
                raise InvalidArgument(f"messages[{i}] must be a dict with str 'role' and 'content', got {message!r}")
            if message.get("tool_calls") is not None and not isinstance(message["tool_calls"], list):
                raise InvalidArgument(f"messages[{i}]['tool_calls'] must be a list")
            if message.get("tool_call_id") is not None and not isinstance(message["tool_call_id"], str):
                raise InvalidArgument(f"messages[{i}]['tool_call_id'] must be a str")
        if not self.has_template:
            raise InvalidArgument("this model has no chat template; pass prompt= instead")
        # Only role, content and the tool keys (Hugging Face's names) reach
        # the template: any other key would be rendered as template text,
        # special tokens and all.
        out = []
        for m in messages:
            kept = {"role": m["role"], "content": m["content"]}
            for key in ("tool_calls", "tool_call_id", "name"):
                if m.get(key) is not None:
                    kept[key] = copy.deepcopy(m[key])
            out.append(kept)
        return out

    @property
    def has_template(self) -> bool:
        return bool(self.chat_template) or self.python_template

    @property
    def renders_tools(self) -> bool:
        """Whether the template renders ``tools`` itself (Hugging Face's convention; else a
        caller describes them in a system message). A Jinja template that reads them says
        ``tools``; a Python one is asked: a tool of a name nobody else writes, rendered."""
        if self._renders_tools is None:
            if self.python_template:
                name = "probe_" + secrets.token_hex(6)
                tool = {"type": "function", "function": {"name": name, "description": "",
                                                         "parameters": {"type": "object", "properties": {}}}}
                # Some render them in the system message only (DeepSeek-V3.2's), some refuse one.
                rendered: list[bool] = []
                self._renders_tools = False  # while probing: _render adds no system message
                for messages in ([{"role": "system", "content": ""}, {"role": "user", "content": "x"}],
                                 [{"role": "user", "content": "x"}]):
                    try:
                        rendered.append(name in self._render(messages, [tool]))
                    except ValueError:  # a template that refuses these messages
                        rendered.append(False)
                self._renders_tools = any(rendered)
                self._tools_need_system = rendered == [True, False]
            else:
                self._renders_tools = jinja_renders_tools(self.chat_template)
        return self._renders_tools

    @property
    def thinks(self) -> bool:
        """Whether the template's model reasons in ``<think>`` ... ``</think>`` blocks: a
        Jinja template names both markers; for a Python one, mlx-lm's reading of the
        tokenizer (its vocabulary's thinking tokens) says so."""
        if self.python_template:
            return bool(self.tokenizer.has_thinking) and \
                (self.tokenizer.think_start, self.tokenizer.think_end) == (THINK_START, THINK_END)
        return jinja_thinks(self.chat_template)

    def _render(self, messages: list[dict], tools: list[dict] | None = None,
                template_kwargs: dict[str, Any] | None = None) -> str:
        if self.python_template:
            options = dict(template_kwargs or {})
            # A Python template's options are apply_chat_template's keywords: the tokenizer's own
            # (a Jinja template of the caller's, say) are no template option.
            refused = sorted(options.keys() & _TOKENIZER_OPTIONS)
            if refused:
                raise InvalidArgument(f"template option {refused[0]!r} is the tokenizer's, not one the template reads")
            if tools is not None:
                options["tools"] = tools
                has_system = any(m["role"] in ("system", "developer") for m in messages)
                if self.renders_tools and self._tools_need_system and not has_system:
                    messages = [{"role": "system", "content": ""}, *messages]  # where it writes the tools
            messages = [_arguments_as_text(m) for m in messages]
            try:
                return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                          **options)
            except (AssertionError, KeyError, TypeError, ValueError) as exc:  # its own checks of the messages
                raise InvalidArgument(f"the chat template refused the messages: {exc}") from exc
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            # Sandboxed like Hugging Face's: the template comes with the model file.
            # Its helpers as Hugging Face defines them (jinja2's own tojson escapes
            # HTML, which a prompt must not).
            env = ImmutableSandboxedEnvironment()
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise_template_error
            env.globals["strftime_now"] = lambda fmt: __import__("datetime").datetime.now().strftime(fmt)
            self._template = env.from_string(self.chat_template)
        options = dict(template_kwargs or {})
        options.update(messages=messages, add_generation_prompt=True)
        if tools is not None:
            options["tools"] = tools
        return self._template.render(**options)

    def _encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` with special-token text encoded as ordinary text."""
        if self._plain_tokenizer is None:
            backend = getattr(self.tokenizer, "backend_tokenizer", self.tokenizer)
            plain = Tokenizer.from_str(backend.to_str())  # a copy: the flag is per tokenizer
            plain.encode_special_tokens = True
            self._plain_tokenizer = plain
        return encode_text(self._plain_tokenizer, text)

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (a byte-level BPE token or a SentencePiece <0xNN> piece may be
        part of a UTF-8 character)."""
        cached = self._token_bytes.get(token) if type(token) is int else None
        if cached is None:
            # An id past the vocabulary was b"" (and kept, one entry per id asked), -1 an OverflowError, True id 1.
            if not is_int(token):
                raise InvalidArgumentType(f"a token id must be an int, got {type(token).__name__}")
            if token < 0 or (self.vocab_size is not None and token >= self.vocab_size):
                raise InvalidArgument(f"token id {brief(token)} is outside the vocabulary [0, {self.vocab_size})")
            token = int(token)
            backend = getattr(self.tokenizer, "backend_tokenizer", self.tokenizer)
            piece = backend.id_to_token(token) if hasattr(backend, "id_to_token") else None
            decoder = byte_decoder()
            if piece is not None and "ByteLevel" in str(getattr(backend, "decoder", "")) \
                    and all(c in decoder for c in piece):
                cached = bytes(decoder[c] for c in piece)
            elif piece is not None and _sentencepiece_decoder(backend) and token not in self._added_ids(backend):
                # Decoding one SentencePiece token drops its leading space and turns a <0xNN> piece into U+FFFD.
                byte = _BYTE_PIECE.fullmatch(piece)
                cached = bytes([int(byte[1], 16)]) if byte else piece.replace("▁", " ").encode()
            else:
                cached = self.tokenizer.decode([token]).encode()
            self._token_bytes[token] = cached
        return cached

    def _added_ids(self, backend) -> frozenset[int]:
        """The added vocabulary's ids (special tokens and the like): their bytes are their decode."""
        if self._added_token_ids is None:
            added = backend.get_added_tokens_decoder() if hasattr(backend, "get_added_tokens_decoder") else {}
            self._added_token_ids = frozenset(added)
        return self._added_token_ids

    def _has_special_text(self, text: str) -> bool:
        return encode_text(self.tokenizer, text) != self._encode_plain(text)

    def _encode_chat(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                     template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Render with a unique marker for each content, then encode the template's
        parts with special tokens and each content as plain text.

        Tools, tool-call arguments, tool-call ids and template options are
        rendered by the template as they are, so special-token text in them
        is refused (a user could otherwise forge turns through them).
        """
        messages = self._check_messages(messages)
        tools = self._check_tools(tools)
        template_kwargs = template_kwargs or {}
        for i, message in enumerate(messages):
            if self._has_special_text(message["role"]):
                raise SpecialTokenText(f"messages[{i}]['role'] contains special-token text: {message['role']!r}",
                                       ("messages", i, "role"))
            for key in ("tool_calls", "tool_call_id", "name"):
                if key in message and self._has_special_text(json.dumps(message[key], ensure_ascii=False)):
                    raise SpecialTokenText(f"messages[{i}]['{key}'] contains special-token text", ("messages", i, key))
        if tools is not None and self._has_special_text(json.dumps(tools, ensure_ascii=False)):
            at = next(i for i, tool in enumerate(tools)  # which one: checked one by one only once one has it
                      if self._has_special_text(json.dumps(tool, ensure_ascii=False)))
            raise SpecialTokenText(f"tools contain special-token text (tools[{at}])", ("tools", at))
        for key, value in template_kwargs.items():
            if isinstance(value, str) and self._has_special_text(value):
                raise SpecialTokenText(f"template option {key!r} contains special-token text",
                                       ("template_kwargs", key))
        nonce = secrets.token_hex(8)
        markers = {f"[[content:{nonce}:{i}]]": m["content"] for i, m in enumerate(messages)}
        marked = self._render([{**m, "content": k} for k, m in zip(markers, messages)], tools, template_kwargs)
        rendered = self._render(messages, tools, template_kwargs)
        pattern = re.compile("|".join(re.escape(k) for k in markers))
        if pattern.sub(lambda hit: markers[hit.group(0)], marked) != rendered:
            # The template transforms the content (trims it, say): no safe split.
            for i, message in enumerate(messages):
                if self._has_special_text(message["content"]):
                    raise InvalidArgument(f"messages[{i}]['content'] contains special-token text, which this "
                                          "chat template does not let the engine keep as text")
            return encode_text(self.tokenizer, rendered)
        ids, last = [], 0
        for hit in pattern.finditer(marked):
            ids += encode_text(self.tokenizer, marked[last:hit.start()])
            ids += self._encode_plain(markers[hit.group(0)])
            last = hit.end()
        return ids + encode_text(self.tokenizer, marked[last:])


def _tojson(value: Any, indent: int | None = None, separators=None, sort_keys: bool = False,
            ensure_ascii: bool = False) -> str:
    """Hugging Face's ``tojson`` for chat templates: plain JSON, no HTML escaping."""
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


def _raise_template_error(message: str):
    raise InvalidArgument(f"the chat template refused the messages: {message}")


def find_stop(text: str, stop: list[str], ending_after: int = 0) -> int | None:
    """Where the first stop string in `text` that ends past its first `ending_after`
    characters starts, if any does."""
    hits = [i for s in stop if (i := text.find(s, max(0, ending_after - len(s) + 1))) >= 0]
    return min(hits) if hits else None


def stop_prefix_len(text: str, stop: list[str]) -> int:
    """Length of the longest suffix of `text` that starts some stop string. Only the suffixes
    that begin with a stop string's first character are compared with it (found by
    ``str.find``), longest first; the service bounds a stop string's length, since the
    worst case (a run of one character) still costs the square of it at every token."""
    best = 0
    for s in stop:
        if not s:
            continue  # an empty string starts everything and stops nothing
        tail = text[len(text) - min(len(s) - 1, len(text)):]
        at = tail.find(s[0])
        while at != -1 and len(tail) - at > best:
            if s.startswith(tail[at:]):
                best = len(tail) - at
                break
            at = tail.find(s[0], at + 1)
    return best


__all__ = ["Detokenizer", "PromptEncoder", "byte_decoder", "encode_text", "find_stop", "stop_prefix_len"]
