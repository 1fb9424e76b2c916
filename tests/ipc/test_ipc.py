"""Shared-memory export/import between processes, pointers and devices."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import mlx.core as mx
import numpy as np
import pytest

import emlx_async as ea
from support.helpers import on_every_loop


@on_every_loop
async def test_shm_round_trip_between_two_processes(rt):
    x = mx.arange(12, dtype=mx.float32).reshape(3, 4).T * 1.5  # a transposed view
    name, nbytes = await ea.ipc.to_shm(x)
    assert nbytes == 12 * 4
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import asyncio
        import mlx.core as mx
        import emlx_async as ea

        async def main():
            y = await ea.ipc.from_shm({name!r}, (4, 3), mx.float32)
            print(y.tolist())
            try:
                await ea.ipc.from_shm({name!r}, (4, 3), mx.float32)
            except ea.ipc.SharedMemoryError as exc:
                print("second open:", exc)

        asyncio.run(main())
    """)], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    first, second = child.stdout.strip().splitlines()
    np.testing.assert_array_equal(np.array(eval(first)), np.array(x))
    assert "no shared memory" in second  # unlinked as it was opened
    ea.ipc.shm_unlink(name)  # idempotent


@on_every_loop
async def test_from_shm_checks_size_and_in_process_round_trip(rt):
    x = mx.ones((2, 3), dtype=mx.bfloat16)
    name, _ = await ea.ipc.to_shm(x)
    with pytest.raises(ea.ipc.SharedMemoryError, match="holds 12 bytes, but the shape and dtype need 24"):
        await ea.ipc.from_shm(name, (2, 3), mx.float32)
    y = await ea.ipc.from_shm(name, (2, 3), mx.bfloat16)
    assert (await ea.ops.sum(y)).item() == 6
    empty_name, n = await ea.ipc.to_shm(mx.zeros((0, 3)))
    assert n == 0 and (await ea.ipc.from_shm(empty_name, (0, 3), mx.float32)).shape == (0, 3)


@on_every_loop
async def test_data_ptr_and_to_device(rt):
    x = await ea.ops.add(mx.zeros(4), 1.0, lazy=True)
    pointer = await ea.ipc.data_ptr(x)
    assert pointer == np.asarray(memoryview(x)).__array_interface__["data"][0]  # the same bytes
    y = await ea.ipc.to_device(x, "cpu")
    np.testing.assert_array_equal(np.array(y), np.ones(4))


@on_every_loop
async def test_from_numpy_reads_the_other_byte_order_and_refuses_what_mlx_has_no_array_of(rt):
    swapped = np.arange(6, dtype=">i8").reshape(2, 3)  # mlx fails on it (std::bad_cast)
    for copy in (True, False):
        got = ea.ipc.from_numpy(swapped, copy=copy)
        assert got.dtype == mx.int64 and got.tolist() == swapped.tolist()
    for value in (np.array(["a"]), np.array([np.datetime64("2020-01-01")]), np.array(3, dtype=object)):
        with pytest.raises(ea.InvalidInputType, match="Invalid type ndarray received in array initialization"):
            ea.ipc.from_numpy(value)


@on_every_loop
async def test_from_numpy_shares_or_copies(rt):
    import sys

    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    refs = sys.getrefcount(base)
    shared = ea.ipc.from_numpy(base, copy=False)
    copied = ea.ipc.from_numpy(base)
    assert await ea.ipc.data_ptr(copied) != base.ctypes.data
    # Whether MLX wraps the memory or copies it is the backend's choice
    # (this CPU build copies); either way the values and lifetimes are right.
    if await ea.ipc.data_ptr(shared) == base.ctypes.data:
        base[0, 0] = 100.0
        assert shared[0, 0].item() == 100.0
    total = await ea.ops.sum(shared, queue=rt.default_queue())  # usable on a worker thread
    assert total.item() == base.sum()
    strided = ea.ipc.from_numpy(base[:, ::2], copy=False)  # not contiguous: copied
    np.testing.assert_array_equal(np.array(strided), base[:, ::2])
    del shared, total
    import gc

    gc.collect()
    assert sys.getrefcount(base) == refs  # the owner reference is released with (or after copying) the array
