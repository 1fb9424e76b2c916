"""Process-level behaviour, each in a fresh interpreter: exit, fork, implicit runtime."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout)


def test_exit_with_open_queues_and_running_jobs_does_not_hang():
    result = run_python("""
        import asyncio, time
        import mlx.core as mx
        import emlx_async as ea

        async def main():
            rt = ea.Runtime()
            q = rt.default_queue()
            q.run(time.sleep, 0.5)               # running Python job
            for _ in range(5):
                q.run(lambda: mx.ones((256, 256)) @ mx.ones((256, 256)))
            await asyncio.sleep(0.05)
            print("leaving", flush=True)

        asyncio.run(main())
    """, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "leaving" in result.stdout


def test_child_after_fork_gets_a_clear_error():
    result = run_python("""
        import asyncio, os
        import emlx_async as ea

        async def main():
            rt = ea.Runtime()
            q = rt.default_queue()
            assert await q.run(lambda: 1) == 1
            pid = os.fork()
            if pid == 0:
                try:
                    q.run(lambda: 2)
                except ea.ForkedProcessError as exc:
                    print("child:", exc, flush=True)
                    os._exit(0)
                os._exit(3)
            _, status = os.waitpid(pid, 0)
            print("child exit", os.waitstatus_to_exitcode(status), flush=True)
            await rt.close()

        asyncio.run(main())
    """)
    assert result.returncode == 0, result.stderr
    assert "child: this runtime was created in another process" in result.stdout
    assert "child exit 0" in result.stdout


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_implicit_runtime_closes_at_loop_shutdown(loop):
    result = run_python(f"""
        import asyncio, uvloop
        import mlx.core as mx
        import emlx_async as ea
        from emlx_async import testing

        async def main():
            x = await ea.run(lambda: mx.arange(5).sum())
            assert x.item() == 10
            assert testing.active_workers() == 1

        runner = asyncio.run if "{loop}" == "asyncio" else uvloop.run
        runner(main())
        runner(main())
        print("active after", testing.active_workers(), flush=True)
    """)
    assert result.returncode == 0, result.stderr
    assert "active after 0" in result.stdout
