"""Finding mx.arrays inside the nested arguments and results of jobs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mlx.core as mx


def iter_arrays(tree: Any) -> Iterator[mx.array]:
    """Yield every mx.array in any nesting of lists, tuples and dicts."""
    if isinstance(tree, mx.array):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from iter_arrays(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from iter_arrays(item)
