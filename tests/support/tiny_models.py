"""Tiny random-weight mlx-lm models of many architectures, built in code (no download),
and mlx-lm's own tokens for them: the references the replayed step is held to."""

from __future__ import annotations

import itertools

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import _get_classes

BASE = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256, max_position_embeddings=512,
            rope_theta=10000.0, tie_word_embeddings=False)
WINDOW = 8  # gemma3's sliding window: shorter than the prompts plus answers the tests decode
ARCHITECTURES = {
    "llama": {},
    "qwen3": dict(head_dim=16),
    # Layer 0 slides (a RotatingKVCache of WINDOW), layer 1 is global.
    "gemma3_text": dict(head_dim=16, sliding_window=WINDOW, sliding_window_pattern=2, query_pre_attn_scalar=16),
    "phi3": {},
    "qwen3_moe": dict(head_dim=16, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                      moe_intermediate_size=32, norm_topk_prob=True),
    "starcoder2": dict(norm_epsilon=1e-5),
    "olmo2": {},
    "granite": dict(logits_scaling=2.0, attention_multiplier=0.25, embedding_multiplier=2.0, residual_multiplier=0.5,
                    attention_bias=False, mlp_bias=False),
}
# Learned position embeddings read off cache.offset (an array in the traced step).
POSITION_EMBEDDING_ARCHITECTURES = {
    "gpt2": dict(n_ctx=512, n_embd=64, n_head=4, n_layer=2, n_positions=512, layer_norm_epsilon=1e-5),
}
# SSM and hybrid caches (ArraysCache): fixed-shape states in and out.
STATE_ARCHITECTURES = {
    "mamba2": dict(num_heads=4, head_dim=16, hidden_size=32, intermediate_size=64, state_size=16,
                   layer_norm_epsilon=1e-5, conv_kernel=4, n_groups=1, use_bias=False, use_conv_bias=True,
                   time_step_limit=(0.0, float("inf")), time_step_rank="auto", tie_word_embeddings=True),
    "qwen3_next": dict(full_attention_interval=2, linear_num_value_heads=2, linear_num_key_heads=2,
                       linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
                       num_experts_per_tok=2, decoder_sparse_step=1, shared_expert_intermediate_size=32,
                       mlp_only_layers=[], moe_intermediate_size=32, partial_rotary_factor=0.5, head_dim=16),
    # Qwen3.5's text model: qwen3_next's linear attention without the experts.
    "qwen3_5": dict(full_attention_interval=2, linear_num_value_heads=2, linear_num_key_heads=2,
                    linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, head_dim=16),
    # Every layer a CacheList: a Mamba-2 state beside a KVCache.
    "falcon_h1": dict(head_dim=16, mamba_d_ssm=64, mamba_d_state=16, mamba_d_head=16, mamba_n_heads=4,
                      mamba_chunk_size=8),
}
# One query head of 32 per key-value head: a whole quantization group of 32 (kv_group_size=32).
QUANTIZABLE = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32)


def tiny(kind: str, **overrides):
    """A random `kind` model (seeded: the same weights every time), evaluated so any worker can read it."""
    config = {**BASE, **ARCHITECTURES.get(kind, {}), **POSITION_EMBEDDING_ARCHITECTURES.get(kind, {}),
              **STATE_ARCHITECTURES.get(kind, {}), **overrides, "model_type": kind}
    model_class, args_class = _get_classes(config)
    mx.random.seed(0)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    return model


def mlx_lm_tokens(model, prompt: list[int], n: int, *, seed: int | None = None, temperature: float = 0.0,
                  top_p: float = 1.0, top_k: int = 0, **options) -> list[int]:
    """mlx-lm's own tokens: generate_step with make_sampler, the global random state seeded
    (kv_bits quantize from the first token: quantized_kv_start 0)."""
    if seed is not None:
        mx.random.seed(seed)
    steps = generate_step(mx.array(prompt), model, max_tokens=n, quantized_kv_start=0,
                          sampler=make_sampler(temperature, top_p, top_k=top_k),
                          stream=mx.default_stream(mx.default_device()), **options)
    return [token for token, _ in itertools.islice(steps, n)]


class IdsTokenizer:
    """Decodes token ids as their numbers: enough for the engine's detokenizer."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)


def tiny_model_folder(path, chat_template: str, kind: str = "llama"):
    """An mlx-lm folder (config, random weights, SmolLM2's tokenizer) with `chat_template`:
    what `emlx-async serve --model PATH` loads, to test a template of one's own."""
    import json

    from mlx.utils import tree_flatten

    from emlx_async.llm import _gguf
    from emlx_async.llm.save import hf_tokenizer

    _, meta = mx.load(_gguf.smollm2_path(), return_metadata=True)
    tokenizer = _gguf.gguf_tokenizer(meta)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    bos, eos = _gguf.gguf_special_ids(meta)
    hf_tokenizer(tokenizer, eos_ids=set(eos), bos_id=bos, chat_template=chat_template).save_pretrained(path)
    model = tiny(kind, vocab_size=vocab)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    config = {**BASE, **ARCHITECTURES.get(kind, {}), "vocab_size": vocab, "model_type": kind,
              "eos_token_id": sorted(eos)}
    (path / "config.json").write_text(json.dumps(config))
    return path


def smollm2_vocab_llama():
    """A random llama with SmolLM2's vocabulary: a fast step, meaningless logits (for grammar tests
    that need the real tokenizer, not a meaningful model)."""
    config = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64,
              "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "vocab_size": 49152,
              "tie_word_embeddings": True}
    model_class, args_class = _get_classes(config)
    mx.random.seed(11)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    return model
