"""A user's snippet that awaits ops type-checks under ``mypy --strict``.

The generated modules carry mlx's annotations with ``JobFuture[...]`` return
types and the package ships ``py.typed``; mlx ships its own stubs
(``mlx/core/*.pyi``), so ``mx.array`` is a real type and ``await`` gives it.
The snippet below says what mypy must report on each line (``# R:`` a
revealed type, ``# E:`` an error code), in the manner of mypy's own test
data; the test fails on any other report, missing or extra.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import emlx_async as ea

SNIPPET = '''
import mlx.core as mx
import emlx_async as ea


async def main(q: ea.CommandQueue) -> None:
    x = mx.ones((2, 3))
    s = await ea.ops.sum(x, 1)
    reveal_type(s)  # R: mlx.core.array
    z = await ea.ops.zeros((2, 2))
    reveal_type(z)  # R: mlx.core.array
    n = await ea.random.normal((2, 2), key=mx.random.key(0))
    reveal_type(n)  # R: mlx.core.array
    u = await ea.random.uniform(shape=(3,))
    reveal_type(u)  # R: mlx.core.array
    inverse = await ea.linalg.inv(z, stream=mx.cpu)
    reveal_type(inverse)  # R: mlx.core.array
    factors = await ea.linalg.qr(z, queue=q)
    reveal_type(factors)  # R: tuple[mlx.core.array, mlx.core.array]
    u, singular, vt = await ea.linalg.svd(z, stream=mx.cpu)
    reveal_type(singular)  # R: mlx.core.array
    parts = await ea.ops.split(x, 3, 1)
    reveal_type(parts)  # R: list[mlx.core.array]
    spectrum = await ea.fft.rfft(x, lazy=True)
    reveal_type(spectrum)  # R: mlx.core.array
    path = await ea.ops.einsum_path("ij,jk->ik", x, x.T)
    reveal_type(path)  # R: tuple[list[tuple[int, int]], str]
    w_q, scales, *biases = await ea.ops.quantize(mx.ones((4, 64)), 64, 4)
    reveal_type(w_q)  # R: mlx.core.array
    await ea.ops.sum(x, axiz=1)  # E: call-arg
    await ea.ops.zeros((2, 2), dtype="float32")  # E: arg-type
    await ea.ops.sum(x, 1, nowait="yes")  # E: arg-type
    not_an_array: int = await ea.ops.zeros((2,))  # E: assignment
'''

_EXPECTED = re.compile(r"#\s*(R|E): (.+)$")
# "snippet.py:8: note: Revealed type is "mlx.core.array"" / "snippet.py:9: error: ...  [call-arg]"
_REVEALED = re.compile(r'^snippet\.py:(\d+): note: Revealed type is "(.+)"$')
_ERROR = re.compile(r"^snippet\.py:(\d+): error: .*\[([a-z-]+)\]$")


def test_awaited_ops_type_check_under_mypy_strict(tmp_path: Path) -> None:
    source = textwrap.dedent(SNIPPET).lstrip()
    (tmp_path / "snippet.py").write_text(source)
    package_root = Path(ea.__file__).resolve().parent.parent
    # emlx_async is found by path whether it is installed as a wheel, editable or
    # not at all, and its own modules are analysed but not reported on, which is
    # what mypy does with any installed package: only the user's snippet is
    # held to --strict.
    (tmp_path / "mypy.ini").write_text(f"[mypy]\nmypy_path = {package_root}\n\n"
                                       "[mypy-emlx_async.*]\nfollow_imports = silent\n")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", "mypy.ini", "--cache-dir",
         str(tmp_path / "mypy_cache"), "--no-error-summary", "--hide-error-context", "snippet.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert not result.stderr.strip(), result.stderr

    expected = set()
    for number, line in enumerate(source.splitlines(), start=1):
        marker = _EXPECTED.search(line)
        if marker:
            expected.add((number, marker.group(1), marker.group(2).strip()))
    reported = set()
    for line in result.stdout.splitlines():
        if revealed := _REVEALED.match(line):
            # mypy before 2.0 spells builtins out ("builtins.list[...]")
            reported.add((int(revealed.group(1)), "R", revealed.group(2).replace("builtins.", "")))
        elif error := _ERROR.match(line):
            reported.add((int(error.group(1)), "E", error.group(2)))
        elif ": note: " not in line:  # notes that explain an error ("defined here") are fine
            reported.add((0, "?", line))
    assert reported == expected, (f"missing: {sorted(expected - reported)}\n"
                                  f"unexpected: {sorted(reported - expected)}\n{result.stdout}")
    assert result.returncode == 1  # the four planted errors
