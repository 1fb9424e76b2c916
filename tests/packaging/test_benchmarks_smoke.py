"""The decode and service benchmarks run end to end (a few tokens; `make bench` runs them in full).

The decode benchmark reaches into the engine (the traced steps it times, the
Python twin it builds), so a change there that breaks the script fails here
rather than on the next benchmark run. The service benchmark runs our server
only: vllm-mlx, several GB, is installed only when --servers names it, and
a failed install skips it. Nothing is timed: the scripts' exit status and
the rows they print are the check.
"""

from __future__ import annotations

import os
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
                "targets: batch replayed", "(i) batch, penalties", "penalized / plain replayed step",
                "constrained / unconstrained replayed step"):
        assert row in done.stdout, done.stdout


MOE = ROOT / "benchmarks" / "moe.py"


@pytest.mark.timeout(300)
def test_moe_benchmark_compares_both_steps_of_each_family_built_in_code():
    done = subprocess.run([sys.executable, str(MOE), "--hidden", "64", "--tokens", "2", "--rounds", "1"],
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for row in ("dbrx       python  (python)", "dbrx       replay  (replay)", "dbrx       replay / python",
                "qwen3_moe  replay  (replay)", "qwen3_moe  replay / python"):
        assert row in done.stdout, done.stdout


GRAMMAR = ROOT / "benchmarks" / "grammar.py"


@pytest.mark.timeout(300)
def test_grammar_benchmarks_engine_section_runs_constrained_rows_on_the_replayed_step():
    done = subprocess.run([sys.executable, str(GRAMMAR), "--engine-only", "--engine-models", "fast", "--engine-streams",
                           "1,2", "--engine-tokens", "2", "--engine-rounds", "1"], capture_output=True, text=True,
                          timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for row in ("fast step: tiny random llama", "engine step replay", "regex tok/s", "schema tok/s"):
        assert row in done.stdout, done.stdout
    rows = [line.split()[:2] for line in done.stdout.splitlines()]
    assert all(row in rows for row in (["parallel", "1"], ["parallel", "2"], ["batch", "1"], ["batch", "2"])), \
        done.stdout


SERVE = ROOT / "benchmarks" / "serve.py"


def test_serve_benchmark_leaves_vllm_mlx_out_unless_servers_names_it(tmp_path):
    helped = subprocess.run([sys.executable, str(SERVE), "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert "(default: auto,parallel,mlx-lm)" in " ".join(helped.stdout.split()), helped.stdout
    venv = tmp_path / "vllm-venv"
    done = subprocess.run([sys.executable, str(SERVE), "--servers", "parallel", "--clients", "1", "--requests", "1",
                           "--tokens", "2", "--vllm-venv", str(venv)], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "vllm-mlx: not in --servers, skipped" in done.stdout, done.stdout
    assert any(line.split()[:2] == ["parallel", "1"] for line in done.stdout.splitlines()), done.stdout
    assert not venv.exists()


def test_serve_benchmark_skips_vllm_mlx_with_a_message_when_its_install_fails(tmp_path):
    # No package index and no local wheels: what an offline machine gives pip.
    env = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1")
    venv = tmp_path / "vllm-venv"
    done = subprocess.run([sys.executable, str(SERVE), "--servers", "vllm-mlx", "--clients", "1", "--requests", "1",
                           "--tokens", "2", "--vllm-venv", str(venv)], capture_output=True, text=True, timeout=90,
                          env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "vllm-mlx: installing vllm-mlx==" in done.stdout, done.stdout
    assert "vllm-mlx: skipped, its install failed" in done.stdout, done.stdout
    assert not any(line.startswith("vllm-mlx ") for line in done.stdout.splitlines()), done.stdout  # no row
    assert not (venv / ".installed").exists()


def test_serve_benchmarks_constrained_rows_run_against_the_same_servers_free_rows():
    done = subprocess.run([sys.executable, str(SERVE), "--servers", "parallel", "--clients", "1", "--requests", "1",
                           "--tokens", "2", "--constrained"], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {tuple(line.split()[:2] + line.split()[9:10]): line for line in done.stdout.splitlines()}
    for kind in ("free", "schema", "tool"):
        assert ("parallel", "1", kind) in rows, done.stdout
    assert "schema kept 1/1" in rows[("parallel", "1", "schema")], done.stdout  # the answer opens a JSON object
    assert "constrained / free, the same server at the same N" in done.stdout, done.stdout
    ratios = [line.split() for line in done.stdout.split("constrained / free")[1].splitlines()]
    assert any(row[:2] == ["parallel", "1"] and row[2].endswith("x") and row[3].endswith("x") for row in ratios), \
        done.stdout
    bad = subprocess.run([sys.executable, str(SERVE), "--constrained", "regex"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--constrained takes schema, tool, got regex" in bad.stderr, bad.stderr
