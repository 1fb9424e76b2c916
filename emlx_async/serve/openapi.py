"""The service's OpenAPI 3.1 document, served at /openapi.json.

It describes what the service accepts and answers, which is a subset of
OpenAI's API: request fields the service refuses (n > 1, ...) are
not documented as accepted. protocol.py is what enforces the rules; the
schemas here say the same in JSON Schema (2020-12, as OpenAPI 3.1 uses),
and tests/test_serve_openapi.py checks that the two agree on the requests
the tests send.
"""

from __future__ import annotations

import copy
from typing import Any

from .protocol import DEFAULT_MAX_MESSAGES, MAX_STOP_SEQUENCES, MAX_TOP_LOGPROBS


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


_SAMPLING = {
    "model": {"type": "string", "description": "the served model's id; other ids get 400"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1, "description": "the newer name of max_tokens"},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2, "description": "0 is greedy"},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1, "maximum": (1 << 63) - 1, "description": "0 or -1: all tokens"},
    "seed": {"type": "integer", "minimum": -(1 << 63), "maximum": (1 << 64) - 1},
    "stop": {"oneOf": [{"type": "string", "minLength": 1},
                       {"type": "array", "items": {"type": "string", "minLength": 1},
                        "maxItems": MAX_STOP_SEQUENCES}]},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}},
                       "description": "only with stream: true"},
    "n": {"const": 1},
    "best_of": {"const": 1},
    "presence_penalty": {"const": 0},
    "frequency_penalty": {"const": 0},
}

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}

_CONTENT = {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]}
_HISTORY_CALL = {"type": "object", "required": ["function"],
                 "properties": {"id": {"type": "string"}, "type": {"const": "function"},
                                "function": {"type": "object", "required": ["name"],
                                             "properties": {"name": {"type": "string"},
                                                            "arguments": {"type": ["string", "object"]}}}}}
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
                                                                   "description": "a JSON schema"}}}}}
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

_ONE_TOKEN_LIMIT = {"not": {"required": ["max_tokens", "max_completion_tokens"],
                            "properties": {"max_tokens": {"type": "number"},
                                           "max_completion_tokens": {"type": "number"}}}}

_CHAT_REQUEST = {
    "type": "object", "required": ["messages"],
    "allOf": [_STREAM_OPTIONS_NEED_STREAM, _TOP_LOGPROBS_NEED_LOGPROBS, _ONE_TOKEN_LIMIT],
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
        "chat_template_kwargs": {"type": "object", "description": "options for the chat template, such as "
                                 "enable_thinking (booleans, numbers, strings)",
                                 "additionalProperties": {"type": ["boolean", "number", "string"]}},
        **_SAMPLING,
    },
}

_PROMPT_TEXT = {"type": "string", "minLength": 1}
_PROMPT_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}

_COMPLETION_REQUEST = {
    "type": "object", "required": ["prompt"], "allOf": [_STREAM_OPTIONS_NEED_STREAM, _ONE_TOKEN_LIMIT],
    "properties": {
        "prompt": {"oneOf": [_PROMPT_TEXT, _PROMPT_IDS,
                             {"type": "array", "items": {"oneOf": [_PROMPT_TEXT, _PROMPT_IDS]},
                              "minItems": 1, "maxItems": 1}],
                   "description": "text, or token ids (below the model's vocabulary size); one prompt only"},
        "guided_json": {"type": ["object", "string"], "description": "extension: the output matches this JSON "
                        "schema (one guided_* field per request)"},
        "guided_regex": {"type": "string", "description": "extension: the output matches this regular expression"},
        "guided_grammar": {"type": "string", "description": "extension: the output follows this Lark grammar "
                           "(llguidance's dialect)"},
        **_SAMPLING,
    },
}

_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
          "properties": {name: {"type": "integer", "minimum": 0}
                         for name in ("prompt_tokens", "completion_tokens", "total_tokens")}}

_LOGPROB = {"type": "object", "required": ["token", "logprob", "bytes"],
            "properties": {"token": {"type": "string"}, "logprob": {"type": "number"},
                           "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}}}}

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
        "choices": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
            "type": "object", "required": ["index", "message", "finish_reason"],
            "properties": {
                "index": {"const": 0}, "finish_reason": _FINISH,
                "message": {"type": "object", "required": ["role", "content"],
                            "properties": {"role": {"const": "assistant"},
                                           "content": {"type": ["string", "null"],
                                                       "description": "null when the answer is tool calls"},
                                           "reasoning_content": {"type": "string",
                                                                 "description": "templates that think"},
                                           "tool_calls": {"type": "array", "items": _CALL}}},
                "logprobs": {"oneOf": [{"type": "null"}, {
                    "type": "object", "required": ["content"],
                    "properties": {"content": {"type": "array", "items": {
                        "allOf": [_LOGPROB, {"type": "object", "properties": {
                            "top_logprobs": {"type": "array", "items": _LOGPROB}}}]}}}}]},
            }}},
    },
}

_TEXT_COMPLETION = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "text_completion"}, "created": {"type": "integer"},
        "model": {"type": "string"}, "usage": _ref("Usage"),
        "choices": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
            "type": "object", "required": ["index", "text", "finish_reason"],
            "properties": {"index": {"const": 0}, "text": {"type": "string"}, "finish_reason": _FINISH}}},
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

_HEALTH = {"type": "object", "required": ["status", "model", "mode"],
           "properties": {"status": {"enum": ["loading", "ready", "failed", "draining", "broken"]},
                          "model": {"type": "string"}, "mode": {"enum": ["parallel", "batch"]},
                          "step": {"enum": ["replay", "python"]}, "error": {"type": "string"}}}

_ERRORS = {
    "400": {"description": "a field is invalid or unsupported (`param` names it)", "content": _json(_ref("Error"))},
    "408": {"description": "the body did not arrive in time", "content": _json(_ref("Error"))},
    "413": {"description": "the body is larger than --max-body-bytes", "content": _json(_ref("Error"))},
    "429": {"description": "the server is at capacity; see Retry-After", "content": _json(_ref("Error"))},
    "503": {"description": "loading, shutting down, or the model failed to load", "content": _json(_ref("Error"))},
}


# One server-sent event: its data is a chunk's JSON (the shape of the whole
# response, a choice's `delta` in place of its `message`) or "[DONE]".
_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}


def _generation(summary: str, request: str, response: str) -> dict:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": _json(_ref(request))},
        "responses": {"200": {"description": "the completion, or with stream: true server-sent chunks ending "
                                             "with `data: [DONE]`",
                              "content": {**_json(_ref(response)), "text/event-stream": {"schema": _EVENT}}},
                      **_ERRORS},
    }}


_DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "emlx_async OpenAI-compatible service", "version": "1"},
    "paths": {
        "/v1/chat/completions": _generation("Chat completion", "ChatCompletionRequest", "ChatCompletion"),
        "/v1/completions": _generation("Text completion", "CompletionRequest", "TextCompletion"),
        "/v1/models": {"get": {"summary": "The served model", "responses": {"200": {
            "description": "a list of one model", "content": _json({
                "type": "object", "required": ["object", "data"],
                "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _ref("Model")}}})}}}},
        "/v1/models/{name}": {"get": {
            "summary": "One model", "parameters": [{"name": "name", "in": "path", "required": True,
                                                   "schema": {"type": "string"}}],
            "responses": {"200": {"description": "the model", "content": _json(_ref("Model"))},
                          "404": {"description": "not the served model", "content": _json(_ref("Error"))}}}},
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
    }},
}


def document(model_name: str | None = None, max_messages: int = DEFAULT_MAX_MESSAGES,
             vocab_size: int | None = None, context_length: int | None = None) -> dict[str, Any]:
    """The OpenAPI document, with this server's model id, message bound and
    (once the model is loaded) vocabulary size and context."""
    doc = copy.deepcopy(_DOCUMENT)
    schemas = doc["components"]["schemas"]
    if context_length is not None:  # the prompt's tokens count against it too
        for name in ("ChatCompletionRequest", "CompletionRequest"):
            for field in ("max_tokens", "max_completion_tokens"):
                schemas[name]["properties"][field]["maximum"] = context_length - 1
    schemas["ChatCompletionRequest"]["properties"]["messages"]["maxItems"] = max_messages
    if vocab_size is not None:
        prompt = schemas["CompletionRequest"]["properties"]["prompt"]["oneOf"]
        for ids in (prompt[1], prompt[2]["items"]["oneOf"][1]):
            ids["items"]["maximum"] = vocab_size - 1
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        request = schemas[name]
        if model_name is not None:
            request["properties"]["model"]["enum"] = [model_name]
        # An explicit null is the field's absence, as OpenAI reads it.
        for field, schema in request["properties"].items():
            if field not in request["required"]:
                request["properties"][field] = {"anyOf": [schema, {"type": "null"}]}
    return doc
