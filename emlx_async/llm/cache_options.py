"""mlx-lm's KV-cache options, in one place for every decode path.

``max_kv_size`` bounds each layer's keys and values with a rotating cache
that always keeps the first 4 tokens (mlx-lm's ``make_prompt_cache``; a
model with its own ``make_cache``, llama and gemma3 among them, ignores it,
as in mlx-lm). ``kv_bits`` and ``kv_group_size`` quantize the key-value
caches after every model call, as ``generate_step`` does with
``quantized_kv_start=0`` (from the first token); mlx-lm cannot quantize a
rotating cache, so ``kv_bits`` with sliding-window layers or
``max_kv_size`` is refused.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generate_step

from .. import InvalidArgument

# generate_step prefills all but the last token in calls of this many, quantizing (kv_bits)
# after each: until then its tokens attend to full-precision keys.
PREFILL_STEP: int = inspect.signature(generate_step).parameters["prefill_step_size"].default


def _int_or_none(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise InvalidArgument(f"{name} must be an int or None, got {value!r}")


@dataclass(frozen=True)
class CacheOptions:
    """How a request's mlx-lm caches are made and kept (mlx-lm's generate_step options)."""

    max_kv_size: int | None = None
    kv_bits: int | None = None
    kv_group_size: int = 64

    def __post_init__(self) -> None:
        _int_or_none("max_kv_size", self.max_kv_size)
        _int_or_none("kv_bits", self.kv_bits)
        if not isinstance(self.kv_group_size, int) or isinstance(self.kv_group_size, bool):
            # None reached mlx-lm, whose quantize took its own default of 64 in silence.
            raise InvalidArgument(f"kv_group_size must be an int, got {self.kv_group_size!r}")
        if self.max_kv_size is not None and self.max_kv_size <= 4:
            # make_prompt_cache keeps the first 4 tokens; the ring rotates what follows.
            raise InvalidArgument(f"max_kv_size must be more than 4 (the tokens mlx-lm always keeps), "
                                  f"got {self.max_kv_size}")
        # mlx checks the rest, but divides by the group size first: 0 killed the process (SIGFPE).
        for name in ("kv_bits", "kv_group_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidArgument(f"{name} must be a positive int, got {value!r}")

    def prompt_cache(self, model) -> list[Any]:
        """A fresh cache for a prompt (mlx-lm's make_prompt_cache)."""
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(model, max_kv_size=self.max_kv_size)

    def quantize(self, caches: list[Any]) -> None:
        """After each model call, as generate_step: the key-value caches quantized, in place (kv_bits only)."""
        if self.kv_bits is None:
            return
        from mlx_lm.generate import maybe_quantize_kv_cache

        try:
            maybe_quantize_kv_cache(caches, 0, self.kv_group_size, self.kv_bits)
        except NotImplementedError as exc:  # RotatingKVCache.to_quantized
            raise InvalidArgument(f"kv_bits: mlx-lm cannot quantize this model's rotating caches "
                                  f"(sliding-window layers or max_kv_size): {exc}") from exc

    def probe(self, model) -> list[Any]:
        """The caches after one token through `model` (lazy: shapes only), quantized if asked.

        Raises what mlx or mlx-lm raise for options this model cannot take
        (a group size that does not divide its head size, say)."""
        caches = self.prompt_cache(model)
        model(mx.array([[0]], dtype=mx.int32), cache=caches)
        self.quantize(caches)
        if self.kv_bits is not None:
            mx.eval([c.state for c in caches])  # mlx checks the quantization options when it runs
        return caches

    def describe(self) -> str:
        parts = []
        if self.max_kv_size is not None:
            parts.append(f"max_kv_size {self.max_kv_size}")
        if self.kv_bits is not None:
            parts.append(f"{self.kv_bits}-bit keys and values (group size {self.kv_group_size})")
        return ", ".join(parts)


__all__ = ["CacheOptions", "PREFILL_STEP"]
