"""The core's refusals raise the package's classes, each still the builtin a caller catches.

One representative per kind: the package's own checks (InvalidArgument,
InvalidArgumentType, InvalidState) and the checks that mirror mlx (an MLX*
class or OptionTypeError, with mlx's message where mlx has one for the call).
"""

from __future__ import annotations

import asyncio

import mlx.core as mx
import pytest

import emlx_async as ea
from emlx_async import _errors, _op_table


def _raised(call):
    try:
        result = call()
        mx.eval(result)
    except Exception as exc:  # noqa: BLE001 - the outcome compared
        return exc
    raise AssertionError(f"{call} did not raise")


def test_the_packages_own_checks():
    cases = [
        (lambda: ea.memory.set_cache_limit(-1), ea.InvalidArgument, ValueError, "cache limit"),
        (lambda: ea.memory.set_cache_limit(True), ea.InvalidArgumentType, TypeError, "got a bool"),
        (lambda: ea.bind(5), ea.InvalidArgumentType, TypeError, "needs a CommandQueue"),
        (lambda: ea.get_runtime(), ea.InvalidState, RuntimeError, "needs a running event loop"),
        (lambda: _op_table.split_kind("nonsense"), ea.InvalidArgument, ValueError, "op spec"),
    ]
    for call, ours, builtin, words in cases:
        with pytest.raises(ours, match=words) as caught:
            call()
        assert isinstance(caught.value, builtin) and isinstance(caught.value, ea.EMLXError)


def test_checks_that_mirror_mlx_keep_its_class_and_message():
    small = mx.ones(2, dtype=mx.int8)

    async def main():
        async with ea.Runtime():
            calls = {  # (ours, mlx's) of the same call
                "an int past int64": (lambda: ea.ops.add(small, 2**70), lambda: mx.add(small, 2**70)),
                "an int past the dtype": (lambda: ea.ops.add(small, 300), lambda: mx.add(small, 300)),
                "a shape past int32": (lambda: ea.ops.zeros([2**31]), lambda: mx.zeros([2**31])),
                "an option's type": (lambda: ea.ops.softmax(small, precise=1), lambda: mx.softmax(small, precise=1)),
            }
            found = {}
            for label, (ours, theirs) in calls.items():
                want = _raised(theirs)
                try:
                    await ours()
                except Exception as exc:  # noqa: BLE001 - compared with mlx's below
                    got = exc
                else:
                    raise AssertionError(f"{label}: did not raise")
                assert isinstance(got, ea.EMLXError) and isinstance(got, type(want)), (label, got, want)
                assert str(got) == str(want), label
                found[label] = type(got)
            return found

    found = asyncio.run(main())
    assert found == {"an int past int64": ea.MLXRuntimeError, "an int past the dtype": ea.MLXValueError,
                     "a shape past int32": ea.MLXOverflowError, "an option's type": _errors.OptionTypeError}


def test_shared_memory_shapes_are_refused_by_the_packages_classes():
    async def main():
        async with ea.Runtime():
            name, _ = await ea.ipc.to_shm(mx.zeros(4, dtype=mx.uint8))
            for shape, ours, builtin in [((2**31,), ea.MLXOverflowError, OverflowError),
                                         ((-1,), ea.InvalidArgument, ValueError),
                                         ((1.5,), ea.InvalidArgumentType, TypeError)]:
                with pytest.raises(ours) as caught:
                    await ea.ipc.from_shm(name, shape, mx.uint8)
                assert isinstance(caught.value, builtin), shape
            with pytest.raises(ea.InvalidArgumentType, match="permissions"):
                await ea.ipc.to_shm(mx.zeros(4), "0o600")
            assert (await ea.ipc.from_shm(name, (4,), mx.uint8)).tolist() == [0] * 4

    asyncio.run(main())
