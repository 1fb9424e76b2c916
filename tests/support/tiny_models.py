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
# The long tail of mlx-lm's families (tests/llm/test_model_families.py): each built from
# FAMILY_BASE, which gives most of them every field they need, plus its own fields.
FAMILY_BASE = dict(head_dim=16, num_experts=4, num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1,
                   moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                   num_local_experts=4, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None,
                   qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, routed_scaling_factor=1.0,
                   topk_method="noaux_tc", n_group=1, topk_group=1, sliding_window=WINDOW, layer_norm_eps=1e-5,
                   layer_norm_epsilon=1e-5, norm_eps=1e-5, partial_rotary_factor=0.5, attention_bias=False,
                   mlp_bias=False, rope_scaling=None, hidden_act="silu")
_LINEAR = dict(linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
               linear_conv_kernel_dim=4)
_TEXT = dict(BASE, head_dim=16)
_FAMILY_TEXT = dict(BASE, **FAMILY_BASE)  # a wrapper's text_config: a FAMILIES model's own fields
_GRANITE = dict(logits_scaling=2.0, attention_multiplier=0.25, embedding_multiplier=2.0, residual_multiplier=0.5)
_ROPE_LLAMA4 = dict(rope_theta=10000.0, llama_4_scaling_beta=0.1, original_max_position_embeddings=512, type="default")
_ROPE_BY_LAYER = dict(sliding_attention=dict(rope_theta=10000.0), full_attention=dict(rope_theta=10000.0))
_SLIDING_FULL = ["sliding_attention", "full_attention"]
_INDEXER = dict(index_head_dim=16, index_n_heads=2, index_topk=8, q_lora_rank=16)  # DeepSeek-V3.2's sparse attention
_LONGCAT = dict(ffn_hidden_size=128, moe_topk=2, expert_ffn_hidden_size=32, zero_expert_num=2, num_layers=2,
                q_lora_rank=16, mla_scale_q_lora=True, mla_scale_kv_lora=True)
FAMILIES = {
    **{kind: {} for kind in (
        "Klear", "bailing_moe_v3", "cohere", "deepseek", "deepseek_v3", "dots1", "gemma", "gemma2", "glm", "glm4",
        "glm4_moe_lite", "gpt_oss", "helium", "hunyuan_v1_dense", "internlm2", "internlm3", "iquestloopcoder",
        "laguna", "mimo", "mistral", "mixtral", "muse_glimmer", "nanbeige", "nanochat", "nemotron", "olmoe", "phi",
        "phimoe", "plamo2", "plamo3", "qwen2", "qwen2_vl", "qwen3_vl", "seed_oss", "smollm3", "solar_open",
        "talkie", "telechat3", "youtu_llm")},
    "deepseek_v2": dict(rope_scaling=dict(type="yarn", factor=1.0, original_max_position_embeddings=512,
                                          mscale_all_dim=0)),
    "glm4_moe": dict(use_qk_norm=True),
    "exaone4": dict(sliding_window_pattern="LG"),
    "ernie4_5": dict(use_bias=False),
    "minimax": dict(shared_intermediate_size=32, rotary_dim=8),
    "minicpm": dict(dim_model_base=64, scale_depth=1.4, scale_emb=12),
    "olmo3": dict(layer_types=["sliding_attention", "full_attention"]),
    "plamo3": dict(sliding_window_pattern=2),  # a sliding layer, then a full one, as its checkpoints
    # Multimodal wrappers: the text model's config inside.
    "gemma3": dict(text_config=dict(_TEXT, model_type="gemma3_text", sliding_window=WINDOW, sliding_window_pattern=2,
                                    query_pre_attn_scalar=16)),
    "mistral3": dict(text_config=dict(_TEXT, model_type="ministral3", rope_parameters=dict(
        rope_theta=10000.0, llama_4_scaling_beta=0.1, original_max_position_embeddings=512))),
    # Two of four layers share the keys and values of earlier ones.
    "gemma4_text": dict(num_hidden_layers=4, num_kv_shared_layers=2, sliding_window_pattern=2, global_head_dim=32,
                        num_key_value_heads=1, vocab_size_per_layer_input=256, hidden_size_per_layer_input=16,
                        num_experts=None),
    "llama4_text": dict(num_hidden_layers=4, intermediate_size_mlp=128, no_rope_layers=[1, 1, 1, 0], use_qk_norm=True,
                        attention_chunk_size=8, num_local_experts=2, num_experts_per_tok=1, interleave_moe_layer_step=1),
    # Hybrids: convolution, Mamba-2 and linear-attention states beside key-value layers.
    "lfm2": dict(conv_bias=False, conv_L_cache=3, block_dim=64, block_multiple_of=16, block_ffn_dim_multiplier=1.0,
                 block_auto_adjust_ff_dim=False, block_ff_dim=128, full_attn_idxs=[1]),
    "nemotron_h": dict(mamba_num_heads=4, mamba_head_dim=16, mamba_proj_bias=False, ssm_state_size=16, conv_kernel=4,
                       n_groups=1, use_conv_bias=True, use_bias=False, hybrid_override_pattern=["M", "*", "-"],
                       num_hidden_layers=3, time_step_limit=(0.0, 1e9)),
    "kimi_linear": dict(linear_attn_config=dict(kda_layers=[1], num_heads=2, head_dim=16, short_conv_kernel_size=4),
                        model_max_length=512),
    "olmo_hybrid": dict(_LINEAR, linear_allow_neg_eigval=False, layer_types=["linear_attention", "full_attention"]),
    "qwen3_5_moe": dict(_LINEAR, full_attention_interval=2, shared_expert_intermediate_size=32),
    "exaone": dict(num_layers=2),
    "gpt_neox": dict(rotary_emb_base=10000, rotary_pct=0.5),
    "plamo": dict(n_shared_head=2),
    "qwen": dict(kv_channels=16),
    "qwen2_moe": dict(shared_expert_intermediate_size=32),
    "stablelm": dict(use_qkv_bias=False),
    "apertus": dict(post_norm=False, qk_norm=True),
    "afmoe": dict(layer_types=_SLIDING_FULL, num_shared_experts=1, num_dense_layers=1),
    "baichuan_m1": dict(sliding_window_layers=[0], conv_window=2, num_swa_attention_heads=4,
                        num_swa_key_value_heads=2),
    "bailing_moe": dict(num_shared_experts=1, topk_group=1),
    "bailing_moe_linear": dict(num_shared_experts=1, layer_group_size=2, group_norm_size=1, topk_group=1),
    "bailing_hybrid": dict(num_shared_experts=1, layer_group_size=2, group_norm_size=1,
                           moe_shared_expert_intermediate_size=32),
    "cohere2": dict(sliding_window_pattern=2, logit_scale=0.5),
    "deepseek_v32": _INDEXER,
    "glm_moe_dsa": dict(_INDEXER, scoring_func="sigmoid", moe_layer_freq=1,
                        rope_parameters=dict(rope_theta=10000.0, type="default")),
    "ernie4_5_moe": dict(use_bias=False, moe_num_experts=4, moe_k=2, moe_layer_start_index=1, moe_num_shared_experts=1),
    "exaone_moe": dict(num_shared_experts=1, layer_types=_SLIDING_FULL, is_moe_layer=[False, True]),
    "gear": dict(layer_types=_SLIDING_FULL),
    "gptj": dict(n_embd=64, n_head=4, rotary_dim=8, n_layer=2, n_positions=512),
    "granitemoe": _GRANITE,
    "granitemoehybrid": dict(_GRANITE, layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=16,
                             mamba_proj_bias=False, mamba_d_state=16, mamba_d_conv=4, mamba_n_groups=1,
                             mamba_conv_bias=True, shared_intermediate_size=32),
    # Cross-layer attention: layer 1 attends with layer 0's keys and values.
    "hunyuan": dict(moe_topk=2, num_shared_expert=1, use_mixed_mlp_moe=True, use_qk_norm=True, use_cla=True,
                    cla_share_factor=2, rope_scaling=dict(alpha=1.0, factor=1.0, type="dynamic")),
    "jamba": dict(attn_layer_offset=1, attn_layer_period=2, expert_layer_offset=1, expert_layer_period=2,
                  mamba_d_conv=4, mamba_d_state=16, mamba_expand=2),
    "kimi_k3": dict(hidden_act="situ", q_lora_rank=16, num_experts_per_token=2, num_shared_experts=1,
                    linear_attn_config=dict(kda_layers=[1], num_heads=2, head_dim=16, short_conv_kernel_size=4,
                                            full_attn_layers=[2])),
    "lfm2_moe": dict(use_expert_bias=True, num_dense_layers=1, conv_bias=False, conv_L_cache=3, full_attn_idxs=[1]),
    "lille-130m": dict(block_size=512, n_embd=64, n_head=4, n_kv_heads=2, n_layer=2),
    "longcat_flash": dict(_LONGCAT, attention_method="MLA", zero_expert_type="identity"),
    "mamba": dict(hidden_size=32, intermediate_size=64, state_size=16, conv_kernel=4, use_bias=False,
                  use_conv_bias=True, time_step_rank="auto", tie_word_embeddings=True),
    "mellum": dict(layer_types=_SLIDING_FULL, rope_parameters=_ROPE_BY_LAYER),
    "mimo_v2_flash": dict(hybrid_layer_pattern=[1, 0], moe_layer_freq=[0, 1], add_swa_attention_sink_bias=True,
                          add_full_attention_sink_bias=False, sliding_window_size=WINDOW, scoring_func="sigmoid",
                          layernorm_epsilon=1e-5, swa_rope_theta=10000.0, swa_num_attention_heads=4,
                          swa_num_key_value_heads=2, swa_head_dim=16, swa_v_head_dim=16),
    "minicpm3": dict(dim_model_base=64, scale_depth=1.4, scale_emb=12, q_lora_rank=16,
                     rope_scaling=dict(original_max_position_embeddings=512)),
    "ministral3": dict(rope_parameters=_ROPE_LLAMA4),
    "mistral4": dict(q_lora_rank=16, rope_parameters=_ROPE_LLAMA4),
    # A layer whose attention is a no-op beside one with grouped query heads.
    "nemotron-nas": dict(block_configs=[dict(attention=dict(n_heads_in_group=2), ffn=dict(ffn_mult=1.0)),
                                        dict(attention=dict(no_op=True), ffn=dict(ffn_mult=1.0))]),
    "openelm": dict(num_transformer_layers=2, model_dim=64, ffn_dim_divisor=16, num_query_heads=[4, 4],
                    num_kv_heads=[2, 2], ffn_multipliers=[1.0, 2.0]),
    "phixtral": dict(num_vocab=256, model_dim=64, num_heads=4, num_layers=2, rotary_dim=8),
    "recurrent_gemma": dict(conv1d_width=4, logits_soft_cap=30.0, attention_window_size=WINDOW,
                            block_types=["recurrent", "attention"], num_key_value_heads=1),
    "rwkv7": dict(a_low_rank_dim=16, v_low_rank_dim=16, gate_low_rank_dim=16, decay_low_rank_dim=16),
    "spark2_5": dict(layer_types=_SLIDING_FULL, rope_parameters=_ROPE_BY_LAYER, hidden_act="gelu"),
    "step3p5": dict(num_attention_groups=2, layer_types=_SLIDING_FULL, moe_num_experts=4, moe_top_k=2,
                    share_expert_dim=32, moe_layers_enum="1"),
    # Two of four layers read the keys and values of earlier ones (cache.keys_and_values()).
    "gemma3n": dict(text_config=dict(_FAMILY_TEXT, model_type="gemma3n_text", num_hidden_layers=4,
                                     num_kv_shared_layers=2, layer_types=_SLIDING_FULL * 2,
                                     vocab_size_per_layer_input=256, rope_local_base_freq=10000.0,
                                     final_logit_softcapping=30.0, activation_sparsity_pattern=[0.95, 0, 0, 0],
                                     hidden_size_per_layer_input=16, altup_num_inputs=4, altup_coef_clip=120.0,
                                     altup_correct_scale=True, altup_active_idx=0, laurel_rank=8)),
    "gemma4": dict(text_config=dict(_FAMILY_TEXT, num_hidden_layers=4, num_kv_shared_layers=2,
                                    sliding_window_pattern=2, global_head_dim=32, num_key_value_heads=1,
                                    vocab_size_per_layer_input=256, hidden_size_per_layer_input=16,
                                    num_experts=None)),
    "kimi_k25": dict(text_config=dict(_FAMILY_TEXT, model_type="deepseek_v3")),
    "kimi_vl": dict(text_config=dict(_FAMILY_TEXT, model_type="deepseek_v3")),
    "lfm2-vl": dict(text_config=dict(_FAMILY_TEXT, model_type="lfm2", conv_bias=False, conv_L_cache=3, block_dim=64,
                                     block_multiple_of=16, block_ffn_dim_multiplier=1.0,
                                     block_auto_adjust_ff_dim=False, block_ff_dim=128, full_attn_idxs=[1])),
    "minimax_m3_vl": dict(text_config=dict(_FAMILY_TEXT, model_type="minimax_m3", moe_layer_freq=[0, 1])),
    "pixtral": dict(text_config=dict(_FAMILY_TEXT, model_type="llama")),
    "qwen3_vl_moe": dict(text_config=dict(_FAMILY_TEXT, model_type="qwen3_moe")),
    # qwen3_5 with one Hadamard-rotated 2-bit layer (a pack's manifest: its input rotated in blocks of 512),
    # its packed weights random (_fill_packs).
    "prism_hadamard_qwen35": dict(
        text_config=dict(BASE, **STATE_ARCHITECTURES["qwen3_5"], intermediate_size=512), schema_version=1,
        tensor_namespace="mlx-lm-text", quantization=dict(bits=2, group_size=128, mode="affine"),
        modules=[dict(path="model.layers.0.mlp.down_proj", embedding=False, dtype="float16", block=512)]),
    # These fall back to the Python step (test_model_families.FALLS_BACK says why).
    "afm7": dict(hidden_dim=64, num_layers=3, num_kv_reuse_layers=1, num_heads=4, num_kv_heads=2,
                 hidden_dim_scale_factor=2.0),
    "dbrx": dict(d_model=64, n_layers=2, n_heads=4, ffn_config=dict(ffn_hidden_size=64, moe_num_experts=4, moe_top_k=2),
                 attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=10000.0)),
    "deepseek_v41": _INDEXER,
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_inner=128, n_head=4, n_positions=512),
    "llama4": dict(text_config=dict(_FAMILY_TEXT, model_type="llama4_text", num_hidden_layers=4,
                                    intermediate_size_mlp=128, no_rope_layers=[1, 1, 1, 0], use_qk_norm=True,
                                    attention_chunk_size=8, num_local_experts=2, num_experts_per_tok=1,
                                    interleave_moe_layer_step=1)),
    "longcat_flash_ngram": dict(_LONGCAT, ngram_vocab_size_ratio=2),
    # Its logits mask ids 100256 to 100351 (dummy tokens): a vocabulary that holds them.
    "phi3small": dict(dense_attention_every_n_layers=2, ff_intermediate_size=128, gegelu_limit=20.0,
                      blocksparse_block_size=32, blocksparse_num_local_blocks=2, blocksparse_vert_stride=2,
                      vocab_size=100352),
}
# One query head of 32 per key-value head: a whole quantization group of 32 (kv_group_size=32).
QUANTIZABLE = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32)


def tiny_config(kind: str, **overrides) -> dict:
    """The config.json of a tiny `kind` model."""
    family = {**FAMILY_BASE, **FAMILIES[kind]} if kind in FAMILIES else {}
    return {**BASE, **ARCHITECTURES.get(kind, {}), **POSITION_EMBEDDING_ARCHITECTURES.get(kind, {}),
            **STATE_ARCHITECTURES.get(kind, {}), **family, **overrides, "model_type": kind}


def tiny(kind: str, **overrides):
    """A random `kind` model (seeded: the same weights every time), evaluated so any worker can read it."""
    config = tiny_config(kind, **overrides)
    model_class, args_class = _get_classes(config)
    mx.random.seed(0)
    model = model_class(args_class.from_dict(config))
    _fill_packs(model)
    mx.eval(model.parameters())
    return model


def _fill_packs(model) -> None:
    """Random values in the layers of a weight pack (prism_hadamard_qwen35's, built as zeros)."""
    for _, module in model.named_modules():
        if type(module).__name__ == "HadamardQuantizedLinear":
            module.weight = mx.random.randint(0, 2**31, module.weight.shape).astype(mx.uint32)
            module.scales = (mx.random.normal(module.scales.shape) * 0.05).astype(mx.float16)
            module.biases = (mx.random.normal(module.biases.shape) * 0.05).astype(mx.float16)
            if "signs" in module:
                module.signs = mx.where(mx.random.bernoulli(0.5, module.signs.shape), 1.0, -1.0)


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
    config = {**tiny_config(kind, vocab_size=vocab), "eos_token_id": sorted(eos)}
    (path / "config.json").write_text(json.dumps(config))
    return path


def loaded_tokenizer(folder, tokenizer, chat_template: str, config: dict | None = None, tokens=()):
    """`tokenizer` (a GGUF's, SmolLM2's) saved in `folder` with `chat_template`, `config` added
    to its tokenizer_config and `tokens` to its vocabulary, as mlx-lm's loader reads it back: a
    TokenizerWrapper, with the tool parser that loader chose for it."""
    import json
    from pathlib import Path

    from mlx_lm.tokenizer_utils import load

    from emlx_async.llm.save import hf_tokenizer

    hf = hf_tokenizer(tokenizer, eos_ids={2}, bos_id=None, chat_template=chat_template)
    if tokens:
        hf.add_special_tokens({"additional_special_tokens": list(tokens)})
    hf.save_pretrained(folder)
    path = Path(folder) / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **(config or {})}))
    return load(Path(folder))


XTML = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")  # Kimi K3's vocabulary marks, which name its format


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
