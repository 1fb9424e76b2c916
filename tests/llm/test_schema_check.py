"""Schemas with no finite value (emlx_async/llm/schema_check.py): found from the schema
alone, refused when the Grammar is built, and in agreement with llguidance, which
compiles them and then fails at the first token mask."""

from __future__ import annotations

import pytest

from emlx_async.llm.schema_check import recursion_without_end

ENDLESS = [
    {"$ref": "#"},
    {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
    {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}},
    {"type": "object", "required": ["child"], "properties": {"child": {"$ref": "#"}}},
    {"anyOf": [{"$ref": "#"}]},
    {"allOf": [{"$ref": "#"}, {"type": "object"}]},
    {"type": "array", "minItems": 1, "items": {"$ref": "#"}},
    {"$ref": "#/definitions/node", "definitions": {"node": {
        "type": "object", "required": ["next"], "properties": {"next": {"$ref": "#/definitions/node"}}}}},
]

FINITE = [
    {"type": "object", "properties": {"child": {"$ref": "#"}}},              # the child is optional
    {"anyOf": [{"$ref": "#"}, {"type": "null"}]},                            # a branch ends it
    {"type": "array", "items": {"$ref": "#"}},                               # [] ends it
    {"type": ["object", "null"], "required": ["a"], "properties": {"a": {"$ref": "#"}}},
    {"$ref": "#/$defs/a", "$defs": {
        "a": {"type": "object", "required": ["b"], "properties": {"b": {"$ref": "#/$defs/b"}}},
        "b": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "string"}]}}},
    {"type": "object", "required": ["a"], "properties": {"a": {"$ref": "#"}, "b": {}}, "const": {"a": 1}},
    {"$ref": "#/$defs/Tree", "$defs": {"Tree": {"type": "object", "required": ["children"], "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}}}}}},  # pydantic's recursive model
    {"type": "string"},
    {},
]


@pytest.mark.parametrize("schema", ENDLESS)
def test_a_schema_whose_values_never_end_is_found(schema):
    assert "without end" in recursion_without_end(schema)


@pytest.mark.parametrize("schema", FINITE)
def test_a_schema_with_a_finite_value_passes(schema):
    assert recursion_without_end(schema) is None


@pytest.mark.parametrize("reference", ["http://example.com/schema", "#/nowhere", "#anchor", 3])
def test_a_reference_it_cannot_follow_counts_as_allowing_a_value(reference):
    assert recursion_without_end({"type": "object", "required": ["a"], "properties": {"a": {"$ref": reference}}}) \
        is None


def test_the_grammar_refuses_it_when_built():
    pytest.importorskip("llguidance")
    from emlx_async.llm.grammar import Grammar, GrammarError

    with pytest.raises(GrammarError, match="allows no finite value"):
        Grammar.json_schema({"$ref": "#"})
    with pytest.raises(GrammarError, match="allows no finite value"):
        Grammar.json_schema({"$ref": "#"}, lenient=True)
    Grammar.json_schema(FINITE[0])


@pytest.mark.model
def test_llguidance_agrees_on_every_case():
    """Each ENDLESS schema, compiled by llguidance past our check, fails within its first
    masks on SmolLM2's tokens; each FINITE one starts (so the check refuses nothing llguidance serves)."""
    pytest.importorskip("llguidance")
    import json

    import llguidance

    from emlx_async.llm.grammar import (_JSON_OPTIONS, Grammar, GrammarError, GrammarStateError, GrammarTokenizer,
                                         unpack_token_mask)
    from support.helpers import smollm2_tokenizer_and_template

    def starts(matcher_of, schema) -> bool:
        compiled = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_OPTIONS)
        try:
            matcher = matcher_of(Grammar("json_schema", json.dumps(schema), (), compiled))
            for _ in range(8):
                allowed = unpack_token_mask(matcher.mask(), tokenizer.vocab_size).nonzero()[0]
                if matcher.is_finished or not allowed.size:
                    break
                matcher.advance(int(allowed[0]))
        except (GrammarError, GrammarStateError):  # at its compile or at a mask
            return False
        return True

    hf, _ = smollm2_tokenizer_and_template()
    with GrammarTokenizer(hf, eos_ids=[2]) as tokenizer:
        assert not any(starts(tokenizer.matcher, schema) for schema in ENDLESS)
        assert all(starts(tokenizer.matcher, schema) for schema in FINITE if "const" not in schema)


def test_a_long_chain_of_references_is_judged_in_linear_time():
    """Each target is judged again only when one it refers to turns True: 5,000 definitions
    in a chain (the last a string) take well under a second, not minutes."""
    import time

    definitions = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(5000)}
    definitions["d5000"] = {"type": "string"}
    started = time.perf_counter()
    assert recursion_without_end({"$ref": "#/$defs/d0", "$defs": definitions}) is None
    definitions["d5000"] = {"$ref": "#/$defs/d0"}
    assert recursion_without_end({"$ref": "#/$defs/d0", "$defs": definitions}) is not None
    assert time.perf_counter() - started < 5.0


def test_a_schema_nested_past_the_stack_is_left_to_llguidance():
    schema: dict = {"type": "string"}
    for _ in range(5000):
        schema = {"type": "object", "required": ["a"], "properties": {"a": schema}}
    assert recursion_without_end(schema) is None
