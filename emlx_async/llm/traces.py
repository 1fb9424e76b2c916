"""The replayed step's traces: one per shape (greedy, rows, cache size) and variant
(with or without the penalties' inputs, with or without a token mask), made on first
use and sharing the model's weights.

The traced step itself (mlx-lm's own model call over fixed cache buffers,
with sampling inside the graph) is llm/replay_step.py; this module decides
which shapes exist and traces them.
"""

from __future__ import annotations

from typing import Any

import anyio
import mlx.core as mx

from .. import Runtime
from .. import replay as _replay
from . import penalties as _penalties
from . import traced as _traced
from .cache_options import CacheOptions
from .replay_step import CacheSpec, check_against_model, make_step, model_weights
from .sampling import GREEDY

# Fixed KV cache lengths of the replayed step: powers of two from 64 up to the
# model's context (which is always one; 4096 when unknown). Attention reads the
# whole cache every step, so a stream starts on the smallest that holds its
# prompt and moves to the next when it is full; each length is one trace.
SMALLEST_CACHE = 64
UNKNOWN_CONTEXT = 4096
# What a chained step is given for the inputs its chain carries.
STAND_IN = mx.array(0, dtype=mx.int32)
# The step's variants, (penalized, masked): which optional inputs follow top_k (llm/replay_step.py).
VARIANTS = ((False, False), (True, False), (False, True), (True, True))


def cache_sizes(context: int) -> list[int]:
    """Powers of two from SMALLEST_CACHE below `context`, and the context itself."""
    sizes, n = [], SMALLEST_CACHE
    while n < context:
        sizes.append(n)
        n *= 2
    return sizes + [context]


class ReplayTraces:
    """The traced decode step and the weights its traces share.

    A trace is one shape: (greedy, rows, cache size). ``rows`` None is one
    stream's step ("parallel" mode: key {2}, position and options scalars);
    an int is a batch of that many rows ("batch" mode), a power of two up to
    the engine's max_concurrent (or max_concurrent itself), since on CPU
    every row costs a whole step. Greedy streams (and batches of only
    greedy rows) get a step without the sampler, which sorts the
    vocabulary. Load traces the greedy step of every cache size (parallel)
    or every row count at the smallest size (batch); any other shape is
    traced on the queue that first needs it (a fraction of a second), as
    is every shape of the other variants (``VARIANTS``: penalized, masked).
    """

    def __init__(self, model, spec: CacheSpec, sizes: list[int], vocab: int, *, max_concurrent: int,
                 group: Any = None):
        self.model = model
        # A sharded model's traces are its group's (``Group.trace``: each all_sum replayed over
        # the group, every call on the group's queue); None: the runtime's (``ea.trace``).
        self.group = group
        self.spec = spec  # the cache buffers: shapes, and moving mlx-lm caches in and out
        self.sizes = sizes
        self.vocab = vocab  # the logits' width: top_k at or past it keeps every token
        self.weights = model_weights(model)  # bound to every trace (TracedFunction.bind)
        # A variant is (penalized, masked): the step with the penalties' inputs (llm/penalties.py)
        # and with a token mask (llm/grammar.py), for the requests that have them; the plain
        # step keeps its inputs and its speed.
        self._steps = {(greedy, *variant): make_step(model, spec, weights_as_inputs=True, greedy=greedy,
                                                     penalized=variant[0], masked=variant[1])
                       for greedy in (False, True) for variant in VARIANTS}
        self.n_caches = n = spec.n_buffers
        self.row_buckets = sorted({2 ** i for i in range(max_concurrent.bit_length())
                                   if 2 ** i <= max_concurrent} | {max_concurrent})
        # Each variant's traces by shape (greedy, rows, size).
        self.variants: dict[tuple[bool, bool], dict[tuple[bool, int | None, int], Any]] = {v: {} for v in VARIANTS}
        self.traced = self.variants[False, False]
        self.traced_penalized = self.variants[True, False]
        # The steps as chains: one stream's (rows None, parallel mode) or a batch's, by shape and variant.
        self.chains: dict[tuple[bool, int | None, int, bool, bool], Any] = {}
        # What takes a batch chain's carried arrays back to the loop, per (rows, size, penalized).
        self.takes: dict[tuple[int, int, bool], Any] = {}
        self._tracing = anyio.Lock()
        # Donated: cache buffers -> outputs 2..., key -> output 1, updated in
        # place and published back into the caller's arrays; the penalized
        # step's counts and window (inputs n + 6, n + 7) -> outputs n + 2, n + 3. A mask is
        # an input of one step only: never donated, the same indices with or without it.
        self.donate = {**{i: 2 + i for i in range(n)}, n: 1}
        self.donate_penalized = {**self.donate, n + 6: n + 2, n + 7: n + 3}

    def size_for(self, tokens: int) -> int | None:
        """The smallest traced cache that holds a stream of `tokens` tokens (None: none does)."""
        needed = self.spec.positions_needed(tokens)
        return next((n for n in self.sizes if n >= needed), None)

    def rows_for(self, count: int) -> int:
        """Rows of the smallest batch step that holds `count` streams (0 for none)."""
        return next((n for n in self.row_buckets if n >= count), 0) if count else 0

    def release(self) -> None:
        for function in [*(f for traced in self.variants.values() for f in traced.values()),
                         *self.chains.values(), *self.takes.values()]:
            function.release()

    async def function(self, queue, *, greedy: bool, rows: int | None, size: int, penalized: bool = False,
                       masked: bool = False) -> Any:
        """The step of this shape and variant, traced on `queue` the first time it is asked for."""
        shape = (greedy, rows, size)
        traced = self.variants[penalized, masked]
        function = traced.get(shape)
        if function is None:
            async with self._tracing:
                function = traced.get(shape)
                if function is None:
                    function = traced[shape] = await self._trace(queue, *shape, penalized, masked)
        return function

    async def chained(self, queue, *, greedy: bool, size: int, penalized: bool = False, masked: bool = False,
                      rows: int | None = None) -> Any:
        """The step of this shape as a chain: caches, key and token (and the penalized
        step's counts and window) carried on the worker; a call returns the token(s).
        A masked step's mask is a per-call input, as the options are."""
        key = (greedy, rows, size, penalized, masked)
        function = self.chains.get(key)
        if function is None:
            step = await self.function(queue, greedy=greedy, rows=rows, size=size, penalized=penalized, masked=masked)
            n = self.n_caches
            carried = {i: 2 + i for i in range(n)}  # caches -> outputs 2...
            carried.update({n: 1, n + 1: 0})  # key <- output 1, token <- output 0
            if penalized:
                carried.update({n + 6: n + 2, n + 7: n + 3})  # counts, window <- after the caches
            function = self.chains.setdefault(key, step.chain(carried, returned=(0,)))
        return function

    async def take(self, queue, *, rows: int, size: int, penalized: bool = False) -> Any:
        """The end of a batch chain of this shape: fed the last step's outputs, it returns
        them all (token, keys, caches[, counts, window]) as they are, no copy, so the
        loop holds the batch's arrays again (then ``end_chain_here`` drops the chain's)."""
        shape = (rows, size, penalized)
        function = self.takes.get(shape)
        if function is None:
            async with self._tracing:
                function = self.takes.get(shape)
                if function is None:
                    outputs = [mx.zeros((rows, 1), dtype=mx.int32), mx.zeros((rows, 2), dtype=mx.uint32),
                               *self.spec.example(rows, size), *(self._history(rows)[:2] if penalized else [])]
                    traced = await self._trace_on(queue, lambda *arrays: list(arrays), outputs)
                    try:
                        function = self.takes[shape] = traced.chain({k: k for k in range(len(outputs))},
                                                                    returned=range(len(outputs)))
                    finally:
                        traced.release()
        return function

    async def _trace(self, queue, greedy: bool, rows: int | None, size: int, penalized: bool, masked: bool):
        if rows is None:
            per_row = [mx.random.key(0), mx.array([[0]], dtype=mx.int32), mx.array(0, dtype=mx.int32),
                       *_traced.sampling_inputs(0.0, 1.0, 0, 1)]
            if penalized:
                per_row += [*self._history(1), *_penalties.penalty_inputs(None)]
        else:
            per_row = [mx.zeros((rows, 2), dtype=mx.uint32), mx.zeros((rows, 1), dtype=mx.int32),
                       mx.zeros((rows,), dtype=mx.int32), *_traced.sampling_rows([GREEDY] * rows, 1)]
            if penalized:
                per_row += [*self._history(rows), *_penalties.penalty_rows([None] * rows)]
        if masked:  # every token allowed: the mask's shape and dtype, {rows, V} bool
            per_row.append(mx.ones((rows or 1, self.vocab), dtype=mx.bool_))
        caches = self.spec.example(rows or 1, size)
        traced = await self._trace_on(queue, self._steps[greedy, penalized, masked], [*caches, *per_row,
                                                                                       *self.weights])
        try:
            # The weights go to the worker with the graph, once: a step's
            # submit carries the caches and the few per-step inputs only.
            return traced.bind(*self.weights)
        finally:
            traced.release()

    async def _trace_on(self, queue, fn, examples: list[mx.array]) -> Any:
        if self.group is not None:
            return await self.group.trace(fn, *examples)
        return await _replay.trace(fn, *examples, queue=queue)

    def _history(self, rows: int) -> list[mx.array]:
        """Stand-ins of the penalized step's counts, window and bias for `rows` rows."""
        return [mx.zeros((rows, self.vocab), dtype=mx.int32),
                mx.zeros((rows, _penalties.REPETITION_CONTEXT), dtype=mx.int32),
                mx.zeros((rows, self.vocab), dtype=mx.float32)]

    @classmethod
    async def trace(cls, runtime: Runtime, model, sizes: list[int], *, mode: str, max_concurrent: int,
                    options: CacheOptions, group: Any = None) -> ReplayTraces:
        """Describe the model's cache buffers and check the step against the model's
        own forward, then trace the greedy steps of what `mode` runs most.

        `group` (an ``ea.distributed.Group``): the model is its rank's shard; the
        check and the traces run on the group's queue, as every rank does.

        Raises NotTraceable (a cache with no buffer form), ValueError (the
        step disagrees with the model) or what tracing raises (an op MLX
        cannot export)."""
        async with runtime.queue() as queue:
            if group is None:
                spec, vocab = await queue.run(_described, model, options)
            else:  # the check's forward passes hold all_sums: in the group's order
                described = await group.run(_described_or_refusal, model, options, what="sharded step check")
                if isinstance(described, Exception):  # the same on every rank: the group stays whole
                    raise described
                spec, vocab = described
            replay = cls(model, spec, sizes, vocab, max_concurrent=max_concurrent, group=group)
            try:
                if mode == "batch":
                    for rows in replay.row_buckets:
                        await replay.function(queue, greedy=True, rows=rows, size=sizes[0])
                else:
                    for size in sizes:
                        await replay.function(queue, greedy=True, rows=None, size=size)
            except BaseException:
                replay.release()
                raise
        return replay


def _described(model, options: CacheOptions) -> tuple[CacheSpec, int]:
    """On a worker: the model's cache buffers, and the logits' width once the fixed-buffer
    step agrees with the model's own forward (a model whose cache use the buffers do
    not capture fails here rather than decoding wrong tokens)."""
    spec = CacheSpec.of(model, options)
    return spec, check_against_model(model, spec)


def _described_or_refusal(model, options: CacheOptions) -> tuple[CacheSpec, int] | Exception:
    """`_described`, with a refusal returned: raised inside a group's job it would break the group."""
    try:
        return _described(model, options)
    except Exception as exc:  # noqa: BLE001 - given back to the caller as it is
        return exc


__all__ = ["STAND_IN", "ReplayTraces", "UNKNOWN_CONTEXT", "cache_sizes"]
