"""The LLM layer's own refusals are the package's classes (EMLXErrors) and still the builtin users catch."""

from __future__ import annotations

import pytest

import emlx_async as ea
from support.helpers import needs, on_loops

needs_mlx_lm = needs("mlx_lm")


def test_a_refused_value_is_invalid_argument_and_a_value_error():
    from emlx_async.llm.sampling import check_sampling

    with pytest.raises(ea.InvalidArgument, match="invalid sampling: temperature=-1") as caught:
        check_sampling(temperature=-1)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, ea.EMLXError)


def test_a_refused_type_is_invalid_argument_type_and_a_type_error():
    from emlx_async.llm import Grammar

    with pytest.raises(ea.InvalidArgumentType, match="build a Grammar with") as caught:
        Grammar("regex", "a")  # not through a classmethod: nothing compiled
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, ea.EMLXError)


@needs_mlx_lm
@on_loops("asyncio")
async def test_a_closed_engine_refuses_with_invalid_state_a_runtime_error(rt, tmp_path):
    from support.tiny_models import tiny_model_folder

    from emlx_async.llm import Engine

    engine = await Engine.load(str(tiny_model_folder(tmp_path, "{{ messages[0].content }}")), runtime=rt,
                               step="python")
    await engine.close()
    with pytest.raises(ea.InvalidState, match="the engine is closed") as caught:
        async for _ in engine.generate([1, 2, 3], max_tokens=2):
            pass
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, ea.EMLXError)
