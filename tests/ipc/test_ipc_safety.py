"""Shared memory under hostile or unlucky conditions: bad shapes, shrinking
senders, foreign segments, permissions, cancellation, a full filesystem.

Cases that used to crash the process run in a fresh interpreter, and each
checks that a normal job on the queue still works after the error.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import textwrap
import time

import _posixshmem
import anyio
import mlx.core as mx
import numpy as np
import pytest

import emlx_async as ea
from support.helpers import Awaiter, on_every_loop

SHM_DIR = "/dev/shm"  # where Linux lists POSIX shared memory objects


def run_python(code: str, timeout: float = 120, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*(prefix or []), sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout)


def our_segments(pid: int) -> list[str]:
    if not os.path.isdir(SHM_DIR):
        pytest.skip("no listing of POSIX shared memory objects on this system")
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(f"emlx-{pid}-"))


def segment_exists(name: str) -> bool:
    try:
        fd = _posixshmem.shm_open(name, os.O_RDONLY, 0)
    except FileNotFoundError:
        return False
    os.close(fd)
    return True


def test_from_shm_checks_every_dimension_and_the_byte_size():
    result = run_python("""
        import asyncio
        import mlx.core as mx
        import emlx_async as ea

        async def main():
            small, _ = await ea.ipc.to_shm(mx.zeros(4, dtype=mx.float32))
            try:
                y = await ea.ipc.from_shm(small, (2**32 + 4,), mx.float32)
                print("accepted shape", y.shape, flush=True)
            except OverflowError as exc:
                print("dimension:", exc, flush=True)
            name, _ = await ea.ipc.to_shm(mx.zeros(4096, dtype=mx.uint8))
            try:
                y = await ea.ipc.from_shm(name, [1235045764, 1867010176, 8], mx.uint8)  # 2**64 + 4096 elements
                print("accepted", y.shape, flush=True)
                print(y.sum().item(), flush=True)
            except OverflowError as exc:
                print("bytes:", exc, flush=True)
            for bad in [(-1, 4), (2**31,), (2**63,), (1.5,)]:
                try:
                    await ea.ipc.from_shm(name, bad, mx.uint8)
                except (ValueError, OverflowError, TypeError) as exc:
                    builtin = next(c for c in type(exc).__mro__ if c.__module__ == "builtins")
                    print(f"{type(exc).__name__}/{builtin.__name__}", exc, flush=True)
            # Refused shapes leave the segments alone: the right ones still read.
            assert (await ea.ipc.from_shm(small, (4,), mx.float32)).tolist() == [0.0] * 4
            assert (await ea.ipc.from_shm(name, (64, 64), mx.uint8)).shape == (64, 64)
            print("next job", (await ea.ops.add(mx.ones(3), 1.0)).tolist(), flush=True)

        asyncio.run(main())
    """)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    assert re.match(r"dimension: .*dimension 0 .*4294967300.*int32", lines[0]), lines
    assert re.match(r"bytes: .*18446744073709555712 elements", lines[1]), lines
    assert lines[2].startswith("InvalidArgument/ValueError") and "negative" in lines[2], lines
    assert lines[3].startswith("MLXOverflowError/OverflowError") and "2147483648" in lines[3], lines
    assert lines[4].startswith("MLXOverflowError/OverflowError"), lines
    assert lines[5].startswith("InvalidArgumentType/TypeError") and "[from_shm] shape" in lines[5], lines
    assert lines[6] == "next job [2.0, 2.0, 2.0]"


def test_from_shm_survives_a_sender_that_shrinks_the_segment():
    # A thread plays the sender: it holds an fd on the segment and truncates it
    # as soon as from_shm has unlinked the name, i.e. while it reads.
    result = run_python("""
        import asyncio, os, threading
        import _posixshmem
        import mlx.core as mx
        import emlx_async as ea

        def shrink_when_unlinked(name, fd, done):
            while not done.is_set():
                try:
                    os.close(_posixshmem.shm_open(name, os.O_RDONLY, 0))
                except FileNotFoundError:
                    os.ftruncate(fd, 0)
                    return

        async def main():
            x = mx.ones((32 * 1024 * 1024,), dtype=mx.float32)  # 128 MiB: the read takes a while
            outcomes = []
            while len(outcomes) < 8 and not any("shrank" in o for o in outcomes):  # a slow thread may miss
                name, _ = await ea.ipc.to_shm(x)
                fd = _posixshmem.shm_open(name, os.O_RDWR, 0)
                done = threading.Event()
                sender = threading.Thread(target=shrink_when_unlinked, args=(name, fd, done))
                sender.start()
                try:
                    y = await ea.ipc.from_shm(name, x.shape, mx.float32)
                    outcomes.append("read")
                except ea.ipc.SharedMemoryError as exc:
                    outcomes.append(str(exc))
                done.set()
                sender.join()
                os.close(fd)
            for outcome in outcomes:
                print(outcome, flush=True)
            print("next job", (await ea.ops.add(mx.ones(3), 1.0)).tolist(), flush=True)

        asyncio.run(main())
    """)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    *outcomes, last = result.stdout.splitlines()
    assert last == "next job [2.0, 2.0, 2.0]"
    assert any("shrank while being read" in o for o in outcomes), outcomes
    assert all("shrank while being read" in o or o == "read" for o in outcomes), outcomes


@on_every_loop
async def test_from_shm_refuses_segments_that_are_not_ours(rt):
    # Another program's segment, named as multiprocessing names its own (its
    # SharedMemory class would start a resource tracker, so it is made here).
    foreign = f"/psm_{secrets.token_hex(4)}"
    fd = _posixshmem.shm_open(foreign, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 16)
        for name in [foreign, foreign[1:]]:
            with pytest.raises(ValueError, match="not an emlx_async shared-memory name"):
                await ea.ipc.from_shm(name, (4,), mx.float32)
            with pytest.raises(ValueError, match="not an emlx_async shared-memory name"):
                ea.ipc.shm_unlink(name)
        assert segment_exists(foreign)  # neither opened nor unlinked
    finally:
        os.close(fd)
        _posixshmem.shm_unlink(foreign)
    for name in ["/emlx-", "/emlx-a/b", "emlx-abc", "/emlx-" + "a" * 300, "/emlx-\u00e9"]:
        with pytest.raises(ValueError, match="not an emlx_async shared-memory name"):
            await ea.ipc.from_shm(name, (4,), mx.float32)

    # Our prefix, but writable by others: someone else may have written it.
    name = f"/emlx-{os.getpid()}-{secrets.token_hex(16)}"
    fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 16)
        os.fchmod(fd, 0o666)
        with pytest.raises(ea.ipc.SharedMemoryError, match="writable by group or others"):
            await ea.ipc.from_shm(name, (4,), mx.float32)
        assert segment_exists(name)
    finally:
        os.close(fd)
        _posixshmem.shm_unlink(name)
    assert (await ea.ops.add(mx.ones(2), 1.0)).tolist() == [2.0, 2.0]


def _wake_a_blocked_reader(fifo: str) -> None:
    """Open `fifo` for writing once, so a reader blocked opening it goes on (nothing when none waits)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


@on_every_loop
async def test_from_shm_refuses_a_fifo_or_directory_under_our_name_at_once(rt):
    if not os.path.isdir(SHM_DIR):
        pytest.skip("no listing of POSIX shared memory objects on this system")
    name = f"/emlx-{os.getpid()}-{secrets.token_hex(16)}"
    path = os.path.join(SHM_DIR, name[1:])
    os.mkfifo(path, 0o600)
    try:
        # Opened blocking, a FIFO held the worker until some writer came: for ever.
        with anyio.fail_after(10):
            with pytest.raises(ea.ipc.SharedMemoryError, match="is not a shared-memory object"):
                await ea.ipc.from_shm(name, (4,), mx.float32)
    finally:
        _wake_a_blocked_reader(path)
        os.unlink(path)
    os.mkdir(path, 0o700)
    try:
        with pytest.raises(ea.ipc.SharedMemoryError, match="is not a shared-memory object"):
            await ea.ipc.from_shm(name, (4,), mx.float32)
    finally:
        os.rmdir(path)
    assert (await ea.ops.add(mx.ones(2), 1.0)).tolist() == [2.0, 2.0]


def _mode(name: str) -> int:
    fd = _posixshmem.shm_open(name, os.O_RDONLY, 0)
    try:
        return stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


@on_every_loop
async def test_to_shm_creates_owner_only_segments_with_random_names(rt):
    x = mx.arange(6, dtype=mx.float32)
    old_umask = os.umask(0)  # the mode must not depend on the umask
    try:
        names = [(await ea.ipc.to_shm(x))[0] for _ in range(3)]
        wider, _ = await ea.ipc.to_shm(x, 0o644)
    finally:
        os.umask(old_umask)
    try:
        for name in names:
            assert re.fullmatch(rf"/emlx-{os.getpid()}-[0-9a-f]{{32}}", name), name
            assert _mode(name) == 0o600
        assert len(set(names)) == 3
        assert _mode(wider) == 0o644
    finally:
        for name in [*names, wider]:
            ea.ipc.shm_unlink(name)

    for bad in [0o666, 0o620, 0o602, 0o700, 0o400, 0o4600, -1]:
        with pytest.raises(ValueError, match="permissions"):
            await ea.ipc.to_shm(x, bad)
    for bad in ["/mine", "emlx-x", "/emlx-a/b", "/psm_123"]:
        with pytest.raises(ValueError, match="not an emlx_async shared-memory name"):
            await ea.ipc.to_shm(x, name=bad)
    chosen = f"/emlx-test-{secrets.token_hex(8)}"
    assert (await ea.ipc.to_shm(x, name=chosen)) == (chosen, 24)
    try:
        assert _mode(chosen) == 0o600
        # O_EXCL: an existing name is never reused, and the message is the worker's own.
        with pytest.raises(ea.ipc.SharedMemoryError, match=r"cannot create '/emlx-test-[0-9a-f]+': File exists"):
            await ea.ipc.to_shm(x, name=chosen)
        y = await ea.ipc.from_shm(chosen, (6,), mx.float32)
        assert y.tolist() == list(range(6))
    finally:
        ea.ipc.shm_unlink(chosen)
    assert (await ea.ops.add(mx.ones(2), 1.0)).tolist() == [2.0, 2.0]


@on_every_loop
async def test_cancelled_exports_leave_no_segment(rt):
    pid = os.getpid()
    assert our_segments(pid) == []
    q = rt.default_queue()
    x = mx.ones((40 * 1024 * 1024,), dtype=mx.float32)  # 160 MiB: exports take a while
    await ea.eval(x)
    kept = []

    async def cancel_when(delay=None):
        async with anyio.create_task_group() as tg:
            export = Awaiter(tg, ea.ipc.to_shm(x))
            if delay is None:  # as soon as the export has created its segment
                while not our_segments(pid) and not export.done.is_set():
                    await anyio.sleep(0.0005)
            else:
                await anyio.sleep(delay)
            export.cancel()
        if export.outcome != "cancelled":  # finished before the cancel landed: the caller owns it
            kind, value = export.outcome
            assert kind == "ok", value
            kept.append(value[0])

    async with ea.bind(q):
        for _ in range(4):
            await cancel_when()
        async with anyio.create_task_group() as tg:
            for delay in [0, 0, 0.001, 0.01, 0.05, 0.1]:
                tg.start_soon(cancel_when, delay)
        for delay in [0.02, 0.05, 0.1, 0.2]:
            await cancel_when(delay)
    await q.synchronize()
    await q.run(lambda: None)  # every export job has finished
    for name in kept:
        ea.ipc.shm_unlink(name)
    assert our_segments(pid) == []
    assert (await q.run(lambda: 1 + 1)) == 2


@on_every_loop
async def test_export_finished_but_caller_cancelled_leaves_no_segment(rt):
    # The loop is blocked while the export finishes, then the caller is
    # cancelled before it sees the result: the name it never got is removed.
    pid = os.getpid()
    x = mx.ones((16 * 1024 * 1024,), dtype=mx.float32)  # 64 MiB: the export is seen running
    await ea.eval(x)
    async with anyio.create_task_group() as tg:
        export = Awaiter(tg, ea.ipc.to_shm(x))
        while not our_segments(pid):
            assert not export.done.is_set()
            await anyio.sleep(0.0005)
        (segment,) = our_segments(pid)
        deadline = time.monotonic() + 30
        while _size("/" + segment) < x.nbytes:  # blocks the loop: the worker writes and hands over
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.1)
        export.cancel()
    assert export.outcome == "cancelled"
    assert our_segments(pid) == []
    assert (await rt.default_queue().run(lambda: 3)) == 3


def _size(name: str) -> int:
    fd = _posixshmem.shm_open(name, os.O_RDONLY, 0)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def test_to_shm_errors_come_back_with_the_worker_message():
    # RLIMIT_FSIZE makes sizing the segment fail (Python ignores SIGXFSZ).
    result = run_python("""
        import asyncio, os, resource
        import mlx.core as mx
        import emlx_async as ea

        async def main():
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
            try:
                await ea.ipc.to_shm(mx.ones((1 << 20,), dtype=mx.float32))
            except ea.ipc.SharedMemoryError as exc:
                print("error:", exc, flush=True)
            left = [n for n in os.listdir("/dev/shm") if n.startswith(f"emlx-{os.getpid()}-")]
            print("left", left, flush=True)
            print("next job", (await ea.ops.add(mx.ones(3), 1.0)).tolist(), flush=True)

        asyncio.run(main())
    """)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    error, left, last = result.stdout.splitlines()
    assert re.match(r"error: \[to_shm\] cannot \w+ '/emlx-\d+-[0-9a-f]+': File too large", error), error
    assert left == "left []"
    assert last == "next job [2.0, 2.0, 2.0]"


def test_to_shm_reports_a_full_shm_filesystem():
    # A private, 1 MiB /dev/shm in a user and mount namespace, where one is allowed.
    unshare = shutil.which("unshare")
    if unshare is None or sys.platform != "linux":
        pytest.skip("needs unshare (util-linux) on Linux")
    prefix = [unshare, "--user", "--map-root-user", "--mount", "--", "sh", "-c",
              'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$@"', "sh"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private tmpfs here: {probe.stderr.strip()}")
    result = run_python("""
        import asyncio, os
        import mlx.core as mx
        import emlx_async as ea

        async def main():
            try:
                await ea.ipc.to_shm(mx.ones((1 << 20,), dtype=mx.float32))  # 4 MiB into 1 MiB
                print("exported", flush=True)
            except ea.ipc.SharedMemoryError as exc:
                print("error:", exc, flush=True)
            print("left", os.listdir("/dev/shm"), flush=True)
            name, n = await ea.ipc.to_shm(mx.ones((1024,), dtype=mx.float32))
            print("small", n, (await ea.ipc.from_shm(name, (1024,), mx.float32)).sum().item(), flush=True)
            print("next job", (await ea.ops.add(mx.ones(3), 1.0)).tolist(), flush=True)

        asyncio.run(main())
    """, prefix=prefix)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    error, left, small, last = result.stdout.splitlines()
    assert re.match(r"error: \[to_shm\] cannot write '/emlx-\d+-[0-9a-f]+': No space left on device", error), error
    assert left == "left []"
    assert small == "small 4096 1024.0"
    assert last == "next job [2.0, 2.0, 2.0]"


@on_every_loop
async def test_round_trip_keeps_values_of_every_layout(rt):
    # Views, offsets and many dtypes still arrive intact through the read path.
    base = mx.arange(2 * 3 * 5, dtype=mx.float32).reshape(2, 3, 5)
    for x in [base[:, 1:, ::2], base.astype(mx.int16).transpose(2, 0, 1), base.astype(mx.bfloat16)[1],
              mx.array(True), base.astype(mx.complex64)]:
        name, nbytes = await ea.ipc.to_shm(x)
        assert nbytes == x.nbytes
        y = await ea.ipc.from_shm(name, x.shape, x.dtype)
        assert y.dtype == x.dtype and y.shape == x.shape
        np.testing.assert_array_equal(np.array(y.astype(mx.float32) if x.dtype == mx.bfloat16 else y),
                                      np.array(x.astype(mx.float32) if x.dtype == mx.bfloat16 else x))
        assert not segment_exists(name)


@on_every_loop
async def test_from_shm_reads_on_a_worker_while_the_loop_runs(rt):
    x = mx.ones((32 * 1024 * 1024,), dtype=mx.float32)  # 128 MiB
    name, _ = await ea.ipc.to_shm(x)
    ticks = 0

    async def heartbeat():
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat)
        await anyio.sleep(0)
        before = ticks
        y = await ea.ipc.from_shm(name, x.shape, mx.float32)
        during = ticks - before
        tg.cancel_scope.cancel()
    assert during > 1  # the loop kept running while the worker read
    values = np.array(y)
    assert values.shape == x.shape and values.min() == values.max() == 1.0


@on_every_loop
async def test_the_shim_checks_names_shapes_and_permissions_itself(rt):
    # The C ABI refuses what the Python layer already refuses, without touching any segment.
    from emlx_async._native import ffi, lib, last_error

    out = mx.array(0)
    placeholder = ffi.cast("void*", id(out))
    for shape, code, message in [
        ([1235045764, 1867010176, 8], lib.EMLX_SHM_OVERFLOW, "byte size overflows"),
        ([2**32 + 4], lib.EMLX_SHM_OVERFLOW, "dimension 0 is 4294967300"),
        ([3, -1], lib.EMLX_SHM_BAD_VALUE, "negative dimension"),
    ]:
        status = lib.emlx_from_shm(b"/emlx-missing", ffi.new("int64_t[]", shape), len(shape), 0, placeholder)
        assert (status, message in last_error()) == (code, True), last_error()
    for name in [b"/psm_1", b"/emlx-", b"/emlx-a/b", b"/emlx-" + b"a" * 250]:
        status = lib.emlx_from_shm(name, ffi.new("int64_t[]", [1]), 1, 0, placeholder)
        assert status == lib.EMLX_SHM_BAD_VALUE and "not an emlx_async shared-memory name" in last_error()
        assert lib.emlx_shm_unlink(name) == lib.EMLX_SHM_BAD_VALUE
    x = mx.ones(4)
    await ea.eval(x)
    state, size = ffi.new("int*", lib.EMLX_SHM_RUNNING), ffi.new("size_t*")
    for permissions in [0o666, 0o700, 0o400, 0o1600]:
        name = f"/emlx-{os.getpid()}-{secrets.token_hex(16)}"
        status = lib.emlx_to_shm(ffi.cast("void*", id(x)), name.encode(), permissions, state, size)
        assert status == lib.EMLX_SHM_BAD_VALUE and "permissions" in last_error()
        assert not segment_exists(name)
    # An export whose caller already gave up creates nothing.
    assert lib.emlx_shm_give_up(state) == lib.EMLX_SHM_RUNNING
    name = f"/emlx-{os.getpid()}-{secrets.token_hex(16)}"
    assert lib.emlx_to_shm(ffi.cast("void*", id(x)), name.encode(), 0o600, state, size) == lib.EMLX_SHM_ABANDONED
    assert not segment_exists(name)


def test_data_ptr_refuses_what_is_not_an_mx_array():
    # The shim read a NumPy array (or any object) as an mx.array: SIGSEGV. In a child, as it was fatal.
    done = run_python("""
        import asyncio
        import mlx.core as mx
        import numpy as np
        import emlx_async as ea

        async def main():
            for x in (np.ones(3), [1.0], None, 3):
                try:
                    await ea.ipc.data_ptr(x)
                except TypeError as exc:
                    assert isinstance(exc, ea.EMLXError), exc
                    print("refused", type(x).__name__, exc)
            print("then", (await ea.ops.add(mx.ones(2), 1.0)).tolist())

        asyncio.run(main())
    """)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.count("refused") == 4 and "must be an mx.array, got ndarray" in done.stdout, done.stdout
    assert "then [2.0, 2.0]" in done.stdout
