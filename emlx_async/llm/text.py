"""Text: prompts to token ids (chat rendering with special-token safety), token ids
back to text as it streams, and stop strings.

In chat messages only the template makes control tokens; special-token text a
user types stays text. A raw prompt is the caller's own template, so its
special-token text is parsed.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids from a `tokenizers.Tokenizer` (an Encoding) or a Hugging Face one (a list)."""
    out = tokenizer.encode(text, add_special_tokens=False)
    return list(getattr(out, "ids", out))


class Detokenizer:
    """Streaming detokenization that never splits a multi-byte character.

    Decodes a short window of recent tokens rather than the whole text each
    step: the text of tokens[prefix:read] is already out, tokens[read:] not yet.
    """

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

    def flush(self) -> str:
        """At the end of the stream: the text held back (an incomplete character is dropped)."""
        return ""


_BYTE_DECODER: dict[str, int] = {}


def byte_decoder() -> dict[str, int]:
    """Byte-level BPE's printable character for each byte, inverted (GPT-2's bytes_to_unicode)."""
    if not _BYTE_DECODER:
        printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
        shifted = 0
        for byte in range(256):
            if byte in printable:
                _BYTE_DECODER[chr(byte)] = byte
            else:
                _BYTE_DECODER[chr(256 + shifted)] = byte
                shifted += 1
    return _BYTE_DECODER


class PromptEncoder:
    """A model's prompts as token ids: raw text, ids, or chat messages through its template.

    Ids past the embedding crash MLX's gather (SIGSEGV), so every prompt is
    checked against `vocab_size`.
    """

    def __init__(self, tokenizer, *, bos_id: int | None, chat_template: str | None, vocab_size: int | None):
        self.tokenizer = tokenizer
        self.bos_id = bos_id
        self.chat_template = chat_template
        self.vocab_size = vocab_size
        self._plain_tokenizer = None  # encodes special-token text as plain text
        self._template = None  # the compiled chat template
        self._token_bytes: dict[int, bytes] = {}

    def detokenizer(self) -> Detokenizer:
        """A fresh streaming detokenizer for one generation."""
        return Detokenizer(self.tokenizer)

    def encode(self, prompt: str | list[int] | None = None, messages: Sequence[dict] | None = None) -> list[int]:
        """Token ids for a raw prompt (text or ids) or chat messages (see Engine.encode)."""
        if (prompt is None) == (messages is None):
            raise ValueError("give exactly one of prompt= or messages=")
        if messages is not None:
            ids = self._encode_chat(messages)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)  # already token ids
        elif isinstance(prompt, str):
            ids = encode_text(self.tokenizer, prompt)
        else:
            raise TypeError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        if not ids:
            raise ValueError("the prompt is empty")
        self._check_ids(ids)
        return ids

    def _check_ids(self, ids: list[int]) -> None:
        if self.vocab_size is None:
            return
        low, high = min(ids), max(ids)
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")

    def render_chat(self, messages: Sequence[dict]) -> str:
        """The chat template's text for `messages` (special-token text in it is not escaped)."""
        return self._render(self._check_messages(messages))

    def _check_messages(self, messages: Sequence[dict]) -> list[dict]:
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                    or not isinstance(message.get("content"), str):
                raise ValueError(f"messages[{i}] must be a dict with str 'role' and 'content', got {message!r}")
        if not self.chat_template:
            raise ValueError("this model has no chat template; pass prompt= instead")
        # Only role and content reach the template: any other key would be
        # rendered as template text, special tokens and all.
        return [{"role": m["role"], "content": m["content"]} for m in messages]

    def _render(self, messages: list[dict]) -> str:
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            # Sandboxed like Hugging Face's: the template comes with the model file.
            self._template = ImmutableSandboxedEnvironment().from_string(self.chat_template)
        return self._template.render(messages=messages, add_generation_prompt=True)

    def _encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` with special-token text encoded as ordinary text."""
        if self._plain_tokenizer is None:
            from tokenizers import Tokenizer

            backend = getattr(self.tokenizer, "backend_tokenizer", self.tokenizer)
            plain = Tokenizer.from_str(backend.to_str())  # a copy: the flag is per tokenizer
            plain.encode_special_tokens = True
            self._plain_tokenizer = plain
        return encode_text(self._plain_tokenizer, text)

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (a byte-level BPE token may be part of a UTF-8 character)."""
        cached = self._token_bytes.get(token)
        if cached is None:
            backend = getattr(self.tokenizer, "backend_tokenizer", self.tokenizer)
            piece = backend.id_to_token(token) if hasattr(backend, "id_to_token") else None
            decoder = byte_decoder()
            if piece is not None and "ByteLevel" in str(getattr(backend, "decoder", "")) \
                    and all(c in decoder for c in piece):
                cached = bytes(decoder[c] for c in piece)
            else:
                cached = self.tokenizer.decode([token]).encode()
            self._token_bytes[token] = cached
        return cached

    def _has_special_text(self, text: str) -> bool:
        return encode_text(self.tokenizer, text) != self._encode_plain(text)

    def _encode_chat(self, messages: Sequence[dict]) -> list[int]:
        """Render with a unique marker for each content, then encode the template's
        parts with special tokens and each content as plain text."""
        messages = self._check_messages(messages)
        for i, message in enumerate(messages):
            if self._has_special_text(message["role"]):
                raise ValueError(f"messages[{i}]['role'] contains special-token text: {message['role']!r}")
        nonce = secrets.token_hex(8)
        markers = {f"[[content:{nonce}:{i}]]": m["content"] for i, m in enumerate(messages)}
        marked = self._render([{**m, "content": k} for k, m in zip(markers, messages)])
        rendered = self._render(messages)
        pattern = re.compile("|".join(re.escape(k) for k in markers))
        if pattern.sub(lambda hit: markers[hit.group(0)], marked) != rendered:
            # The template transforms the content (trims it, say): no safe split.
            for i, message in enumerate(messages):
                if self._has_special_text(message["content"]):
                    raise ValueError(f"messages[{i}]['content'] contains special-token text, which this "
                                     "chat template does not let the engine keep as text")
            return encode_text(self.tokenizer, rendered)
        ids, last = [], 0
        for hit in pattern.finditer(marked):
            ids += encode_text(self.tokenizer, marked[last:hit.start()])
            ids += self._encode_plain(markers[hit.group(0)])
            last = hit.end()
        return ids + encode_text(self.tokenizer, marked[last:])


def find_stop(text: str, stop: list[str]) -> int | None:
    """Where the first stop string in `text` starts, if any does."""
    hits = [i for s in stop if (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def stop_prefix_len(text: str, stop: list[str]) -> int:
    """Length of the longest suffix of `text` that starts some stop string."""
    best = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if s.startswith(text[-n:]):
                best = n
                break
    return best


__all__ = ["Detokenizer", "PromptEncoder", "byte_decoder", "encode_text", "find_stop", "stop_prefix_len"]
