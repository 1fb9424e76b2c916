"""schemathesis hooks for the service's schema run (tests/test_serve_schemathesis.py):
generated requests stay cheap on a CPU: a valid max_tokens above 2 becomes 2
(JSON Schema counts 5.0 as an integer, so floats too). Values past the
documented maximum (EMLX_SCHEMA_MAX_TOKENS) are left for the server to refuse."""

import numbers
import os

import schemathesis

MAXIMUM = float(os.environ.get("EMLX_SCHEMA_MAX_TOKENS", "inf"))


@schemathesis.hook
def map_body(context, body):
    if isinstance(body, dict):
        for name in ("max_tokens", "max_completion_tokens"):
            value = body.get(name)
            if isinstance(value, numbers.Real) and not isinstance(value, bool) and 2 < value <= MAXIMUM \
                    and float(value).is_integer():
                body[name] = 2
    return body
