"""Random JSON schemas whose every instance is short, for constrained decoding on random models."""

from __future__ import annotations

import random


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A JSON schema whose every instance is short: strings, arrays and numbers are bounded."""
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const"]
    if depth < 2:
        kinds += ["array", "object", "object", "anyOf"]
    kind = rng.choice(kinds)
    if kind == "string":
        if rng.random() < 0.3:
            return {"type": "string", "pattern": rng.choice(["^[a-z]{1,4}$", "^[0-9]{2,3}-[A-Z]$", "^(yes|no)$"])}
        high = rng.randint(0, 6)
        return {"type": "string", "minLength": rng.randint(0, high), "maxLength": high}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 500)}
    if kind == "number":
        return {"type": "number", "minimum": -10, "maximum": rng.choice([1, 10, 100])}
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", 3, 4.5, True, None, "a b"], rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(["fixed", 7, False, {"k": 1}])}
    if kind == "array":
        low = rng.randint(0, 2)
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": low,
                "maxItems": low + rng.randint(0, 2)}
    if kind == "object":
        names = rng.sample(["id", "name", "tags", "x", "y", "kind", "meta"], rng.randint(1, 3))
        return {"type": "object", "properties": {n: random_schema(rng, depth + 1) for n in names},
                "required": rng.sample(names, rng.randint(0, len(names))), "additionalProperties": False}
    return {"anyOf": [random_schema(rng, depth + 1), random_schema(rng, depth + 1)]}
