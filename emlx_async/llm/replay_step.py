"""One decode step of any mlx-lm model, traced once and replayed natively.

mlx-lm's caches grow in Python objects; a traced graph needs fixed shapes.
So the step calls the model itself (``model(tokens, cache=caches)``, any
architecture) with stand-ins of mlx-lm's cache classes backed by
preallocated buffers: the new keys and values are written at a position
array (one row: a dynamic slice_update; B rows: a scatter, each row at its
own position), ``cache.offset`` *is* that array (mlx-lm gives it to rope,
and ``mx.fast.rope`` takes an array offset, one per row), and
``make_mask`` hides what the buffer holds beyond each row's position (or
outside a sliding window). The sampler runs inside the graph too.

Which stand-in each layer gets follows ``make_prompt_cache``:

* ``KVCache``: a buffer of the trace's cache size.
* ``RotatingKVCache`` (sliding-window layers; every layer with
  ``max_kv_size``): a ring of ``min(max_size, size)`` positions whose first
  ``keep`` slots hold the first tokens and the rest rotate, as mlx-lm's do.
* ``QuantizedKVCache`` (``kv_bits``): quantized buffers, keys and values
  (weights, scales, biases) tuples with ``bits`` and ``group_size``, so
  mlx-lm's attention takes its quantized path.
* ``ArraysCache`` (SSM and linear-attention layers): its arrays in and out,
  fixed-shape states that need no position. A state that grows over the
  first tokens up to a bound (longcat_flash_ngram's last n - 1 token ids)
  is buffered at the bound, the first tokens' narrower state at its end.
* ``ChunkedKVCache`` (llama4's chunked attention: a token attends to the
  earlier tokens of its own chunk): a ring of ``min(chunk, size)`` slots,
  position p in slot p mod chunk, ``make_chunk_mask`` showing the chunk's
  slots. mlx-lm's llama4 builds that mask itself from Python-int positions,
  so it replays once ``model_fixes.fix_position_arrays`` made it ask its cache
  (Engine.load does).
* ``CacheList`` (a layer with several caches, as falcon_h1's state and
  keys): each of its caches' buffers in turn.

Anything else raises ``NotTraceable`` naming it. ``CacheSpec`` describes the
buffers (per layer: shapes per rows and size, dtypes) and moves mlx-lm
caches into them after a prefill and back out for the prompt cache.

The step's calling convention is ``step(*buffers, key, token, position,
inv_temperature, top_p, top_k[, *weights]) -> (next_token, key, *buffers)``:
donate buffer i to output 2 + i and the key to output 1. The penalized
variant (``make_step(penalized=True)``, llm/penalties.py) takes
``PENALTY_INPUTS`` after top_k and gives the counts and window back after
the buffers.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.cache import ArraysCache, CacheList, ChunkedKVCache, KVCache, QuantizedKVCache, RotatingKVCache

from .. import InvalidArgument, InvalidArgumentType
from .. import NotTraceable as NotTraceable
from . import penalties as _penalties
from .cache_options import CacheOptions
from .grammar import apply_token_mask
from .traced import sample

__all__ = ["NotTraceable", "CacheSpec", "MASK_INPUT", "PENALTY_INPUTS", "forward", "make_step",
           "check_against_model", "check_batch_against_rows", "check_mlx_batch_against_rows", "model_weights"]


# ---- what the buffers are --------------------------------------------------------

@dataclass(frozen=True)
class Buffer:
    """One array a layer carries from step to step.

    ``dims``: one row's shape; for a timed buffer the two axes around the
    time axis ({rows, dims[0], length, dims[1]}, mlx-lm's key layout),
    else the whole row ({rows, *dims}).
    """
    dims: tuple[int, ...]
    dtype: mx.Dtype
    timed: bool = True


@dataclass(frozen=True)
class KVLayer:
    """Keys and values at absolute positions; a ring when ``max_size`` is set (RotatingKVCache)."""
    keys: Buffer
    values: Buffer
    max_size: int | None = None
    keep: int = 0

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return self.keys, self.values

    def length(self, size: int) -> int:
        return size if self.max_size is None else min(self.max_size, size)

    def stand_in(self, arrays: Sequence[mx.array], position: mx.array, masks: list) -> _PositionedKVCache:
        return _PositionedKVCache(*arrays, position, self, masks)

    def outputs(self, cache: Any) -> list[mx.array]:
        return [cache.keys, cache.values]

    def from_mlx(self, cache: Any, size: int) -> list[mx.array]:
        wanted = KVCache if self.max_size is None else RotatingKVCache
        if type(cache) is not wanted:
            raise InvalidArgumentType(f"this key-value layer takes a {wanted.__name__}, got {type(cache).__name__}")
        if self.max_size is not None:
            return _ring_from_rotating(self, cache, size)
        if cache.offset > size:
            raise InvalidArgument(f"{cache.offset} tokens do not fit buffers of {size} positions")
        return [_placed(part[..., :cache.offset, :], size) for part in (cache.keys, cache.values)]

    def to_mlx(self, arrays: Sequence[mx.array], row: int, length: int):
        keys, values = (a[row:row + 1] for a in arrays)
        if self.max_size is None:
            cache = KVCache()
            cache.keys, cache.values, cache.offset = keys[..., :length, :], values[..., :length, :], length
            return cache
        cache = RotatingKVCache(max_size=self.max_size, keep=self.keep)
        ring = keys.shape[2]
        if length <= ring:
            order = mx.arange(length)
        else:  # wrapped: the kept slots, then the ring from its oldest slot on
            oldest = _slot_of(length, ring, self.keep, wraps=True)
            order = mx.array([*range(self.keep),
                              *(self.keep + (oldest - self.keep + j) % (ring - self.keep)
                                for j in range(ring - self.keep))])
        # In temporal order, the next write after its end (mlx-lm's state: keys, values,
        # offset, keep, max_size, write index).
        cache.state = (mx.take(keys, order, axis=2), mx.take(values, order, axis=2), length, self.keep,
                       self.max_size, order.size)
        return cache


@dataclass(frozen=True)
class QuantizedLayer:
    """Keys and values quantized as mlx-lm's QuantizedKVCache: (weights, scales, biases) each."""
    keys: tuple[Buffer, Buffer, Buffer]
    values: tuple[Buffer, Buffer, Buffer]
    bits: int
    group_size: int

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return (*self.keys, *self.values)

    def length(self, size: int) -> int:
        return size

    def stand_in(self, arrays: Sequence[mx.array], position: mx.array, masks: list) -> _PositionedQuantizedKVCache:
        return _PositionedQuantizedKVCache(tuple(arrays[:3]), tuple(arrays[3:]), position, self, masks)

    def outputs(self, cache: Any) -> list[mx.array]:
        return [*cache.keys, *cache.values]

    def from_mlx(self, cache: Any, size: int) -> list[mx.array]:
        if isinstance(cache, KVCache):  # not quantized yet: mlx-lm's own conversion
            cache = cache.to_quantized(group_size=self.group_size, bits=self.bits)
        if not isinstance(cache, QuantizedKVCache) or (cache.bits, cache.group_size) != (self.bits, self.group_size):
            raise InvalidArgumentType(f"a {self.bits}-bit layer takes a QuantizedKVCache of {self.bits} bits and "
                                      f"group size {self.group_size}, got {type(cache).__name__}")
        if cache.offset > size:
            raise InvalidArgument(f"{cache.offset} tokens do not fit buffers of {size} positions")
        return [_placed(part[..., :cache.offset, :], size) for part in (*cache.keys, *cache.values)]

    def to_mlx(self, arrays: Sequence[mx.array], row: int, length: int):
        cache = QuantizedKVCache(group_size=self.group_size, bits=self.bits)
        parts = [a[row:row + 1, :, :length, :] for a in arrays]
        cache.keys, cache.values, cache.offset = tuple(parts[:3]), tuple(parts[3:]), length
        return cache


@dataclass(frozen=True)
class ArraysLayer:
    """An ArraysCache's arrays (SSM and linear-attention states): fixed shapes, no position."""
    states: tuple[Buffer, ...]

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return self.states

    def length(self, size: int) -> int:
        return 0

    def stand_in(self, arrays: Sequence[mx.array], position: mx.array, masks: list) -> ArraysCache:
        cache = ArraysCache(len(arrays))
        cache.cache = list(arrays)
        return cache

    def outputs(self, cache: Any) -> list[mx.array]:
        out = list(cache.cache)
        for i, (state, buffer) in enumerate(zip(out, self.states)):
            if state is None or tuple(state.shape[1:]) != buffer.dims:
                raise NotTraceable(f"ArraysCache state {i} does not keep its shape {buffer.dims} through a step")
        return [state.astype(buffer.dtype) for state, buffer in zip(out, self.states)]

    def from_mlx(self, cache: Any, size: int) -> list[mx.array]:
        if not isinstance(cache, ArraysCache) or any(state is None for state in cache.cache):
            raise InvalidArgumentType(f"an arrays layer takes a filled ArraysCache, got {type(cache).__name__}")
        return [_grown(state[:1], buffer) for state, buffer in zip(cache.cache, self.states)]

    def to_mlx(self, arrays: Sequence[mx.array], row: int, length: int):
        cache = ArraysCache(len(arrays))
        cache.cache = [a[row:row + 1] for a in arrays]
        return cache


@dataclass(frozen=True)
class ChunkedLayer:
    """Keys and values of chunked attention (mlx-lm's ChunkedKVCache): a token sees the earlier
    tokens of its own chunk of ``chunk`` positions only, so ``chunk`` slots hold them all,
    position p in slot p mod chunk (the chunk's first token in slot 0)."""
    keys: Buffer
    values: Buffer
    chunk: int

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return self.keys, self.values

    def length(self, size: int) -> int:
        return min(self.chunk, size)

    def stand_in(self, arrays: Sequence[mx.array], position: mx.array, masks: list) -> _PositionedChunkedKVCache:
        return _PositionedChunkedKVCache(*arrays, position, self, masks)

    def outputs(self, cache: Any) -> list[mx.array]:
        return [cache.keys, cache.values]

    def from_mlx(self, cache: Any, size: int) -> list[mx.array]:
        if type(cache) is not ChunkedKVCache or cache.chunk_size != self.chunk:
            raise InvalidArgumentType(f"this chunked layer takes a ChunkedKVCache of chunk {self.chunk}, "
                                      f"got {type(cache).__name__}")
        offset, held_from = cache.offset, cache.start_position
        if offset > size < self.chunk:  # a ring of a whole chunk holds any length
            raise InvalidArgument(f"{offset} tokens do not fit buffers of {size} positions")
        # The next token's chunk so far (mlx-lm holds at least those, maybe earlier ones).
        first = offset - offset % self.chunk
        return [_placed(part[..., first - held_from:offset - held_from, :], self.length(size))
                for part in (cache.keys, cache.values)]

    def to_mlx(self, arrays: Sequence[mx.array], row: int, length: int):
        first = length - length % self.chunk
        cache = ChunkedKVCache(self.chunk)
        cache.keys, cache.values = (a[row:row + 1, :, :length - first, :] for a in arrays)
        cache.offset, cache.start_position = length, first
        return cache


@dataclass(frozen=True)
class ListLayer:
    """A CacheList's caches (a hybrid layer's state and keys): each part's buffers in turn."""
    parts: tuple[KVLayer | QuantizedLayer | ArraysLayer | ChunkedLayer, ...]

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return tuple(buffer for part in self.parts for buffer in part.buffers)

    def stand_in(self, arrays: Sequence[mx.array], position: mx.array, masks: list) -> CacheList:
        return CacheList(*(part.stand_in(a, position, masks) for part, a in zip(self.parts, self._split(arrays))))

    def outputs(self, cache: Any) -> list[mx.array]:
        return [array for part, c in zip(self.parts, cache.caches) for array in part.outputs(c)]

    def from_mlx(self, cache: Any, size: int) -> list[mx.array]:
        if type(cache) is not CacheList or len(cache.caches) != len(self.parts):
            raise InvalidArgumentType(f"this layer takes a CacheList of {len(self.parts)} caches, "
                                      f"got {type(cache).__name__}")
        return [array for part, c in zip(self.parts, cache.caches) for array in part.from_mlx(c, size)]

    def to_mlx(self, arrays: Sequence[mx.array], row: int, length: int):
        return CacheList(*(part.to_mlx(a, row, length) for part, a in zip(self.parts, self._split(arrays))))

    def _split(self, arrays: Sequence[mx.array]) -> list[list[mx.array]]:
        return _split_among(self.parts, arrays)


Layer = KVLayer | QuantizedLayer | ArraysLayer | ChunkedLayer | ListLayer


def _parts(layer: Layer) -> tuple[KVLayer | QuantizedLayer | ArraysLayer | ChunkedLayer, ...]:
    return layer.parts if isinstance(layer, ListLayer) else (layer,)


@dataclass(frozen=True)
class CacheSpec:
    """The buffers of a model's traced step, in the order the step takes them.

    Build it with ``CacheSpec.of(model, options)`` (mlx-lm's cache options,
    llm/cache_options.py). A step of `rows` rows over caches of `size`
    positions takes ``n_buffers`` arrays of ``shapes(rows, size)``; time
    axes are axis 2, so a chain moving to a longer trace pads them at their
    end.
    """
    layers: tuple[Layer, ...]
    options: CacheOptions = CacheOptions()

    @classmethod
    def of(cls, model, options: CacheOptions | None = None) -> CacheSpec:
        """The buffers for `model`'s own caches (``make_prompt_cache`` with `options`).

        Raises NotTraceable naming a cache that has no buffer form, and what
        ``options.probe`` raises for options the model cannot take.
        """
        options = options or CacheOptions()
        caches = _settled(model, options, options.probe(model))
        return cls(tuple(_layer_of(cache, i) for i, cache in enumerate(caches)), options)

    def prompt_cache(self, model) -> list[Any]:
        """A fresh mlx-lm cache for a prefill with these options."""
        return self.options.prompt_cache(model)

    def quantize(self, caches: list[Any]) -> None:
        """After each prefill chunk: what generate_step does to the caches (kv_bits)."""
        self.options.quantize(caches)

    def positions_needed(self, tokens: int) -> int:
        """The cache size a stream of `tokens` tokens needs: all of them, unless every
        layer is bounded (rings hold their max_size, states no positions at all), so a
        max_kv_size stream (or an SSM's) replays at any length."""
        bounds = [layer.max_size if isinstance(layer, KVLayer) else 0 if isinstance(layer, ArraysLayer)
                  else layer.chunk if isinstance(layer, ChunkedLayer) else None
                  for parts in map(_parts, self.layers) for layer in parts]
        if any(bound is None for bound in bounds):
            return tokens
        return max(1, min(tokens, max(bounds, default=0)))

    @property
    def n_buffers(self) -> int:
        return sum(len(layer.buffers) for layer in self.layers)

    def shapes(self, rows: int, size: int) -> list[tuple[int, ...]]:
        return [_shape(buffer, rows, part.length(size))
                for layer in self.layers for part in _parts(layer) for buffer in part.buffers]

    def dtypes(self) -> list[mx.Dtype]:
        return [buffer.dtype for layer in self.layers for buffer in layer.buffers]

    def zeros(self, rows: int, size: int) -> list[mx.array]:
        return [mx.zeros(shape, dtype=dtype) for shape, dtype in zip(self.shapes(rows, size), self.dtypes())]

    def example(self, rows: int, size: int) -> list[mx.array]:
        """Stand-ins of the buffers for tracing: zero broadcasts, so a long batch allocates nothing."""
        return [mx.broadcast_to(mx.zeros((1,) * len(shape), dtype=dtype), shape)
                for shape, dtype in zip(self.shapes(rows, size), self.dtypes())]

    def from_prompt_cache(self, caches: Sequence[Any], size: int) -> list[mx.array]:
        """One row's buffers of `size` positions holding mlx-lm caches (make_prompt_cache's, after a prefill)."""
        if len(caches) != len(self.layers):
            raise InvalidArgument(f"the step has {len(self.layers)} cache layers, got {len(caches)} caches")
        return [array for layer, cache in zip(self.layers, caches) for array in layer.from_mlx(cache, size)]

    def to_prompt_cache(self, buffers: Sequence[mx.array], row: int, length: int) -> list[Any]:
        """mlx-lm caches holding row `row`'s first `length` tokens (views of the buffers: copy to keep)."""
        return [layer.to_mlx(arrays, row, length) for layer, arrays in zip(self.layers, self._split(buffers))]

    def relayout(self, buffers: Sequence[mx.array] | None, keep: Sequence[int], rows: int,
                 size: int) -> list[mx.array]:
        """New buffers of `rows` rows and `size` positions holding old rows `keep` in rows 0, 1, ...

        Time axes are cut or padded at their end: a ring longer than the
        new size has not wrapped (every row's position is below it).
        """
        new = self.zeros(rows, size)
        if keep:
            moved = mx.array(list(keep))
            for k, old in enumerate(buffers):
                span = tuple(slice(0, min(a, b)) for a, b in zip(new[k].shape[1:], old.shape[1:]))
                new[k][(slice(0, len(keep)), *span)] = old[moved][(slice(None), *span)]
        return new

    def write_row(self, buffers: list[mx.array], row: int, one_row: Sequence[mx.array]) -> None:
        """Put a row's buffers (from_prompt_cache at the same size) into row `row`, in place."""
        for k, part in enumerate(one_row):
            buffers[k][row:row + 1] = part

    def _split(self, buffers: Sequence[mx.array]) -> list[list[mx.array]]:
        return _split_among(self.layers, buffers)


def _split_among(owners: Sequence[Any], arrays: Sequence[mx.array]) -> list[list[mx.array]]:
    """`arrays` cut into each owner's ``buffers``' worth, in order."""
    out, at = [], 0
    for owner in owners:
        out.append(list(arrays[at:at + len(owner.buffers)]))
        at += len(owner.buffers)
    return out


def _shape(buffer: Buffer, rows: int, length: int) -> tuple[int, ...]:
    return (rows, buffer.dims[0], length, buffer.dims[1]) if buffer.timed else (rows, *buffer.dims)


def _timed(array: mx.array) -> Buffer:
    return Buffer((array.shape[1], array.shape[3]), array.dtype)


def _layer_of(cache: Any, index: int) -> Layer:
    kind = type(cache)
    if kind is KVCache:
        return KVLayer(_timed(cache.keys), _timed(cache.values))
    if kind is RotatingKVCache:
        if cache.max_size <= cache.keep:
            raise NotTraceable(f"a RotatingKVCache of {cache.max_size} positions keeping {cache.keep} (layer {index})")
        return KVLayer(_timed(cache.keys), _timed(cache.values), max_size=cache.max_size, keep=cache.keep)
    if kind is ChunkedKVCache:
        return ChunkedLayer(_timed(cache.keys), _timed(cache.values), chunk=cache.chunk_size)
    if kind is QuantizedKVCache:
        return QuantizedLayer(tuple(_timed(x) for x in cache.keys), tuple(_timed(x) for x in cache.values),
                              bits=cache.bits, group_size=cache.group_size)
    if kind is CacheList:
        parts = tuple(_layer_of(part, index) for part in cache.caches)
        if any(isinstance(part, ListLayer) for part in parts):
            raise NotTraceable(f"a CacheList inside a CacheList (layer {index}) has no fixed-buffer form")
        return ListLayer(parts)
    if isinstance(cache, ArraysCache):
        if any(state is None for state in cache.cache):
            raise NotTraceable(f"{kind.__name__} of layer {index} is not filled by a decode step")
        return ArraysLayer(tuple(Buffer(tuple(state.shape[1:]), state.dtype, timed=False) for state in cache.cache))
    raise NotTraceable(f"{kind.__name__} (layer {index}) has no fixed-buffer form")


# How many more one-token steps CacheSpec.of takes, at most, for the states to settle.
_SETTLE_STEPS = 16


def _state_shapes(caches: Sequence[Any]) -> list[tuple[int, ...] | None]:
    return [None if state is None else tuple(state.shape)
            for cache in caches for part in (cache.caches if type(cache) is CacheList else (cache,))
            if isinstance(part, ArraysCache) for state in part.cache]


def _settled(model, options: CacheOptions, caches: list[Any]) -> list[Any]:
    """`caches` (the probe's, one token in) stepped on, lazily, until their ArraysCache states
    keep their shapes through a step. A state may grow with the first tokens up to a bound
    (longcat_flash_ngram's n-gram context: the last n - 1 token ids, 1 after one token); its
    buffer holds the bound, the first tokens' narrower state at its end (``_grown``).
    States that never settle keep growing in the traced step, which refuses them."""
    shapes = _state_shapes(caches)
    for _ in range(_SETTLE_STEPS if shapes else 0):
        model(mx.array([[0]], dtype=mx.int32), cache=caches)
        options.quantize(caches)
        now = _state_shapes(caches)
        if now == shapes:
            break
        shapes = now
    return caches


def _grown(state: mx.array, buffer: Buffer) -> mx.array:
    """An ArraysCache state {1, ...} narrower than its settled buffer (the first tokens'
    state, before it grew to its bound) at the end of each short axis, zeros before it:
    what the model's own code shifts in for the tokens before the first (check_against_model
    holds the step to the model's own forward over such states)."""
    shape = (state.shape[0], *buffer.dims)
    if tuple(state.shape) == shape:
        return state
    if state.ndim != len(shape) or any(have > want for have, want in zip(state.shape, shape)):
        raise InvalidArgument(f"an ArraysCache state of shape {tuple(state.shape)} does not fit its buffer {shape}")
    fixed = mx.zeros(shape, dtype=state.dtype)
    fixed[tuple(slice(want - have, want) for have, want in zip(state.shape, shape))] = state
    return fixed


def _placed(part: mx.array, length: int) -> mx.array:
    """`part` {1, H, n, X} at positions 0.. of a zero buffer of `length` positions."""
    fixed = mx.zeros((part.shape[0], part.shape[1], length, part.shape[3]), dtype=part.dtype)
    fixed[:, :, :part.shape[2], :] = part
    return fixed


def _slot_of(position: int, length: int, keep: int, wraps: bool) -> int:
    """_slot for a Python int."""
    return position if not wraps or position < keep else keep + (position - keep) % (length - keep)


def _ring_from_rotating(layer: KVLayer, cache: RotatingKVCache, size: int) -> list[mx.array]:
    """A RotatingKVCache's tokens in the ring: position p in slot p (before it wraps), then rotating."""
    ring, keep, offset = layer.length(size), layer.keep, cache.offset
    wraps = ring == layer.max_size
    if offset > ring and not wraps:
        raise InvalidArgument(f"{offset} tokens do not fit buffers of {size} positions")
    out = []
    for part in (cache.keys, cache.values):
        ordered = cache._temporal_order(part)  # mlx-lm's own unrolling: kept tokens, then oldest to newest
        held = ordered.shape[2]
        # Temporal entry i holds position i for i < keep, then offset - held + i.
        kept = min(keep, held)
        positions = [*range(kept), *range(offset - held + kept, offset)]
        wanted = [(i, p) for i, p in enumerate(positions) if p < keep or p >= offset - (ring - keep)]
        slots = mx.array([_slot_of(p, ring, keep, wraps) for _, p in wanted])
        fixed = mx.zeros((1, part.shape[1], ring, part.shape[3]), dtype=part.dtype)
        fixed[:, :, slots, :] = mx.take(ordered, mx.array([i for i, _ in wanted]), axis=2)
        out.append(fixed)
    return out


# ---- the cache stand-ins the model is called with --------------------------------

def _slot(position: mx.array, length: int, keep: int, wraps: bool = True) -> mx.array:
    """Where position p lives: p itself, or past a ring's end keep + (p - keep) mod (length - keep)."""
    if not wraps:
        return position
    return mx.where(position < keep, position, keep + (position - keep) % (length - keep))


def _visible(position: mx.array, length: int, layer: KVLayer | QuantizedLayer, window: int | None) -> mx.array:
    """{rows, 1, 1, length}: which slots a row at `position` ({} or {rows}) attends to."""
    positions = mx.reshape(position, (-1, 1))
    slots = mx.arange(length, dtype=mx.int32)[None]
    held = slots  # the position each slot holds
    if isinstance(layer, KVLayer) and layer.max_size is not None and length == layer.max_size:
        keep, ring = layer.keep, length - layer.keep
        newest = _slot(positions, length, keep)
        wrapped = mx.where(slots < keep, slots, positions - (newest - slots) % ring)
        held = mx.where(positions >= length, wrapped, slots)
    visible = held <= positions
    if window is not None:
        visible = visible & (held > positions - window)
    return visible.reshape(positions.shape[0], 1, 1, length)


def _write(buffer: mx.array, new: mx.array, slots: mx.array) -> mx.array:
    """`new` {B, H, 1, X} into `buffer` at each row's slot (in place when the buffer is donated)."""
    if slots.ndim == 0:  # one row: a dynamic slice_update
        return mx.slice_update(buffer, new.astype(buffer.dtype), mx.reshape(slots, (1,)), axes=(2,))
    index = mx.broadcast_to(slots.reshape(-1, 1, 1, 1), new.shape)
    return mx.put_along_axis(buffer, index, new.astype(buffer.dtype), axis=2)


class _Positioned:
    """What both key-value stand-ins share: the position as ``offset``, the mask, the slot."""

    def _setup(self, position: mx.array, layer, masks: list) -> None:
        self.offset = position  # rope's offset: an array (one per row) is what mx.fast.rope takes
        self._layer = layer
        self._masks = masks  # shared by the step's caches: did the model ask for a mask?

    def _slots(self, length: int) -> mx.array:
        layer = self._layer
        wraps = isinstance(layer, KVLayer) and layer.max_size is not None and length == layer.max_size
        return _slot(self.offset, length, getattr(layer, "keep", 0), wraps)

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False) -> mx.array:  # noqa: N803
        if N != 1:
            raise NotTraceable(f"the traced step decodes one token per row, the model asked for a mask of {N}")
        self._masks.append(window_size)
        return _visible(self.offset, self._length(), self._layer, window_size)

    def is_trimmable(self) -> bool:
        return False

    def empty(self) -> bool:
        return False


def _check_decode(keys: mx.array) -> None:
    if keys.shape[2] != 1:
        raise NotTraceable(f"the traced step decodes one token per row, the model wrote {keys.shape[2]}")


class _PositionedKVCache(_Positioned, KVCache):
    """KVCache's interface over fixed buffers (a ring for RotatingKVCache layers)."""

    def __init__(self, keys: mx.array, values: mx.array, position: mx.array, layer: KVLayer, masks: list):
        self.keys, self.values = keys, values
        self._setup(position, layer, masks)

    def _length(self) -> int:
        return self.keys.shape[2]

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        _check_decode(keys)
        slots = self._slots(self._length())
        self.keys, self.values = _write(self.keys, keys, slots), _write(self.values, values, slots)
        return self.keys, self.values

    def keys_and_values(self):
        # What a layer sharing another's cache reads (gemma3n's): the whole buffer, as
        # update_and_fetch gives it, the mask hiding what is past each row's position.
        return self.keys, self.values


class _PositionedChunkedKVCache(_PositionedKVCache):
    """ChunkedKVCache's keys and values in a ring of a chunk's slots (KVCache's interface, as
    the key-value stand-in's), and ``make_chunk_mask`` showing each row's chunk so far.

    The chunks are the model's doing, not the cache's: mlx-lm's ChunkedKVCache has no
    ``make_mask`` (a model asking gets none, and attends to all it holds, which its own
    trimming decides), so a model asking this one for a mask is refused; llama4 fixed
    (``model_fixes.fix_position_arrays``) asks for the chunk mask it built itself."""

    def __init__(self, keys: mx.array, values: mx.array, position: mx.array, layer: ChunkedLayer, masks: list):
        super().__init__(keys, values, position, layer, masks)
        self.chunk_size = layer.chunk

    @property
    def start_position(self) -> mx.array:
        """The first position of each row's chunk (mlx-lm's: the first it holds)."""
        return self.offset - self.offset % self.chunk_size

    def maybe_trim_front(self) -> None:
        # mlx-lm's llama4 trims its chunked caches, then builds their mask from Python-int positions
        # (mx.arange(start, end)), which a step traced over a position array cannot give.
        raise NotTraceable("the model builds its chunked attention's mask itself from int positions "
                           "(mlx-lm's llama4: model_fixes.fix_position_arrays has it ask its cache)")

    def _slots(self, length: int) -> mx.array:
        return self.offset % self.chunk_size

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False) -> mx.array:  # noqa: N803
        raise NotTraceable("the model asks its ChunkedKVCache for a mask (mlx-lm's has none: the model "
                           "attends to all the cache holds)")

    def make_chunk_mask(self, N: int) -> mx.array:  # noqa: N803
        """{rows, 1, 1, slots}: each row's chunk up to its token (llama4's own chunk mask)."""
        if N != 1:
            raise NotTraceable(f"the traced step decodes one token per row, the model asked for a mask of {N}")
        self._masks.append(None)
        within = mx.reshape(self.offset % self.chunk_size, (-1, 1))  # each row's slot
        visible = mx.arange(self._length(), dtype=mx.int32)[None] <= within
        return visible.reshape(within.shape[0], 1, 1, self._length())


class _PositionedQuantizedKVCache(_Positioned, QuantizedKVCache):
    """QuantizedKVCache's interface over fixed quantized buffers (``bits`` and
    ``group_size`` send mlx-lm's attention to quantized_scaled_dot_product_attention)."""

    def __init__(self, keys: tuple, values: tuple, position: mx.array, layer: QuantizedLayer, masks: list):
        self.keys, self.values = keys, values
        self.bits, self.group_size = layer.bits, layer.group_size
        self._setup(position, layer, masks)

    def _length(self) -> int:
        return self.keys[0].shape[2]

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        _check_decode(keys)
        slots = self._slots(self._length())
        new_keys = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
        new_values = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        self.keys = tuple(_write(b, n, slots) for b, n in zip(self.keys, new_keys))
        self.values = tuple(_write(b, n, slots) for b, n in zip(self.values, new_values))
        return self.keys, self.values

    def keys_and_values(self):
        return self.keys, self.values


# ---- the step -------------------------------------------------------------------

def forward(model, spec: CacheSpec, token: mx.array, position: mx.array,
            buffers: Sequence[mx.array]) -> tuple[mx.array, list[mx.array]]:
    """Logits {B, V} of `token` {B, 1} at `position` ({} or {B}: each row's own) through
    mlx-lm's own model call, and the buffers with the step written in."""
    if len(buffers) != spec.n_buffers:
        raise InvalidArgument(f"the step takes {spec.n_buffers} cache buffers, got {len(buffers)}")
    masks: list = []
    caches = [layer.stand_in(arrays, position, masks) for layer, arrays in zip(spec.layers, spec._split(buffers))]
    logits = model(token, cache=caches)
    if not masks and any(not isinstance(part, ArraysLayer) for layer in spec.layers for part in _parts(layer)):
        # Without a mask the positions past a row's own (zeros, or an earlier
        # request's) would be attended: refuse rather than decode wrong tokens.
        raise NotTraceable("the model attends without asking its cache for a mask")
    return logits[:, -1, :], [array for layer, cache in zip(spec.layers, caches) for array in layer.outputs(cache)]


# The penalized step's inputs after top_k (llm/penalties.py): the chained history, the
# bias row and the per-row options.
PENALTY_INPUTS = ("counts", "window", "bias", "presence", "frequency", "repetition", "log_min_p")
# The masked step's input after those: each row's allowed next tokens, {B, V} bool (a free
# row all True), unpacked on the host from the grammar's bitmask (one `where` in the graph).
MASK_INPUT = "allowed"


def make_step(model, spec: CacheSpec, *, weights_as_inputs: bool = False, greedy: bool = False,
              penalized: bool = False, masked: bool = False) -> Callable[..., Any]:
    """step(*buffers, key, token, position, inv_temperature, top_p, top_k[, *weights])
    -> (next_token {B, 1}, key', *buffers'): one decode step with the sampler inside.

    One stream: ``key`` an ``mx.random.key`` ({2} uint32), token {1, 1},
    position and the options (``traced.sampling_inputs``) scalars, buffers
    ``spec.shapes(1, size)``. B streams: buffers of B rows, keys {B, 2},
    tokens {B, 1}, positions and options {B} (``traced.sampling_rows``).
    ``greedy=True``: the same inputs and outputs, the argmax only (the key
    comes back as it was). ``weights_as_inputs=True``: the model's
    parameters (``model_weights``) follow, so every queue shares
    one copy.

    ``penalized=True``: the ``PENALTY_INPUTS`` follow top_k (counts {B, V}
    and window {B, W} int32, bias {B, V} float32, then presence, frequency,
    repetition and log(min_p) as the options are: ``penalties.penalty_inputs``
    or ``penalty_rows``), and the counts and window come back after the
    buffers, the fed token recorded: the step's logits go through
    ``penalties.adjust`` before the sampler, min-p among its filters.

    ``masked=True``: ``MASK_INPUT`` follows (after the penalties' inputs
    when both are asked for), {B, V} bool ({1, V} for one stream), and the
    logits keep only the allowed tokens (``grammar.apply_token_mask``, after
    the penalties, as the Python step masks them), so greedy and sampled
    rows pick only allowed ids; the outputs are the same as without it.
    """
    n = spec.n_buffers
    n_penalty = len(PENALTY_INPUTS) if penalized else 0

    def decode(model, *inputs: mx.array):
        buffers, (key, token, position, inv_temperature, top_p, top_k, *extra) = inputs[:n], inputs[n:]
        logits, new_buffers = forward(model, spec, token, position, buffers)
        history, log_min_p = [], None
        if penalized:
            counts, window, bias, presence, frequency, repetition, log_min_p = extra[:n_penalty]
            counts, window = _penalties.record(counts, window, token, position)
            logits = _penalties.adjust(logits, counts, window, bias, presence, frequency, repetition)
            history = [counts, window]
        if masked:
            logits = apply_token_mask(logits, extra[n_penalty])
        if greedy:
            return (mx.argmax(logits, axis=-1, keepdims=True).astype(mx.int32), key, *new_buffers, *history)
        next_token, next_key = sample(logits, key, inv_temperature, top_p, top_k, log_min_p)
        return (next_token, next_key, *new_buffers, *history)

    return _with_weights(model, weights_as_inputs, decode, n + 6 + n_penalty + (1 if masked else 0))


def check_against_model(model, spec: CacheSpec, tokens: Sequence[int] = (1, 2, 3)) -> int:
    """The step's logits agree with the model's own (mlx-lm's caches with the same options):
    the first token prefilled by mlx-lm and copied into buffers, as the engine does, the
    rest stepped both ways. Returns the logits' width. A model whose cache use the
    buffers do not capture fails here (ValueError) rather than decoding wrong tokens."""
    caches = spec.prompt_cache(model)
    model(mx.array([tokens[:1]], dtype=mx.int32), cache=caches)
    spec.quantize(caches)
    buffers = spec.from_prompt_cache(caches, 8)
    for position, token in enumerate(tokens[1:], start=1):
        want = model(mx.array([[token]], dtype=mx.int32), cache=caches)[:, -1, :]
        spec.quantize(caches)
        logits, buffers = forward(model, spec, mx.array([[token]], dtype=mx.int32),
                                  mx.array(position, dtype=mx.int32), buffers)
        if not mx.allclose(logits.astype(mx.float32), want.astype(mx.float32), rtol=1e-2, atol=1e-2).item():
            raise InvalidArgument("the fixed-cache step disagrees with the model's own forward")
    return int(logits.shape[-1])


def check_batch_against_rows(model, spec: CacheSpec, prompts: Sequence[Sequence[int]] = ((1, 2, 3, 4), (5, 6))) -> None:
    """A batch's logits are its rows' own: rows at different positions stepped together and
    each alone. Raises ValueError naming what differs. mlx-lm's gemma2 adds a batch's mask
    {B, 1, 1, S} to scores it has split into {B, heads, repeats, 1, S}: the rows' mask lands
    on the key-value heads, so a batch of it is wrong (or fails) on both steps, unless
    model_fixes.fix_batch_masks fixed it."""
    rows = [spec.from_prompt_cache(_prefilled_cache(model, spec, prompt[:-1]), 8) for prompt in prompts]
    buffers = spec.zeros(len(prompts), 8)
    for row, one_row in enumerate(rows):
        spec.write_row(buffers, row, one_row)
    tokens = mx.array([[prompt[-1]] for prompt in prompts], dtype=mx.int32)
    positions = mx.array([len(prompt) - 1 for prompt in prompts], dtype=mx.int32)
    try:
        together, _ = forward(model, spec, tokens, positions, buffers)
        mx.eval(together)
    except NotTraceable:
        raise  # the stand-ins cannot step the model at all, a batch or not
    except Exception as exc:  # noqa: BLE001 - mlx's broadcasting error, say
        raise InvalidArgument(f"a batch of {len(prompts)} rows fails in the model's own code: {exc}") from exc
    for row, (prompt, one_row) in enumerate(zip(prompts, rows)):
        alone, _ = forward(model, spec, tokens[row:row + 1], positions[row], one_row)
        if not mx.allclose(together[row:row + 1].astype(mx.float32), alone.astype(mx.float32),
                           rtol=1e-2, atol=1e-2).item():
            raise InvalidArgument(f"the model gives a batch's row {row} other logits than the same row alone")


def check_mlx_batch_against_rows(model, options: CacheOptions | None = None,
                                 prompts: Sequence[Sequence[int]] = ((1, 2, 3, 4), (5, 6))) -> None:
    """mlx-lm's own batch (the Python step's: BatchGenerator merges each row's caches, keys
    left-padded) gives its rows their logits alone. Raises ValueError naming a cache mlx-lm
    cannot batch (no ``merge``: ``ChunkedKVCache``, say) or what differs. The check for a
    batch the buffers cannot vouch for: a model whose caches have no buffer form, or whose
    stand-ins do not step as it does."""
    options = options or CacheOptions()
    rows = []
    for prompt in prompts:
        cache = options.prompt_cache(model)
        model(mx.array([list(prompt[:-1])], dtype=mx.int32), cache=cache)
        rows.append(cache)
    for index, cache in enumerate(rows[0]):
        if not hasattr(cache, "merge"):
            raise InvalidArgument(f"mlx-lm cannot batch its {type(cache).__name__} (layer {index})")
    tokens = mx.array([[prompt[-1]] for prompt in prompts], dtype=mx.int32)
    try:
        merged = [cache.merge([row[index] for row in rows]) for index, cache in enumerate(rows[0])]
        together = model(tokens, cache=merged)[:, -1, :]
        mx.eval(together)
    except Exception as exc:  # noqa: BLE001 - mlx's broadcasting error, say
        raise InvalidArgument(f"mlx-lm's batch of {len(prompts)} rows fails in the model's own code: {exc}") from exc
    for row, cache in enumerate(rows):
        alone = model(tokens[row:row + 1], cache=cache)[:, -1, :]
        if not mx.allclose(together[row:row + 1].astype(mx.float32), alone.astype(mx.float32),
                           rtol=1e-2, atol=1e-2).item():
            raise InvalidArgument(f"mlx-lm's batch gives row {row} other logits than the same row alone")


def _prefilled_cache(model, spec: CacheSpec, tokens: Sequence[int]) -> list[Any]:
    cache = spec.prompt_cache(model)
    model(mx.array([list(tokens)], dtype=mx.int32), cache=cache)
    spec.quantize(cache)
    return cache


def model_weights(model) -> list[mx.array]:
    """The model's parameters in the order a ``weights_as_inputs`` step takes them."""
    return [value for _, value in tree_flatten(model.parameters())]


def _with_weights(model, weights_as_inputs: bool, body: Callable[..., Any], n_fixed: int) -> Callable[..., Any]:
    """`body(model, *fixed)` as a step taking the model's weights after its `n_fixed` inputs when asked."""
    names = [name for name, _ in tree_flatten(model.parameters())]

    def step(*inputs: mx.array):
        if not weights_as_inputs:
            return body(model, *inputs)
        fixed, weights = inputs[:n_fixed], inputs[n_fixed:]
        if len(weights) != len(names):
            raise InvalidArgument(f"the step takes the model's {len(names)} weights after its inputs, "
                                  f"got {len(weights)}")
        # The given arrays stand in for the parameters (traced: they become inputs) in a copy of
        # the model's modules: other threads run the model itself meanwhile (a prompt prefilling
        # beside a trace), and would read the stand-ins, which have no values.
        standing_in = _modules_copy(model)
        standing_in.update(tree_unflatten(list(zip(names, weights))))
        return body(standing_in, *fixed)

    return step


def _modules_copy(value: Any) -> Any:
    """`value` (a module, or what a module holds) with modules, lists and dicts of its own all
    the way down and the same arrays: updating the copy's parameters leaves `value` as it was."""
    if isinstance(value, nn.Module):
        new = copy.copy(value)  # its own dict (the parameters and children) and attributes
        for name, child in value.items():
            dict.__setitem__(new, name, _modules_copy(child))
        return new
    if type(value) in (list, tuple):
        return type(value)(_modules_copy(v) for v in value)
    if type(value) is dict:
        return {k: _modules_copy(v) for k, v in value.items()}
    return value
