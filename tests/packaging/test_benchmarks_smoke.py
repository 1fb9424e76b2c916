"""The decode benchmark runs end to end (a few tokens; `make bench` runs it in full).

It reaches into the engine (the traced steps it times, the Python twin it
builds), so a change there that breaks the script fails here rather than on
the next benchmark run. Nothing is timed: the script's exit status and the
rows it prints are the check.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from support import ROOT
from support.helpers import needs_model

pytestmark = [pytest.mark.model, needs_model]

DECODE = ROOT / "benchmarks" / "decode.py"


@pytest.mark.timeout(300)
def test_decode_benchmark_runs_every_scenario_and_the_busy_loop_section():
    done = subprocess.run([sys.executable, str(DECODE), "--streams", "1", "--tokens", "2", "--no-trio",
                           "--busy-tokens", "2", "--busy-batch", "--no-fast"], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for row in ("(d) emlx_async parallel", "(e') batch, Python step", "100% in-process", "GIL per step"):
        assert row in done.stdout, done.stdout


@pytest.mark.timeout(300)
def test_decode_benchmarks_fast_step_section_runs_on_a_tiny_model_built_in_code():
    done = subprocess.run([sys.executable, str(DECODE), "--fast-only", "--fast-tokens", "2", "--fast-rounds", "1"],
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for row in ("fast step: tiny random llama", "(c) mlx-lm BatchGenerator", "(e') batch, Python step",
                "targets: batch replayed", "(i) batch, penalties", "penalized / plain replayed step"):
        assert row in done.stdout, done.stdout
