"""SmolLM2 sharded three ways (its 9 query and 3 key-value heads divide by 3):
the engine and the HTTP service against one process, and a follower killed
mid-generation. Ranks run on loopback with MLX's ring backend, started and
reaped by the tests; one 3-rank server is shared by the HTTP tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from emlx_async.testing import LocalRing
from support import SUPPORT
from support.dist_rank import MAX_TOKENS
from support.helpers import needs_model

RANK_SCRIPT = str(SUPPORT / "dist_rank.py")
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
STEP_TIMEOUT = 15  # seconds a step may take; this 2-core machine is shared, so not less

# Three ranks share this machine's cores: a model load and a few steps take
# tens of seconds when other work runs, more than the suite's 120 s default.
pytestmark = [needs_model, pytest.mark.timeout(420)]


def one_process(prompts: list[str], max_tokens: int, chat: list[dict] | None = None) -> list:
    """Greedy tokens (or, for `chat`, text) of the unsharded engine in this process."""
    from emlx_async.llm import Engine

    async def run():
        engine = await Engine.load(mode="batch")
        try:
            if chat is not None:
                return "".join([d.text async for d in engine.generate(messages=chat, max_tokens=max_tokens)])
            return [[d.token async for d in engine.generate(p, max_tokens=max_tokens) if d.token is not None]
                    for p in prompts]
        finally:
            await engine.runtime.close()

    return asyncio.run(run())


def test_sharded_engine_gives_one_process_tokens_alone_and_four_at_once():
    with LocalRing(3, [sys.executable, RANK_SCRIPT, "engine", "asyncio"],
                   env={"RANK_TIMEOUT": str(STEP_TIMEOUT)}) as ring:
        codes = ring.wait(timeout=300)
        assert codes == [0, 0, 0], [ring.errors(r)[-3000:] for r in range(3)]
        result = json.loads(ring.output(0).split("RESULT ", 1)[1])
    reference = one_process(result["prompts"], result["max_tokens"])
    assert result["alone"] == reference[:2]
    assert result["together"] == reference
    assert all(len(tokens) > 0 for tokens in reference)


@pytest.mark.parametrize("mode,step", [("batch", "replay"), ("parallel", "python")])
def test_two_ranks_give_the_one_process_tokens_greedy_seeded_and_n_choices(tmp_path, mode, step):
    """A tiny random llama (4 query and 2 key-value heads) over 2 ranks, its step replayed
    (the group's trace) or mlx-lm's Python step: greedy and seeded tokens, alone and at once,
    n=2 seeded choices, and a batch that grows, shrinks and moves to a longer cache with a
    penalized row, equal the one-process engine's (replayed) in either mode."""
    from emlx_async.llm import Engine
    from support.dist_rank import tiny_run
    from support.tiny_models import tiny_model_folder

    folder = tiny_model_folder(tmp_path, "{% for m in messages %}{{ m.content }}{% endfor %}")
    with LocalRing(2, [sys.executable, RANK_SCRIPT, "tiny_engine", "asyncio"],
                   env={"RANK_TIMEOUT": str(STEP_TIMEOUT), "TINY_MODEL": str(folder), "STEP": step}) as ring:
        codes = ring.wait(timeout=300)
        assert codes == [0, 0], [ring.errors(r)[-3000:] for r in range(2)]
        result = json.loads(ring.output(0).split("RESULT ", 1)[1])
        follower = json.loads(ring.output(1).split("RESULT ", 1)[1])

    async def one_process():
        engine = await Engine.load(str(folder), mode=mode)
        try:
            return engine.step_kind, await tiny_run(engine)
        finally:
            await engine.runtime.close()

    step_kind, reference = asyncio.run(one_process())
    assert step_kind == "replay"
    for key in ("greedy", "seeded", "together", "choices", "moving"):
        assert result[key] == reference[key], key
    assert len(set(map(tuple, result["choices"]))) > 1  # each choice its own key
    assert [len(tokens) for tokens in result["moving"]] == [70, 5, len(result["moving"][2]), 3]
    assert result["step_kind"] == follower["step_kind"] == step
    if step == "replay":
        assert "replayed on every rank" in result["step_note"]
    else:
        assert result["step_note"].endswith("the Python step was asked for")


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe"])
def test_two_ranks_replay_other_families_with_the_one_process_tokens(tmp_path, kind):
    """mlx-lm's shard() of qwen3 and of a MoE (qwen3_moe: experts sharded in place, its
    sum_gradients imported by name), the step traced by the group: the one-process tokens."""
    from emlx_async.llm import Engine
    from support.dist_rank import family_run

    result, _ = _tiny_ring(tmp_path, "tiny_family", kind)

    async def one_process():
        engine = await Engine.load(str(tmp_path), mode="batch")
        try:
            return await family_run(engine)
        finally:
            await engine.runtime.close()

    assert result.pop("step_kind") == "replay"
    assert result == asyncio.run(one_process())


def test_replayed_rounds_stay_in_step_when_a_reader_leaves_mid_prompt_or_a_follow_is_cancelled(tmp_path):
    """A reader leaving while its prompt's last chunk runs made rank 0's round stop half-issued
    (the ranks out of step, the group not broken); a cancelled follow() left its round half
    issued and the next follow() read step collectives as plans. Both now keep the ranks in
    step; prepare_step on one rank is refused; close (a stream still open, its tokens all
    out) and the stop plan release the traces."""
    from emlx_async.llm import Engine
    from support.dist_rank import TINY_PROMPTS

    result, follower = _tiny_ring(tmp_path, "replay_faults")

    async def one_process():
        engine = await Engine.load(str(tmp_path), mode="batch")
        try:
            return [d.token async for d in engine.generate(TINY_PROMPTS[1], max_tokens=MAX_TOKENS)
                    if d.token is not None]
        finally:
            await engine.runtime.close()

    assert result == {"rank": 0, "after": asyncio.run(one_process()), "lengths": [60] * 4, "broken": False,
                      "released": True, "refused": "a sharded engine chooses its step at load, on every rank "
                                                   "at once: ShardedEngine.load(step=...)"}
    assert follower == {"rank": 1, "cancelled_following": False, "released": True}


def test_ranks_loaded_with_other_settings_are_refused_on_every_rank(tmp_path):
    result, follower = _tiny_ring(tmp_path, "mismatched_settings")
    for got in (result, follower):
        assert "the ranks were loaded with different settings or models" in got["error"], got


def _tiny_ring(tmp_path, scenario: str, kind: str = "llama") -> tuple[dict, dict | None]:
    """Two ranks of `scenario` (support/dist_rank.py) on a tiny `kind` model (its folder is
    `tmp_path`): each rank's RESULT (None: none)."""
    from support.tiny_models import tiny_model_folder

    folder = tiny_model_folder(tmp_path, "{% for m in messages %}{{ m.content }}{% endfor %}", kind=kind)
    with LocalRing(2, [sys.executable, RANK_SCRIPT, scenario, "asyncio"],
                   env={"RANK_TIMEOUT": str(STEP_TIMEOUT), "TINY_MODEL": str(folder)}) as ring:
        codes = ring.wait(timeout=240)
        assert codes == [0, 0], [ring.errors(r)[-3000:] for r in range(2)]
        results = [json.loads(out.split("RESULT ", 1)[1]) if "RESULT " in out else None
                   for out in (ring.output(0), ring.output(1))]
    return results[0], results[1]


def test_a_closed_sharded_engine_refuses_new_requests_at_once_and_keeps_its_group(tmp_path):
    """close() lets the running request finish and stops the followers; a request after it is
    refused at once instead of sending a plan to ranks that are gone (which broke the group)."""
    result, _ = _tiny_ring(tmp_path, "closed_engine")
    assert result["ran"] == 40
    assert result["refused"] == "InvalidState: the engine is closed", result  # a RuntimeError
    assert result["refused_s"] < 1 and not result["broken"]


def test_close_with_a_bad_timeout_is_refused_and_leaves_the_engine_closable(tmp_path):
    result, follower = _tiny_ring(tmp_path, "close_bad_timeout")
    assert result == {"rank": 0, "refused": [True] * 5, "after": 6, "broken": False}, result
    assert follower == {"rank": 1, "followed": True}


def test_a_second_follow_on_a_rank_is_refused_and_the_first_keeps_the_ranks_in_step(tmp_path):
    from emlx_async.llm import Engine
    from support.dist_rank import MAX_TOKENS, TINY_PROMPTS

    result, follower = _tiny_ring(tmp_path, "follow_twice")
    assert follower["second"] == ["follow() already runs on rank 1"]

    async def one_process():
        engine = await Engine.load(str(tmp_path), mode="batch")
        try:
            return [[d.token async for d in engine.generate(p, max_tokens=MAX_TOKENS) if d.token is not None]
                    for p in TINY_PROMPTS[:2]]
        finally:
            await engine.runtime.close()

    assert result == {"rank": 0, "tokens": asyncio.run(one_process()), "broken": False}


def test_load_refuses_the_engine_options_a_sharded_engine_does_not_have():
    import mlx.core as mx

    from emlx_async import distributed as dist
    from emlx_async.llm.sharded import ShardedEngine

    group = dist.Group(mx.distributed.init(), backend="any", timeout=None, device=mx.cpu)

    async def load(**options):
        await ShardedEngine.load(group=group, **options)

    for options in ({"kv_bits": 4}, {"mode": "parallel", "prompt_cache": object()}, {"max_concurent": 2}):
        with pytest.raises(TypeError, match="ShardedEngine.load does not take " + ", ".join(sorted(options))):
            asyncio.run(load(**options))
    with pytest.raises(ValueError, match=r"idle_interval must be in \(0, 60\) seconds, got True"):  # ran as 1 s
        asyncio.run(load(idle_interval=True))


@pytest.mark.parametrize("step", ["replay", "python"])
def test_serve_distributed_takes_the_step_asked_for_on_every_rank(tmp_path, step):
    """`--step replay` serves the group's replayed step, `--step python` mlx-lm's; /health says which."""
    from support.tiny_models import tiny_model_folder

    folder = tiny_model_folder(tmp_path, "{% for m in messages %}{{ m.content }}{% endfor %}")
    with _serving(2, ["--model", str(folder), "--step", step]) as (_, base):
        status, health = _get(base + "/health")
    assert status == 200 and (health["mode"], health["step"]) == ("batch", step)


# ---- the HTTP service on rank 0 ---------------------------------------------------------


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@contextlib.contextmanager
def _serving(ranks: int, options: list[str]):
    """`emlx-async serve --distributed` over `ranks` local ranks, ready: (the ring, its base URL)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "emlx_async.serve", "--distributed", "--distributed-backend", "ring",
            "--port", str(port), "--step-timeout", str(STEP_TIMEOUT), "--log-level", "warning", *options]
    with LocalRing(ranks, argv) as ring:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            assert all(p.poll() is None for p in ring.ranks), [ring.errors(r)[-2000:] for r in range(ranks)]
            try:
                if _get(base + "/health")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the sharded server never became ready"
            time.sleep(0.5)
        yield ring, base


@pytest.fixture(scope="module")
def server():
    with _serving(3, []) as serving:
        yield serving


@pytest.fixture
def client(server):
    from openai import OpenAI

    _, base = server
    with OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120) as openai_client:
        yield openai_client


def test_openai_client_gets_one_process_text(server, client):
    ring, base = server
    reply = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT, max_tokens=8,
                                           temperature=0)
    text = reply.choices[0].message.content
    assert "Paris" in text
    assert text == one_process([], 8, chat=CHAT)
    streamed = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT, max_tokens=8,
                                              temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text
    status, health = _get(base + "/health")
    assert status == 200 and {key: health[key] for key in ("status", "model", "mode", "step")} == \
        {"status": "ready", "model": "SmolLM2-135M-Instruct", "mode": "batch", "step": "replay"}
    assert [(model["id"], model["status"]) for model in health["models"]] == [("SmolLM2-135M-Instruct", "ready")]


def one_process_choices(chat: list[dict], n: int, max_tokens: int, **options) -> list[str]:
    """The unsharded engine's n choices' texts (Engine.generate_choices) in this process."""
    from emlx_async.llm import Engine

    async def run():
        engine = await Engine.load(mode="batch")
        try:
            texts = [""] * n
            async for i, delta in engine.generate_choices(messages=chat, n=n, max_tokens=max_tokens, **options):
                texts[i] += delta.text
            return texts
        finally:
            await engine.runtime.close()

    return asyncio.run(run())


def test_n_choices_across_ranks_give_the_one_process_texts(server, client):
    """n=2 with a seed: each choice is a row of rank 0's plan with its own seed, the followers
    draw alike, and the texts are the one-process engine's for that seed."""
    reply = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT, max_tokens=6, n=2,
                                           seed=11, temperature=0.9)
    texts = [choice.message.content for choice in sorted(reply.choices, key=lambda c: c.index)]
    assert texts == one_process_choices(CHAT, 2, 6, seed=11, temperature=0.9)
    assert texts[0] != texts[1]  # their own keys
    assert reply.usage.completion_tokens >= 2


def test_killing_a_follower_mid_generation_answers_a_clear_error_within_the_timeout(server, client):
    """Last in this module: it breaks the shared server's group."""
    from openai import APIStatusError

    ring, base = server
    chunks: list[str] = []
    outcome: dict = {}

    def consume() -> None:
        try:
            for chunk in client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT,
                                                         max_tokens=200, temperature=0, stream=True):
                chunks.append(chunk)
        except Exception as exc:  # noqa: BLE001 - the error event is what the test reads
            outcome["error"] = exc
        outcome["ended"] = time.monotonic()

    reader = threading.Thread(target=consume)
    reader.start()
    deadline = time.monotonic() + 120
    while len(chunks) < 3:  # the role chunk and two tokens: mid-generation
        assert time.monotonic() < deadline and reader.is_alive(), "the generation never started"
        time.sleep(0.05)
    ring.ranks[2].kill()
    killed = time.monotonic()
    reader.join(timeout=STEP_TIMEOUT + 60)
    assert not reader.is_alive(), "rank 0 never answered after a follower died"
    assert outcome["ended"] - killed < STEP_TIMEOUT + 20
    error = outcome.get("error")
    assert error is not None and "distributed group is broken" in str(error)
    status, health = _get(base + "/health")
    assert status == 503 and health["status"] == "broken" and "broken" in health["error"]
    started = time.monotonic()
    with pytest.raises(APIStatusError) as refused:  # at once, not after another timeout
        client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT, max_tokens=4)
    assert refused.value.status_code == 503 and "broken" in str(refused.value)
    assert time.monotonic() - started < 5
    # No rank hangs: the other follower ends on its own, rank 0 on SIGTERM.
    assert ring.ranks[1].wait(timeout=STEP_TIMEOUT + 30) == 1
    ring.ranks[0].terminate()
    assert ring.ranks[0].wait(timeout=30) == 0
