"""Grammar-constrained decoding (emlx_async/llm/grammar.py).

Validation of grammar specs; the tokenizer adapter on every tokenizer shape
the engine holds; matchers (masks, tokens, failures, masks computed in the
background, a batch's masks at once); the mask applied in MLX against a
NumPy reference, inside a traced step too; and decoding: SmolLM2 through
mlx-lm's own generate_step with the logits processor (greedy and sampled
JSON that validates, any JSON, a regex, a Lark grammar, a budget too small
to finish), and 60 random bounded schemas on a tiny random llama with
SmolLM2's vocabulary, where the constraint alone makes the output valid.
"""

from __future__ import annotations

import json
import random
import re
import threading

import mlx.core as mx
import numpy as np
import pytest

import emlx_async as ea
from support.helpers import needs_model, on_every_loop
from support.schemas import random_schema
from support.tiny_models import smollm2_vocab_llama

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from emlx_async.llm import _gguf  # noqa: E402
from emlx_async.llm.grammar import (  # noqa: E402
    ALL_ALLOWED, Grammar, GrammarError, GrammarStateError, GrammarTokenizer, apply_token_mask, mask_words,
    unpack_token_mask)

pytestmark = needs_model  # the tokenizer comes from the SmolLM2 GGUF

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def gguf():
    """(tokenizers.Tokenizer, eos ids) from the GGUF, the way the engine builds them."""
    _, meta = mx.load(_gguf.smollm2_path(), return_metadata=True)
    _, eos = _gguf.gguf_special_ids(meta)
    return _gguf.gguf_tokenizer(meta), eos


@pytest.fixture(scope="module")
def tokenizer(gguf):
    hf, eos = gguf
    with GrammarTokenizer(hf, eos_ids=eos) as adapter:
        yield adapter


def encode(hf, text: str) -> list[int]:
    return hf.encode(text, add_special_tokens=False).ids


def allowed(mask: np.ndarray, vocab: int) -> np.ndarray:
    return np.flatnonzero(unpack_token_mask(mask, vocab))


# ---- specs and their validation ------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: Grammar.json_schema("{not json"), "not valid JSON"),
    (lambda: Grammar.json_schema("[1, 2]"), "must be a JSON object"),
    (lambda: Grammar.json_schema(42), "must be a dict or JSON text"),
    (lambda: Grammar.json_schema({"type": "foo"}), "Invalid type: foo"),
    (lambda: Grammar.json_schema({"type": "string", "minLength": 5, "maxLength": 2}), "Unsatisfiable"),
    (lambda: Grammar.json_schema({"properties": {"a": {"$ref": "#/nowhere"}}}), "/nowhere"),
    (lambda: Grammar.json_schema({"type": "string", "pattern": "a(b"}), "unclosed group"),
    (lambda: Grammar.json_schema({"not": {"type": "string"}}), '"not"'),  # unimplemented: named
    (lambda: Grammar.json_schema({"x": float("nan")}), "cannot be written as JSON"),
    (lambda: Grammar.regex("a(b"), "unclosed group"),
    (lambda: Grammar.regex("(?=a)b"), "look-around"),
    (lambda: Grammar.regex(b"ab"), "must be a str"),
    (lambda: Grammar.lark("start: missing"), 'unknown name: "missing"'),
    (lambda: Grammar.lark("start: /[a-z]+/ %ignore"), "Expected"),
    (lambda: Grammar.ebnf("root ::= ("), "invalid EBNF grammar"),
])
def test_invalid_grammars_raise_a_value_error_naming_the_problem(make, message):
    with pytest.raises(GrammarError, match=re.escape(message)) as caught:
        make()
    assert isinstance(caught.value, ValueError)  # the service answers 400
    assert "<state>" not in str(caught.value) and "<grammar>" not in str(caught.value)  # no parser dump


@pytest.mark.parametrize("make, what", [
    (lambda: Grammar.regex("a\ud800"), "the regular expression"),
    (lambda: Grammar.lark('start: "\ud800"'), "the Lark grammar"),
    (lambda: Grammar.ebnf('root ::= "\ud800"'), "the EBNF grammar"),
    (lambda: Grammar.json_schema('{"const": "\ud800"}'), "the JSON schema"),
    (lambda: Grammar.json_schema('{"const": "\\ud800"}'), "the JSON schema"),  # JSON's escape of one
    (lambda: Grammar.json_schema({"enum": ["a", "\ud800"]}), "the JSON schema"),
    (lambda: Grammar.regex("a").after_free_text("\ud800"), "end marker"),
    (lambda: Grammar.regex("a").after_free_text("</t>", start="\ud800"), "start marker"),
])
def test_a_lone_surrogate_is_a_grammar_error_naming_it(make, what):
    # It has no UTF-8 form: llguidance's encoding failed with a UnicodeEncodeError naming nothing.
    with pytest.raises(GrammarError, match=re.escape(what) + r".* no UTF-8 form: '\\ud800' \(a lone surrogate\)"):
        make()


def test_lenient_schemas_keep_the_unenforced_keywords_as_warnings():
    grammar = Grammar.json_schema({"type": "object", "not": {"required": ["a"]}}, lenient=True)
    assert grammar.kind == "json_schema" and any("not" in w for w in grammar.warnings)


def test_specs_say_what_they_were_built_from():
    assert Grammar.json_schema(PERSON) == Grammar.json_schema(json.dumps(PERSON))
    assert json.loads(Grammar.json_schema(PERSON).source) == PERSON
    assert Grammar.json_object().kind == "json_object"
    assert Grammar.regex("ab+").source == "ab+"
    assert Grammar.lark('start: "x"').kind == "lark"
    assert Grammar.ebnf('root ::= "yes" | "no"').kind == "lark"  # converted


# ---- the tokenizer adapter -----------------------------------------------------

def test_the_adapter_reads_every_tokenizer_shape_the_engine_holds(gguf, tokenizer):
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from transformers import PreTrainedTokenizerFast

    hf, eos = gguf
    fast = PreTrainedTokenizerFast(tokenizer_object=hf, eos_token="<|im_end|>")
    grammar = Grammar.regex("[0-9]+")
    want = tokenizer.matcher(grammar).mask()
    for shape, adapter in [("fast", GrammarTokenizer(fast)), ("mlx-lm wrapper", GrammarTokenizer(TokenizerWrapper(fast))),
                           ("wrapper, its eos list", GrammarTokenizer(TokenizerWrapper(fast, eos_token_ids=[2, 0])))]:
        with adapter:
            assert adapter.vocab_size == 49152 and adapter.words == 1536, shape
            assert set(adapter.eos_ids) == ({0, 2} if "eos list" in shape else {2}), shape
            assert np.array_equal(adapter.matcher(grammar).mask(), want), shape
    assert tokenizer.eos_ids == tuple(sorted(eos))
    with pytest.raises(TypeError, match="fast"):
        GrammarTokenizer(object())
    with pytest.raises(ValueError, match="eos_ids"):
        GrammarTokenizer(hf)  # a bare tokenizers.Tokenizer names no EOS


def test_a_padded_vocabulary_never_allows_the_padding(gguf):
    hf, eos = gguf
    with GrammarTokenizer(hf, eos_ids=eos, vocab_size=49200) as adapter:
        assert adapter.vocab_size == 49200 and adapter.words == mask_words(49200) == 1538
        mask = adapter.matcher(Grammar.json_schema({})).mask()  # any JSON value
        assert mask.shape == (1538,) and not unpack_token_mask(mask, 49200)[49152:].any()
    with pytest.raises(ValueError, match="smaller"):
        GrammarTokenizer(hf, eos_ids=eos, vocab_size=1000)


def test_close_stops_the_mask_threads(gguf):
    hf, eos = gguf
    adapter = GrammarTokenizer(hf, eos_ids=eos)
    adapter.matcher(Grammar.regex("a+")).start_mask().result(timeout=10)
    assert any(t.name.startswith("emlx-grammar") for t in threading.enumerate())
    adapter.close()
    adapter.close()  # idempotent
    assert not any(t.name.startswith("emlx-grammar") for t in threading.enumerate())


# ---- matchers -------------------------------------------------------------------

def test_a_matcher_allows_exactly_the_grammar_and_then_only_eos(gguf, tokenizer):
    hf, _ = gguf
    matcher = tokenizer.matcher(Grammar.regex("ab|abc"))
    first = allowed(matcher.mask(), tokenizer.vocab_size)
    assert all(hf.decode([int(t)]) in ("a", "ab", "abc") for t in first) and len(first) > 0
    assert not matcher.is_accepting
    for token in encode(hf, "ab"):
        matcher.advance(token)
    # "ab" is complete, "abc" may go on: EOS or "c".
    assert matcher.is_accepting and not matcher.is_finished
    assert {hf.decode([int(t)], skip_special_tokens=False) for t in allowed(matcher.mask(), 49152)} == {"<|im_end|>", "c"}
    matcher.advance(encode(hf, "c")[0])
    assert matcher.is_finished and list(allowed(matcher.mask(), 49152)) == [2]
    matcher.advance(2)
    assert matcher.tokens == encode(hf, "ab") + encode(hf, "c") + [2]


@pytest.mark.parametrize("pattern", [r"[^\s\S]", r"ab[^\s\S]", r"[a&&b]"])
def test_a_grammar_nothing_matches_is_refused_when_its_matcher_is_built(tokenizer, pattern):
    # llguidance compiles it; its first mask failed (NoExtensionBias), failing the request mid-decode.
    with pytest.raises(GrammarError, match="regex grammar is unsatisfiable: nothing can start its output"):
        tokenizer.matcher(Grammar.regex(pattern))
    for satisfiable in (r"[0-9]+", "(?:)"):  # one that matches only the empty text ends at once
        assert tokenizer.matcher(Grammar.regex(satisfiable)).mask().any()


def test_a_rejected_token_fails_that_matcher_only(gguf, tokenizer):
    hf, _ = gguf
    grammar = Grammar.json_schema(PERSON)
    bad, good = tokenizer.matcher(grammar), tokenizer.matcher(grammar)
    with pytest.raises(GrammarStateError, match="rejected") as caught:
        bad.advance(encode(hf, "x")[0])
    assert isinstance(caught.value, RuntimeError) and bad.error is caught.value
    with pytest.raises(GrammarStateError):
        bad.mask()  # it stays failed
    with pytest.raises(GrammarStateError):
        bad.advance(encode(hf, "{")[0])
    # The batch goes on: the failed row gets an all-allowed mask and its error.
    masks, errors = tokenizer.fill_masks([good, None, bad])
    assert errors[0] is None and errors[1] is None and isinstance(errors[2], GrammarStateError)
    assert (masks[1] == ALL_ALLOWED).all() and (masks[2] == ALL_ALLOWED).all()
    assert np.array_equal(masks[0], good.mask())
    for token in encode(hf, '{"name": "Ada", "age": 36}'):
        good.advance(token)
    assert good.is_finished


def test_masks_computed_in_the_background_equal_the_inline_ones(gguf, tokenizer):
    hf, _ = gguf
    grammar = Grammar.json_schema(PERSON)
    inline, background = tokenizer.matcher(grammar), tokenizer.matcher(grammar)
    for token in encode(hf, '{"name": "Grace", "age": 85}') + [2]:
        future = background.start_mask()
        want = inline.mask()
        assert np.array_equal(future.result(timeout=10), want)
        assert background.mask() is future.result()  # one computation per state
        inline.advance(token)
        background.start_mask()  # in flight while advancing: advance waits for it
        background.advance(token)
    assert inline.is_finished and background.is_finished
    pending = tokenizer.matcher(grammar)
    pending.advance(encode(hf, "{")[0])
    future = pending.start_mask()
    with pytest.raises(GrammarStateError):
        pending.advance(encode(hf, "x")[0])
    assert future.done()


def test_a_batchs_masks_at_once_equal_each_rows_own(gguf, tokenizer):
    hf, _ = gguf
    texts = ['{"name": "', '{"name": "Li", "age": 3', '{', '']
    rows = []
    for text in texts:
        m = tokenizer.matcher(Grammar.json_schema(PERSON))
        for token in encode(hf, text):
            m.advance(token)
        rows.append(m)
    want = [m.mask().copy() for m in rows]
    for m in rows:
        m._mask = None  # forget them: fill_masks computes them again, in parallel
    out = tokenizer.allocate_masks(6)
    masks, errors = tokenizer.start_masks([rows[0], None, rows[1], rows[2], None, rows[3]], out).result(timeout=10)
    assert masks is out and errors == [None] * 6
    for row, m in zip((0, 2, 3, 5), want):
        assert np.array_equal(masks[row], m)
    assert (masks[[1, 4]] == ALL_ALLOWED).all()
    with pytest.raises(ValueError, match="uint32"):
        tokenizer.fill_masks(rows, np.zeros((4, tokenizer.words), dtype=np.int32))


def test_mask_time_counts_each_computation_once(gguf):
    """The service's mask metrics: a mask computed inline or in the background is one
    computation of one mask; a batch round's rows at once are one computation of as many;
    a mask already computed costs nothing more."""
    hf, eos = gguf
    with GrammarTokenizer(hf, eos_ids=eos) as fresh:
        grammar = Grammar.json_schema(PERSON)
        first, second, third = (fresh.matcher(grammar) for _ in range(3))
        assert (fresh.mask_time.computations, fresh.mask_time.masks, fresh.mask_time.seconds) == (0, 0, 0.0)
        first.mask()
        first.mask()  # kept: not computed again
        second.start_mask().result(timeout=10)
        assert (fresh.mask_time.computations, fresh.mask_time.masks) == (2, 2)
        third.advance(encode(hf, "{")[0])
        first.advance(encode(hf, "{")[0])
        fresh.fill_masks([first, None, second, third])  # second's mask was kept: two rows computed
        assert (fresh.mask_time.computations, fresh.mask_time.masks) == (3, 4)
        assert fresh.mask_time.seconds > 0


# ---- the mask in MLX ------------------------------------------------------------

def reference(logits: np.ndarray, packed: np.ndarray, vocab: int) -> np.ndarray:
    bits = np.unpackbits(packed.view(np.uint8), axis=-1, bitorder="little")[..., :vocab].astype(bool)
    return np.where(bits, logits, -np.inf)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("shape", [(100,), (3, 100), (2, 49152)])
def test_the_mlx_mask_equals_the_numpy_reference(dtype, shape):
    rng = np.random.default_rng(sum(shape))
    vocab, words = shape[-1], mask_words(shape[-1])
    packed = rng.integers(0, 2**32, size=(*shape[:-1], words), dtype=np.uint32)
    logits = mx.random.normal(shape, key=mx.random.key(1)).astype(dtype)
    want = reference(np.array(logits.astype(mx.float32)), packed, vocab)
    got = apply_token_mask(logits, mx.array(packed))
    assert got.dtype == dtype and got.shape == shape
    np.testing.assert_array_equal(np.array(got.astype(mx.float32)), want)
    # The host-unpacked form gives the same logits, and both unpackings agree.
    unpacked = unpack_token_mask(packed, vocab)
    assert unpacked.dtype == np.bool_ and unpacked.shape == shape
    np.testing.assert_array_equal(np.array(unpack_token_mask(mx.array(packed), vocab)), unpacked)
    np.testing.assert_array_equal(np.array(apply_token_mask(logits, mx.array(unpacked)).astype(mx.float32)), want)


def test_mask_shapes_that_do_not_fit_are_refused():
    logits = mx.zeros((2, 100))
    with pytest.raises(ValueError, match="covers 64 tokens"):
        apply_token_mask(logits, mx.zeros((2, 2), dtype=mx.uint32))
    with pytest.raises(ValueError, match="uint32"):
        apply_token_mask(logits, mx.zeros((2, 4), dtype=mx.int32))
    with pytest.raises(ValueError, match="one entry per token"):
        apply_token_mask(logits, mx.zeros((2, 99), dtype=mx.bool_))


@on_every_loop
@pytest.mark.parametrize("form", ["packed", "bool"])
async def test_the_mask_is_an_input_of_a_traced_step_mixing_constrained_and_free_rows(rt, form):
    vocab, rows = 300, 3

    def step(logits, mask):
        return mx.argmax(apply_token_mask(logits, mask), axis=-1).astype(mx.int32)

    rng = np.random.default_rng(7)

    def inputs(seed):
        packed = np.full((rows, mask_words(vocab)), ALL_ALLOWED, dtype=np.uint32)  # row 1 stays free
        for row in (0, 2):
            packed[row] = 0
            for token in rng.choice(vocab, size=5, replace=False):
                packed[row, token >> 5] |= np.uint32(1 << (token & 31))
        mask = mx.array(packed if form == "packed" else unpack_token_mask(packed, vocab))
        logits = mx.random.normal((rows, vocab), key=mx.random.key(seed))
        mx.eval(logits, mask)
        return logits, mask, packed

    logits, mask, _ = inputs(0)
    traced = await ea.trace(step, logits, mask, queue=rt.default_queue())
    try:
        for seed in (1, 2, 3):  # new masks every call: the mask is an input, not a constant
            logits, mask, packed = inputs(seed)
            got = np.array(await traced(logits, mask, queue=rt.default_queue()))
            want = np.argmax(reference(np.array(logits), packed, vocab), axis=-1)
            np.testing.assert_array_equal(got, want)
            assert got[1] == int(np.argmax(np.array(logits)[1]))  # the free row is unconstrained
            for row in (0, 2):
                assert unpack_token_mask(packed[row], vocab)[got[row]]
    finally:
        traced.release()


# ---- decoding with the real model (mlx-lm's Python step) -----------------------

@pytest.fixture(scope="module")
def smollm2():
    from emlx_async.llm.engine import load_model_files

    model, hf, extra = load_model_files(None)
    mx.eval(model.parameters())
    return model, hf, extra["eos_ids"]


def chat(hf, question: str) -> list[int]:
    return encode(hf, f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


def decode(model, prompt: list[int], processor, eos_ids, *, max_tokens: int, temperature: float = 0.0,
           seed: int = 0) -> tuple[list[int], bool]:
    """(tokens before EOS, whether it ended by itself) from mlx-lm's generate_step."""
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    mx.random.seed(seed)
    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens,
                                  sampler=make_sampler(temperature), logits_processors=[processor]):
        if token in eos_ids:
            return out, True
        out.append(token)
    return out, False


@pytest.mark.model
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_smollm2_writes_json_that_validates_greedy_and_sampled(smollm2, tokenizer, temperature):
    model, hf, eos = smollm2
    processor = tokenizer.logits_processor(Grammar.json_schema(PERSON))
    tokens, ended = decode(model, chat(hf, "Describe a cat as JSON with its name and age."), processor, eos,
                           max_tokens=40, temperature=temperature)
    text = hf.decode(tokens)
    assert ended, text
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.model
def test_smollm2_any_json_parses_a_regex_matches_and_a_lark_grammar_holds(smollm2, tokenizer):
    model, hf, eos = smollm2
    cases = [
        ('Reply with a JSON object: {"ok": true}', Grammar.json_object(), lambda s: isinstance(json.loads(s), dict)),
        ("What time is it?", Grammar.regex(r"[0-2][0-9]:[0-5][0-9]"),
         lambda s: re.fullmatch(r"[0-2][0-9]:[0-5][0-9]", s)),
        ("Is Paris in France?", Grammar.lark('start: answer "."\nanswer: "yes" | "no"'),
         lambda s: s in ("yes.", "no.")),
    ]
    for question, grammar, holds in cases:
        tokens, ended = decode(model, chat(hf, question), tokenizer.logits_processor(grammar), eos, max_tokens=40)
        text = hf.decode(tokens)
        assert ended and holds(text), (grammar.kind, text)


@pytest.mark.model
def test_a_grammar_that_cannot_finish_in_the_budget_ends_with_what_it_made(smollm2, tokenizer):
    model, hf, eos = smollm2
    grammar = Grammar.json_schema({"type": "object", "properties": {"story": {"type": "string", "minLength": 200}},
                                   "required": ["story"], "additionalProperties": False})
    processor = tokenizer.logits_processor(grammar)
    tokens, ended = decode(model, chat(hf, "Tell me a story."), processor, eos, max_tokens=6)
    text = hf.decode(tokens)
    assert not ended and len(tokens) == 6 and text.startswith('{"story": "'), text
    assert not processor.matcher.is_accepting and processor.matcher.error is None


# ---- random schemas on a tiny random model --------------------------------------

@pytest.fixture(scope="module")
def tiny_random_llama():
    return smollm2_vocab_llama()


def test_random_schemas_on_a_random_model_always_validate(gguf, tokenizer, tiny_random_llama):
    hf, eos = gguf
    rng = random.Random(2026)
    prompt = encode(hf, "JSON:")
    completed, produced = 0, []
    for i in range(60):
        schema = random_schema(rng)
        processor = tokenizer.logits_processor(Grammar.json_schema(schema))
        tokens, ended = decode(tiny_random_llama, prompt, processor, eos, max_tokens=48, temperature=1.0, seed=i)
        text = hf.decode(tokens)
        produced.append((ended, text))
        if ended:
            completed += 1
            jsonschema.validate(json.loads(text), schema)
        else:
            assert len(tokens) == 48 and not processor.matcher.is_finished
    # Bounded schemas mostly finish within the budget even on noise.
    assert completed >= 45, (completed, produced)


def test_a_grammar_is_built_by_its_classmethods_and_a_closed_adapter_refuses_threads(gguf):
    with pytest.raises(TypeError, match="Grammar.json_schema"):
        Grammar("regex", "a+")  # not compiled, not validated
    hf, eos = gguf
    adapter = GrammarTokenizer(hf, eos_ids=eos)
    adapter.close()
    matcher = adapter.matcher(Grammar.regex("a+"))
    assert matcher.mask().shape == (adapter.words,)  # on the calling thread: fine
    matcher._mask = None
    with pytest.raises(RuntimeError, match="closed"):
        matcher.start_mask()
    with pytest.raises(TypeError, match="takes a Grammar"):
        adapter.matcher("a+")


def test_mlx_lms_batch_generator_mixes_constrained_and_free_rows(gguf, tokenizer, tiny_random_llama):
    from mlx_lm.generate import BatchGenerator

    hf, eos = gguf
    schemas = {0: PERSON, 2: {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                              "minItems": 1, "maxItems": 3}}
    prompts = [encode(hf, text) for text in ("JSON:", "Hello there, how", "A list:", "Once")]

    def run(constrained: bool) -> dict[int, list[int]]:
        processors = [[tokenizer.logits_processor(Grammar.json_schema(schemas[i]))] if constrained and i in schemas
                      else [] for i in range(len(prompts))]
        generator = BatchGenerator(tiny_random_llama, stop_tokens=[[e] for e in eos], max_tokens=40,
                                   stream=mx.default_stream(mx.default_device()))
        try:
            uids = generator.insert(prompts, logits_processors=processors)
            out: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
            finished: set[int] = set()
            while len(finished) < len(prompts):
                for r in generator.next_generated():
                    row = uids.index(r.uid)
                    if r.token not in eos:
                        out[row].append(r.token)
                    if r.finish_reason is not None:
                        finished.add(row)
                        assert r.finish_reason == "stop" or row not in schemas or not constrained, (row, r)
            return out
        finally:
            generator.close()

    free, mixed = run(False), run(True)
    for row, schema in schemas.items():
        jsonschema.validate(json.loads(hf.decode(mixed[row])), schema)
    for row in (1, 3):  # a row without a grammar decodes as if no row had one
        assert mixed[row] == free[row]


def test_the_logits_processor_raises_or_ends_the_row_on_a_grammar_failure(gguf, tokenizer):
    hf, _ = gguf
    prompt = mx.array(encode(hf, "JSON:"))
    logits = mx.random.normal((1, tokenizer.vocab_size), key=mx.random.key(0))
    bad = encode(hf, "x")[0]  # a JSON document cannot start with it
    raising = tokenizer.logits_processor(Grammar.json_schema(PERSON))
    first = raising(prompt, logits)
    assert list(np.flatnonzero(np.isfinite(np.array(first[0])))) == list(allowed(raising.matcher.mask(), 49152))
    with pytest.raises(GrammarStateError, match="rejected"):
        raising(mx.concatenate([prompt, mx.array([bad])]), logits)
    ending = tokenizer.logits_processor(Grammar.json_schema(PERSON), on_error="end")
    ending(prompt, logits)
    for extra in ([bad], [bad, 2]):  # the failed row is offered only EOS from then on
        out = ending(mx.concatenate([prompt, mx.array(extra)]), logits)
        assert list(np.flatnonzero(np.isfinite(np.array(out[0])))) == [2]
    assert isinstance(ending.error, GrammarStateError) and raising.error is not None
    with pytest.raises(ValueError, match="vocab_size=100"):
        tokenizer.logits_processor(Grammar.regex("a")).__call__(prompt, mx.zeros((1, 100)))
    with pytest.raises(ValueError, match="on_error"):
        tokenizer.logits_processor(Grammar.regex("a"), on_error="ignore")
