"""llm/loading.py: reading a model folder or GGUF file, and the fixes it applies (llm/model_fixes.py)."""

from __future__ import annotations

import re

import pytest

from support.helpers import needs_model


@pytest.mark.parametrize("text, problem", [
    ("{not json", "config.json is not JSON: Expecting property name"),
    (b"\xff{}", "config.json is not JSON"),
    ("[1, 2]", "config.json must hold a JSON object, got a JSON array"),
    ('"llama"', "config.json must hold a JSON object, got a JSON string"),
    ('{"hidden_size": 64}', "config.json must name the model's model_type as a string, got none"),
    ('{"model_type": 5}', "config.json must name the model's model_type as a string, got 5"),
    ('{"model_type": null}', "config.json must name the model's model_type as a string, got None"),
])
def test_a_broken_config_json_is_refused_naming_the_file_and_the_problem(tmp_path, text, problem):
    # mlx-lm's own JSONDecodeError, AttributeError ('list' object has no attribute 'get') or
    # KeyError named neither the file nor the problem.
    pytest.importorskip("mlx_lm")
    import emlx_async as ea
    from emlx_async.llm.loading import load_model_files

    config = tmp_path / "config.json"
    config.write_bytes(text) if isinstance(text, bytes) else config.write_text(text)
    with pytest.raises(ea.InvalidArgument, match=re.escape(f"{tmp_path}: {problem}")):
        load_model_files(str(tmp_path))


@needs_model
def test_an_unknown_model_type_keeps_mlx_lms_error_naming_it(tmp_path):
    import json

    from support.tiny_models import tiny_model_folder

    from emlx_async.llm.loading import load_model_files

    config = tiny_model_folder(tmp_path, "{{ messages[0].content }}") / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_type": "no_such_family"}))
    with pytest.raises(ValueError, match="no_such_family"):
        load_model_files(str(tmp_path))



@pytest.mark.parametrize("kind", ["dbrx", "gpt_bigcode", "phi3small"])
def test_loading_an_mlx_lm_folder_applies_the_fixes_its_step_needs(tmp_path, monkeypatch, kind):
    # What test_model_families applies by hand to a model built in code, load_model_files applies
    # (mlx-lm's loader stands in: Transformers reads no tokenizer for these tiny configs).
    import json
    from types import SimpleNamespace

    import mlx_lm

    from emlx_async.llm.loading import load_model_files
    from emlx_async.llm.model_fixes import fix_block_sparse_masks, fix_expert_picks, fix_position_arrays
    from support.tiny_models import tiny

    fixes = (fix_expert_picks, fix_position_arrays, fix_block_sparse_masks)
    assert any(fix(tiny(kind)) for fix in fixes)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": kind}))
    tokenizer = SimpleNamespace(eos_token_ids=[2], eos_token_id=2, chat_template=None, bos_token_id=None)
    monkeypatch.setattr(mlx_lm, "load", lambda path: (tiny(kind), tokenizer))
    model, _, _ = load_model_files(str(tmp_path))
    assert not any(fix(model) for fix in fixes)  # nothing left to fix
