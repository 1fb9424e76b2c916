"""Mixture-of-experts decode: the replayed step against the Python step, in one run.

One stream's decode rate (tokens/s between its first and last token, greedy,
EOS ignored) of random mixture-of-experts models larger than the tests'
(built in code: no download), each loaded with ``Engine.load`` in parallel
mode twice, ``step="python"`` and ``step="auto"`` (the replayed step where
it traces), the two taking turns
for ``--rounds`` rounds:
  * dbrx: mlx-lm's picks each token's experts in Python; ``Engine.load``
    stacks them into mlx-lm's SwitchGLU so the step can be traced and reads
    only the picked experts (``model_fixes.fix_expert_picks``). In a dtype MLX's
    gather_mm cannot take on this device (its CPU: float32 only) the replayed
    engine falls back to the Python step and the row says so;
  * qwen3_moe: mlx-lm's own SwitchGLU, for reference.
``--quantize`` writes the weights 4-bit (groups of 64) first.

    python benchmarks/moe.py [--tokens 32] [--rounds 3] [--quantize] [--dtype float32] [--hidden 1024]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import anyio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emlx_async as ea  # noqa: E402
from emlx_async.llm import Engine  # noqa: E402


def models(hidden: int) -> dict[str, dict]:
    """The configs: 16 experts, 4 picked a token, experts of `hidden` x 2 `hidden`, 4 layers
    (decode reads the picked experts' weights)."""
    return {
        "dbrx": dict(d_model=hidden, n_layers=4, n_heads=16, max_seq_len=4096, tie_word_embeddings=False,
                     ffn_config=dict(ffn_hidden_size=2 * hidden, moe_num_experts=16, moe_top_k=4),
                     attn_config=dict(kv_n_heads=8, clip_qkv=8.0, rope_theta=10000.0)),
        "qwen3_moe": dict(hidden_size=hidden, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
                          head_dim=hidden // 16, num_experts=16, num_experts_per_tok=4,
                          moe_intermediate_size=2 * hidden, intermediate_size=2 * hidden, decoder_sparse_step=1,
                          mlp_only_layers=[], norm_topk_prob=True),
    }


PROMPT = "Tell me about mixtures of experts."


def model_folder(root: str, kind: str, config: dict, dtype: str, quantize: bool) -> str:
    """An mlx-lm folder of a random `kind` model (weights in `dtype`, 4-bit if `quantize`)."""
    from _tiny_model import tiny_model_folder

    folder = tiny_model_folder(os.path.join(root, kind), model_type=kind, vocab_size=1024, torch_dtype=dtype,
                               **config)
    if dtype != "float32" or quantize:
        import json

        import mlx.core as mx
        import mlx.nn as nn
        from mlx.utils import tree_flatten
        from mlx_lm.utils import load_model

        model, config = load_model(folder)
        model.set_dtype(getattr(mx, dtype))
        if quantize:
            nn.quantize(model, group_size=64, bits=4)
            config["quantization"] = {"group_size": 64, "bits": 4}
        mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
        (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


async def one_stream(engine: Engine, tokens: int) -> float:
    times = []
    async for delta in engine.generate(engine.encode(messages=[{"role": "user", "content": PROMPT}]),
                                       max_tokens=tokens, ignore_eos=True):
        if delta.token is not None:
            times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


async def main(args) -> None:
    with tempfile.TemporaryDirectory(prefix="emlx-moe-") as root:
        async with ea.Runtime() as rt:
            for kind, config in models(args.hidden).items():
                folder = model_folder(root, kind, config, args.dtype, args.quantize)
                # "auto": the replayed step where it traces, else the Python step with step_note saying why
                engines = {name: await Engine.load(folder, runtime=rt, mode="parallel", step=step, max_concurrent=1)
                           for name, step in (("python", "python"), ("replay", "auto"))}
                rates: dict[str, list[float]] = {step: [] for step in engines}
                for step, engine in engines.items():  # warm-up: the first call traces and compiles
                    await one_stream(engine, 4)
                for _ in range(args.rounds):
                    for step, engine in engines.items():
                        rates[step].append(await one_stream(engine, args.tokens))
                fell_back = engines["replay"].step_kind == "python"
                note = engines["replay"].step_note if fell_back else None  # why it fell back
                for step, engine in engines.items():
                    runs = " ".join(f"{r:6.1f}" for r in rates[step])
                    print(f"{kind:10s} {step:7s} ({engine.step_kind:6s}) tok/s {runs}   median "
                          f"{statistics.median(rates[step]):6.1f}")
                    await engine.close()
                ratio = statistics.median(rates["replay"]) / statistics.median(rates["python"])
                print(f"{kind:10s} replay / python {ratio:.2f}x" + (f"   (the Python step: {note})" if note else ""))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--quantize", action="store_true")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden size (experts: twice it)")
    anyio.run(main, parser.parse_args())
