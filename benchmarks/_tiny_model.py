"""A tiny random-weight mlx-lm model folder, built in code (no download).

Its decode step is short (a hidden size of 128 and 2 layers step in about
1 ms on a 2-core CPU), like a real model's step on a GPU, so it shows what
the runtime itself costs per step. The tokenizer is byte-level BPE with no
merges: every byte is a token, and the rest of the vocabulary are two-byte
tokens that only decoding produces, so any id the random model picks decodes.
"""

from __future__ import annotations

import json
import pathlib

import mlx.core as mx
from mlx.utils import tree_flatten

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_level_tokenizer(vocab_size: int):
    """A `tokenizers.Tokenizer` of exactly `vocab_size` ids, the special tokens last."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    alphabet.sort()
    pieces = list(alphabet) + [a + b for a in alphabet for b in alphabet]
    plain = vocab_size - len(SPECIAL)
    if not len(alphabet) <= plain <= len(pieces):
        raise ValueError(f"vocab_size must be in [{len(alphabet) + len(SPECIAL)}, {len(pieces) + len(SPECIAL)}]")
    tokenizer = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces[:plain])}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL)
    return tokenizer


def tiny_model_folder(path: str | pathlib.Path, *, model_type: str = "llama", hidden_size: int = 128,
                      num_hidden_layers: int = 2, vocab_size: int = 49152, seed: int = 0, **config) -> pathlib.Path:
    """Write an mlx-lm folder (config, random weights, tokenizer, chat template) that
    ``mlx_lm.load`` and ``Engine.load`` read; extra keyword arguments go into the config."""
    from mlx_lm.utils import _get_classes

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {"model_type": model_type, "hidden_size": hidden_size, "num_hidden_layers": num_hidden_layers,
              "intermediate_size": 2 * hidden_size, "num_attention_heads": 4, "num_key_value_heads": 2,
              "rms_norm_eps": 1e-5, "vocab_size": vocab_size, "max_position_embeddings": 4096,
              "rope_theta": 10000.0, "tie_word_embeddings": True, **config}
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    eos = vocab_size - len(SPECIAL) + SPECIAL.index("<|im_end|>")
    (path / "config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    byte_level_tokenizer(vocab_size).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "bos_token": None,
        "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE, "model_max_length": 4096}))
    return path
