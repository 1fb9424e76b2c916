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

    python benchmarks/grammar.py [--steps 400] [--repeats 200]

``--steps 40 --repeats 20`` is a quick check (well under a minute).
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
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
