"""OpenAI's Responses API, for what it shares with chat: ``POST /v1/responses`` (and
``/v1/responses/input_tokens``, the tokens its prompt takes).

``input`` (a string, or messages with input_text/output_text parts) and
``instructions`` become the chat GenerationRequest the service already
runs, so a conversation gets the same greedy answer as from
/v1/chat/completions. The answer is a response object whose output is a
message and, with tools, ``function_call`` items; a generation cut off by
``max_output_tokens`` is ``incomplete`` with ``incomplete_details.reason``
"max_output_tokens" (streamed, its last event is ``response.incomplete``,
as OpenAI sends it). Errors keep OpenAI's shape. A response is stored
(``store``, true by default, as OpenAI's) in the server's memory
(serve/stored_responses.py): a streamed one from its start (``in_progress``,
its id in ``response.created``) to its end (completed, incomplete, failed,
or cancelled when the client left), a collected one once answered (one that
ended early is not: its client never saw its id):
``GET``/``DELETE /v1/responses/{id}`` read and drop it, ``GET
/v1/responses/{id}/input_items`` lists the items its answer came from, and
``previous_response_id`` continues its conversation (its input and output
come before the new input; its ``instructions`` do not). With
``include`` "message.output_text.logprobs" (or ``top_logprobs``) each
output_text has its tokens' logprobs, chat's entries (AnswerParts says which
text each token's goes with). A stored ``conversation`` or ``prompt``
and tools other than functions are refused with a 400 naming the field.

With ``background`` the request is answered at once, ``queued``, and its
generation runs on among the service's own tasks (admitted as any request,
so a full server answers 429 then): stored from that moment, ``in_progress``
while it runs, then as a collected answer ends (``GET`` polls it). ``POST
/v1/responses/{id}/cancel`` ends a running one (stored ``cancelled``) and
answers it as stored; only background responses can be cancelled. One must be
stored (``store`` false is a 400, and so is a conversation larger than the
store: nobody could read its answer); the server's shutdown cancels it. With
``stream`` its events stream to its client as a streamed answer's
(``response.created`` queued, then in progress), and are kept (an EventLog,
bounded as serve/stored_responses.py says): the client leaving ends its
reading, not the run, and ``GET /v1/responses/{id}?stream=true`` (with
``starting_after``, a sequence number) replays them, following a running
one's until it ends. A response that was not streamed in the background has
no events to replay: its ``stream`` is a 400, as OpenAI's.

``text.format`` (json_schema or json_object) constrains the answer with the
chat endpoint's grammar. On a template that thinks the reasoning is a
``reasoning`` output item of its own (streamed as ``response.reasoning_text``
deltas), ``reasoning.effort`` "none" turns the thinking off, and reasoning
items sent back in ``input`` are left out of the prompt. With
``reasoning.summary`` ("auto", "concise" or "detailed"; "none" asks for none) the item's summary is
the reasoning itself, streamed as ``response.reasoning_summary_text`` deltas
instead: a local model's reasoning is not hidden, so nothing is summarized
away, and clients that show only summaries (Codex) show it.

Tools run on the chat endpoint's machinery (serve/tools.py): function
``tools`` (name, description, parameters at the top level), ``tool_choice``
auto, none, required or a named function (the last two constrained by the
call grammar) and ``parallel_tool_calls``. In the input, ``function_call``
items are the assistant's tool calls and ``function_call_output`` items
(each naming an earlier call's call_id) the tool results. A call streams as
the model writes it: ``response.output_item.added`` once its name is
written, ``response.function_call_arguments.delta`` pieces as its arguments
come, then ``.done`` and ``response.output_item.done``; a call whose
arguments are no whole object (cut by max_output_tokens) is "incomplete": it
is left out of the stored conversation, and sent back, or answered by a
function_call_output, it is a 400 that says it is incomplete.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .service import Generation, ServerSentEvents, Service, shutdown_error, until_disconnected
from .stored_responses import TOO_LARGE, EventLog, StoredResponse, StoredResponses, conversation_chars
from .common import (JSON, AnswerParts, Collected, boolean, checked_text, collected_body, event, generation_route,
                     guarded, integer, joined_text, last_event, number, optional_object, prompt_tokens_route,
                     required_text, string, wrong_type)
from .protocol import (DEFAULT_MAX_MESSAGES, MAX_TOP_LOGPROBS, APIError, GenerationRequest, ToolCallIds,
                       check_message_count, checked_json, checked_tool,
                       choose_tools, constrain_answer, invalid, json_object_grammar, schema_grammar, show,
                       think_for_effort, type_name)
from .tools import CallArguments, CallEnd, CallStart, Reasoning

RESPONSES = "/v1/responses"
INPUT_TOKENS = RESPONSES + "/input_tokens"
logger = logging.getLogger("emlx_async.serve")
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")


# The service names the chat request's fields; these are their names here.
_FIELD_NAMES = {"max_tokens": "max_output_tokens", "messages": "input"}


def error_response(error: APIError) -> Response:
    if error.param in _FIELD_NAMES:
        error.param = _FIELD_NAMES[error.param]
    return JSON(error.body(), status_code=error.status, headers=error.headers)


# ---- requests -----------------------------------------------------------------------

@dataclass
class ResponsesRequest:
    generation: GenerationRequest
    # Echoed in the response object, as OpenAI does.
    echo: dict = field(default_factory=dict)
    # Where the response is kept (None: store false), after the stored conversation it continues,
    # with its own input items (and, kept, as they are stored: encoded once, off the loop).
    store: StoredResponses | None = None
    earlier: StoredResponse | None = None
    input_items: list[dict] = field(default_factory=list)
    input_json: str | None = None
    # Answered at once, its generation running on past the request.
    background: bool = False


def _unsupported(param: str, what: str) -> APIError:
    return invalid(param, f"{param}: {what} is not supported", "unsupported_parameter")


def _refuse_unsupported(body: dict) -> None:
    for name, what in (("conversation", "a stored conversation (send the conversation in 'input', or "
                        "continue a stored response with 'previous_response_id')"), ("prompt", "a stored prompt")):
        if body.get(name) is not None:
            raise _unsupported(name, what)
    truncation = body.get("truncation")
    if truncation is not None and truncation not in ("auto", "disabled"):
        raise invalid("truncation", "truncation: expected 'auto' or 'disabled'")


def _content(content, param: str) -> str:
    return joined_text(content, param, text_types=_TEXT_PARTS, noun="content part")



# Why an incomplete call (ResponsesReply._keep leaves it out of the stored conversation) cannot go on.
_CUT = (": its arguments are no whole JSON object (max_output_tokens cut them off, or the model wrote them "
        "wrong), so it cannot be sent back as input, nor answered; ask again, with a larger max_output_tokens")


def _function_call(item: dict, where: str) -> dict:
    """A function_call input item as a chat tool call (arguments as the template reads them, a dict)."""
    text = required_text(item, "arguments", where) if item.get("arguments") != "" else "{}"
    try:
        arguments = json.loads(text)
    except (ValueError, RecursionError):
        arguments = None
    if not isinstance(arguments, dict):
        if item.get("status") == "incomplete":  # an incomplete response's call, sent back
            raise invalid(f"{where}.arguments", f"{where}.arguments: this function_call is incomplete{_CUT}",
                          "incomplete_function_call")
        raise invalid(f"{where}.arguments", f"{where}.arguments: expected JSON text of an object", "invalid_value")
    checked_json(arguments, f"{where}.arguments")
    return {"type": "function", "id": required_text(item, "call_id", where),
            "function": {"name": required_text(item, "name", where), "arguments": arguments}}


def input_items(body: dict) -> list:
    """`input` as a list of items (a string is one user message)."""
    items = body.get("input")
    if items is None:
        raise invalid("input", "input: field required", "missing_required_parameter")
    if isinstance(items, str):
        return [{"type": "message", "role": "user", "content": checked_text(items, "input")}]
    if not isinstance(items, list):
        raise wrong_type("input", "a string or an array of input items", items)
    if not items:
        raise invalid("input", "input: at least one item is required")
    return items


def parse_input(body: dict, max_messages: int = DEFAULT_MAX_MESSAGES, earlier: Sequence[dict] = (),
                items: list | None = None, cut: Collection[str] = ()) -> list[dict]:
    """`instructions` and `input` as the chat messages of the engine's template; `earlier`: the
    items of the conversation a stored response holds, before the input; `items`: the input as
    ``input_items`` read it (default: read here); `cut`: the call_ids of that conversation's
    incomplete calls, which its items leave out."""
    messages: list[dict] = []
    instructions = string(body, "instructions")
    if instructions is not None:
        messages.append({"role": "system", "content": checked_text(instructions, "instructions")})
    if items is None:
        items = input_items(body)
    # Reasoning items sent back (an agent's every turn has one) are left out of the prompt, and of the
    # count; so is a stored conversation, which was counted as it came and may grow turn by turn.
    check_message_count([i for i in items if not (isinstance(i, dict) and i.get("type") == "reasoning")],
                        "input", max_messages)
    ids = ToolCallIds("function_call item", any_earlier=True)
    # A stored item was checked when it was sent: a fault can only come from the new ones, named by index.
    named = [("previous_response_id", item) for item in earlier] + [(f"input[{i}]", item) for i, item in
                                                                    enumerate(items)]
    item_ids: set[str] = set()  # an item's id is its place in a stored conversation (input_items pages by it)
    made_at: dict[str, str] = {}  # each call's id: where it was made
    for where, item in named:
        if not isinstance(item, dict):
            raise wrong_type(where, "an input item object", item)
        item_id = item.get("id")
        if isinstance(item_id, str) and item_id:
            if item_id in item_ids:  # OpenAI's words
                raise invalid(f"{where}.id", f"Duplicate item found with id {show(item_id)}.", "duplicate_item")
            item_ids.add(item_id)
        kind = item.get("type", "message")
        if kind == "function_call":
            call = _function_call(item, where)
            ids.made([call["id"]], [f"{where}.call_id"])
            made_at[call["id"]] = where
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the calls of one turn: one assistant message
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            continue
        if kind == "function_call_output":
            call_id = required_text(item, "call_id", where)
            try:
                ids.answered(call_id, f"{where}.call_id")
            except APIError as error:
                if error.code != "unknown_tool_call_id" or call_id not in cut:
                    raise
                raise invalid(f"{where}.call_id", f"{where}.call_id: the function_call {show(call_id)} is "
                              f"incomplete{_CUT}", "incomplete_function_call") from None
            if "output" not in item:
                raise invalid(f"{where}.output", f"{where}.output: field required", "missing_required_parameter")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": _content(item["output"], f"{where}.output")})
            continue
        if kind == "reasoning":
            continue  # an earlier turn's reasoning, sent back: the template leaves it out of the prompt
        if kind != "message":
            if not isinstance(kind, str):
                raise wrong_type(f"{where}.type", "a string", kind)
            raise invalid(f"{where}.type", f"{where}.type: '{kind}' items are not supported: only messages, "
                          "function_call, function_call_output and reasoning", "unsupported_value")
        role = item.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise invalid(f"{where}.role", f"{where}.role: expected one of {sorted(_ROLES)}"
                          + ("" if isinstance(role, str) else f", got {type_name(role)}"))
        if "content" not in item:
            raise invalid(f"{where}.content", f"{where}.content: field required", "missing_required_parameter")
        messages.append({"role": _ROLES[role], "content": _content(item["content"], f"{where}.content")})
    if all(isinstance(item, dict) and item.get("type") == "reasoning" for item in items):
        raise invalid("input", "input: reasoning items are left out of the prompt: at least one message, "
                      "function_call or function_call_output item is required")
    _check_answered(ids, made_at)
    return messages


def _check_answered(ids: ToolCallIds, made_at: dict[str, str]) -> None:
    """Every function_call needs a function_call_output after it, as OpenAI's API requires (a
    400 in its words); a call left open would be sent to the model as if it had no answer yet."""
    unanswered = ids.unanswered()
    if not unanswered:
        return
    call_id = unanswered[0]
    where = made_at[call_id]
    if where == "previous_response_id":  # the stored response's call: the input must answer it
        raise invalid("input", f"input: No tool output found for function call {show(call_id)} (made by the "
                      "previous response): the input needs a function_call_output item answering it",
                      "missing_tool_output")
    raise invalid(f"{where}.call_id", f"{where}.call_id: No tool output found for function call {show(call_id)}: "
                  "every function_call item needs a function_call_output item after it", "missing_tool_output")


_TOOL_CHOICES = ("auto", "none", "required")


def parse_tools(body: dict, request: GenerationRequest) -> tuple[list[dict], str | dict]:
    """`tools` and `tool_choice` onto the chat request (serve/protocol.py's checks and grammar);
    returns both as the response echoes them."""
    tools = body.get("tools")
    if tools is None:
        tools = []
    elif not isinstance(tools, list):
        raise wrong_type("tools", "an array of tools", tools)
    parsed, echoed, names = [], [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise wrong_type(where, "a tool object", tool)
        if tool.get("type") != "function":
            raise invalid(f"{where}.type", f"{where}.type: only function tools are supported, got "
                          f"{show(tool.get('type'))}", "unsupported_value")
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise wrong_type(f"{where}.strict", "a boolean", strict)
        entry = checked_tool(tool.get("name"), tool.get("description"), tool.get("parameters"), names,
                             {key: f"{where}.{key}" for key in ("name", "description", "parameters")})
        parsed.append(entry)
        echoed.append({"type": "function", "name": entry["function"]["name"],
                       "description": entry["function"].get("description"),
                       "parameters": entry["function"].get("parameters"), "strict": strict})
    choice = body.get("tool_choice")
    name = None
    if choice is None:
        choice = "auto"
        echo: str | dict = "auto" if parsed else "none"
    elif isinstance(choice, dict):
        name = choice.get("name")
        if choice.get("type") != "function" or not isinstance(name, str):
            raise invalid("tool_choice", "tool_choice: expected 'auto', 'none', 'required' or "
                          "{'type': 'function', 'name'}", "unsupported_value")
        if name not in names:
            raise invalid("tool_choice.name", f"tool_choice.name: {show(name)} is not one of the tools",
                          "unknown_tool")
        choice, echo = "function", {"type": "function", "name": name}
    elif choice in _TOOL_CHOICES:
        echo = choice
    else:
        raise invalid("tool_choice", f"tool_choice: expected one of {list(_TOOL_CHOICES)} or a named function",
                      "unsupported_value")
    choose_tools(request, parsed, choice, name)
    return echoed, echo


VERBOSITIES = ("low", "medium", "high")
# OpenAI's bounds on metadata (stored and echoed with the response): pairs, and characters of a key and of a value.
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


def _check_metadata(metadata: dict) -> None:
    if not all(isinstance(v, str) for v in metadata.values()):
        raise invalid("metadata", "metadata: values must be strings", "invalid_type")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid("metadata", f"metadata: at most {MAX_METADATA_PAIRS} pairs, got {len(metadata)}")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY:
            raise invalid("metadata", f"metadata: a key has at most {MAX_METADATA_KEY} characters, got {show(key)} "
                          f"({len(key)})")
        if len(value) > MAX_METADATA_VALUE:
            raise invalid("metadata", f"metadata[{show(key)}]: at most {MAX_METADATA_VALUE} characters, got "
                          f"{len(value)}")


def _parse_text_format(body: dict, generation: GenerationRequest) -> dict:
    """`text.format`, the answer's structured output (text, a JSON object, or a JSON schema's
    instance: what client.responses.parse sends), onto the request; the format as echoed."""
    text = optional_object(body, "text")
    verbosity = None if text is None else text.get("verbosity")
    if verbosity is not None and verbosity not in VERBOSITIES:  # accepted, and ignored
        raise invalid("text.verbosity", f"text.verbosity: expected one of {list(VERBOSITIES)}, got {show(verbosity)}",
                      "invalid_value" if isinstance(verbosity, str) else "invalid_type")
    fmt = None if text is None else text.get("format")
    if fmt is None:
        return {"type": "text"}
    if not isinstance(fmt, dict):
        raise wrong_type("text.format", "an object", fmt)
    kind = fmt.get("type")
    if kind == "text":
        return {"type": "text"}
    if kind == "json_object":
        constrain_answer(generation, json_object_grammar(), "text.format")
        return {"type": "json_object"}
    if kind != "json_schema":
        raise invalid("text.format.type", f"text.format.type must be 'text', 'json_object' or 'json_schema', "
                      f"got {show(kind)}", "unsupported_value")
    name = required_text(fmt, "name", "text.format")
    description = fmt.get("description")
    if description is not None and not isinstance(description, str):
        raise wrong_type("text.format.description", "a string", description)
    strict = fmt.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise wrong_type("text.format.strict", "a boolean", strict)
    schema = fmt.get("schema")
    if schema is None:
        raise invalid("text.format.schema", "text.format.schema is required for a json_schema format")
    constrain_answer(generation, schema_grammar(schema, "text.format.schema", strict=bool(strict)), "text.format")
    return {"type": "json_schema", "name": name, "schema": schema, "strict": bool(strict),
            **({"description": description} if description is not None else {})}


# "none": no summary (Codex sends it); the others give the reasoning itself as the summary.
SUMMARIES = ("auto", "concise", "detailed", "none")


def _parse_reasoning(body: dict, generation: GenerationRequest) -> dict | None:
    """`reasoning` onto the chat request: on a template that thinks, effort "none" turns its
    thinking off (enable_thinking false) and any other on; the reasoning comes back as
    reasoning items, with a summary when one is asked for (``generate_summary`` is its
    older name). The setting as echoed."""
    reasoning = optional_object(body, "reasoning")
    if reasoning is None:
        return None
    summary = None
    for name in ("summary", "generate_summary"):
        value = reasoning.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise wrong_type(f"reasoning.{name}", "a string", value)
        if value not in SUMMARIES:
            raise invalid(f"reasoning.{name}", f"reasoning.{name} must be one of {list(SUMMARIES)}, "
                          f"got {value!r}", "unsupported_value")
        summary = summary or value
    effort = think_for_effort(generation, reasoning.get("effort"), "reasoning.effort")
    return {"effort": effort, "summary": summary}


# What `include` may name: the answer's logprobs; the others name what a local model has
# nothing of (encrypted reasoning: its reasoning is sent in the clear), or tools not served.
LOGPROBS_INCLUDED = "message.output_text.logprobs"
# OpenAI's `include` values: the rest name outputs of tools and encryption this server has
# not (Codex sends reasoning.encrypted_content), so they add nothing; any other is a typo.
INCLUDABLE = ("code_interpreter_call.outputs", "computer_call_output.output.image_url", "file_search_call.results",
              "message.input_image.image_url", LOGPROBS_INCLUDED, "reasoning.encrypted_content",
              "web_search_call.action.sources", "web_search_call.results")


def _parse_logprobs(body: dict, generation: GenerationRequest) -> int:
    """`include`'s "message.output_text.logprobs" and `top_logprobs` (which asks for them
    too) onto the chat request; top_logprobs as echoed."""
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(i, str) for i in include)):
        raise wrong_type("include", "an array of strings", include)
    for i, name in enumerate(include or ()):
        if name not in INCLUDABLE:
            raise invalid(f"include[{i}]", f"include[{i}]: {show(name)} is not one of OpenAI's values: "
                          f"{', '.join(INCLUDABLE)}", "invalid_value")
    top = integer(body, "top_logprobs", low=0, high=MAX_TOP_LOGPROBS) or 0
    generation.logprobs = LOGPROBS_INCLUDED in (include or ()) or top > 0
    generation.top_logprobs = top
    return top


def _previous(body: dict, stored: StoredResponses | None) -> StoredResponse | None:
    """The stored response `previous_response_id` names (None: none named)."""
    name = string(body, "previous_response_id")
    if name is None:
        return None
    previous = None if stored is None else stored.get(name)
    if previous is None:  # OpenAI's words and code
        raise invalid("previous_response_id", f"Previous response with id {show(name)} not found.",
                      "previous_response_not_found")
    if previous.status in ("queued", "in_progress"):  # its output is not known yet
        raise invalid("previous_response_id", f"Previous response with id {show(name)} is still in progress: "
                      "continue it once it has ended.", "previous_response_in_progress")
    if previous.status in ("failed", "cancelled"):  # no answer: its input alone would be a turn without a reply
        raise invalid("previous_response_id", f"Previous response with id {show(name)} {previous.status}: it has "
                      "no answer to continue (send its input again).", f"previous_response_{previous.status}")
    return previous


def parse_request(body: dict, max_messages: int = DEFAULT_MAX_MESSAGES,
                  stored: StoredResponses | None = None) -> ResponsesRequest:
    """A request to the Responses API; `stored`: the server's stored responses."""
    _refuse_unsupported(body)
    model = string(body, "model")
    previous = _previous(body, stored)
    items = input_items(body)
    messages = parse_input(body, max_messages, previous.items() if previous is not None else (), items,
                           previous.cut_call_ids() if previous is not None else ())
    # OpenAI's default is true: only an explicit false keeps nothing.
    store_asked = body.get("store") is None or boolean(body, "store")
    store = store_asked and stored is not None
    background = boolean(body, "background")
    if background and not store_asked:  # its answer is only ever read from the store
        raise invalid("background", "background: a background response must be stored (store false was sent)")
    metadata = optional_object(body, "metadata")
    if metadata is not None:
        _check_metadata(metadata)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise wrong_type("parallel_tool_calls", "a boolean", parallel)
    for name in ("user", "safety_identifier", "prompt_cache_key", "service_tier"):
        string(body, name)  # accepted, and ignored
    generation = GenerationRequest(
        chat=True, model=model, messages=messages, max_tokens=integer(body, "max_output_tokens", low=1),
        max_tokens_field="max_output_tokens",
        temperature=number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=number(body, "top_p", 1.0, 0.0, 1.0, low_open=True), stream=boolean(body, "stream"),
        parallel_tool_calls=parallel is not False, max_tool_calls=integer(body, "max_tool_calls", low=1),
        drop_old_turns=body.get("truncation") == "auto")
    tools, tool_choice = parse_tools(body, generation)
    text_format = _parse_text_format(body, generation)
    echo = {"text": {"format": text_format}, "reasoning": _parse_reasoning(body, generation),
            "top_logprobs": _parse_logprobs(body, generation),
            "instructions": body.get("instructions"), "metadata": metadata or {},
            "max_output_tokens": generation.max_tokens, "temperature": generation.temperature,
            "top_p": generation.top_p, "parallel_tool_calls": generation.parallel_tool_calls,
            "max_tool_calls": generation.max_tool_calls,
            "truncation": body.get("truncation") or "disabled", "tools": tools, "tool_choice": tool_choice,
            "store": store, "previous_response_id": body.get("previous_response_id"), "background": background}
    input_json = json.dumps([listed_item(item) for item in items]) if store else None
    if background and store:
        _check_room(stored, echo, model, input_json, previous)
    return ResponsesRequest(generation, echo, stored if store else None, previous, items, input_json, background)


def _check_room(stored: StoredResponses, echo: dict, model: str | None, input_json: str,
                previous: StoredResponse | None) -> None:
    """A 400 for a background response the store could not keep (its answer is only ever read
    from there): its conversation and the request it echoes past the store's bound, before it
    is admitted. (Its answer's own size is known only at its end, where any response too large
    is logged and not kept.) `model`: the name asked for, which the answer names (None: the
    server's default, a name of its own configuration)."""
    # (_EMPTY_RESPONSE_CHARS counts the model's name as "": its quotes are counted there.)
    chars = (len(json.dumps(echo)) + len(json.dumps(model or "")) - 2 + _EMPTY_RESPONSE_CHARS
             + conversation_chars(input_json, "[]", previous))
    if chars > stored.max_chars:
        raise invalid("background", f"background: a background response is only read from the store, and {TOO_LARGE} "
                      f"({chars} characters, the store holds {stored.max_chars}): send it without background",
                      "response_too_large")


# ---- answers ------------------------------------------------------------------------

def usage(input_tokens: int, output_tokens: int, reasoning_tokens: int = 0) -> dict:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens}


# What a stored response holds besides the request it echoes and its output, counted at its
# widest (ids, time, usage with token counts of ten digits; its model's name aside).
_EMPTY_RESPONSE_CHARS = len(json.dumps({
    "id": "resp_" + "0" * 32, "object": "response", "created_at": 10 ** 10, "status": "in_progress",
    "model": "", "output": [], "usage": usage(10 ** 9, 10 ** 9, 10 ** 9), "error": None,
    "incomplete_details": {"reason": "max_output_tokens"}}))


def output_text(text: str, logprobs: list[dict] | None = None) -> dict:
    """A message's text; `logprobs`: its tokens' entries (with include's logprobs)."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(id_: str, status: str, content: list[dict]) -> dict:
    return {"type": "message", "id": id_, "status": status, "role": "assistant", "content": content}


def reasoning_item(id_: str, status: str, text: str | None, summarized: bool = False) -> dict:
    """The reasoning of a template that thinks, markers left out (None: not yet written);
    `summarized`: its summary, asked for, is the reasoning itself."""
    return {"type": "reasoning", "id": id_, "status": status,
            "summary": [summary_text(text)] if summarized and text is not None else [],
            "content": [] if text is None else [{"type": "reasoning_text", "text": text}]}


def summary_text(text: str) -> dict:
    return {"type": "summary_text", "text": text}


def function_call_item(call_id: str, name: str, arguments: str, status: str) -> dict:
    """A chat tool call as a function_call output item (its call_id is the call's id)."""
    return {"type": "function_call", "id": "fc_" + call_id.removeprefix("call_"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def ended_call_item(end: CallEnd) -> dict:
    """A call that ended as its output item: "incomplete" when its arguments are not a whole
    object (max_output_tokens cut it, or the model wrote them wrong), as streamed."""
    function = end.call["function"]
    return function_call_item(end.call["id"], function["name"], function["arguments"],
                              "completed" if end.valid else "incomplete")


_ITEM_ID_PREFIXES = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


def listed_item(item: dict) -> dict:
    """An input item as it is stored and listed (GET .../input_items): OpenAI's full form, with
    a type, an id (one of the server's where the client sent none) and a status, and a message's
    text as content parts. Parsing it again gives the same prompt."""
    kind = item.get("type", "message")
    listed = {**item, "type": kind}
    if not isinstance(listed.get("id"), str) or not listed["id"]:
        listed["id"] = _ITEM_ID_PREFIXES.get(kind, "item_") + uuid.uuid4().hex
    if kind != "reasoning":
        listed.setdefault("status", "completed")
    if kind == "message" and isinstance(item.get("content"), str):
        text = item["content"]
        listed["content"] = [output_text(text) if item.get("role") == "assistant"
                             else {"type": "input_text", "text": text}]
    return listed


def _new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex


def _new_reasoning_id() -> str:
    return "rs_" + uuid.uuid4().hex


class ResponsesReply:
    """The answer to one admitted Responses API request (common.Reply): its ids and
    state, from which each of its shapes is built."""

    def __init__(self, request: ResponsesRequest, generation: Generation):
        self.request, self.generation = request, generation
        self.model = generation.model_name
        self.id = "resp_" + uuid.uuid4().hex
        self.created_at = int(time.time())
        self.sequence_number = 0
        self.parts = AnswerParts(generation)
        self.summarized = (request.echo.get("reasoning") or {}).get("summary") not in (None, "none")
        self._ended: str | None = None  # "answered", or "early" (a failure, or the client gone)
        self._failed = False  # ended early by a failure (its error kept)
        # A stream's and a background response's client sees its id before its end.
        self._kept_from_start = request.generation.stream or request.background

    def response(self, status: str, output: list[dict], usage_: dict | None = None,
                 error: dict | None = None) -> dict:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "model": self.model, "output": output, "usage": usage_, "error": error,
                "incomplete_details": incomplete, **self.request.echo}

    def _keep(self, response: dict, *, replacing: bool) -> dict:
        """Store `response` where the request asked (store), with its input and output items:
        anew, or `replacing` its start (not where that was deleted meanwhile); returns it."""
        request = self.request
        if request.store is None:
            return response
        # A call whose arguments are no whole object (cut short) cannot be sent back as input.
        output = [item for item in response["output"]
                  if not (item["type"] == "function_call" and item["status"] == "incomplete")]
        why = request.store.put(response, request.input_json, output, request.earlier, replacing=replacing)
        if why == TOO_LARGE:
            logger.warning("response %s not stored: %s (%d characters)", self.id, why, request.store.max_chars)
        return response

    @property
    def ended(self) -> bool:
        """Whether the answer's end has been made: its last event or body, or a failure's (a
        client leaving is no end: a shutdown's failure still follows it)."""
        return self._ended == "answered" or self._failed

    def started(self, status: str, *, replacing: bool = False) -> dict:
        """The response at its start (`status`: queued or in_progress, no output yet), stored
        where the request asked: a stream's and a background response's client sees its id now."""
        return self._keep(self.response(status, []), replacing=replacing)

    def _kept(self, response: dict) -> dict:
        """`response`, the answer's end, stored where the request asked: in place of its start
        where it was kept from its start, a collected answer's only now (its body is where its
        client first sees its id)."""
        self._ended = "answered"
        return self._keep(response, replacing=self._kept_from_start)

    def ended_early(self, error: APIError | None) -> None:
        """A stream's or a background response's kept as "failed" with the error, or
        "cancelled" when the client left or cancelled it (its output is not kept). A collected
        answer's is not kept: its client got an error, or nothing, never its id, and it would
        only push real responses out of the store."""
        # A shutdown's failure comes after the stream's close (the client still there), so it wins.
        if self._ended == "answered" or (self._ended and error is None):
            return
        self._ended = "early"
        self._failed = self._failed or error is not None
        if self._kept_from_start:
            self._keep(self.response("cancelled", []) if error is None else self._failed_response(error),
                       replacing=True)

    def _usage(self) -> dict:
        return usage(self.generation.prompt_tokens, self.generation.stats.generated_tokens,
                     self.parts.reasoning_tokens)

    @staticmethod
    def _status(finish_reason: str | None) -> str:
        return "incomplete" if finish_reason == "length" else "completed"

    def body(self, collected: Collected) -> dict:
        status = self._status(self.generation.finish_reason)
        parts = self.parts.whole(collected)
        logprobs = iter(self.parts.text_logprobs)  # one list per text part, in order
        output = [message_item(_new_message_id(), status, [output_text(part, next(logprobs))])
                  if isinstance(part, str)
                  else reasoning_item(_new_reasoning_id(), status, part.text, self.summarized)
                  if isinstance(part, Reasoning)
                  else ended_call_item(part) for part in parts]
        if not any(item["type"] != "reasoning" for item in output):  # an answer has a message, if empty
            output.append(message_item(_new_message_id(), status, [output_text("")]))
        return self._kept(self.response(status, output, self._usage()))

    def event(self, kind: str, **fields) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return event(kind, data)

    def _failed_response(self, error: APIError) -> dict:
        return self.response("failed", [], error={"code": "server_error", "message": error.message})

    def failed(self, error: APIError) -> bytes:
        return self.event("response.failed", response=self._failed_response(error))

    async def events(self) -> AsyncIterator[bytes]:
        if self.request.background:  # kept queued as it was answered: in progress from here
            yield self.event("response.created", response=self.response("queued", []))
            yield self.event("response.in_progress", response=self.started("in_progress", replacing=True))
        else:
            yield self.event("response.created", response=self.started("in_progress"))
            yield self.event("response.in_progress", response=self.response("in_progress", []))
        output: list[dict] = []  # the items done
        message: dict | None = None  # the message item being written, its text and logprobs so far
        texts: list[str] = []
        entries: list[dict] = []
        logprobs = self.request.generation.logprobs
        call: dict = {}  # the function_call item being written
        reasoning: dict | None = None  # the reasoning item being written
        thoughts: list[str] = []

        # Where a reasoning delta goes: the summary (asked for; the reasoning itself) or the content.
        place = ({"summary_index": 0}, "response.reasoning_summary_text") if self.summarized \
            else ({"content_index": 0}, "response.reasoning_text")

        def open_reasoning() -> list[bytes]:
            nonlocal reasoning
            reasoning = reasoning_item(_new_reasoning_id(), "in_progress", None)
            thoughts.clear()
            out = [self.event("response.output_item.added", output_index=len(output), item=reasoning)]
            if self.summarized:
                out.append(self.event("response.reasoning_summary_part.added", item_id=reasoning["id"],
                                      output_index=len(output), summary_index=0, part=summary_text("")))
            return out

        def close_reasoning(status: str) -> list[bytes]:
            nonlocal reasoning
            full = "".join(thoughts)
            done = reasoning_item(reasoning["id"], status, full, self.summarized)
            out = [self.event(place[1] + ".done", item_id=done["id"], output_index=len(output), **place[0],
                              text=full)]
            if self.summarized:
                out.append(self.event("response.reasoning_summary_part.done", item_id=done["id"],
                                      output_index=len(output), summary_index=0, part=summary_text(full)))
            out.append(self.event("response.output_item.done", output_index=len(output), item=done))
            output.append(done)
            reasoning = None
            return out

        def where() -> dict:
            return {"item_id": message["id"], "output_index": len(output), "content_index": 0}

        def open_message() -> list[bytes]:
            nonlocal message
            message = message_item(_new_message_id(), "in_progress", [])
            texts.clear()
            entries.clear()
            return [self.event("response.output_item.added", output_index=len(output), item=message),
                    self.event("response.content_part.added", **where(), part=output_text(""))]

        def close_message(status: str) -> list[bytes]:
            nonlocal message
            full = "".join(texts)
            done = message_item(message["id"], status, [output_text(full, entries)])
            out = [self.event("response.output_text.done", **where(), text=full, logprobs=list(entries)),
                   self.event("response.content_part.done", **where(), part=output_text(full, entries)),
                   self.event("response.output_item.done", output_index=len(output), item=done)]
            output.append(done)
            message = None
            return out

        if not self.parts.split:  # one message, open from the start (else it opens at the first text)
            for chunk in open_message():
                yield chunk
        async for delta in self.generation.deltas():
            final = delta.finish_reason is not None
            parts = self.parts.feed(delta.text, final, token=delta.token is not None,
                                    logprob=self.generation.logprob_entry(delta) if logprobs else None)
            taken = self.parts.taken
            for part in parts:
                if isinstance(part, Reasoning):
                    if reasoning is None:
                        for chunk in open_reasoning():
                            yield chunk
                    thoughts.append(part.text)
                    yield self.event(place[1] + ".delta", item_id=reasoning["id"], output_index=len(output),
                                     **place[0], delta=part.text)
                    continue
                if reasoning is not None:  # the reasoning ended: its item is done before the answer's
                    for chunk in close_reasoning("completed"):
                        yield chunk
                if isinstance(part, str):
                    if message is None:
                        for chunk in open_message():
                            yield chunk
                    texts.append(part)
                    entries.extend(taken)
                    yield self.event("response.output_text.delta", **where(), delta=part, logprobs=taken)
                    taken = []
                    continue
                if isinstance(part, CallStart):
                    if message is not None:
                        for chunk in close_message("completed"):
                            yield chunk
                    call = function_call_item(part.id, part.name, "", "in_progress")
                    yield self.event("response.output_item.added", output_index=len(output), item=call)
                elif isinstance(part, CallArguments):
                    yield self.event("response.function_call_arguments.delta", item_id=call["id"],
                                     output_index=len(output), delta=part.text)
                elif isinstance(part, CallEnd):
                    done = ended_call_item(part)
                    yield self.event("response.function_call_arguments.done", item_id=done["id"],
                                     output_index=len(output), name=done["name"], arguments=done["arguments"])
                    yield self.event("response.output_item.done", output_index=len(output), item=done)
                    output.append(done)
            if final:
                status = self._status(delta.finish_reason)
                left = self.parts.left_logprobs()
                if message is not None and left:  # tokens that wrote nothing at its end (end of sequence)
                    entries.extend(left)
                    yield self.event("response.output_text.delta", **where(), delta="", logprobs=left)
                if reasoning is not None:  # it ended reasoning
                    for chunk in close_reasoning(status):
                        yield chunk
                if message is None and not any(item["type"] != "reasoning" for item in output):
                    # no message nor call: one empty message, as unstreamed
                    for chunk in open_message():
                        yield chunk
                if message is not None:
                    for chunk in close_message(status):
                        yield chunk
                yield self.event("response.incomplete" if status == "incomplete" else "response.completed",
                                 response=self._kept(self.response(status, output, self._usage())))


# ---- routes -------------------------------------------------------------------------

def _not_found(response_id: str) -> Response:
    return error_response(APIError(404, f"Response with id {show(response_id)} not found.", param="response_id",
                                   code="not_found"))


@dataclass
class BackgroundRun:
    """A background response's generation while it runs: cancelling `scope` ends it; `ended` is
    set once it has ended and its end is stored; `events`: a streamed one's, as they come."""

    scope: anyio.CancelScope
    ended: anyio.Event
    events: EventLog | None = None


class EventReplay(ServerSentEvents):
    """A background stream's events as server-sent events: those after `after` (a sequence
    number; -1: all), then each as its run appends it, until the run ends. The client leaving
    ends this reading only: the run goes on, its events kept for the next reader."""

    def __init__(self, events: EventLog, after: int = -1):
        super().__init__()
        self.events, self.after = events, after

    async def __call__(self, scope, receive, send) -> None:
        async with anyio.create_task_group() as group:
            async def watch() -> None:
                await until_disconnected(receive)
                group.cancel_scope.cancel()

            group.start_soon(watch)
            replay = self.events.after(self.after)
            try:
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                async for chunk in replay:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                with anyio.CancelScope(shield=True):
                    await replay.aclose()  # type: ignore[attr-defined]
            group.cancel_scope.cancel()


def _starting_after(query) -> int:
    """``starting_after``, the sequence number a replay starts after (-1: none given, all of it)."""
    raw = query.get("starting_after")
    if raw is None:
        return -1
    after = _unsigned(raw, 18)  # any larger number is past every event a log can hold
    if after is None:
        raise invalid("starting_after", f"starting_after: expected a sequence number (an integer >= 0), "
                      f"got {show(raw)}")
    return after


def _unsigned(raw: str, digits: int) -> int | None:
    """A query's unsigned integer as written (leading zeros and all), at most 10**digits (int()
    refuses thousands of digits); None: not one."""
    if not (raw.isascii() and raw.isdigit()):
        return None
    significant = raw.lstrip("0")
    return int(significant or "0") if len(significant) <= digits else 10 ** digits


def _streamed(query) -> bool:
    """The ``stream`` query parameter, a boolean as clients write one in a URL."""
    raw = query.get("stream", "false")
    if raw.lower() in ("true", "1"):
        return True
    if raw.lower() in ("false", "0", ""):
        return False
    raise invalid("stream", f"stream: expected true or false, got {show(raw)}")


MAX_LISTED_ITEMS = 100  # OpenAI's bound on a page


def page_of_items(kept: StoredResponse, query) -> dict:
    """A page of `kept`'s input items as OpenAI lists them: ``order`` desc (the default) or
    asc, at most ``limit`` (1 to 100, default 20) of them: the first after the item ``after``
    names (and before ``before``'s), or with ``before`` alone the last before it (the page
    before; ``has_more``: more precede it)."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("order", f"order: expected 'asc' or 'desc', got {show(order)}")
    raw = query.get("limit", "20")
    limit = _unsigned(raw, 4) or 0
    if not 1 <= limit <= MAX_LISTED_ITEMS:
        raise invalid("limit", f"limit: expected an integer from 1 to {MAX_LISTED_ITEMS}, got {show(raw)}")
    items = kept.input_items()
    ordered = items if order == "asc" else items[::-1]
    ids = [item.get("id") for item in ordered]
    start, end = 0, len(ordered)
    for param in ("after", "before"):
        name = query.get(param)
        if name is None:
            continue
        if name not in ids:
            raise invalid(param, f"{param}: no input item of this response has the id {show(name)}")
        if param == "after":
            start = ids.index(name) + 1
        else:
            end = ids.index(name)
    if query.get("before") is not None and query.get("after") is None:
        first = max(start, end - limit)  # the page just before it (a page back), and whether more precede it
        data, more = ordered[first:end], first > start
    else:
        data = ordered[start:min(end, start + limit)] if start < end else []
        more = start + len(data) < end
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


def routes(service: Service) -> list[Route]:
    stored = StoredResponses()
    running: dict[str, BackgroundRun] = {}  # the background responses still generating, by id
    parse = functools.partial(parse_request, max_messages=service.config.max_messages, stored=stored)

    async def in_background(parsed: ResponsesRequest, answer: ResponsesReply,
                            generation: Generation) -> Response | None:
        """A background request's answer, queued, its generation left running among the
        service's tasks (None: not a background request)."""
        if not parsed.background:
            return None
        run = BackgroundRun(anyio.CancelScope(), anyio.Event(), EventLog() if parsed.generation.stream else None)

        async def stream_into(events: EventLog) -> None:
            """The events of a streamed answer (guarded), ended by response.failed where the
            shutdown deadline cuts it short, as EventStream's are."""
            shutdown_scope = anyio.CancelScope()
            with service.on_cut_off(shutdown_scope.cancel), shutdown_scope:
                async for chunk in guarded(answer, generation, parsed.generation):
                    events.append(chunk)
            if shutdown_scope.cancel_called and not answer.ended:  # not cut off once its end is kept
                events.append(last_event(answer, shutdown_error()))

        async def generate() -> None:
            try:
                with run.scope:
                    if run.events is not None:
                        await stream_into(run.events)
                    else:
                        answer.started("in_progress", replacing=True)
                        await collected_body(service, answer, generation, parsed.generation)
            except APIError:
                pass  # stored as failed, where its client reads it
            except Exception:  # stored as failed; the service's other tasks go on
                logger.exception("background response %s failed", answer.id)
            finally:
                if run.events is not None:  # kept with its end, for replay: before it leaves `running`
                    run.events.close()
                    if stored.keep_events(answer.id, run.events) == TOO_LARGE:
                        logger.warning("response %s's events not kept for replay: with them it is larger than the "
                                       "store (%d characters)", answer.id, stored.max_chars)
                running.pop(answer.id, None)
                run.ended.set()

        # Kept and registered before the run can start (a task may start eagerly): its end replaces this.
        queued = answer.started("queued")
        running[answer.id] = run
        try:
            service.run_in_background(generate)
        except RuntimeError:  # the service is not running (closed): nothing to run it among
            running.pop(answer.id, None)
            stored.delete(answer.id)
            await generation.aclose()
            return error_response(shutdown_error())
        return JSON(queued) if run.events is None else EventReplay(run.events)

    async def cancel(request: Request) -> Response:
        """POST: end a background response's generation (stored cancelled); answer it as stored."""
        response_id = request.path_params["response_id"]
        run = running.get(response_id)
        if run is not None:
            run.scope.cancel()
            await run.ended.wait()  # its end is stored: cancelled, or how it ended first
        kept = stored.get(response_id)
        if kept is None:
            return _not_found(response_id)
        if not kept.background:  # OpenAI's words
            return error_response(invalid("response_id", "Only background responses can be cancelled.",
                                          "not_background"))
        return Response(kept.response_json, media_type="application/json")

    async def stored_response(request: Request) -> Response:
        """GET: the stored response as it was answered (with ``stream``: its events, EventReplay);
        DELETE: drop it."""
        response_id = request.path_params["response_id"]
        if request.method == "DELETE":
            run = running.get(response_id)
            if run is not None:  # its end could never be read: its slot goes back now
                run.scope.cancel()
            if not stored.delete(response_id):
                return _not_found(response_id)
            return JSON({"id": response_id, "object": "response.deleted", "deleted": True})
        kept = stored.get(response_id)
        if kept is None:
            return _not_found(response_id)
        try:
            streamed = _streamed(request.query_params)
            after = _starting_after(request.query_params)
        except APIError as error:
            return error_response(error)
        if not streamed:
            return Response(kept.response_json, media_type="application/json")
        run = running.get(response_id)
        events = run.events if run is not None else stored.events(response_id)
        if events is None:  # OpenAI streams only these too
            return error_response(invalid("stream", "stream: this response has no events kept: only one created "
                                          "with background and stream true has them (where the store can hold "
                                          "them); GET it without stream", "not_streamable"))
        return EventReplay(events, after)

    async def stored_input_items(request: Request) -> Response:
        """GET: the input items a stored response was generated from, a page at a time."""
        response_id = request.path_params["response_id"]
        kept = stored.get(response_id)
        if kept is None:
            return _not_found(response_id)
        try:
            # Off the loop: a long conversation is many items to parse.
            page = await service.off_loop(page_of_items, kept, request.query_params)
        except APIError as error:
            return error_response(error)
        return JSON(page)

    return [prompt_tokens_route(service, INPUT_TOKENS, lambda body: parse(body).generation,
                                lambda tokens: {"object": "response.input_tokens", "input_tokens": tokens},
                                error_response),
            generation_route(service, RESPONSES, parse, ResponsesReply, error_response, in_background),
            Route(RESPONSES + "/{response_id}", stored_response, methods=["GET", "DELETE"]),
            Route(RESPONSES + "/{response_id}/cancel", cancel, methods=["POST"]),
            Route(RESPONSES + "/{response_id}/input_items", stored_input_items, methods=["GET"])]
