"""The cost of grammar-constrained decoding on SmolLM2's tokenizer (llguidance).

For a JSON schema, any JSON object, a regular expression and a Lark grammar:
the compile time (validation, then the matcher on the tokenizer; then a
cached copy), and per decode step the time to compute the next token mask
and to consume the sampled token (p50/p99), on random walks through the
grammar (each step takes a random allowed token, EOS as soon as it is
allowed, and starts over when the grammar is done). Then the cost of
applying the mask to the logits as MLX ops (packed, or unpacked on the
host), against the argmax it precedes; a batch's masks at once against one by one; and the thread hop
of computing a mask in the background.

With ``--engine``: constrained rows on the engine's replayed step (the masked
variant) against free rows, one stream and 8, in both modes, on the fast-step
tiny model (a random llama whose step is about 1 ms here, as a real model's is
on a GPU) and on SmolLM2: aggregate tokens/s (greedy, the best of
``--engine-rounds``), the ratio to the free rows (target >= 0.9), and per
constrained step the time the grammar spends in its thread (taking the token,
computing the mask) and the time the loop waits for that thread (the hop
included). Two grammars: a regex with no forced tokens (``[a-z ,.]+``: every
mask waits for its token) and the JSON schema below (its keys and
punctuation forced: planned ahead).

    python benchmarks/grammar.py [--steps 400] [--repeats 200] [--engine] [--engine-only]
                                 [--engine-tokens 64] [--smollm2-tokens 16] [--engine-rounds 3]
                                 [--engine-streams 1,8] [--engine-models fast,smollm2]

``--steps 40 --repeats 20`` is a quick check (well under a minute);
``--engine-only --engine-tokens 32 --smollm2-tokens 6 --engine-rounds 2`` the
engine section's quick form (about two minutes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import mlx.core as mx
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from emlx_async.llm import _gguf  # noqa: E402
from emlx_async.llm.grammar import Grammar, GrammarTokenizer, apply_token_mask, unpack_token_mask  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,12}\\.(com|org)$"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "email", "tags", "address", "role"],
    "additionalProperties": False,
}

LARK = r"""
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,6}/
"""

GRAMMARS = {
    "json schema (6 fields, nested)": lambda: Grammar.json_schema(SCHEMA),
    "any JSON object": Grammar.json_object,
    "regex (date, time, level, text)": lambda: Grammar.regex(
        r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2} (INFO|WARN|ERROR) [a-z ]{1,40}"),
    "lark (arithmetic)": lambda: Grammar.lark(LARK),
}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def us(seconds: float) -> str:
    return f"{seconds * 1e6:9.1f}"


def walk(tokenizer: GrammarTokenizer, grammar: Grammar, steps: int, rng: np.random.Generator):
    """(mask times, advance times, finished walks) over `steps` random steps."""
    eos = tokenizer.eos_ids[0]
    masks, advances, finished = [], [], 0
    matcher = tokenizer.matcher(grammar)
    for _ in range(steps):
        t0 = time.perf_counter()
        mask = matcher.mask()
        t1 = time.perf_counter()
        masks.append(t1 - t0)
        allowed = np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[:tokenizer.vocab_size])
        token = eos if eos in allowed else int(rng.choice(allowed))
        t0 = time.perf_counter()
        matcher.advance(token)
        advances.append(time.perf_counter() - t0)
        if token == eos or matcher.is_finished:
            finished += 1
            matcher = tokenizer.matcher(grammar)
    return masks, advances, finished


def timed(fn, repeats: int) -> list[float]:
    fn()  # warm up
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="decode steps walked per grammar")
    parser.add_argument("--repeats", type=int, default=200, help="repeats of each MLX timing")
    parser.add_argument("--engine", action="store_true", help="also constrained rows on the engine's replayed step")
    parser.add_argument("--engine-only", action="store_true", help="only the engine section")
    parser.add_argument("--engine-tokens", type=int, default=64, help="tokens per stream, fast-step model")
    parser.add_argument("--smollm2-tokens", type=int, default=16, help="tokens per stream, SmolLM2")
    parser.add_argument("--engine-rounds", type=int, default=3, help="rounds per row (the best kept)")
    parser.add_argument("--engine-streams", default="1,8", help="concurrent streams per row")
    parser.add_argument("--engine-models", default="fast,smollm2", help="the fast-step model, SmolLM2, or both")
    args = parser.parse_args()
    if not args.engine_only:
        grammar_engine(args)
    if args.engine or args.engine_only:
        import asyncio

        asyncio.run(engine_section(args))


def grammar_engine(args) -> None:
    import llguidance

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    _, meta = mx.load(_gguf.smollm2_path(), return_metadata=True)
    hf = _gguf.gguf_tokenizer(meta)
    _, eos = _gguf.gguf_special_ids(meta)
    t1 = time.perf_counter()
    tokenizer = GrammarTokenizer(hf, eos_ids=eos)
    t2 = time.perf_counter()
    print(f"llguidance {llguidance.__version__}, mlx {mx.__version__}, SmolLM2 tokenizer "
          f"(V={tokenizer.vocab_size}, mask {tokenizer.words} uint32 words), {os.cpu_count()} CPUs")
    print(f"tokenizer from the GGUF {1e3 * (t1 - t0):.0f} ms; GrammarTokenizer (once per engine) "
          f"{1e3 * (t2 - t1):.0f} ms\n")

    print(f"{'grammar':34} {'validate':>9} {'compile':>9} {'cached':>9} {'mask p50':>9} {'mask p99':>9} "
          f"{'mask max':>9} {'adv p50':>9} {'adv p99':>9}  walks done")
    print(f"{'':34} {'us':>9} {'us':>9} {'us':>9} {'us':>9} {'us':>9} {'us':>9} {'us':>9} {'us':>9}")
    all_masks = []
    for label, make in GRAMMARS.items():
        t0 = time.perf_counter()
        grammar = make()
        t1 = time.perf_counter()
        tokenizer.matcher(grammar)  # compiles (first use)
        t2 = time.perf_counter()
        tokenizer.matcher(grammar)  # a copy of the compiled one
        t3 = time.perf_counter()
        masks, advances, finished = walk(tokenizer, grammar, args.steps, rng)
        all_masks += masks
        print(f"{label:34} {us(t1 - t0)} {us(t2 - t1)} {us(t3 - t2)} {us(pct(masks, .5))} {us(pct(masks, .99))} "
              f"{us(max(masks))} {us(pct(advances, .5))} {us(pct(advances, .99))}  {finished}")
    print(f"{'all steps':34} {'':9} {'':9} {'':9} {us(pct(all_masks, .5))} {us(pct(all_masks, .99))} "
          f"{us(max(all_masks))}")

    # Applying the mask inside the step: the same argmax with and without it,
    # the mask packed ({B, W} uint32) or unpacked on the host ({B, V} bool).
    print(f"\nmask applied as MLX ops (apply_token_mask), then argmax; p50 of {args.repeats} repeats, us")
    print(f"{'rows':>4} {'argmax':>9} {'packed':>9} {'+cost':>9} {'bool':>9} {'+cost':>9} "
          f"{'host unpack':>12} {'np->mx bool':>12}")
    matcher = tokenizer.matcher(Grammar.json_schema(SCHEMA))
    one = matcher.mask()
    p = statistics.median
    for rows in (1, 8):
        logits = mx.random.normal((rows, tokenizer.vocab_size), key=mx.random.key(rows))
        packed_np = np.ascontiguousarray(np.broadcast_to(one, (rows, tokenizer.words)))
        packed = mx.array(packed_np)
        allowed_np = unpack_token_mask(packed_np, tokenizer.vocab_size)
        allowed = mx.array(allowed_np)
        mx.eval(logits, packed, allowed)
        plain = p(timed(lambda: mx.eval(mx.argmax(logits, axis=-1)), args.repeats))
        on_packed = p(timed(lambda: mx.eval(mx.argmax(apply_token_mask(logits, packed), axis=-1)), args.repeats))
        on_bool = p(timed(lambda: mx.eval(mx.argmax(apply_token_mask(logits, allowed), axis=-1)), args.repeats))
        unpack = p(timed(lambda: unpack_token_mask(packed_np, tokenizer.vocab_size), args.repeats))
        convert = p(timed(lambda: mx.eval(mx.array(allowed_np)), args.repeats))
        print(f"{rows:4} {us(plain)} {us(on_packed)} {us(on_packed - plain)} {us(on_bool)} {us(on_bool - plain)} "
              f"{us(unpack):>12} {us(convert):>12}")

    # A batch's masks: llguidance's pool at once, against one by one.
    grammar = Grammar.json_schema(SCHEMA)
    batch = [tokenizer.matcher(grammar) for _ in range(8)]
    for m in batch:  # a few tokens in, past the forced opening
        for token in hf.encode('{"name": "').ids:
            m.advance(token)

    def fresh(ms):
        for m in ms:
            m._mask = m._pending = None  # forget the computed mask: time the computation itself
        return ms

    together = timed(lambda: tokenizer.fill_masks(fresh(batch)), args.repeats)
    alone = timed(lambda: [m.mask() for m in fresh(batch)], args.repeats)
    inline = timed(lambda: fresh(batch[:1])[0].mask(), args.repeats)
    threaded = timed(lambda: fresh(batch[:1])[0].start_mask().result(), args.repeats)
    print(f"\n8 rows' masks inside a JSON string: fill_masks p50 {us(statistics.median(together)).strip()} us, "
          f"one by one {us(statistics.median(alone)).strip()} us")
    print(f"one mask on the calling thread p50 {us(statistics.median(inline)).strip()} us, through start_mask() "
          f"(a background thread) p50 {us(statistics.median(threaded)).strip()} us")
    tokenizer.close()


# ---- constrained rows on the engine's replayed step ------------------------------------

# Text that never has to end (EOS is allowed once accepting; greedy on these models
# does not take it), and no forced token: every mask waits for the token before it.
FREE_TEXT = "[a-z ,.]+"
ENGINE_GRAMMARS = {"regex": lambda: Grammar.regex(FREE_TEXT), "schema": lambda: Grammar.json_schema(SCHEMA)}


class MaskClock:
    """The grammar's time per constrained step, wrapped around the engine's mask planning
    (llm/constrained.py): inside its thread, and the loop's wait for it (the hop included)."""

    def __init__(self):
        from emlx_async.llm import batch_replay, constrained

        self.inside = self.waited = 0.0
        self._patched = [(constrained, "plan_masks"), (batch_replay, "batch_masks"),
                         (constrained.StreamMasks, "after"), (batch_replay.ReplayBatcher, "_grammar_round")]
        self._saved = [getattr(owner, name) for owner, name in self._patched]

    def __enter__(self) -> MaskClock:
        def inside(fn):
            def timed_fn(*args):
                t0 = time.perf_counter()
                try:
                    return fn(*args)
                finally:
                    self.inside += time.perf_counter() - t0
            return timed_fn

        def waited(fn):
            async def timed_fn(*args):
                t0 = time.perf_counter()
                try:
                    return await fn(*args)
                finally:
                    self.waited += time.perf_counter() - t0
            return timed_fn

        for (owner, name), fn in zip(self._patched, self._saved):
            setattr(owner, name, inside(fn) if name.endswith("masks") else waited(fn))
        return self

    def __exit__(self, *exc) -> None:
        for (owner, name), fn in zip(self._patched, self._saved):
            setattr(owner, name, fn)


async def engine_run(engine, prompts: list[list[int]], tokens: int, grammar) -> tuple[int, float]:
    """(tokens, wall seconds) of every prompt at once, greedy, constrained by `grammar()` if given."""
    import anyio

    counts = [0] * len(prompts)

    async def one(i):
        async for delta in engine.generate(prompts[i], max_tokens=tokens,
                                           grammar=grammar() if grammar else None):
            counts[i] += delta.token is not None

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    return sum(counts), time.perf_counter() - start


async def engine_model(label: str, engine, tokens: int, rounds: int, streams: list[int]) -> None:
    from _prompts import PROMPTS

    prompts = [engine.encode(p) for p in PROMPTS]
    print(f"\n{label}: engine step {engine.step_kind}; {tokens} tokens per stream, greedy, best of {rounds}")
    print(f"{'mode':8} {'N':>2} {'free tok/s':>10} " + " ".join(
        f"{name + ' tok/s':>12} {'ratio':>5} {'mask us':>8} {'wait us':>8}" for name in ENGINE_GRAMMARS))
    for mode in ("parallel", "batch"):
        engine.mode = mode  # the same model and traces; batch shapes are traced on first use
        for n in streams:
            batch = [prompts[i % len(prompts)] for i in range(n)]
            for grammar in (None, *ENGINE_GRAMMARS.values()):  # warm every shape this row takes
                await engine_run(engine, batch, 2, grammar)
            free = max(total / wall for total, wall in [await engine_run(engine, batch, tokens, None)
                                                        for _ in range(rounds)])
            cells = []
            for grammar in ENGINE_GRAMMARS.values():
                best, per_step = 0.0, (0.0, 0.0)
                for _ in range(rounds):
                    with MaskClock() as clock:
                        total, wall = await engine_run(engine, batch, tokens, grammar)
                    if total / wall > best:
                        best, per_step = total / wall, (clock.inside / total, clock.waited / total)
                cells.append(f"{best:12.1f} {best / free:5.2f} {1e6 * per_step[0]:8.1f} {1e6 * per_step[1]:8.1f}")
            print(f"{mode:8} {n:2} {free:10.1f} " + " ".join(cells), flush=True)
        await engine.wait_idle()


async def engine_section(args) -> None:
    import tempfile

    import emlx_async as ea
    from emlx_async.llm import Engine
    from _tiny_model import tiny_model_folder

    streams = [int(n) for n in args.engine_streams.split(",")]
    models = args.engine_models.split(",")
    async with ea.Runtime() as runtime:
        if "fast" in models:
            with tempfile.TemporaryDirectory() as folder:
                tiny_model_folder(folder)
                engine = await Engine.load(folder, runtime=runtime, max_concurrent=max(streams))
                await engine_model("fast step: tiny random llama (hidden 128, 2 layers, vocabulary 49152)", engine,
                                   args.engine_tokens, args.engine_rounds, streams)
                await engine.close()
        if "smollm2" in models:
            engine = await Engine.load(runtime=runtime, max_concurrent=max(streams))
            await engine_model("SmolLM2-135M", engine, args.smollm2_tokens, args.engine_rounds, streams)
            await engine.close()


if __name__ == "__main__":
    main()
