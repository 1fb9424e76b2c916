"""The service's OpenAPI 3.1 document, served at /openapi.json.

It describes what the service accepts and answers, which is a subset of
OpenAI's Chat Completions, Completions and Responses APIs and of Anthropic's
Messages API: request fields the service refuses (best_of > 1, ...) are
not documented as accepted. The parsers (protocol.py, anthropic.py,
responses.py) are what enforce the rules; the schemas here say the same in
JSON Schema (2020-12, as OpenAPI 3.1 uses), and tests/serve/test_serve_openapi.py
checks that the two agree on the requests the tests send. One rule no
schema can say is in a description: a Messages API conversation ends with
the user's turn.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from .anthropic import MAX_STOP_SEQUENCES as ANTHROPIC_MAX_STOP_SEQUENCES
from .anthropic import MAX_USER_ID
from .protocol import (DEFAULT_MAX_MESSAGES, GUIDED_FIELDS, LOGIT_BIAS_BOUND, MAX_CHOICES, MAX_COMPLETION_LOGPROBS,
                       MAX_PROMPTS, MAX_STOP_CHARS, MAX_STOP_SEQUENCES, MAX_STOP_TOKEN_IDS, MAX_SCHEMA_PROPERTIES, MAX_TOP_LOGPROBS,
                       PENALTY_BOUND, REPETITION_BOUNDS, NO_EFFECT_TEXT_FIELDS, REASONING_EFFORTS, TEMPLATE_RESERVED)
from .responses import INCLUDABLE, MAX_METADATA_KEY, MAX_METADATA_PAIRS, MAX_METADATA_VALUE, VERBOSITIES


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


_SAMPLING = {
    "model": {"type": "string", "description": "a served model's id (GET /v1/models; none: the first); "
                                               "other ids get 404 model_not_found"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1, "description": "the newer name of max_tokens"},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2, "description": "0 is greedy"},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1, "maximum": (1 << 63) - 1, "description": "0 or -1: all tokens"},
    "seed": {"type": "integer", "minimum": -(1 << 63), "maximum": (1 << 64) - 1},
    "stop": {"oneOf": [{"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS},
                       {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS},
                        "maxItems": MAX_STOP_SEQUENCES}]},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}},
                       "description": "only with stream: true"},
    "n": {"type": "integer", "minimum": 1, "maximum": MAX_CHOICES,
          "description": "choices from one prefill, each sampled on its own (each takes a slot: at most "
                         "--max-concurrent); choice i has seed + i * 0x9E3779B97F4A7C15 (mod 2**64)"},
    "stop_token_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": MAX_STOP_TOKEN_IDS,
                       "description": "vLLM's extension: token ids (in the vocabulary) that end a choice with "
                                      "finish_reason 'stop', their text left out"},
    "min_tokens": {"type": "integer", "minimum": 0, "maximum": (1 << 63) - 1,
                   "description": "vLLM's extension: neither end-of-sequence (unless ignore_eos) nor "
                                  "stop_token_ids is sampled before this many tokens, and stop strings are "
                                  "looked for only in the text after them; at most max_tokens, which without it "
                                  "is at least this; not with what constrains the output (as ignore_eos)"},
    "ignore_eos": {"type": "boolean",
                   "description": "vLLM's extension: end-of-sequence tokens do not end a choice, which runs to "
                                  "max_tokens or a stop (their text and other special tokens' left out); not "
                                  "with what constrains the output (a JSON response_format, a required or named "
                                  "tool, guided_*, thinking_token_budget on a template that thinks)"},
    "best_of": {"const": 1},
    "presence_penalty": {"type": "number", "minimum": -PENALTY_BOUND, "maximum": PENALTY_BOUND,
                         "description": "OpenAI's: off each token generated so far"},
    "frequency_penalty": {"type": "number", "minimum": -PENALTY_BOUND, "maximum": PENALTY_BOUND,
                          "description": "OpenAI's: off each token per time it was generated"},
    "repetition_penalty": {"type": "number", "minimum": REPETITION_BOUNDS[0], "maximum": REPETITION_BOUNDS[1],
                           "description": "mlx-lm's: divides (multiplies, when negative) the logits of the last "
                                          "20 tokens of prompt and answer; 1 is off"},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1,
              "description": "drops tokens less likely than min_p times the most likely one"},
    "logit_bias": {"type": "object", "propertyNames": {"pattern": "^[0-9]{1,19}$"},
                   "additionalProperties": {"type": "number", "minimum": -LOGIT_BIAS_BOUND,
                                            "maximum": LOGIT_BIAS_BOUND},
                   "description": "token id (a decimal string, below the model's vocabulary size) to a bias "
                                  "added to its logit"},
}

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}

_TEXT_FORMAT = {"oneOf": [
    {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
    {"type": "object", "required": ["type", "name", "schema"],
     "properties": {"type": {"const": "json_schema"}, "name": {"type": "string", "minLength": 1},
                    "schema": {"type": "object"}, "strict": {"type": "boolean"}, "description": {"type": "string"}}},
], "description": "the output text is constrained to the format (client.responses.parse sends a json_schema); "
                  "a schema the grammar cannot enforce gets 400"}

_CONTENT = {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]}
_HISTORY_CALL = {"type": "object", "required": ["function"],
                 "properties": {"id": {"type": "string"}, "type": {"const": "function"},
                                "function": {"type": "object", "required": ["name", "arguments"],
                                             "properties": {"name": {"type": "string"},
                                                            "arguments": {"type": "string",
                                                                          "description": "JSON text of an object"}}}}}
_MESSAGE = {"oneOf": [
    {"type": "object", "required": ["role", "content"],
     "properties": {"role": {"enum": ["system", "developer", "user"]}, "content": _CONTENT}},
    {"type": "object", "required": ["role"],
     "properties": {"role": {"const": "assistant"}, "tool_calls": {"type": "array", "items": _HISTORY_CALL},
                    "content": {"oneOf": [_CONTENT, {"type": "null"}]}},
     "description": "content may be null only with tool_calls",
     "if": {"not": {"required": ["tool_calls"]}}, "then": {"required": ["content"],
                                                           "properties": {"content": _CONTENT}}},
    {"type": "object", "required": ["role", "content", "tool_call_id"],
     "properties": {"role": {"const": "tool"}, "content": _CONTENT, "tool_call_id": {"type": "string",
                                                                                      "minLength": 1}}},
]}

_TOOL = {"type": "object", "required": ["type", "function"],
         "properties": {"type": {"const": "function"},
                        "function": {"type": "object", "required": ["name"],
                                     "properties": {"name": {"type": "string", "minLength": 1},
                                                    "description": {"type": "string"},
                                                    "parameters": {"type": "object",
                                                                   "description": "a JSON schema of at most "
                                                                                  f"{MAX_SCHEMA_PROPERTIES} "
                                                                                  "properties in all"},
                                                    "strict": {"type": "boolean"}}}}}
_TOOL_CHOICE = {"oneOf": [{"enum": ["auto", "none", "required"]},
                          {"type": "object", "required": ["type", "function"],
                           "properties": {"type": {"const": "function"},
                                          "function": {"type": "object", "required": ["name"],
                                                       "properties": {"name": {"type": "string"}}}}}],
                "description": "'required' and a named function are constrained by a grammar of the tools' "
                               "schemas; a name must be one of 'tools'"}
_RESPONSE_FORMAT = {"oneOf": [
    {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
    {"type": "object", "required": ["type", "json_schema"],
     "properties": {"type": {"const": "json_schema"},
                    "json_schema": {"type": "object", "required": ["name"],
                                    "properties": {"name": {"type": "string"}, "schema": {"type": "object"},
                                                   "strict": {"type": "boolean"}}}}},
], "description": "the output is constrained to the schema; a schema the grammar cannot enforce gets 400"}

# Rules between fields, as protocol.py checks them.
_STREAM_OPTIONS_NEED_STREAM = {"if": {"required": ["stream_options"],
                                      "properties": {"stream_options": {"type": "object"}}},
                               "then": {"required": ["stream"], "properties": {"stream": {"const": True}}}}
_TOP_LOGPROBS_NEED_LOGPROBS = {"if": {"required": ["top_logprobs"],
                                      "properties": {"top_logprobs": {"type": "integer", "minimum": 1}}},
                               "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}}


def _without_a_grammar(*grammars: dict) -> list[dict]:
    """ignore_eos: true and min_tokens of 1 or more are refused beside what makes a grammar
    (its end is end-of-sequence)."""
    return [{"if": {"required": [name], "properties": {name: when}}, "then": {"not": {"anyOf": list(grammars)}}}
            for name, when in (("ignore_eos", {"const": True}), ("min_tokens", {"type": "integer", "minimum": 1}))]


_JSON_RESPONSE_FORMAT = {"required": ["response_format"], "properties": {"response_format": {
    "type": "object", "required": ["type"], "properties": {"type": {"enum": ["json_object", "json_schema"]}}}}}
_TOOL_REQUIRED = {"required": ["tool_choice"],
                  "properties": {"tool_choice": {"anyOf": [{"const": "required"}, {"type": "object"}]}}}

_ONE_TOKEN_LIMIT = {"not": {"required": ["max_tokens", "max_completion_tokens"],
                            "properties": {"max_tokens": {"type": "number"},
                                           "max_completion_tokens": {"type": "number"}}}}

_CHAT_REQUEST = {
    "type": "object", "required": ["messages"],
    "allOf": [_STREAM_OPTIONS_NEED_STREAM, _TOP_LOGPROBS_NEED_LOGPROBS, _ONE_TOKEN_LIMIT,
              *_without_a_grammar(_JSON_RESPONSE_FORMAT, _TOOL_REQUIRED)],
    "properties": {
        "messages": {"type": "array", "items": _MESSAGE, "minItems": 1, "maxItems": DEFAULT_MAX_MESSAGES,
                     "description": "at most --max-messages (default shown)"},
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS,
                         "description": "more than 0 needs logprobs: true"},
        "response_format": _RESPONSE_FORMAT,
        "tools": {"type": "array", "items": _TOOL},
        "tool_choice": _TOOL_CHOICE,
        "parallel_tool_calls": {"type": "boolean"},
        "reasoning_effort": {"enum": list(REASONING_EFFORTS),
                             "description": "on a template that thinks, none turns its thinking off and any other "
                                            "on (chat_template_kwargs' enable_thinking wins)"},
        "thinking_token_budget": {"type": "integer", "minimum": 1,
                                  "description": "on a template that thinks, the reasoning's most tokens: then "
                                                 "its end marker is forced and the answer follows"},
        "chat_template_kwargs": {"type": "object", "description": "options for the chat template, such as "
                                 "enable_thinking (booleans, finite numbers, strings), named by identifiers; "
                                 "what the template itself reads (messages, tools, add_generation_prompt, "
                                 "Jinja's globals, the renderer's helpers) cannot be set",
                                 "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
                                                   "not": {"enum": list(TEMPLATE_RESERVED)}},
                                 "additionalProperties": {"type": ["boolean", "number", "string"]}},
        **{name: {"type": "string", "description": "ignored"} for name in NO_EFFECT_TEXT_FIELDS},
        "store": {"type": "boolean", "description": "ignored: chat completions are not stored"},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}, "description": "ignored"},
        **_SAMPLING,
    },
}

_PROMPT_TEXT = {"type": "string", "minLength": 1}
_PROMPT_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}

_ZERO_TOKENS_NEED_ECHO = {"if": {"required": ["max_tokens"], "properties": {"max_tokens": {"const": 0}}},
                          "then": {"required": ["echo"], "properties": {"echo": {"const": True}}}}

_COMPLETION_REQUEST = {
    "type": "object", "required": ["prompt"],
    "allOf": [_STREAM_OPTIONS_NEED_STREAM, _ONE_TOKEN_LIMIT, _ZERO_TOKENS_NEED_ECHO,
              *_without_a_grammar(*({"required": [name]} for name in GUIDED_FIELDS))],
    "properties": {
        "prompt": {"oneOf": [_PROMPT_TEXT, _PROMPT_IDS,
                             {"type": "array", "items": {"oneOf": [_PROMPT_TEXT, _PROMPT_IDS]},
                              "minItems": 1, "maxItems": MAX_PROMPTS}],
                   "description": "text, or token ids (below the model's vocabulary size), or a list of those: "
                                  "choice i of prompt j at index j * n + i; past the server's concurrent "
                                  "generations they run in waves"},
        "guided_json": {"type": ["object", "string"], "description": "extension: the output matches this JSON "
                        "schema (one guided_* field per request)"},
        "guided_regex": {"type": "string", "description": "extension: the output matches this regular expression"},
        "guided_grammar": {"type": "string", "description": "extension: the output follows this Lark grammar "
                           "(llguidance's dialect)"},
        "user": {"type": "string", "description": "ignored"},
        "logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_COMPLETION_LOGPROBS,
                     "description": "each token's logprob, and this many of the most likely tokens beside it"},
        "echo": {"type": "boolean", "description": "the answer opens with the prompt; with logprobs, the prompt's "
                 "tokens are scored too (the first has null)"},
        **_SAMPLING,
        "max_tokens": {"type": "integer", "minimum": 0,
                       "description": "0 only with echo: the prompt alone (scored with logprobs), nothing generated"},
    },
}

_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
          "properties": {**{name: {"type": "integer", "minimum": 0}
                            for name in ("prompt_tokens", "completion_tokens", "total_tokens")},
                         "completion_tokens_details": {
                             "type": "object", "required": ["reasoning_tokens"],
                             "description": "chat: the completion tokens written inside the reasoning block",
                             "properties": {"reasoning_tokens": {"type": "integer", "minimum": 0}}}}}

_LOGPROB = {"type": "object", "required": ["token", "logprob", "bytes"],
            "properties": {"token": {"type": "string"}, "logprob": {"type": "number"},
                           "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}}}}

_LOGPROBS = {"type": "array", "description": "per token: its logprob and its most likely alternatives",
             "items": {"allOf": [_LOGPROB, {"type": "object", "properties": {
                 "top_logprobs": {"type": "array", "items": _LOGPROB}}}]}}

_FINISH = {"enum": ["stop", "length", "tool_calls", None]}
_CALL = {"type": "object", "required": ["id", "type", "function"],
         "properties": {"id": {"type": "string"}, "type": {"const": "function"},
                        "function": {"type": "object", "required": ["name", "arguments"],
                                     "properties": {"name": {"type": "string"},
                                                    "arguments": {"type": "string"}}}}}

_CHAT_COMPLETION = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "chat.completion"}, "created": {"type": "integer"},
        "model": {"type": "string"}, "usage": _ref("Usage"),
        "choices": {"type": "array", "minItems": 1, "maxItems": MAX_CHOICES, "items": {
            "type": "object", "required": ["index", "message", "finish_reason"],
            "properties": {
                "index": {"type": "integer", "minimum": 0}, "finish_reason": _FINISH,
                "message": {"type": "object", "required": ["role", "content"],
                            "properties": {"role": {"const": "assistant"},
                                           "content": {"type": ["string", "null"],
                                                       "description": "null when the answer is tool calls"},
                                           "reasoning_content": {"type": "string",
                                                                 "description": "templates that think"},
                                           "tool_calls": {"type": "array", "items": _CALL}}},
                "logprobs": {"oneOf": [{"type": "null"}, {
                    "type": "object", "required": ["content"], "properties": {"content": _ref("Logprobs")}}]},
            }}},
    },
}

_TEXT_COMPLETION = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "text_completion"}, "created": {"type": "integer"},
        "model": {"type": "string"}, "usage": _ref("Usage"),
        "choices": {"type": "array", "minItems": 1, "maxItems": MAX_CHOICES, "items": {
            "type": "object", "required": ["index", "text", "finish_reason"],
            "properties": {"index": {"type": "integer", "minimum": 0}, "text": {"type": "string"},
                           "finish_reason": _FINISH,
                           "logprobs": {"oneOf": [{"type": "null"}, {
                               "type": "object", "required": ["tokens", "token_logprobs", "top_logprobs",
                                                              "text_offset"],
                               "properties": {
                                   "tokens": {"type": "array", "items": {"type": "string"}},
                                   "token_logprobs": {"type": "array", "items": {"type": ["number", "null"]},
                                                      "description": "null: an echoed prompt's first token"},
                                   "top_logprobs": {"type": "array", "items": {
                                       "type": ["object", "null"], "additionalProperties": {"type": "number"},
                                       "description": "the most likely tokens and the chosen one"}},
                                   "text_offset": {"type": "array", "items": {"type": "integer", "minimum": 0},
                                                   "description": "where each token's text starts"}}}]}}}},
    },
}

_ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string", "minLength": 1}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"], "description": "the field at fault"},
                       "code": {"type": ["string", "null"]}}}},
}

_MODEL = {"type": "object", "required": ["id", "object", "created", "owned_by"],
          "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                         "owned_by": {"type": "string"}}}

_STEP = {"enum": ["replay", "python"]}
_MODEL_STATUS = {"enum": ["loading", "ready", "failed", "unloading", "unloaded"]}
_HEALTH = {"type": "object", "required": ["status", "model", "model_status", "mode", "configured_mode", "models"],
           "properties": {"status": {"enum": ["loading", "ready", "failed", "draining", "broken"]},
                          "model": {"type": "string", "description": "the default model"},
                          "model_status": {**_MODEL_STATUS, "description": "the default model's status: loading "
                                           "before its first load, unloaded once --idle-unload unloaded it (its "
                                           "next request loads it again)"},
                          "mode": {"enum": ["parallel", "batch", None],
                                   "description": "the mode the default model runs; null while it is not loaded, "
                                                  "as model_status says (mode \"auto\" picks one at load)"},
                          "configured_mode": {"enum": ["auto", "batch", "parallel"],
                                              "description": "--mode, every model's (\"auto\" by default)"},
                          "step": _STEP, "error": {"type": "string"},
                          "models": {"type": "array", "description": "every model and whether it is loaded",
                                     "items": {"type": "object", "required": ["id", "status"], "properties": {
                                         "id": {"type": "string"},
                                         "status": _MODEL_STATUS,
                                         "mode": {"enum": ["parallel", "batch"], "description": "while it is loaded"},
                                         "step": _STEP, "error": {"type": "string"}}}}}}


def _errors(schema: str, unavailable: str = "503") -> dict:
    """The error answers every generation endpoint shares, in one API's error shape
    (the Messages API answers the service's 503 as 529)."""
    content = _json(_ref(schema))
    return {
        "400": {"description": "a field is invalid or unsupported (the error names it)", "content": content},
        "404": {"description": "`model` names no served model (model_not_found)", "content": content},
        "408": {"description": "the body did not arrive in time", "content": content},
        "413": {"description": "the body is larger than --max-body-bytes", "content": content},
        "429": {"description": "the server is at capacity; see Retry-After", "content": content},
        unavailable: {"description": "loading, shutting down, or the model failed to load", "content": content},
    }


# One server-sent event: its data is a chunk's JSON (the shape of the whole
# response, a choice's `delta` in place of its `message`) or "[DONE]".
_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}


def _named_event(data: str) -> dict:
    """A named server-sent event (``event: NAME`` then ``data: JSON``), its data one of `data`."""
    return {"type": "object", "required": ["event", "data"],
            "properties": {"event": {"type": "string", "description": "the data's `type`"},
                           "data": {"type": "string", "contentMediaType": "application/json",
                                    "contentSchema": _ref(data)}}}


def _generation(summary: str, request: str, response: str, *, errors: dict | None = None,
                events: dict | None = None, streamed: str = "server-sent chunks ending with `data: [DONE]`") -> dict:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": _json(_ref(request))},
        "responses": {"200": {"description": f"the answer, or with stream: true {streamed}",
                              "content": {**_json(_ref(response)), "text/event-stream": {"schema": events or _EVENT}}},
                      **(errors or _errors("Error"))},
    }}


# ---- the Messages API (anthropic.py) -------------------------------------------------

_ANTHROPIC_CONTENT = {**_CONTENT,
                      "description": "text, or text blocks (joined; their cache_control and citations are ignored)"}

_TOOL_USE = {"type": "object", "required": ["type", "id", "name", "input"],
             "properties": {"type": {"const": "tool_use"}, "id": {"type": "string", "minLength": 1},
                            "name": {"type": "string", "minLength": 1}, "input": {"type": "object"}}}
_THINKING = {"type": "object", "required": ["type", "thinking", "signature"],
             "properties": {"type": {"const": "thinking"}, "thinking": {"type": "string"},
                            "signature": {"type": "string"}},
             "description": "the reasoning of a template that thinks, its markers left out (no signature)"}
_TOOL_RESULT = {"type": "object", "required": ["type", "tool_use_id"],
                "properties": {"type": {"const": "tool_result"}, "tool_use_id": {"type": "string", "minLength": 1},
                               "content": _CONTENT, "is_error": {"type": "boolean"}},
                "description": "its tool_use_id names a tool_use block of the assistant message before"}


def _turn_content(*blocks: dict) -> dict:
    """A user's or an assistant's content: text, or text blocks (joined) and its other blocks."""
    return {"oneOf": [{"type": "string", "minLength": 1},
                      {"type": "array", "items": {"oneOf": [_TEXT_PART, *blocks]}, "minItems": 1}],
            "description": "text, or blocks: text (joined; cache_control and citations are ignored), tool_use "
                           "and thinking (assistant; thinking is left out of the prompt), tool_result (user); "
                           "not empty"}


_ANTHROPIC_TOOL = {"type": "object", "required": ["name", "input_schema"],
                   "properties": {"type": {"const": "custom"}, "name": {"type": "string", "minLength": 1},
                                  "description": {"type": "string"},
                                  "input_schema": {"type": "object", "description": "a JSON schema"}},
                   "description": "server tools get 400; names are unique"}

# What both /v1/messages and /v1/messages/count_tokens read: the conversation, the
# tools, and thinking and output_config (both change the prompt or its grammar).
_CONVERSATION = {
    "model": _SAMPLING["model"],
    "system": _ANTHROPIC_CONTENT,
    "messages": {"type": "array", "minItems": 1,
                 "items": {"oneOf": [
                     {"type": "object", "required": ["role", "content"],
                      "properties": {"role": {"const": "user"}, "content": _turn_content(_TOOL_RESULT)}},
                     {"type": "object", "required": ["role", "content"],
                      "properties": {"role": {"const": "assistant"}, "content": _turn_content(_TOOL_USE, {
                          **_THINKING, "required": ["type"]})}}]},
                 "description": "the last one is the user's: a final assistant message (a prefill) gets 400; "
                                "an assistant's tool_use blocks each get a tool_result in the next message"},
    "tools": {"type": "array", "items": _ANTHROPIC_TOOL},
    "tool_choice": {"type": "object", "required": ["type"],
                    "properties": {"type": {"enum": ["auto", "any", "tool", "none"]}, "name": {"type": "string"},
                                   "disable_parallel_tool_use": {"type": "boolean"}},
                    "if": {"properties": {"type": {"const": "tool"}}}, "then": {"required": ["name"]},
                    "description": "any and tool (name: one of tools) are constrained by a grammar of the "
                                   "tools' schemas; any and tool need tools"},
    "thinking": {"oneOf": [
        {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["disabled", "adaptive"]}}},
        {"type": "object", "required": ["type", "budget_tokens"],
         "properties": {"type": {"const": "enabled"}, "budget_tokens": {"type": "integer", "minimum": 1}}}],
        "description": "on a template that thinks: disabled turns its thinking off, enabled and adaptive on; "
                       "budget_tokens (less than max_tokens) bounds the reasoning; the reasoning comes back "
                       "as thinking blocks; enabled with a tool_choice that forces a call (any, tool) "
                       "is a 400, as Anthropic's"},
    "output_config": {"type": "object", "properties": {"format": {"anyOf": [{"type": "null"}, {
        "type": "object", "required": ["type", "schema"],
        "properties": {"type": {"const": "json_schema"}, "schema": {"type": "object"}}}]}},
                      "description": "its effort is ignored; format (structured outputs, what client.messages.parse "
                                     "sends): the text is constrained to the schema, and one the grammar cannot "
                                     "enforce gets 400"},
}

# Anthropic's rule: manual thinking with a tool_choice that forces a call is a 400.
_NO_THINKING_WHEN_FORCED = {"not": {"required": ["thinking", "tool_choice"], "properties": {
    "thinking": {"type": "object", "required": ["type"], "properties": {"type": {"const": "enabled"}}},
    "tool_choice": {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["any", "tool"]}}}}}}

_MESSAGES_REQUEST = {
    "type": "object", "required": ["messages", "max_tokens"], "allOf": [_NO_THINKING_WHEN_FORCED],
    "properties": {
        **_CONVERSATION,
        "max_tokens": _SAMPLING["max_tokens"],
        "temperature": {"type": "number", "minimum": 0, "maximum": 1, "description": "0 is greedy; default 1"},
        "top_p": _SAMPLING["top_p"],
        "top_k": {"type": "integer", "minimum": 0, "description": "0: all tokens"},
        "stop_sequences": {"type": "array", "items": {"type": "string", "minLength": 1,
                                                      "maxLength": MAX_STOP_CHARS},
                           "maxItems": ANTHROPIC_MAX_STOP_SEQUENCES},
        "stream": _SAMPLING["stream"],
        "metadata": {"type": "object", "description": "ignored",
                     "properties": {"user_id": {"type": ["string", "null"], "maxLength": MAX_USER_ID}}},
        "service_tier": {"type": "string", "description": "ignored"},
    },
}

_COUNT_TOKENS_REQUEST = {"type": "object", "required": ["messages"], "allOf": [_NO_THINKING_WHEN_FORCED],
                         "properties": _CONVERSATION}

_MESSAGES_USAGE = {"type": "object", "required": ["input_tokens", "output_tokens"],
                   "properties": {name: {"type": "integer", "minimum": 0}
                                  for name in ("input_tokens", "output_tokens")}}

_STOP_REASON = {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]}

_MESSAGE_ANSWER = {
    "type": "object", "required": ["id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"],
    "properties": {
        "id": {"type": "string", "pattern": "^msg_"}, "type": {"const": "message"}, "role": {"const": "assistant"},
        "model": {"type": "string"},
        "content": {"type": "array", "items": {"oneOf": [_TEXT_PART, _TOOL_USE, _THINKING]},
                    "description": "the reasoning as a thinking block (a template that thinks), text, then the "
                                   "calls as tool_use blocks (stop_reason tool_use)"},
        "stop_reason": {"anyOf": [_STOP_REASON, {"type": "null"}], "description": "null only in message_start"},
        "stop_sequence": {"type": ["string", "null"], "description": "the stop sequence that matched"},
        "usage": _ref("MessagesUsage"),
    },
}

_ANTHROPIC_ERROR = {
    "type": "object", "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": {
        "type": "object", "required": ["type", "message"],
        "properties": {"type": {"type": "string", "description": "invalid_request_error, request_too_large, "
                                                                 "rate_limit_error, overloaded_error, api_error, ..."},
                       "message": {"type": "string", "minLength": 1,
                                   "description": "starts with the field at fault, where one is"}}}},
}


def _typed(kind: str, **properties) -> dict:
    """An event's data: its `type` and fields."""
    return {"type": "object", "required": ["type", *properties],
            "properties": {"type": {"const": kind}, **properties}}


_BLOCK_INDEX = {"type": "integer", "minimum": 0}

_MESSAGE_STREAM_EVENT = {
    "oneOf": [
        _typed("message_start", message=_ref("Message")),
        _typed("content_block_start", index=_BLOCK_INDEX,
               content_block={"oneOf": [_TEXT_PART, _TOOL_USE, _THINKING]}),
        _typed("ping"),
        _typed("content_block_delta", index=_BLOCK_INDEX,
               delta={"oneOf": [_typed("text_delta", text={"type": "string"}),
                                _typed("input_json_delta", partial_json={"type": "string"}),
                                _typed("thinking_delta", thinking={"type": "string"}),
                                _typed("signature_delta", signature={"type": "string"})]}),
        _typed("content_block_stop", index=_BLOCK_INDEX),
        _typed("message_delta", delta={"type": "object", "required": ["stop_reason", "stop_sequence"],
                                       "properties": {"stop_reason": _STOP_REASON,
                                                      "stop_sequence": {"type": ["string", "null"]}}},
               usage=_ref("MessagesUsage")),
        _typed("message_stop"),
        _ref("AnthropicError"),
    ],
    "description": "message_start, content_block_start, ping, content_block_delta..., content_block_stop, "
                   "message_delta, message_stop; the reasoning of a template that thinks is a thinking block "
                   "first (thinking_delta pieces, then a signature_delta); with tools or reasoning a text block "
                   "opens at the first text and each call is a tool_use block (its input in input_json_delta "
                   "pieces); an error event ends a stream a failure or the shutdown cut short",
}


# ---- the Responses API (responses.py) ------------------------------------------------

_REFUSED = "refused with 400: "

_INPUT_CONTENT = {"oneOf": [{"type": "string"}, {"type": "array", "items": {
    "type": "object", "required": ["type", "text"],
    "properties": {"type": {"enum": ["input_text", "output_text"]}, "text": {"type": "string"}}}}]}

_INPUT_ITEM = {"oneOf": [
    {"type": "object", "required": ["role", "content"],
     "properties": {
         "type": {"const": "message", "description": "the default; items other than these four get 400"},
         "role": {"enum": ["user", "assistant", "system", "developer"], "description": "developer is system"},
         "content": _INPUT_CONTENT}},
    {"type": "object", "required": ["type", "call_id", "name", "arguments"],
     "properties": {"type": {"const": "function_call"}, "call_id": {"type": "string", "minLength": 1},
                    "name": {"type": "string", "minLength": 1},
                    "arguments": {"type": "string", "description": "JSON text of an object"},
                    "id": {"type": "string"}, "status": {"type": "string"}}},
    {"type": "object", "required": ["type", "call_id", "output"],
     "properties": {"type": {"const": "function_call_output"}, "call_id": {"type": "string", "minLength": 1},
                    "output": _INPUT_CONTENT, "id": {"type": "string"}, "status": {"type": "string"}},
     "description": "its call_id names an earlier function_call item's"},
    {"type": "object", "required": ["type"], "properties": {"type": {"const": "reasoning"}},
     "description": "an earlier answer's reasoning item, sent back: left out of the prompt"},
]}

_RESPONSES_TOOL = {"type": "object", "required": ["type", "name"],
                   "properties": {"type": {"const": "function"}, "name": {"type": "string", "minLength": 1},
                                  "description": {"type": ["string", "null"]},
                                  "parameters": {"type": ["object", "null"], "description": "a JSON schema"},
                                  "strict": {"type": ["boolean", "null"]}},
                   "description": "function tools only; names are unique"}
_RESPONSES_TOOL_CHOICE = {"oneOf": [{"enum": ["none", "auto", "required"]},
                                    {"type": "object", "required": ["type", "name"],
                                     "properties": {"type": {"const": "function"}, "name": {"type": "string"}}}],
                          "description": "required and a named function (one of tools) are constrained by a "
                                         "grammar of the tools' schemas; required needs tools"}

_RESPONSES_REQUEST = {
    "type": "object", "required": ["input"],
    "properties": {
        "model": _SAMPLING["model"],
        "input": {"oneOf": [{"type": "string", "description": "one user message"},
                            {"type": "array", "items": _INPUT_ITEM, "minItems": 1,
                             "contains": {"not": {"type": "object", "required": ["type"],
                                                  "properties": {"type": {"const": "reasoning"}}}},
                             "description": "at least one item that is no reasoning item"}]},
        "instructions": {"type": "string", "description": "a system message before the input"},
        "max_output_tokens": _SAMPLING["max_tokens"],
        "temperature": _SAMPLING["temperature"],
        "top_p": _SAMPLING["top_p"],
        "stream": _SAMPLING["stream"],
        "metadata": {"type": "object", "maxProperties": MAX_METADATA_PAIRS,
                     "propertyNames": {"maxLength": MAX_METADATA_KEY},
                     "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE},
                     "description": "echoed"},
        "parallel_tool_calls": {"type": "boolean"},
        "max_tool_calls": {"type": "integer", "minimum": 1,
                           "description": "the calls an answer may hold: later ones are dropped"},
        "truncation": {"enum": ["auto", "disabled"],
                       "description": "auto: the oldest turns go while the input does not fit the context"},
        "text": {"type": "object", "properties": {"format": {"anyOf": [_TEXT_FORMAT, {"type": "null"}]},
                                                  "verbosity": {"enum": [*VERBOSITIES, None],
                                                                "description": "ignored"}}},
        "include": {"type": "array", "items": {"enum": list(INCLUDABLE)},
                    "description": "message.output_text.logprobs: each output_text's logprobs; the others "
                                   "(outputs of tools this server has not) add nothing"},
        "tool_choice": _RESPONSES_TOOL_CHOICE,
        "tools": {"type": "array", "items": _RESPONSES_TOOL},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS,
                         "description": "the most likely tokens beside each one; more than 0 asks for logprobs"},
        "background": {"type": "boolean", "description": "answer at once, queued, the generation running on "
                       "in the server: poll GET /v1/responses/{id}, end it with POST /v1/responses/{id}/cancel; "
                       "needs store (store false, or a conversation larger than the store, is a 400); with stream "
                       "its events stream (response.created queued), and run on when the client leaves: GET "
                       "/v1/responses/{id}?stream=true replays them"},
        "store": {"type": "boolean", "description": "keep the response (default true) in the server's memory, "
                  "bounded (the oldest go first) and gone when it stops: GET and DELETE /v1/responses/{id}, "
                  "GET /v1/responses/{id}/input_items, and previous_response_id"},
        "previous_response_id": {"type": "string", "description": "continue a stored response's conversation: its "
                                 "input and output come before this input (its instructions do not); one "
                                 "still in progress, failed or cancelled is a 400, and so is an input item "
                                 "whose id the conversation already holds"},
        **{name: {"type": "string", "description": "ignored"}
           for name in ("user", "safety_identifier", "prompt_cache_key", "service_tier")},
        **{name: {"type": "null", "description": _REFUSED + f"a stored {what}: send the whole conversation in input"}
           for name, what in (("conversation", "conversation"), ("prompt", "prompt"))},
        "reasoning": {"type": "object", "properties": {
            "effort": {"enum": list(REASONING_EFFORTS)},
            "summary": {"enum": ["auto", "concise", "detailed", "none"],
                        "description": "the reasoning item's summary is the reasoning itself (a local model's "
                                       "reasoning is not hidden), streamed as reasoning_summary_text deltas"},
            "generate_summary": {"enum": ["auto", "concise", "detailed", "none"],
                                 "description": "summary's older name"}},
            "description": "on a template that thinks, effort none turns its thinking off and any other on; "
                           "the reasoning comes back as a reasoning item"},
    },
    # A background response is read from the store only.
    "if": {"required": ["background"], "properties": {"background": {"const": True}}},
    "then": {"properties": {"store": {"not": {"const": False}}}},
}

_OUTPUT_TEXT = {"type": "object", "required": ["type", "text", "annotations", "logprobs"],
                "properties": {"type": {"const": "output_text"}, "text": {"type": "string"},
                               "annotations": {"type": "array", "maxItems": 0},
                               "logprobs": _ref("Logprobs")}}

_STATUS = {"enum": ["in_progress", "completed", "incomplete", "failed"]}

_OUTPUT_MESSAGE = {"type": "object", "required": ["type", "id", "status", "role", "content"],
                   "properties": {"type": {"const": "message"}, "id": {"type": "string", "pattern": "^msg_"},
                                  "status": _STATUS, "role": {"const": "assistant"},
                                  "content": {"type": "array", "items": _ref("OutputText"), "maxItems": 1}}}

_FUNCTION_CALL = {"type": "object", "required": ["type", "id", "call_id", "name", "arguments", "status"],
                  "properties": {"type": {"const": "function_call"}, "id": {"type": "string", "pattern": "^fc_"},
                                 "call_id": {"type": "string"}, "name": {"type": "string"},
                                 "arguments": {"type": "string",
                                               "description": "JSON text; \"\" while in progress"},
                                 "status": {"enum": ["in_progress", "completed", "incomplete"],
                                            "description": "incomplete: its arguments are not a whole "
                                                           "object (max_output_tokens cut it)"}}}
_SUMMARY_TEXT = {"type": "object", "required": ["type", "text"],
                 "properties": {"type": {"const": "summary_text"}, "text": {"type": "string"}}}
_REASONING_ITEM = {"type": "object", "required": ["type", "id", "status", "summary", "content"],
                   "properties": {"type": {"const": "reasoning"}, "id": {"type": "string", "pattern": "^rs_"},
                                  "status": _STATUS,
                                  "summary": {"type": "array", "maxItems": 1, "items": _SUMMARY_TEXT,
                                              "description": "with reasoning.summary: the reasoning itself"},
                                  "content": {"type": "array", "maxItems": 1, "items": {
                                      "type": "object", "required": ["type", "text"],
                                      "properties": {"type": {"const": "reasoning_text"},
                                                     "text": {"type": "string"}}}}},
                   "description": "the reasoning of a template that thinks, its markers left out"}
_OUTPUT_ITEM = {"oneOf": [_ref("ResponseOutputMessage"), _ref("ResponseFunctionCall"), _REASONING_ITEM]}

_RESPONSES_USAGE = {
    "type": "object",
    "required": ["input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details", "total_tokens"],
    "properties": {
        "input_tokens": {"type": "integer", "minimum": 0}, "output_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer", "minimum": 0},
        "input_tokens_details": {"type": "object", "required": ["cached_tokens"],
                                 "properties": {"cached_tokens": {"type": "integer", "minimum": 0}}},
        "output_tokens_details": {"type": "object", "required": ["reasoning_tokens"],
                                  "properties": {"reasoning_tokens": {"type": "integer", "minimum": 0}}},
    },
}

_RESPONSE = {
    "type": "object",
    "required": ["id", "object", "created_at", "status", "model", "output", "usage", "error", "incomplete_details",
                 "tool_choice", "tools", "text", "reasoning", "store", "previous_response_id", "background",
                 "instructions",
                 "metadata", "max_output_tokens", "temperature", "top_p", "parallel_tool_calls", "truncation"],
    "properties": {
        "id": {"type": "string", "pattern": "^resp_"}, "object": {"const": "response"},
        "created_at": {"type": "integer"}, "model": {"type": "string"},
        "status": {"enum": [*_STATUS["enum"], "cancelled", "queued"],
                   "description": "a stored response is in_progress until it ends (a background one queued at "
                                  "first); cancelled: its client left, or cancelled it"},
        "output": {"type": "array", "items": _OUTPUT_ITEM,
                   "description": "a reasoning item (a template that thinks), a message, then (with tools) "
                                  "function_call items"},
        "usage": {"anyOf": [_ref("ResponsesUsage"), {"type": "null"}], "description": "null until it ends"},
        "error": {"anyOf": [{"type": "null"}, {
            "type": "object", "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}],
            "description": "what ended a failed response"},
        "incomplete_details": {"anyOf": [{"type": "null"}, {
            "type": "object", "required": ["reason"], "properties": {"reason": {"const": "max_output_tokens"}}}]},
        # The request's own, echoed (tool_choice "none" when it has no tools and names none).
        "tool_choice": _RESPONSES_TOOL_CHOICE, "tools": {"type": "array", "items": _RESPONSES_TOOL},
        "text": {"type": "object", "required": ["format"], "properties": {"format": _TEXT_FORMAT}},
        "reasoning": {"anyOf": [{"type": "null"}, {"type": "object", "required": ["effort", "summary"]}]},
        "store": {"type": "boolean"}, "previous_response_id": {"type": ["string", "null"]},
        "background": {"type": "boolean"},
        # The request's own, echoed.
        "instructions": {"type": ["string", "null"]},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
        "temperature": _SAMPLING["temperature"], "top_p": _SAMPLING["top_p"],
        "parallel_tool_calls": {"type": "boolean"}, "truncation": {"enum": ["auto", "disabled"]},
        "max_tool_calls": {"type": ["integer", "null"], "minimum": 1},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
    },
}

_OUTPUT_INDEX = {"type": "integer", "minimum": 0}
_WHERE = {"item_id": {"type": "string"}, "output_index": _OUTPUT_INDEX, "content_index": {"const": 0}}
_SUMMARY_WHERE = {"item_id": {"type": "string"}, "output_index": _OUTPUT_INDEX, "summary_index": {"const": 0}}


def _sequenced(kind: str, **properties) -> dict:
    """A Responses event's data: its type, its place in the stream, and fields."""
    return _typed(kind, sequence_number={"type": "integer", "minimum": 0}, **properties)


_RESPONSE_STREAM_EVENT = {
    "oneOf": [
        *(_sequenced(kind, response=_ref("Response"))
          for kind in ("response.created", "response.in_progress", "response.completed", "response.incomplete",
                       "response.failed")),
        *(_sequenced(kind, output_index=_OUTPUT_INDEX, item=_OUTPUT_ITEM)
          for kind in ("response.output_item.added", "response.output_item.done")),
        *(_sequenced(kind, **_WHERE, part=_ref("OutputText"))
          for kind in ("response.content_part.added", "response.content_part.done")),
        _sequenced("response.output_text.delta", **_WHERE, delta={"type": "string"}, logprobs=_ref("Logprobs")),
        _sequenced("response.output_text.done", **_WHERE, text={"type": "string"}, logprobs=_ref("Logprobs")),
        _sequenced("response.function_call_arguments.delta", item_id={"type": "string"},
                   output_index=_OUTPUT_INDEX, delta={"type": "string"}),
        _sequenced("response.function_call_arguments.done", item_id={"type": "string"},
                   output_index=_OUTPUT_INDEX, name={"type": "string"}, arguments={"type": "string"}),
        _sequenced("response.reasoning_text.delta", **_WHERE, delta={"type": "string"}),
        _sequenced("response.reasoning_text.done", **_WHERE, text={"type": "string"}),
        *(_sequenced(kind, **_SUMMARY_WHERE, part=_SUMMARY_TEXT)
          for kind in ("response.reasoning_summary_part.added", "response.reasoning_summary_part.done")),
        _sequenced("response.reasoning_summary_text.delta", **_SUMMARY_WHERE, delta={"type": "string"}),
        _sequenced("response.reasoning_summary_text.done", **_SUMMARY_WHERE, text={"type": "string"}),
    ],
    "description": "response.created, response.in_progress, response.output_item.added, "
                   "response.content_part.added, response.output_text.delta..., response.output_text.done, "
                   "response.content_part.done, response.output_item.done, then response.completed or "
                   "response.incomplete (max_output_tokens reached); the reasoning of a template that thinks "
                   "is a reasoning item first (output_item.added, reasoning_text.delta..., reasoning_text.done, "
                   "output_item.done; with reasoning.summary reasoning_summary_part.added, "
                   "reasoning_summary_text.delta..., reasoning_summary_text.done, reasoning_summary_part.done "
                   "instead); with tools or reasoning a message opens at the first "
                   "text and each call is a function_call item (output_item.added, "
                   "function_call_arguments.delta..., function_call_arguments.done, output_item.done); "
                   "response.failed ends a stream a failure "
                   "or the shutdown cut short",
}

_RESPONSE_ID = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
_REPLAY_PARAMETERS = [
    {"name": "stream", "in": "query", "schema": {"type": "boolean", "default": False},
     "description": "the events of a response created with background and stream true, as server-sent events"},
    {"name": "starting_after", "in": "query", "schema": {"type": "integer", "minimum": 0},
     "description": "with stream: the sequence number of the event the replay starts after"}]
_PAGE_PARAMETERS = [
    {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"], "default": "desc"}},
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}},
    {"name": "after", "in": "query", "schema": {"type": "string"}, "description": "the id of the item the page "
     "starts after"},
    {"name": "before", "in": "query", "schema": {"type": "string"}, "description": "the id of the item the page "
     "ends before"}]


_DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "emlx_async OpenAI-compatible service", "version": "1"},
    "paths": {
        "/v1/chat/completions": _generation("Chat completion", "ChatCompletionRequest", "ChatCompletion"),
        "/v1/completions": _generation("Text completion", "CompletionRequest", "TextCompletion"),
        "/v1/messages": _generation("Anthropic Messages API", "MessagesRequest", "Message",
                                    errors=_errors("AnthropicError", "529"), events=_named_event("MessageStreamEvent"),
                                    streamed="server-sent named events (`event: NAME`)"),
        "/v1/messages/count_tokens": {"post": {
            "summary": "The tokens a Messages API conversation's prompt takes",
            "requestBody": {"required": True, "content": _json(_ref("CountTokensRequest"))},
            "responses": {"200": {"description": "the count", "content": _json({
                "type": "object", "required": ["input_tokens"],
                "properties": {"input_tokens": {"type": "integer", "minimum": 0}}})},
                **_errors("AnthropicError", "529")}}},
        "/v1/responses": _generation("OpenAI Responses API", "ResponsesRequest", "Response",
                                     events=_named_event("ResponseStreamEvent"),
                                     streamed="server-sent named events (`event: NAME`)"),
        "/v1/responses/input_tokens": {"post": {
            "summary": "The tokens a Responses API request's prompt takes (its usage.input_tokens), stored "
                       "conversation, tools and truncation included; nothing is generated or stored",
            "requestBody": {"required": True, "content": _json(_ref("ResponsesRequest"))},
            "responses": {"200": {"description": "the count", "content": _json({
                "type": "object", "required": ["object", "input_tokens"],
                "properties": {"object": {"const": "response.input_tokens"},
                               "input_tokens": {"type": "integer", "minimum": 0}}})},
                **_errors("Error")}}},
        "/v1/responses/{response_id}": {
            "get": {"summary": "A stored response", "parameters": [*_RESPONSE_ID, *_REPLAY_PARAMETERS], "responses": {
                "200": {"description": "the response as it was answered; with stream true its events, "
                                       "following a running one's until it ends",
                        "content": {**_json(_ref("Response")), "text/event-stream": {
                            "schema": _named_event("ResponseStreamEvent")}}},
                "400": {"description": "stream true for a response not created with background and stream true "
                                       "(no events kept), or starting_after not a sequence number",
                        "content": _json(_ref("Error"))},
                "404": {"description": "no stored response has this id", "content": _json(_ref("Error"))}}},
            "delete": {"summary": "Drop a stored response", "parameters": _RESPONSE_ID, "responses": {
                "200": {"description": "dropped", "content": _json({
                    "type": "object", "required": ["id", "object", "deleted"],
                    "properties": {"id": {"type": "string"}, "object": {"const": "response.deleted"},
                                   "deleted": {"const": True}}})},
                "404": {"description": "no stored response has this id", "content": _json(_ref("Error"))}}}},
        "/v1/responses/{response_id}/cancel": {"post": {
            "summary": "End a background response's generation (stored cancelled)", "parameters": _RESPONSE_ID,
            "responses": {
                "200": {"description": "the response as stored: cancelled, or how it ended before",
                        "content": _json(_ref("Response"))},
                "400": {"description": "not a background response", "content": _json(_ref("Error"))},
                "404": {"description": "no stored response has this id", "content": _json(_ref("Error"))}}}},
        "/v1/responses/{response_id}/input_items": {"get": {
            "summary": "The input items a stored response's answer came from (the earlier conversation, then "
                       "its input), a page at a time",
            "parameters": [*_RESPONSE_ID, *_PAGE_PARAMETERS],
            "responses": {
                "200": {"description": "a page of items", "content": _json({
                    "type": "object", "required": ["object", "data", "first_id", "last_id", "has_more"],
                    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {
                                       "type": "object", "required": ["id", "type"]}},
                                   "first_id": {"type": ["string", "null"]}, "last_id": {"type": ["string", "null"]},
                                   "has_more": {"type": "boolean"}}})},
                "400": {"description": "a query parameter out of range, or a cursor naming no item of the "
                                       "response", "content": _json(_ref("Error"))},
                "404": {"description": "no stored response has this id", "content": _json(_ref("Error"))}}}},
        "/v1/models": {"get": {"summary": "The served models", "responses": {"200": {
            "description": "every model the server serves, loaded or not", "content": _json({
                "type": "object", "required": ["object", "data"],
                "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _ref("Model")}}})}}}},
        "/v1/models/{name}": {"get": {
            "summary": "One model", "parameters": [{"name": "name", "in": "path", "required": True,
                                                   "schema": {"type": "string"}}],
            "responses": {"200": {"description": "the model", "content": _json(_ref("Model"))},
                          "404": {"description": "not a served model", "content": _json(_ref("Error"))}}}},
        "/health": {"get": {"summary": "Readiness", "responses": {
            "200": {"description": "ready", "content": _json(_ref("Health"))},
            "503": {"description": "not ready (loading, failed, draining, broken)", "content": _json(_ref("Health"))}}}},
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {
            "200": {"description": "the text exposition format", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        "/openapi.json": {"get": {"summary": "This document", "responses": {
            "200": {"description": "OpenAPI 3.1", "content": _json({"type": "object"})}}}},
    },
    "components": {"schemas": {
        "ChatCompletionRequest": _CHAT_REQUEST, "CompletionRequest": _COMPLETION_REQUEST,
        "ChatCompletion": _CHAT_COMPLETION, "TextCompletion": _TEXT_COMPLETION, "Usage": _USAGE,
        "Error": _ERROR, "Model": _MODEL, "Health": _HEALTH,
        "MessagesRequest": _MESSAGES_REQUEST, "CountTokensRequest": _COUNT_TOKENS_REQUEST,
        "Message": _MESSAGE_ANSWER, "MessagesUsage": _MESSAGES_USAGE, "AnthropicError": _ANTHROPIC_ERROR,
        "MessageStreamEvent": _MESSAGE_STREAM_EVENT,
        "ResponsesRequest": _RESPONSES_REQUEST, "Response": _RESPONSE, "ResponsesUsage": _RESPONSES_USAGE,
        "ResponseOutputMessage": _OUTPUT_MESSAGE, "ResponseFunctionCall": _FUNCTION_CALL,
        "OutputText": _OUTPUT_TEXT, "Logprobs": _LOGPROBS,
        "ResponseStreamEvent": _RESPONSE_STREAM_EVENT,
    }},
}


# The request schemas, each with its token limit (bounded by the context once it is known).
_REQUESTS = {"ChatCompletionRequest": ("max_tokens", "max_completion_tokens"),
             "CompletionRequest": ("max_tokens", "max_completion_tokens"),
             "MessagesRequest": ("max_tokens",), "CountTokensRequest": (),
             "ResponsesRequest": ("max_output_tokens",)}


def document(model_names: Sequence[str] | None = None, max_messages: int = DEFAULT_MAX_MESSAGES,
             vocab_size: int | None = None, context_length: int | None = None,
             max_choices: int = MAX_CHOICES) -> dict[str, Any]:
    """The OpenAPI document, with this server's model ids, message bound, bound on `n` (its
    concurrent generations, at most MAX_CHOICES) and (once the models are loaded) vocabulary
    size and context."""
    doc = copy.deepcopy(_DOCUMENT)
    schemas = doc["components"]["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        schemas[name]["properties"]["n"] = {**schemas[name]["properties"]["n"], "maximum": max_choices}
        if vocab_size is not None:
            ids = schemas[name]["properties"]["stop_token_ids"]
            schemas[name]["properties"]["stop_token_ids"] = {**ids, "items": {**ids["items"],
                                                                              "maximum": vocab_size - 1}}
    if context_length is not None:  # the prompt's tokens count against it too
        for name, limits in _REQUESTS.items():
            for field in limits:
                schemas[name]["properties"][field]["maximum"] = context_length - 1
    for name, field in (("ChatCompletionRequest", "messages"), ("MessagesRequest", "messages"),
                        ("ResponsesRequest", "input")):
        schema = schemas[name]["properties"][field]
        for variant in schema.get("oneOf", [schema]):  # Responses' input: a string or the items
            if variant.get("type") == "array":
                variant["maxItems"] = max_messages
    if vocab_size is not None:
        prompt = schemas["CompletionRequest"]["properties"]["prompt"]["oneOf"]
        for ids in (prompt[1], prompt[2]["items"]["oneOf"][1]):
            ids["items"]["maximum"] = vocab_size - 1
    for name in _REQUESTS:
        request = schemas[name]
        if model_names is not None:
            request["properties"]["model"]["enum"] = list(model_names)
        # An explicit null is the field's absence, as the parsers read it.
        for field, schema in request["properties"].items():
            if field not in request["required"] and schema.get("type") != "null":
                request["properties"][field] = {"anyOf": [schema, {"type": "null"}]}
    return doc
