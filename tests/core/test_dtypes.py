"""The dtype table and the integer ranges (emlx_async/_dtypes.py): right, and stated once."""

from __future__ import annotations

import pathlib
import re

import mlx.core as mx
import numpy as np
import pytest

import emlx_async as ea
from emlx_async._dtypes import DTYPES, INT_RANGES, MAX_DIM

PACKAGE = pathlib.Path(ea.__file__).resolve().parent

# A literal integer bound of a C++ integer type: 2**31, 2 ** 63, 1 << 31, ...
_BOUND = re.compile(r"\b2\s*\*\*\s*(?:7|8|15|16|31|32|63|64)\b|\b1\s*<<\s*(?:31|32|63|64)\b")

# Core modules that still spell a bound themselves, each with its reason to go.
STILL_OWN = {
    "_adapters.py",  # arange's choice of int32 or int64 for its bounds
}


@pytest.mark.parametrize("dtype", [d for d in DTYPES if mx.issubdtype(d, mx.integer)], ids=str)
def test_every_integer_dtype_has_its_range(dtype):
    info = np.iinfo(np.dtype(str(dtype).rsplit(".", 1)[-1]))
    assert INT_RANGES[dtype] == (info.min, info.max)
    for bound in INT_RANGES[dtype]:  # mlx holds both ends in that dtype
        assert np.array(mx.array(np.array(bound, dtype=info.dtype))).item() == bound


def test_a_shape_entry_is_an_int32():
    assert MAX_DIM == np.iinfo(np.int32).max


def _spellers(package: pathlib.Path) -> set[str]:
    return {p.name for p in package.glob("*.py")
            if not p.name.startswith("_generated") and p.name != "_dtypes.py" and _BOUND.search(p.read_text())}


def test_integer_bounds_are_stated_in_dtypes_only():
    assert _spellers(PACKAGE) <= STILL_OWN, f"use _dtypes.INT_RANGES in: {sorted(_spellers(PACKAGE) - STILL_OWN)}"
    assert STILL_OWN <= _spellers(PACKAGE), f"fixed; remove from STILL_OWN: {sorted(STILL_OWN - _spellers(PACKAGE))}"


def test_the_check_sees_a_planted_bound(tmp_path):
    (tmp_path / "ipc.py").write_text("_INT32_MAX = 2**31 - 1\n")
    (tmp_path / "_host_call.py").write_text("_LIMIT = 1 << 62  # not a type's bound\n")
    (tmp_path / "_dtypes.py").write_text("X = 2**63\n")
    assert _spellers(tmp_path) == {"ipc.py"}
