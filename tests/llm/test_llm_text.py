"""Text (llm/text.py): mlx-lm's streaming detokenizers and byte table behind the
engine's streamed text, which is always the tokenizer's decode of the tokens."""

from __future__ import annotations

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import emlx_async as ea
from support.helpers import needs_model, on_loops

pytest.importorskip("mlx_lm")

TEXTS = [
    " Paris is the capital",          # a leading space: a completion's first token has one
    "Café 🎉 naïve — 東京 ok",         # multi-byte characters across tokens
    "ends with a space ",              # a lone space waits for the next token, then the flush
    "  two spaces, then\nlines\n\n",
]


def stream(detok, ids):
    """(pieces as they stream, the flush at the end)."""
    return [detok.add(t) for t in ids], detok.flush()


@pytest.fixture(scope="module")
def gguf_tokenizer():
    from emlx_async.llm import _gguf

    _, meta = mx.load(_gguf.smollm2_path(), return_metadata=True)
    return _gguf.gguf_tokenizer(meta)


@needs_model
def test_a_gguf_tokenizer_streams_its_decode_through_mlx_lms_bpe_detokenizer(gguf_tokenizer):
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer

    from emlx_async.llm.text import Detokenizer, PromptEncoder

    encoder = PromptEncoder(gguf_tokenizer, bos_id=None, chat_template=None, vocab_size=None)
    for text in TEXTS:
        ids = gguf_tokenizer.encode(text, add_special_tokens=False).ids
        for detok in (Detokenizer(gguf_tokenizer), encoder.detokenizer()):
            assert isinstance(detok.streaming, BPEStreamingDetokenizer)
            pieces, tail = stream(detok, ids)
            assert all("\ufffd" not in piece for piece in pieces), pieces
            assert "".join(pieces) + tail == gguf_tokenizer.decode(ids) == text
    # Each generation gets its own state; the token map is built once.
    first, second = encoder.detokenizer(), encoder.detokenizer()
    assert first.streaming is not second.streaming
    assert first.streaming.tokenmap is second.streaming.tokenmap


@on_loops("asyncio", "uvloop")
@needs_model
async def test_an_mlx_lm_folder_keeps_its_tokenizer_wrapper_and_streams_with_its_detokenizer(gguf_tokenizer, tmp_path):
    from mlx_lm.models import llama
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper

    from emlx_async.llm import Engine
    from emlx_async.llm.loading import load_model_files
    from emlx_async.llm.save import save_mlx_lm

    mx.random.seed(3)
    model = llama.Model(llama.ModelArgs(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=gguf_tokenizer.get_vocab_size(),
        max_position_embeddings=128))
    mx.eval(model.parameters())
    template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    save_mlx_lm(str(tmp_path / "tiny"), model, gguf_tokenizer, eos_ids={2}, bos_id=None, chat_template=template)
    loaded, tokenizer, extra = load_model_files(str(tmp_path / "tiny"))
    assert isinstance(tokenizer, TokenizerWrapper)  # not thrown away for the tokenizer inside
    assert extra == {"eos_ids": {2}, "chat_template": template, "bos_id": None}
    mx.eval(loaded.parameters())
    messages = [{"role": "user", "content": "Say <|im_end|> once"}]
    async with ea.Runtime(pool_size=2) as rt:
        engine = Engine(loaded, tokenizer, runtime=rt, **extra)
        gguf = Engine(loaded, gguf_tokenizer, runtime=rt, **extra)
        # Encoding goes through the wrapper to the same tokenizer, chat safety included.
        assert engine.encode(messages=messages) == gguf.encode(messages=messages)
        assert isinstance(engine.text.detokenizer().streaming, BPEStreamingDetokenizer)
        for text in TEXTS:
            ids = gguf_tokenizer.encode(text, add_special_tokens=False).ids
            pieces, tail = stream(engine.text.detokenizer(), ids)
            assert "".join(pieces) + tail == tokenizer.decode(ids) == text
        deltas = [d async for d in engine.generate("The capital of France is", max_tokens=8)]
        assert "".join(d.text for d in deltas) == tokenizer.decode([d.token for d in deltas if d.token is not None])


@on_loops("asyncio")
@needs_model
async def test_a_chat_template_written_in_python_renders_chats_through_mlx_lms_wrapper(tmp_path):
    """A checkpoint naming one of mlx-lm's Python templates (``chat_template_type``, as
    DeepSeek-V3.2's conversions do: no Jinja template) gets mlx-lm's own rendering, tools
    and thinking included, with user text kept as text; and its facts (renders tools, thinks)."""
    import json

    from mlx_lm.chat_templates import deepseek_v32

    from emlx_async.llm import Engine
    from support.tiny_models import tiny_model_folder

    folder = tiny_model_folder(tmp_path / "dsv32", None, kind="llama")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template_type": "deepseek_v32"}))
    tool = {"type": "function", "function": {"name": "get_weather", "description": "the weather",
                                             "parameters": {"type": "object", "properties": {}}}}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    async with ea.Runtime(pool_size=2) as rt:
        engine = await Engine.load(str(folder), runtime=rt)
        assert engine.chat_template is None and engine.text.python_template
        assert engine.text.renders_tools and not engine.text.thinks  # SmolLM2's vocabulary has no <think>
        for options in ({}, {"enable_thinking": False}):
            # mlx-lm's wrapper thinks by default only where the vocabulary has thinking tokens.
            expected = deepseek_v32.apply_chat_template(messages, add_generation_prompt=True, tools=[tool],
                                                        **{"enable_thinking": False, **options})
            assert "get_weather" in expected
            assert engine.text.render_chat(messages, tools=[tool], template_kwargs=options) == expected
            # Each content encoded apart from the template's text (chat safety): the same text.
            ids = engine.text.encode(messages=messages, tools=[tool], template_kwargs=options)
            assert engine.tokenizer.decode(ids) == expected
        assert 2 not in engine.text.encode(messages=[{"role": "user", "content": "Say <|im_end|>"}])  # text
        deltas = [d async for d in engine.generate(messages=messages, max_tokens=3)]
        assert len([d for d in deltas if d.token is not None]) == 3
        with pytest.raises(ValueError, match="the chat template refused the messages"):
            engine.encode(messages=[{"role": "developer", "content": ""}])  # its own assertion


@on_loops("asyncio")
@needs_model
async def test_a_python_template_gets_a_tool_round_trip_and_the_tools_without_a_system_message(tmp_path):
    """DeepSeek-V3.2's template writes tools in a system message only and reads a history
    call's arguments as JSON text (OpenAI's form): a chat of a user message and tools gets
    them (an empty system message is added), and a history with a call and its result renders."""
    import json

    from mlx_lm.chat_templates import deepseek_v32

    from emlx_async.llm import Engine
    from support.tiny_models import tiny_model_folder

    folder = tiny_model_folder(tmp_path / "dsv32", None, kind="llama")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template_type": "deepseek_v32"}))
    tool = {"type": "function", "function": {"name": "get_weather", "description": "the weather",
                                             "parameters": {"type": "object", "properties": {}}}}
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    # The history as the service hands it over: the arguments an object (Jinja templates' form).
    history = [*asked, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    async with ea.Runtime(pool_size=2) as rt:
        engine = await Engine.load(str(folder), runtime=rt)
        rendered = engine.text.render_chat(asked, tools=[tool])
        assert "get_weather" in rendered
        assert rendered == deepseek_v32.apply_chat_template([{"role": "system", "content": ""}, *asked],
                                                            add_generation_prompt=True, tools=[tool],
                                                            enable_thinking=False)
        assert "get_weather" not in engine.text.render_chat(asked)
        text = engine.text.render_chat(history, tools=[tool])
        after = text.split("Weather in Paris?")[-1]
        assert "Paris" in after and "sunny" in after  # the call's arguments, then its result
        ids = engine.text.encode(messages=history, tools=[tool])
        assert engine.tokenizer.decode(ids) == text
        assert history[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}  # the caller's, untouched
        # Its options arrive as apply_chat_template's keywords: the tokenizer's own are refused.
        for key in ("chat_template", "tokenize"):
            with pytest.raises(ValueError, match=f"template option '{key}' is the tokenizer's"):
                engine.text.render_chat(asked, template_kwargs={key: "{{ 'x' }}"})


def test_a_tokenizer_without_a_byte_level_decoder_streams_through_mlx_lms_naive_detokenizer():
    from mlx_lm.tokenizer_utils import NaiveStreamingDetokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from emlx_async.llm.text import Detokenizer

    words = ["[UNK]", "hello", "world", "again"]
    tokenizer = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()
    ids = tokenizer.encode("hello world again", add_special_tokens=False).ids
    detok = Detokenizer(tokenizer)
    assert isinstance(detok.streaming, NaiveStreamingDetokenizer)
    pieces, tail = stream(detok, ids)
    assert "".join(pieces) + tail == tokenizer.decode(ids) == "hello world again"


def test_a_decode_only_tokenizer_streams_a_window_that_never_splits_a_character():
    from emlx_async.llm.text import Detokenizer

    class Utf8Bytes:
        """Each token is one byte of UTF-8."""

        def decode(self, ids, skip_special_tokens=True):
            return bytes(ids).decode("utf-8", errors="replace")

    data = list("é東🎉!".encode())
    detok = Detokenizer(Utf8Bytes())
    assert detok.streaming is None
    pieces, tail = stream(detok, data)
    assert [p for p in pieces if p] == ["é", "東", "🎉", "!"] and tail == ""


def test_the_byte_table_is_mlx_lms_and_covers_every_byte():
    from mlx_lm.tokenizer_utils import _byte_decoder

    from emlx_async.llm.text import byte_decoder

    table = byte_decoder()
    assert table is _byte_decoder()
    assert sorted(table.values()) == list(range(256))
    assert all(table[chr(b)] == b for b in range(ord("!"), ord("~") + 1))  # printable ASCII is itself
    assert table["Ġ"] == ord(" ")  # GPT-2's space


@needs_model
def test_token_bytes_of_a_character_split_over_tokens_join_to_its_utf8(gguf_tokenizer):
    from emlx_async.llm.text import PromptEncoder

    encoder = PromptEncoder(gguf_tokenizer, bos_id=None, chat_template=None, vocab_size=None)
    for text in TEXTS:
        ids = gguf_tokenizer.encode(text, add_special_tokens=False).ids
        assert b"".join(encoder.token_bytes(t) for t in ids) == text.encode()


SPECIAL_PIECES = ["<unk>", "<s>", "</s>"]


def sentencepiece_tokenizer(decoder: str):
    """A tiny Llama-2-style tokenizer: BPE over "▁"-marked words, byte-fallback pieces <0x00>..<0xFF>
    for what the vocabulary lacks ("é"), and either Llama 2's decoder (Replace "▁", ByteFallback, Fuse,
    Strip) or a Metaspace one (Mistral's, Gemma's kind)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    words = ["▁hello", "▁world", "▁caf"]
    letters = sorted({c for word in words for c in word[1:]})
    merges = [(word[:i], word[i]) for word in words for i in range(1, len(word))]
    pieces = [*SPECIAL_PIECES, *(f"<0x{b:02X}>" for b in range(256)), "▁", *letters,
              *(left + right for left, right in merges)]
    tokenizer = Tokenizer(models.BPE({piece: i for i, piece in enumerate(pieces)}, merges, unk_token="<unk>",
                                     byte_fallback=True, fuse_unk=True))
    if decoder == "llama":
        tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                               decoders.Strip(" ", 1, 0)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
    tokenizer.add_special_tokens([AddedToken(piece, special=True, normalized=False) for piece in SPECIAL_PIECES])
    return tokenizer


@pytest.mark.parametrize("decoder", ["llama", "metaspace"])
@pytest.mark.parametrize("wrapping", ["tokenizers", "transformers", "mlx-lm"])
def test_token_bytes_of_sentencepiece_tokens_keep_their_spaces_and_fallback_bytes(decoder, wrapping):
    from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer, TokenizerWrapper
    from transformers import PreTrainedTokenizerFast

    from emlx_async.llm.text import PromptEncoder

    backend = sentencepiece_tokenizer(decoder)
    tokenizer = backend
    if wrapping != "tokenizers":
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                            eos_token="</s>")
    if wrapping == "mlx-lm":
        tokenizer = TokenizerWrapper(tokenizer, SPMStreamingDetokenizer)
    encoder = PromptEncoder(tokenizer, bos_id=backend.token_to_id("<s>"), chat_template=None, vocab_size=None)
    text = "hello world  café"
    ids = backend.encode(text, add_special_tokens=False).ids
    assert [backend.id_to_token(t) for t in ids] == ["▁hello", "▁world", "▁", "▁caf", "<0xC3>", "<0xA9>"]
    # The tokenizer marks the text's start as a word's ("▁hello"): one space more than the text.
    assert b"".join(encoder.token_bytes(t) for t in ids) == b" " + text.encode()
    assert encoder.token_bytes(backend.token_to_id("▁world")) == b" world"
    assert encoder.token_bytes(backend.token_to_id("<0xC3>")) == b"\xc3"
    for special in SPECIAL_PIECES:  # the added vocabulary's tokens stay their decode
        token = backend.token_to_id(special)
        assert encoder.token_bytes(token) == tokenizer.decode([token]).encode()


# ---- encoding a long text without one long hold of the GIL ------------------------

ENCODE_TABLE = [
    "",
    "plain words, then punctuation!?",
    "Café 🎉 naïve — 東京 ok, ünïcödé déjà vu",     # multi-byte characters, some split over tokens
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",  # special-token text: tokens where it is parsed
    "<|im_start|x <|im_end  |im_start|> <|<|im_end|>|>",  # special-token look-alikes around real ones
    "   leading spaces, trailing spaces   \n\n\n\t tabs\r\n",
    "unbreakablewordwithnospacesatall" * 40,       # a long word: merges across any piece
    "1234567890" * 30 + " 3.14159e-10 0x1F",
    '{"type": "function", "function": {"name": "f", "parameters": {"a": [1, 2]}}}',
]


@needs_model
@pytest.mark.parametrize("text", ENCODE_TABLE)
def test_encode_text_gives_the_tokenizers_own_ids(gguf_tokenizer, text):
    from emlx_async.llm.text import PromptEncoder, encode_text

    assert encode_text(gguf_tokenizer, text) == gguf_tokenizer.encode(text, add_special_tokens=False).ids
    encoder = PromptEncoder(gguf_tokenizer, bos_id=None, chat_template=None, vocab_size=None)
    plain = encoder._encode_plain(text)  # special-token text kept as text, through the same call
    assert plain == encoder._plain_tokenizer.encode(text, add_special_tokens=False).ids
    assert ("<|im_end|>" in text) == (plain != encode_text(gguf_tokenizer, text))


@needs_model
def test_encode_text_gives_the_tokenizers_own_ids_for_any_text(gguf_tokenizer):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from emlx_async.llm.text import encode_text

    pieces = st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|", "|>", " ", "\n", "é", "東",
                              "🎉", "word", "'s", "12"])
    texts = st.lists(st.one_of(st.text(max_size=12), pieces), max_size=30).map("".join)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(texts)
    def check(text):
        assert encode_text(gguf_tokenizer, text) == gguf_tokenizer.encode(text, add_special_tokens=False).ids

    check()


def _longest_pause(function) -> tuple[float, float]:
    """(the longest a ticking Python thread waited for the GIL while `function` ran, how long it ran)."""
    import threading
    import time

    pauses, done = [0.0], threading.Event()

    def tick():
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            pauses.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        time.sleep(0.02)
        started = time.perf_counter()
        function()
        took = time.perf_counter() - started
    finally:
        done.set()
        ticker.join()
    return max(pauses), took


@needs_model
def test_a_long_text_encodes_without_holding_the_gil_throughout(gguf_tokenizer):
    """About 1 MB of tools JSON (what a fallback system prompt carries) is one call into the
    tokenizer, ~0.6 s; another thread (the event loop's) must get the GIL meanwhile."""
    import json

    from emlx_async.llm.text import PromptEncoder, encode_text

    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": f"tool {i}: café 東京 🎉",
                                                "parameters": {"type": "object", "properties": {"a": {}}}}}
             for i in range(4000)]
    text = json.dumps(tools, ensure_ascii=False)
    encoder = PromptEncoder(gguf_tokenizer, bos_id=None, chat_template=None, vocab_size=None)
    for encode in (lambda: encode_text(gguf_tokenizer, text), lambda: encoder._encode_plain(text)):
        pause, took = _longest_pause(encode)
        assert took > 0.2, f"the encode took {took:.2f}s: too quick to show anything"
        assert pause < took / 4, f"another thread waited {pause:.2f}s for the GIL in a {took:.2f}s encode"


def _longest_stop_prefix(text: str, stop: list[str]) -> int:
    """The definition, by brute force: the longest suffix of `text` that starts a stop string."""
    return max((n for s in stop for n in range(min(len(s) - 1, len(text)) + 1) if s.startswith(text[len(text) - n:])),
               default=0)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab !", max_size=40), stop=st.lists(st.text(alphabet="ab !", min_size=1, max_size=12),
                                                                  min_size=1, max_size=4))
def test_the_held_back_text_is_the_longest_suffix_that_starts_a_stop_string(text, stop):
    from emlx_async.llm.text import stop_prefix_len

    assert stop_prefix_len(text, stop) == _longest_stop_prefix(text, stop)


def test_an_empty_stop_string_holds_nothing_back():
    from emlx_async.llm.text import stop_prefix_len

    assert stop_prefix_len("abc", ["", "c!"]) == 1 and stop_prefix_len("abc", [""]) == 0


def test_holding_back_text_for_a_long_stop_string_costs_little_per_token():
    """The service's longest stop string, written almost whole (a run of one character, the
    worst case): a token's check stays far under a millisecond-scale budget."""
    import time

    from emlx_async.llm.text import stop_prefix_len
    from emlx_async.serve.protocol import MAX_STOP_CHARS

    stop = [" " * (MAX_STOP_CHARS - 1) + "!", "x" * MAX_STOP_CHARS]
    text = " " * (MAX_STOP_CHARS - 1)
    start = time.perf_counter()
    for _ in range(100):
        assert stop_prefix_len(text, stop) == MAX_STOP_CHARS - 1
    assert (time.perf_counter() - start) / 100 < 0.005


@needs_model
def test_an_id_outside_the_vocabulary_is_named_short_however_large(gguf_tokenizer):
    from emlx_async.llm.text import PromptEncoder

    encoder = PromptEncoder(gguf_tokenizer, bos_id=None, chat_template=None, vocab_size=49152)
    for ids, named in (([1, 49152], "token id 49152 "), ([-3, 5], "token id -3 "),
                       ([10 ** 300], "token id <an integer of 997 bits> "),
                       ([-(10 ** 4000)], "token id <an integer of 13288 bits> ")):
        with pytest.raises(ValueError) as caught:
            encoder.encode(prompt=ids)
        assert str(caught.value).startswith(named) and len(str(caught.value)) < 100, str(caught.value)[:200]


@needs_model
def test_prompt_token_ids_are_ints_bools_refused_numpy_integers_taken(gguf_tokenizer):
    import numpy as np

    from emlx_async.llm.text import PromptEncoder

    encoder = PromptEncoder(gguf_tokenizer, bos_id=None, chat_template=None, vocab_size=49152)
    # [True, True] passed as ids 1, 1 in a bool array, which MLX's embedding refused as bool indices.
    for prompt, at in (([True, True], "bool at index 0"), ([5, 2.0], "float at index 1"), ([5, "6"], "str at index 1")):
        with pytest.raises(TypeError, match=f"prompt token ids must be ints, got {at}"):
            encoder.encode(prompt)
    ids = encoder.encode([np.int64(5), np.uint16(6), 7])
    assert ids == [5, 6, 7] and all(type(t) is int for t in ids)
    with pytest.raises(ValueError, match="token id 49152 is outside the vocabulary"):
        encoder.encode([np.int32(49152)])


@needs_model
def test_text_with_a_lone_surrogate_is_refused_by_name(gguf_tokenizer):
    from emlx_async.llm.text import PromptEncoder

    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    encoder = PromptEncoder(gguf_tokenizer, bos_id=None, chat_template=template, vocab_size=49152)
    # The tokenizer's TypeError named nothing: "TextEncodeInput must be Union[TextInputSequence, ...]".
    with pytest.raises(ValueError, match=r"no UTF-8 form: '\\ud800' \(a lone surrogate\) at index 2"):
        encoder.encode("hi\ud800")
    with pytest.raises(ValueError, match="no UTF-8 form"):
        encoder.encode(messages=[{"role": "user", "content": "a\udfff"}])
    assert encoder.encode("hi \U0001F600") == gguf_tokenizer.encode("hi \U0001F600", add_special_tokens=False).ids


@needs_model
def test_token_bytes_refuses_ids_outside_the_vocabulary(gguf_tokenizer):
    import numpy as np

    from emlx_async.llm.text import PromptEncoder

    encoder = PromptEncoder(gguf_tokenizer, bos_id=None, chat_template=None, vocab_size=49152)
    # 49152 gave b"" (cached: one entry per id asked), -1 and 2**63 OverflowError, True the bytes of id 1.
    for bad in (49152, -1, 10**30):
        with pytest.raises(ValueError, match="is outside the vocabulary"):
            encoder.token_bytes(bad)
    for bad in (True, 1.5, "5", None):
        with pytest.raises(TypeError, match="a token id must be an int"):
            encoder.token_bytes(bad)
    assert encoder.token_bytes(np.int64(3575)) == encoder.token_bytes(3575) == b" capital"
    assert len(encoder._token_bytes) == 1
