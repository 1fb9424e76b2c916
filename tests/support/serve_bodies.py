"""Request bodies the service's tests share: hostile OpenAI bodies for the fuzz tests
(hypothesis strategies), and the question the tool tests ask."""

from __future__ import annotations

from hypothesis import strategies as st

# A question a tool answers (get_weather with a city), for the tool-call tests.
WEATHER_USER = [{"role": "user", "content": "What is the weather in Paris?"}]

# Every field the service reads or refuses by name.
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "seed", "stop", "stop_token_ids", "stream", "stream_options", "logprobs", "top_logprobs", "n", "best_of",
          "tools", "tool_choice", "functions", "function_call", "logit_bias", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "min_p",
          "response_format", "echo", "suffix", "parallel_tool_calls", "chat_template_kwargs", "guided_json",
          "guided_regex", "guided_grammar"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63, max_value=10**500)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
    | st.sampled_from(["\ud800", "x\udfff", "user", "text", "none", "", "SmolLM2-135M-Instruct"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=12)

message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool"]) | json_values,
                                 "content": st.text(max_size=8) | json_values},
                                optional={"tool_calls": json_values, "tool_call_id": json_values})

# Any fields with any values; or that plus messages that are mostly well formed.
bodies = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6) | st.builds(
    lambda extra, messages: {**extra, "messages": messages},
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4), st.lists(message, min_size=1, max_size=3))
