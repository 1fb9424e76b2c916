"""The GGUF as an mlx-lm folder (`emlx-async convert`, `Engine.save`): mlx-lm's own
`load` and our engine read it back and decode the GGUF's greedy tokens."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest

from support.helpers import needs_model, run_on

pytestmark = [pytest.mark.model, needs_model]

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
# Greedy tokens are compared on a short raw prompt (the CPU prefills ~10 tokens/s);
# the chat prompt is compared as token ids.
PARIS = "The capital of France is"
MAX_TOKENS = 6


async def _engine_answer(path=None):
    """(chat prompt ids, greedy tokens after PARIS, their text, engine facts) from our engine on `path`
    (None: the GGUF)."""
    import emlx_async as ea
    from emlx_async.llm import Engine

    async with ea.Runtime(pool_size=2) as rt:
        engine = await Engine.load(path, runtime=rt)
        tokens, text = [], ""
        async for delta in engine.generate(PARIS, max_tokens=MAX_TOKENS):
            text += delta.text
            if delta.token is not None:
                tokens.append(delta.token)
        return engine.encode(messages=FRANCE), tokens, text, (engine.eos_ids, engine.bos_id, engine.chat_template)


@pytest.fixture(scope="module")
def gguf_answer():
    return run_on("asyncio", _engine_answer)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """SmolLM2's GGUF converted by the CLI (no GGUF given: the default model)."""
    from emlx_async.serve import cli

    out = tmp_path_factory.mktemp("convert") / "smollm2-mlx"
    assert cli.main(["convert", str(out)]) == 0
    return out


def test_the_folder_is_what_mlx_lm_writes(folder):
    names = {p.name for p in folder.iterdir()}
    assert {"model.safetensors", "model.safetensors.index.json", "config.json", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja"} <= names
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["rope_traditional"] is True  # GGUF's permuted q/k
    assert config["tie_word_embeddings"] is True
    # 4-bit layers, the 8-bit embedding under its own path.
    assert (config["quantization"]["bits"], config["quantization"]["group_size"]) == (4, 32)
    assert config["quantization"]["model.embed_tokens"]["bits"] == 8
    assert config["eos_token_id"] == [2]  # <|im_end|>: mlx-lm stops at the end of the turn
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    specials = {t["content"] for t in tokenizer["added_tokens"] if t["special"]}
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= specials


def test_mlx_lm_load_decodes_the_gguf_greedy_tokens(folder, gguf_answer):
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    chat_prompt, tokens, text, _ = gguf_answer
    assert text.startswith(" Paris")
    model, tokenizer = load(str(folder))
    # The template and the special tokens survived: the very same prompt ids.
    assert list(tokenizer.apply_chat_template(FRANCE, add_generation_prompt=True)) == chat_prompt
    theirs = []
    for token, _ in generate_step(mx.array(tokenizer.encode(PARIS)), model, max_tokens=MAX_TOKENS):
        if token in tokenizer.eos_token_ids:
            break
        theirs.append(int(token))
    assert theirs == tokens


def test_engine_loads_the_folder(folder, gguf_answer):
    prompt, tokens, text, (eos_ids, bos_id, template) = run_on("asyncio", _engine_answer, str(folder))
    assert (prompt, tokens, text) == gguf_answer[:3]
    assert (eos_ids, bos_id, template) == gguf_answer[3]


def test_engine_save_writes_what_convert_writes(folder, tmp_path):
    import emlx_async as ea
    from emlx_async.llm import Engine

    saved, used = tmp_path / "saved", tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("not a model")

    async def main():
        async with ea.Runtime(pool_size=2) as rt:
            engine = await Engine.load(runtime=rt)
            await engine.save(str(saved))
            with pytest.raises(FileExistsError, match="not empty"):
                await engine.save(str(used))
            with pytest.raises(FileExistsError, match="is a file"):
                await engine.save(str(used / "keep.txt"))
            # Saving leaves the engine's own weights in place (mlx-lm's save can donate them).
            return engine.model.model.embed_tokens.weight.shape

    assert run_on("asyncio", main) == (49152, 144)
    assert sorted(p.name for p in used.iterdir()) == ["keep.txt"]
    assert json.loads((saved / "config.json").read_text()) == json.loads((folder / "config.json").read_text())
    ours, theirs = mx.load(str(saved / "model.safetensors")), mx.load(str(folder / "model.safetensors"))
    assert ours.keys() == theirs.keys()
    assert all(mx.array_equal(ours[k], theirs[k]).item() for k in ours)


def test_a_bos_the_engine_prepends_is_added_by_the_saved_tokenizer(tmp_path):
    """A GGUF with add_bos_token: the engine prepends the BOS; mlx-lm's tokenizer must too."""
    from mlx_lm.utils import load_tokenizer

    from emlx_async.llm import _gguf
    from emlx_async.llm.loading import added_bos, load_model_files
    from emlx_async.llm.save import hf_tokenizer

    _, meta = mx.load(_gguf.smollm2_path(), return_metadata=True)
    tokenizer = _gguf.gguf_tokenizer(meta)
    hf_tokenizer(tokenizer, eos_ids={2}, bos_id=1, chat_template=meta["tokenizer.chat_template"]
                 ).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": [2]}))
    wrapper = load_tokenizer(tmp_path)
    plain = tokenizer.encode("Hello", add_special_tokens=False).ids
    assert wrapper.encode("Hello") == [1, *plain]
    assert added_bos(wrapper._tokenizer) == 1  # Engine.load of such a folder prepends it
    assert tokenizer.encode("Hello").ids == plain  # the engine's own tokenizer is untouched
    with pytest.raises(FileNotFoundError, match="no such GGUF file or mlx-lm folder"):
        load_model_files(str(tmp_path / "missing.gguf"))


def test_cli_convert_refuses_bad_paths_before_loading(tmp_path, capsys):
    from emlx_async.serve import cli

    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("")
    assert cli.main(["convert", str(tmp_path / "missing.gguf"), str(tmp_path / "out")]) == 1
    assert "no such GGUF file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert cli.main(["convert", str(tmp_path / "missing.gguf"), str(used)]) == 1
    assert "not empty" in capsys.readouterr().err
