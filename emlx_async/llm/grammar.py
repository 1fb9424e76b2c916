"""Grammar-constrained decoding: which tokens a request may sample next.

Three pieces, from the request down to the step:

- ``Grammar``: what the output must match. A JSON schema, any JSON object,
  a regular expression, or a Lark grammar (llguidance's dialect; llama.cpp's
  GBNF converts to it). Building one validates it without a tokenizer and
  raises ``GrammarError`` (a ValueError) that names the problem, so a
  service can answer 400 before any model work. ``after_free_text`` puts a
  bounded block of free text (a model's reasoning) before any grammar.
- ``GrammarTokenizer``: the tokenizer as llguidance sees it, built once per
  engine (0.3 to 0.6 s for SmolLM2's 49,152 tokens here). ``matcher(grammar)``
  starts one request's state (compiled grammars are cached, so a repeated
  schema costs a copy, not a compile).
- ``GrammarMatcher``: one request's state. ``mask()`` gives the allowed
  next tokens, ``advance(token)`` consumes the sampled one; ``start_mask()``
  computes the next mask on a background thread (llguidance releases the
  GIL), so it can run while the model step runs on a worker. A rejected
  token or a parser that hits its limits raises ``GrammarStateError`` for
  that request only.

The mask convention: what the grammar computes is a packed bitmask,
``uint32``, shape ``{W}`` per row (``{B, W}`` for a batch), ``W = ceil(V /
32)`` where V is the model's logits width; bit ``j`` of word ``i`` (least
significant first) allows token ``32 * i + j``. That is llguidance's own
layout, filled in place with no conversion. A traced step takes it as one
more input, either packed or unpacked to ``{B, V}`` bool on the host
(``unpack_token_mask``); ``apply_token_mask(logits, mask)`` handles both
with plain MLX ops, so the step stays one native job. A row without a
grammar gets all tokens allowed (``ALL_ALLOWED`` words, or all True).

Why llguidance (measured in benchmarks/RESULTS.md, ``benchmarks/grammar.py``):
an abi3 wheel with no Python dependencies that runs wherever the CPU does;
masks in microseconds on SmolLM2's vocabulary; xgrammar, the other
well-kept engine, imports torch at import time (its wheel requires torch,
triton and transformers).
"""

from __future__ import annotations

import collections
import json
import math
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import mlx.core as mx
import numpy as np

from .. import InvalidArgument, InvalidArgumentType, InvalidState
from .. import GrammarError as GrammarError
from .. import GrammarStateError as GrammarStateError
from .schema_check import recursion_without_end

_llg: Any
try:
    import llguidance as _llg
except ImportError:  # the engine works without it; grammars need it
    _llg = None

__all__ = ["ALL_ALLOWED", "Grammar", "GrammarError", "GrammarLogitsProcessor", "GrammarMatcher",
           "GrammarStateError", "GrammarTokenizer", "MaskTime", "apply_token_mask", "mask_words",
           "unpack_token_mask"]

GrammarKind = Literal["json_schema", "json_object", "regex", "lark"]

ALL_ALLOWED = np.uint32(0xFFFFFFFF)
"""A mask word with every token allowed: fill a free row's mask with it."""

# JSON in one canonical layout: ", " and ": " as a model writes them, and no
# free whitespace elsewhere. Flexible whitespace lets a weak model emit
# newlines forever inside a valid document (it never has to close it). A
# schema's own "x-guidance" options override these.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _require_llguidance():
    if _llg is None:
        raise ImportError("grammar-constrained decoding needs llguidance: pip install 'emlx_async[model]'")
    return _llg


def _limits():
    # verbose_errors=False: messages name the problem without dumping the
    # parser's state and the whole grammar (they reach HTTP clients).
    return _require_llguidance().LLParserLimits(verbose_errors=False)


_executor = None
_executor_lock = threading.Lock()


def _llg_executor():
    """llguidance's thread pool for a batch's masks: one per process (its threads live as long)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = _require_llguidance().LLExecutor(min(4, os.cpu_count() or 1))
        return _executor


def _check_utf8(what: str, text: str, *, at: bool = True) -> None:
    """GrammarError naming a lone surrogate in `text`: llguidance takes UTF-8, and encoding failed in it
    with a UnicodeEncodeError naming nothing. `at`: the index is one in the caller's own text."""
    try:
        text.encode("utf-8") if isinstance(text, str) else None
    except UnicodeEncodeError as exc:
        where = f" at index {exc.start}" if at else ""
        raise GrammarError(f"{what} has no UTF-8 form: {text[exc.start]!r} (a lone surrogate){where}") from None


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "unknown error"


@dataclass(frozen=True)
class Grammar:
    """What a constrained output must match; build one with a classmethod.

    ``kind`` and ``source`` say what the user gave (the schema as JSON text,
    the pattern, the grammar); ``warnings`` are llguidance's notes on a
    lenient schema (keywords it does not enforce). Equal grammars compile
    once per ``GrammarTokenizer``.
    """

    kind: GrammarKind
    source: str
    warnings: tuple[str, ...] = ()
    _compiled: str = field(default="", repr=False)  # llguidance's grammar (JSON or Lark text)
    # after_free_text's token budget: what a matcher switches to once it is spent.
    _budget: _FreeTextBudget | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self._compiled:
            raise InvalidArgumentType("build a Grammar with Grammar.json_schema(), json_object(), regex(), lark() "
                                      "or ebnf()")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str, *, lenient: bool = False) -> Grammar:
        """Output is one JSON document that validates against `schema` (a dict or JSON text).

        Keywords llguidance does not implement (``not``, ``dependentSchemas``,
        ...) raise ``GrammarError`` naming them, since the output could
        break them; ``lenient=True`` accepts such a schema, ignores those
        keywords and keeps the notes in ``warnings``.
        """
        if isinstance(schema, str):
            _check_utf8("the JSON schema", schema)
            try:
                parsed = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
        elif isinstance(schema, Mapping):
            parsed = schema
        else:
            raise GrammarError(f"a JSON schema must be a dict or JSON text, got {type(schema).__name__}")
        if not isinstance(parsed, Mapping):
            raise GrammarError(f"a JSON schema must be a JSON object, got {type(parsed).__name__}")
        try:
            source = json.dumps(parsed, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise GrammarError(f"the JSON schema cannot be written as JSON: {e}") from None
        # A "\ud800" escape in JSON text, or a dict's str, reads as a lone surrogate.
        _check_utf8("the JSON schema", json.dumps(parsed, ensure_ascii=False), at=False)
        endless = recursion_without_end(parsed)
        if endless is not None:
            raise GrammarError(f"the JSON schema allows no finite value: {endless}")
        llg = _require_llguidance()
        options = dict(_JSON_OPTIONS, lenient=True) if lenient else _JSON_OPTIONS
        try:
            compiled = llg.LLMatcher.grammar_from_json_schema(source, defaults=options)
        except ValueError as e:
            raise GrammarError(f"invalid JSON schema: {_first_line(str(e))}") from None
        return cls._validated("json_schema", source, compiled, "invalid JSON schema", lenient)

    @classmethod
    def json_object(cls) -> Grammar:
        """Output is any JSON object (OpenAI's ``response_format`` ``json_object``)."""
        grammar = cls.json_schema({"type": "object"})
        return cls("json_object", grammar.source, (), grammar._compiled)

    @classmethod
    def any_text(cls) -> Grammar:
        """Any text at all: the answer after ``after_free_text``'s bounded block, where only
        the block's length is the constraint (a reasoning budget on a free answer)."""
        return cls.lark("start: /[\\s\\S]*/")

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        """Output matches `pattern` as a whole (Rust regex syntax: no lookaround, no backreferences)."""
        if not isinstance(pattern, str):
            raise GrammarError(f"a regular expression must be a str, got {type(pattern).__name__}")
        _check_utf8("the regular expression", pattern)
        compiled = _require_llguidance().LLMatcher.grammar_from_regex(pattern)
        return cls._validated("regex", pattern, compiled, "invalid regular expression")

    @classmethod
    def lark(cls, text: str) -> Grammar:
        """Output is derived from rule ``start`` of a Lark grammar in llguidance's dialect.

        The dialect adds ``%json {...}`` (a JSON schema inside a rule) and
        lexemes as ``/regex/``; see llguidance's docs/syntax.md.
        """
        if not isinstance(text, str):
            raise GrammarError(f"a Lark grammar must be a str, got {type(text).__name__}")
        _check_utf8("the Lark grammar", text)
        compiled = _require_llguidance().LLMatcher.grammar_from_lark(text)
        return cls._validated("lark", text, compiled, "invalid Lark grammar")

    @classmethod
    def ebnf(cls, text: str) -> Grammar:
        """A grammar in llama.cpp's GBNF (its EBNF dialect, rule ``root``), converted to Lark."""
        if not isinstance(text, str):
            raise GrammarError(f"an EBNF grammar must be a str, got {type(text).__name__}")
        _check_utf8("the EBNF grammar", text)
        _require_llguidance()
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            lark = any_to_lark(text)
        except Exception as e:  # the converter raises its own error classes and plain ones
            raise GrammarError(f"invalid EBNF grammar: {_first_line(str(e))}") from None
        return cls.lark(lark)

    def after_free_text(self, end: str, *, start: str | None = None, max_tokens: int | None = None,
                        gap: int = 2, start_token: int | None = None, end_token: int | None = None) -> Grammar:
        """This grammar, preceded by a block of free text that `end` closes: a model's reasoning
        (``<think>`` ... ``</think>``) before a constrained answer.

        With `start`, the output may open with the block (``start``, free text, ``end``) or go
        straight to this grammar; without it, the output opens inside the block (the prompt
        opened it) and must close it first. Up to `gap` newlines may follow `end`.
        `start_token` and `end_token`: the tokenizer's own token for a marker (Qwen3's
        ``</think>`` is one), which the model may write instead of the marker's text
        (llguidance reads an added token as a token, not as text).

        `max_tokens` bounds the block: once that many tokens of it (its markers included) are
        written without `end`, `end` is forced and this grammar follows, so the answer keeps
        the rest of a request's tokens. Unbounded (None), only the request's own limit ends
        a block the model never closes.
        """
        if not end or (start is not None and not start):
            raise GrammarError("a free-text block needs non-empty markers")
        _check_utf8("the free-text block's end marker", end)
        if start is not None:
            _check_utf8("the free-text block's start marker", start)
        if max_tokens is not None and max_tokens < 1:
            raise GrammarError(f"a free-text block's max_tokens must be >= 1, got {max_tokens}")
        answer = _named_grammars(self._compiled)
        gap_rule = f'GAP: /\\n{{1,{gap}}}/\n' if gap > 0 else ""
        tail = f' GAP? @{answer[0]["name"]}' if gap > 0 else f' @{answer[0]["name"]}'
        # body is lazy: it ends at the first `end`. With an end token, free text without `end`
        # may end at that token instead.
        rules = f'body[suffix={json.dumps(end)}]: /(.|\\n)*/\n'
        inside = "body"
        if end_token is not None:
            rules += f'free: FREE\nFREE: /(.|\\n)*/ & ~/(?s:.*){_regex_literal(end)}(?s:.*)/\n'
            inside = f"(body | free <[{int(end_token)}]>)"
        if start is None:
            lark = f'start: {inside}{tail}\n{rules}{gap_rule}'
        else:
            opening = json.dumps(start) if start_token is None else f"({json.dumps(start)} | <[{int(start_token)}]>)"
            lark = f'start: block?{tail}\nblock: {opening} {inside}\n{rules}{gap_rule}'
        lenient = bool(self.warnings)
        composed = Grammar._validated(self.kind, self.source, _top_level(lark, answer),
                                      f"invalid {self.kind} grammar", lenient)

        def closing(rest: str) -> Grammar:
            marker = json.dumps(rest) if end_token is None else f"({json.dumps(rest)} | <[{int(end_token)}]>)"
            return Grammar._validated(self.kind, self.source, _top_level(f"start: {marker}{tail}\n{gap_rule}", answer),
                                      f"invalid {self.kind} grammar", lenient)

        budget = None
        if max_tokens is not None:
            budget = _FreeTextBudget(max_tokens, start, end, closing)
            budget.closing("")  # compiled now: a grammar that fails, fails before any token
        return Grammar(self.kind, self.source, self.warnings, composed._compiled, budget)

    @classmethod
    def _validated(cls, kind: GrammarKind, source: str, compiled: str, what: str,
                   lenient: bool = False) -> Grammar:
        llg = _require_llguidance()
        failed, messages = llg.LLMatcher.validate_grammar_with_warnings(compiled, None, limits=_limits())
        # Token references (<[id]>) are checked once a tokenizer compiles the grammar.
        messages = [m for m in messages if not m.startswith("no tokenizer - can't validate")]
        if failed:
            raise GrammarError(f"{what}: {messages[0].strip() if messages else 'it does not compile'}")
        if messages and not lenient:
            # A warning is a part of the grammar that would not be enforced.
            raise GrammarError(f"{what}: {'; '.join(m.strip() for m in messages)}")
        return cls(kind, source, tuple(m.strip() for m in messages), compiled)


class _FreeTextBudget:
    """A free-text block's bound (Grammar.after_free_text): after `tokens` tokens still
    inside the block, a matcher goes on with `closing(text)`: the rest of the end marker,
    then the answer."""

    def __init__(self, tokens: int, start: str | None, end: str, build):
        self.tokens, self.start, self.end = tokens, start, end  # start None: the output opened inside
        self._build = build  # the closing grammar for what is left of `end`
        self._closing: dict[str, Grammar] = {}

    def still_open(self, text: str) -> bool:
        """Whether output `text` is still inside the block."""
        if self.start is not None:
            if not text.startswith(self.start):
                return False
            text = text[len(self.start):]
        return self.end not in text

    def closing(self, text: str) -> Grammar:
        """What follows `text` (still inside the block): the end marker, less the part of it
        `text` ends with, then the answer."""
        rest = self.end
        for n in range(len(self.end) - 1, 0, -1):
            if text.endswith(self.end[:n]):
                rest = self.end[n:]
                break
        if rest not in self._closing:
            self._closing[rest] = self._build(rest)
        return self._closing[rest]


_ANSWER_NAME = "emlx_answer"


def _regex_literal(text: str) -> str:
    """`text` matched literally inside a Lark /regex/ (Rust's syntax: only its metacharacters
    escaped, as \\< would be a word boundary there; "/" ends the regex in Lark)."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~/")


def _named_grammars(compiled: str) -> list[dict]:
    """llguidance's grammar list for `compiled` (JSON or Lark text), its first one named
    `_ANSWER_NAME` so that a Lark grammar around it can refer to it (``@emlx_answer``)."""
    try:
        top = json.loads(compiled)
    except ValueError:
        top = None
    grammars = [dict(g) for g in top["grammars"]] if isinstance(top, dict) and "grammars" in top \
        else [{"lark_grammar": compiled}]
    if any(g.get("name") == _ANSWER_NAME for g in grammars[1:]):
        raise GrammarError(f"a grammar may not name a part {_ANSWER_NAME!r}")
    grammars[0]["name"] = _ANSWER_NAME
    return grammars


def _top_level(lark: str, answer: list[dict]) -> str:
    return json.dumps({"grammars": [{"lark_grammar": lark}, *answer]})


def mask_words(vocab_size: int) -> int:
    """W, the number of uint32 words in one row's packed mask for a V-token vocabulary."""
    return (vocab_size + 31) // 32


class MaskTime:
    """What computing masks has cost one GrammarTokenizer's requests (the service's
    metrics): `computations` (one mask, or one batch round's rows at once), `masks`
    (rows' masks) and `seconds` (their wall time: a round's rows, computed in
    parallel, count theirs once). Mean mask time per step: seconds / computations.
    Written from the mask threads, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.computations = 0
        self.masks = 0
        self.seconds = 0.0

    def add(self, masks: int, seconds: float) -> None:
        with self._lock:
            self.computations += 1
            self.masks += masks
            self.seconds += seconds


class GrammarTokenizer:
    """A tokenizer as llguidance sees it, with the threads that compute masks; one per engine.

    `tokenizer` is what the engine holds: a ``tokenizers.Tokenizer`` (built
    from a GGUF), a Hugging Face ``PreTrainedTokenizerFast``, or mlx-lm's
    ``TokenizerWrapper`` around one. `eos_ids` are the tokens that end a
    generation (the engine's set; default: the wrapper's ``eos_token_ids``
    or the tokenizer's ``eos_token_id``): a grammar allows them once the
    output is complete. `vocab_size` is the model's logits width when it is
    larger than the tokenizer's (padded embeddings); the extra ids are never
    allowed.

    ``close()`` (or ``with``) stops the mask threads; they also stop when
    the object is collected.
    """

    def __init__(self, tokenizer: Any, *, eos_ids: Iterable[int] | None = None, vocab_size: int | None = None,
                 threads: int | None = None, cache_size: int = 64):
        llg = _require_llguidance()
        backend = _backend_tokenizer(tokenizer)
        eos = sorted({int(e) for e in eos_ids}) if eos_ids is not None else _default_eos(tokenizer)
        if not eos:
            raise InvalidArgument("the tokenizer names no end-of-sequence token: pass eos_ids")
        own = backend.get_vocab_size(with_added_tokens=True)
        if vocab_size is not None and vocab_size < own:
            raise InvalidArgument(f"vocab_size={vocab_size} is smaller than the tokenizer's {own} tokens")
        self._tokenizer = llg.LLTokenizer(backend.to_str(), n_vocab=vocab_size, eos_token=eos)
        self.vocab_size: int = self._tokenizer.vocab_size
        """V: the width of the logits the masks apply to."""
        self.words: int = mask_words(self.vocab_size)
        """W: uint32 words per row of a packed mask."""
        self.eos_ids: tuple[int, ...] = tuple(self._tokenizer.eos_tokens)
        self._threads = threads or min(4, os.cpu_count() or 1)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._compiled: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._cache_size = cache_size
        self._finalizer: weakref.finalize | None = None
        self._closed = False
        self.mask_time = MaskTime()

    def matcher(self, grammar: Grammar) -> GrammarMatcher:
        """A new request's state for `grammar`.

        Raises ``GrammarError`` when the grammar does not fit this tokenizer
        (what validation without a tokenizer cannot see).
        """
        if not isinstance(grammar, Grammar):
            raise InvalidArgumentType(f"matcher() takes a Grammar, got {type(grammar).__name__}")
        template = self._template(grammar)
        if grammar._budget is not None:
            self._template(grammar._budget.closing(""))  # it fails now, if at all, not mid-answer
        return GrammarMatcher(self, grammar, template.deep_copy())

    def _template(self, grammar: Grammar):
        """`grammar`'s compiled matcher at its start, kept for the next request (GrammarError if it
        does not fit this tokenizer)."""
        with self._lock:
            template = self._compiled.get(grammar._compiled)
            if template is not None:
                self._compiled.move_to_end(grammar._compiled)
        if template is None:
            # Compiling drops the GIL (up to ~1 s for a huge grammar); a copy of a
            # compiled matcher costs microseconds, so keep recent ones.
            template = _require_llguidance().LLMatcher(self._tokenizer, grammar._compiled, log_level=0,
                                                       limits=_limits())
            if template.is_error():
                raise GrammarError(f"the {grammar.kind} grammar does not fit this tokenizer: "
                                   f"{_first_line(template.get_error())}")
            self._check_start(grammar, template)
            with self._lock:
                self._compiled[grammar._compiled] = template
                while len(self._compiled) > self._cache_size:
                    self._compiled.popitem(last=False)
        return template

    def _check_start(self, grammar: Grammar, template: Any) -> None:
        """GrammarError for a grammar no output can match (a regex of an empty class, say):
        llguidance compiles it, then fails the first token's mask (NoExtensionBias). One mask
        per compiled grammar, on a copy, so the request fails here instead of mid-decode."""
        probe = template.deep_copy()
        mask = np.empty(self.words, dtype=np.uint32)
        probe.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        if probe.is_error() or not mask.any():
            detail = _first_line(probe.get_error()) if probe.is_error() else "no token is allowed"
            raise GrammarError(f"the {grammar.kind} grammar is unsatisfiable: nothing can start its output "
                               f"({detail})")

    def logits_processor(self, grammar: Grammar, *,
                         on_error: Literal["raise", "end"] = "raise") -> GrammarLogitsProcessor:
        """mlx-lm's ``logits_processors`` entry for one generation under `grammar`."""
        return GrammarLogitsProcessor(self.matcher(grammar), on_error=on_error)

    def allocate_masks(self, rows: int) -> np.ndarray:
        """A {rows, W} uint32 mask with every token allowed (free rows stay so)."""
        return np.full((rows, self.words), ALL_ALLOWED, dtype=np.uint32)

    def fill_masks(self, matchers: Sequence[GrammarMatcher | None],
                   out: np.ndarray | None = None) -> tuple[np.ndarray, list[GrammarStateError | None]]:
        """Every row's next mask at once: ``({B, W} uint32, per-row error or None)``.

        Row ``i`` is ``matchers[i]``'s mask, or all allowed where it is None
        (a row without a grammar). llguidance computes the rows in parallel
        on its own threads with the GIL released. A row whose grammar fails
        gets its error in the list (fail that request, keep the batch) and
        an all-allowed mask, so the batch's step is still valid. `out`, if
        given, must be C-contiguous {B, W} uint32 and is written in place.
        """
        rows = len(matchers)
        if out is None:
            out = self.allocate_masks(rows)
        elif out.dtype != np.uint32 or out.shape != (rows, self.words) or not out.flags["C_CONTIGUOUS"]:
            raise InvalidArgument(f"out must be a C-contiguous ({rows}, {self.words}) uint32 array, "
                                  f"got {out.dtype} {out.shape}")
        errors: list[GrammarStateError | None] = [None] * rows
        pending = []
        for i, m in enumerate(matchers):
            if m is None:
                out[i] = ALL_ALLOWED
                continue
            if m._tokenizer is not self:
                raise InvalidArgument(f"row {i}'s matcher belongs to another GrammarTokenizer")
            m._join()
            if m._mask is not None:
                out[i] = m._mask
            elif m._error is not None:
                errors[i] = m._error
                out[i] = ALL_ALLOWED
            else:
                pending.append((i, m))
        if pending:
            rows_of = [(m._matcher, i) for i, m in pending]
            start = time.perf_counter()
            _llg_executor().unsafe_compute_mask_ptr(rows_of, out.ctypes.data, self.words * 4, rows)
            self.mask_time.add(len(pending), time.perf_counter() - start)
            for i, m in pending:
                errors[i] = m._record(out[i])
                if errors[i] is not None:
                    out[i] = ALL_ALLOWED
        return out, errors

    def start_masks(self, matchers: Sequence[GrammarMatcher | None],
                    out: np.ndarray | None = None) -> Future[tuple[np.ndarray, list[GrammarStateError | None]]]:
        """``fill_masks`` on a background thread: the future's result is the same pair.

        Do not touch the matchers until it is done (``advance`` would wait).
        """
        return self._submit(self.fill_masks, list(matchers), out)

    def close(self) -> None:
        """Stop the mask threads (pending computations finish first). Idempotent.

        Masks computed on the calling thread (``mask()``, ``fill_masks``)
        still work after it; ``start_mask`` and ``start_masks`` raise.
        """
        with self._lock:
            pool, self._pool = self._pool, None
            self._compiled.clear()
            self._closed = True
        if self._finalizer is not None:
            self._finalizer.detach()
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> GrammarTokenizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _submit(self, fn, *args) -> Future:
        with self._lock:
            if self._closed:
                raise InvalidState("this GrammarTokenizer is closed: its mask threads are stopped")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="emlx-grammar")
                self._finalizer = weakref.finalize(self, self._pool.shutdown, wait=False)
            return self._pool.submit(fn, *args)

    def __repr__(self) -> str:
        return f"<GrammarTokenizer vocab_size={self.vocab_size} eos_ids={list(self.eos_ids)}>"


class GrammarMatcher:
    """One request's grammar state: the mask for its next token, and the tokens it took.

    Use it from one task at a time. ``start_mask()`` may run the mask
    computation on a background thread meanwhile; ``mask()`` and
    ``advance()`` wait for it, so the state is never touched by two threads.
    """

    def __init__(self, tokenizer: GrammarTokenizer, grammar: Grammar, matcher: Any):
        self._tokenizer = tokenizer
        self.grammar = grammar
        self._matcher = matcher
        self._mask: np.ndarray | None = None  # the next token's mask, once computed
        self._error: GrammarStateError | None = None
        self._pending: Future | None = None
        self.tokens: list[int] = []
        """The tokens consumed so far."""

    @property
    def tokenizer(self) -> GrammarTokenizer:
        """The GrammarTokenizer this state was made by (its ``fill_masks`` computes a batch's masks)."""
        return self._tokenizer

    def mask(self) -> np.ndarray:
        """The packed mask {W} (uint32) of the tokens allowed next. Raises ``GrammarStateError``.

        Computed once per state (a second call returns the same array; do
        not write into it). It runs on the calling thread; llguidance
        releases the GIL while it does.
        """
        self._join()
        if self._mask is None and self._error is None:
            self._record(self._computed(), owned=True)
        if self._error is not None:
            raise self._error
        assert self._mask is not None
        return self._mask

    def start_mask(self) -> Future[np.ndarray]:
        """Compute ``mask()`` on a background thread, to overlap it with a model step.

        Returns a ``concurrent.futures.Future`` (``asyncio.wrap_future`` or
        ``anyio.to_thread`` to await it); its exception is the
        ``GrammarStateError``. Calling ``mask()`` later gives the same array.
        """
        if self._pending is not None:
            return self._pending
        mask, error = self._mask, self._error
        if mask is not None or error is not None:
            done: Future[np.ndarray] = Future()
            if error is not None:
                done.set_exception(error)
            elif mask is not None:
                done.set_result(mask)
            return done
        self._pending = self._tokenizer._submit(self._compute)
        return self._pending

    def advance(self, token: int) -> None:
        """Consume the sampled `token`. Raises ``GrammarStateError`` when the grammar rejects it.

        An end-of-sequence token is accepted once the output is complete
        (``is_accepting``); after it, or once ``is_finished``, only EOS is.
        """
        self._join()
        if self._error is not None:
            raise self._error
        if not self._matcher.consume_token(int(token)):
            raise self._fail(f"token {int(token)} was rejected")
        self.tokens.append(int(token))
        self._mask = None
        budget = self.grammar._budget
        if budget is not None and len(self.tokens) == budget.tokens:
            text = self._tokenizer._tokenizer.decode_bytes(self.tokens).decode("utf-8", "replace")
            if budget.still_open(text):  # spent: the end marker comes now, then the answer
                self._matcher = self._tokenizer._template(budget.closing(text)).deep_copy()

    def allows(self, token: int) -> bool:
        """Whether `token` may come next (reads the mask, computing it if needed)."""
        token = int(token)
        if not 0 <= token < self._tokenizer.vocab_size:
            return False
        return bool((int(self.mask()[token >> 5]) >> (token & 31)) & 1)

    @property
    def is_accepting(self) -> bool:
        """The output so far is complete: an end-of-sequence token may end it now."""
        self._join()
        return self._error is None and self._matcher.is_accepting()

    @property
    def is_finished(self) -> bool:
        """Nothing but end-of-sequence can follow: the engine can end the request now (``stop``)
        without running a step that could only sample EOS."""
        self._join()
        return self._error is None and self._matcher.is_stopped()

    @property
    def error(self) -> GrammarStateError | None:
        """The failure that ended this grammar, if any."""
        self._join()
        return self._error

    def _computed(self) -> np.ndarray:
        """The next mask, freshly computed (timed in the tokenizer's ``mask_time``)."""
        out = np.empty(self._tokenizer.words, dtype=np.uint32)
        start = time.perf_counter()
        self._matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        self._tokenizer.mask_time.add(1, time.perf_counter() - start)
        return out

    def _compute(self) -> np.ndarray:
        out = self._computed()
        error = self._record(out, owned=True)
        if error is not None:
            raise error
        return out

    def _record(self, mask: np.ndarray, *, owned: bool = False) -> GrammarStateError | None:
        """Keep a freshly computed mask (a copy unless `owned`), or the error that computing it hit."""
        if self._matcher.is_error():
            return self._fail("computing the next token mask failed")
        self._mask = mask if owned else mask.copy()
        return None

    def _fail(self, what: str) -> GrammarStateError:
        detail = _first_line(self._matcher.get_error())
        self._error = GrammarStateError(f"{self.grammar.kind} grammar: {what}: {detail} "
                                        f"(after {len(self.tokens)} tokens)")
        return self._error

    def _join(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except GrammarStateError:
                pass  # kept in self._error

    def __repr__(self) -> str:
        state = "failed" if self._error else "finished" if self._matcher.is_stopped() else \
            "accepting" if self._matcher.is_accepting() else "running"
        return f"<GrammarMatcher {self.grammar.kind} {state} after {len(self.tokens)} tokens>"


# ---- applying a mask in MLX --------------------------------------------------

def unpack_token_mask(mask: np.ndarray | mx.array, vocab_size: int) -> Any:
    """A packed mask {..., W} (uint32) as booleans {..., V}.

    A NumPy mask unpacks with NumPy (on the host, a few microseconds a row);
    an ``mx.array`` with MLX ops (traceable).
    """
    words = mask.shape[-1]
    if words * 32 < vocab_size:
        raise InvalidArgument(f"a mask of {words} words covers {words * 32} tokens, fewer than {vocab_size}")
    if isinstance(mask, np.ndarray):
        if mask.dtype != np.uint32:
            raise InvalidArgument(f"a packed token mask is uint32, got {mask.dtype}")
        unpacked = np.unpackbits(np.ascontiguousarray(mask).view(np.uint8), axis=-1, bitorder="little")
        return unpacked[..., :vocab_size].view(np.bool_)
    if mask.dtype != mx.uint32:
        raise InvalidArgument(f"a packed token mask is uint32, got {mask.dtype}")
    bits = mx.right_shift(mask[..., None], mx.arange(32, dtype=mx.uint32)) & 1
    return bits.reshape(*mask.shape[:-1], words * 32)[..., :vocab_size].astype(mx.bool_)


def apply_token_mask(logits: mx.array, mask: mx.array) -> mx.array:
    """`logits` {..., V} with -inf wherever `mask` disallows a token.

    `mask` is packed ({..., W} uint32, unpacked here with shift, and) or
    already unpacked ({..., V} bool, from ``unpack_token_mask`` on the
    host): the dtype picks, so a traced step fixes one. Pure MLX ops on
    its inputs, so it belongs inside a traced step as one more input
    (``{B, W}`` or ``{B, V}`` for ``{B, V}`` logits; a row without a grammar
    passes all-allowed). Apply it before sampling, so greedy, top-p, top-k
    and temperature all see only allowed tokens.

    On a CPU the unpacked form costs the step less (one ``where`` pass
    over the logits against about four; benchmarks/RESULTS.md), and the
    host unpacks while the model step runs; the packed form is 8 times
    smaller to hand over.
    """
    vocab = logits.shape[-1]
    if mask.dtype == mx.bool_:
        if mask.shape[-1] != vocab:
            raise InvalidArgument(f"a boolean token mask has one entry per token: {mask.shape[-1]} for {vocab} logits")
        allowed = mask
    else:
        allowed = unpack_token_mask(mask, vocab)
    return mx.where(allowed, logits, mx.array(-math.inf, dtype=logits.dtype))


class GrammarLogitsProcessor:
    """mlx-lm's logits processor for one generation: ``processor(tokens, logits) -> logits``.

    Pass it in ``logits_processors=[...]`` to ``mlx_lm.generate_step`` (or
    one list per row to ``BatchGenerator.insert``). The first call sees the
    prompt; each later call sees one new token, which it feeds to the
    grammar before masking. Reading that token waits for the step that
    made it: a constrained Python step cannot run one step ahead.

    A grammar failure (``GrammarStateError``) raises from the call with
    ``on_error="raise"``. With ``on_error="end"`` the row is ended instead:
    only end-of-sequence is allowed from then on and the failure waits in
    ``error``, so the other rows of a ``BatchGenerator`` batch go on (its
    step would fail as a whole on an exception); check ``error`` when the
    row finishes and fail that request.
    """

    def __init__(self, matcher: GrammarMatcher, *, on_error: Literal["raise", "end"] = "raise"):
        if on_error not in ("raise", "end"):
            raise InvalidArgument(f"on_error must be 'raise' or 'end', got {on_error!r}")
        self.matcher = matcher
        self.on_error = on_error
        self._seen: int | None = None

    @property
    def error(self) -> GrammarStateError | None:
        """The grammar's failure, if it failed (``on_error="end"`` keeps it here)."""
        return self.matcher.error

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        vocab = self.matcher._tokenizer.vocab_size
        if logits.shape[-1] != vocab:
            raise InvalidArgument(f"the logits have {logits.shape[-1]} entries, the GrammarTokenizer {vocab}: "
                                  f"build it with vocab_size={logits.shape[-1]}")
        try:
            if self._seen is None:
                self._seen = int(tokens.size)  # the prompt
            elif tokens.size > self._seen:
                new = np.asarray(tokens[self._seen:]).tolist()
                self._seen = int(tokens.size)
                for token in new:
                    if self.matcher.error is None:
                        self.matcher.advance(token)
            packed = self.matcher.mask()
        except GrammarStateError:
            if self.on_error == "raise":
                raise
            packed = np.zeros(self.matcher._tokenizer.words, dtype=np.uint32)
            eos = self.matcher._tokenizer.eos_ids[0]
            packed[eos >> 5] = np.uint32(1 << (eos & 31))
        # Unpacked on the host: one `where` in the step instead of four passes.
        mask = mx.array(unpack_token_mask(packed, vocab))
        if logits.ndim == 2:
            mask = mask[None]
        return apply_token_mask(logits, mask)


# ---- reading the engine's tokenizer -----------------------------------------

def _backend_tokenizer(tokenizer: Any):
    """The ``tokenizers.Tokenizer`` inside what the engine holds."""
    inner = getattr(tokenizer, "_tokenizer", None)  # mlx-lm's TokenizerWrapper
    if inner is not None and not _is_rust_tokenizer(tokenizer):
        tokenizer = inner
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)  # Hugging Face's fast tokenizer
    if not _is_rust_tokenizer(backend):
        raise InvalidArgumentType(f"grammars need a `tokenizers` (fast) tokenizer, got {type(tokenizer).__name__}")
    return backend


def token_of(tokenizer: Any, text: str) -> int | None:
    """The id of `tokenizer`'s token that is exactly `text` (an added marker token such as
    Qwen3's ``</think>``), or None (the tokenizer spells it with several)."""
    try:
        token = _backend_tokenizer(tokenizer).token_to_id(text)
    except TypeError:
        return None
    return None if token is None else int(token)


def _is_rust_tokenizer(obj: Any) -> bool:
    return hasattr(obj, "to_str") and hasattr(obj, "get_vocab_size")


def _default_eos(tokenizer: Any) -> list[int]:
    # mlx-lm's wrapper keeps a list (eos_token_ids); Hugging Face's tokenizer
    # one id (eos_token_id; transformers 5 also answers eos_token_ids with it).
    for holder in (tokenizer, getattr(tokenizer, "_tokenizer", None)):
        for name in ("eos_token_ids", "eos_token_id"):
            ids = getattr(holder, name, None)
            if isinstance(ids, int):
                return [ids]
            if ids:
                return sorted(int(e) for e in ids)
    return []
