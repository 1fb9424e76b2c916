"""The replayed step's traces: one per shape (greedy, rows, cache size), made on
first use and sharing the model's weights.

The traced step itself (a fixed-cache forward with sampling inside the graph)
is llm/traced.py; this module decides which shapes exist and traces them.
"""

from __future__ import annotations

from typing import Any

import anyio
import mlx.core as mx

from .. import Runtime
from .. import replay as _replay
from . import traced as _traced
from .sampling import GREEDY

# Fixed KV cache lengths of the replayed step: powers of two from 64 up to the
# model's context (which is always one; 4096 when unknown). Attention reads the
# whole cache every step, so a stream starts on the smallest that holds its
# prompt and moves to the next when it is full; each length is one trace.
SMALLEST_CACHE = 64
UNKNOWN_CONTEXT = 4096
# Model types whose layers are traced.forward's llama layout.
TRACEABLE = {"llama"}


def untraceable_reason(model) -> str | None:
    """Why `model` has no traced step, or None when it has one."""
    args = getattr(model, "args", None)
    if getattr(args, "model_type", None) in TRACEABLE:
        return None
    model_type = getattr(args, "model_type", type(model).__name__)
    return f"model type {model_type!r} has no traced step (only {sorted(TRACEABLE)})"


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
    traced on the queue that first needs it (a fraction of a second).
    """

    def __init__(self, model, sizes: list[int], dtype: mx.Dtype, vocab: int, *, max_concurrent: int):
        self.model = model
        self.sizes = sizes
        self.dtype = dtype
        self.vocab = vocab  # the logits' width: top_k at or past it keeps every token
        self.weights = _traced.model_weights(model)  # bound to every trace (TracedFunction.bind)
        self._steps = {greedy: _traced.make_sampling_step(model, weights_as_inputs=True, greedy=greedy)
                       for greedy in (False, True)}
        layers, heads_kv, dim = _traced.layout(model)
        self.n_caches, self.heads_kv, self.head_dim = 2 * layers, heads_kv, dim
        self.row_buckets = sorted({2 ** i for i in range(max_concurrent.bit_length())
                                   if 2 ** i <= max_concurrent} | {max_concurrent})
        self.traced: dict[tuple[bool, int | None, int], Any] = {}
        self.chains: dict[tuple[bool, int], Any] = {}  # one stream's steps as chains (parallel mode)
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
        for function in [*self.traced.values(), *self.chains.values()]:
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
        function = self.chains.get((greedy, size))
        if function is None:
            step = await self.function(queue, greedy=greedy, rows=None, size=size)
            carried = {i: 2 + i for i in range(self.n_caches)}  # caches -> outputs 2...
            carried.update({self.n_caches: 1, self.n_caches + 1: 0})  # key <- output 1, token <- output 0
            function = self.chains.setdefault((greedy, size), step.chain(carried, returned=(0,)))
        return function

    async def _trace(self, queue, greedy: bool, rows: int | None, size: int):
        if rows is None:
            per_row = [mx.random.key(0), mx.array([[0]], dtype=mx.int32), mx.array(0, dtype=mx.int32),
                       *_traced.sampling_inputs(0.0, 1.0, 0, 1)]
        else:
            per_row = [mx.zeros((rows, 2), dtype=mx.uint32), mx.zeros((rows, 1), dtype=mx.int32),
                       mx.zeros((rows,), dtype=mx.int32), *_traced.sampling_rows([GREEDY] * rows, 1)]
        caches = _traced.example_caches(self.model, size, self.dtype, rows or 1)
        traced = await _replay.trace(self._steps[greedy], *caches, *per_row, *self.weights, queue=queue)
        try:
            # The weights go to the worker with the graph, once: a step's
            # submit carries the caches and the few per-step inputs only.
            return traced.bind(*self.weights)
        finally:
            traced.release()

    @classmethod
    async def trace(cls, runtime: Runtime, model, sizes: list[int], *, mode: str,
                    max_concurrent: int) -> ReplayTraces:
        """Check the traced forward against the model's, then trace the greedy steps
        of what `mode` runs most."""
        async with runtime.queue() as queue:
            dtype, vocab = await queue.run(check_forward, model)
            replay = cls(model, sizes, dtype, vocab, max_concurrent=max_concurrent)
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


def check_forward(model) -> tuple[mx.Dtype, int]:
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


__all__ = ["ReplayTraces", "UNKNOWN_CONTEXT", "cache_sizes", "check_forward", "untraceable_reason"]
