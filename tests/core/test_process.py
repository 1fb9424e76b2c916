"""Process-level behaviour, each in a fresh interpreter: exit, fork, implicit runtime."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from support.helpers import run_python


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


# ---- fork: refuse at once where MLX would hang -------------------------------------

def _assert_quick_clean_exit(result: subprocess.CompletedProcess, elapsed: float, limit: float) -> None:
    assert result.returncode == 0, result.stderr
    assert elapsed < limit, f"took {elapsed:.1f}s"
    for noise in ("Traceback", "Fatal", "FATAL", "Exception ignored", "never retrieved", "terminate"):
        assert noise not in result.stderr, result.stderr


@pytest.mark.parametrize("parent_use", ["emlx_async", "plain mlx"])
def test_a_fork_child_of_a_process_that_used_mlx_refuses_a_runtime_at_once(parent_use):
    result = run_python(f"""
        import asyncio, os, signal, time
        import mlx.core as mx
        import emlx_async as ea

        async def use():
            assert (await ea.ops.add(mx.ones(3), 1.0)).tolist() == [2.0, 2.0, 2.0]

        if "{parent_use}" == "emlx_async":
            asyncio.run(use())
        else:
            mx.eval(mx.ones(3) + 1)
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)  # a hang ends the child instead of its parent's wait
            started = time.monotonic()
            try:
                asyncio.run(use())
            except ea.ForkedProcessError as exc:
                print("refused in %.1fs:" % (time.monotonic() - started), exc, flush=True)
                os._exit(0)
            os._exit(3)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status), flush=True)
    """, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "child exit 0" in result.stdout, result.stdout
    assert "refused in 0.0s" in result.stdout, result.stdout
    assert "'spawn'" in result.stdout and "'forkserver'" in result.stdout


def test_a_multiprocessing_fork_worker_gets_the_error_and_spawn_works(tmp_path):
    script = tmp_path / "fork_then_spawn.py"  # spawn re-imports the main module: it must be a file
    script.write_text(textwrap.dedent("""
        import asyncio, multiprocessing as mp
        import mlx.core as mx
        import emlx_async as ea

        def child(out):
            import signal
            signal.alarm(20)
            try:
                asyncio.run(ea.run(lambda: 1))
                out.put("ran")
            except ea.ForkedProcessError as exc:
                out.put("refused: " + str(exc))

        def spawned(out):
            async def main():
                return (await ea.ops.add(mx.ones(2), 1.0)).tolist()
            out.put(asyncio.run(main()))

        if __name__ == "__main__":
            asyncio.run(ea.run(lambda: mx.ones(2).sum()))  # the parent uses MLX
            for method, target in (("fork", child), ("spawn", spawned)):
                context = mp.get_context(method)
                out = context.Queue()
                process = context.Process(target=target, args=(out,))
                process.start()
                process.join(60)
                if process.is_alive():
                    process.kill()
                    print(method, "hung", flush=True)
                else:
                    print(method, process.exitcode, out.get(timeout=5), flush=True)
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "fork 0 refused:" in result.stdout and "spawn" in result.stdout, result.stdout
    assert "spawn 0 [2.0, 2.0]" in result.stdout, result.stdout


def test_a_fork_child_of_a_process_that_only_imported_mlx_can_use_it():
    result = run_python(f"""
        import asyncio, os, signal
        import mlx.core as mx
        import emlx_async as ea

        pid = os.fork()
        if pid == 0:
            signal.alarm(20)  # a hang ends the child instead of its parent's wait
            async def main():
                async with ea.Runtime():
                    return (await ea.ops.add(mx.ones(3), 1.0)).tolist()
            os._exit(0 if asyncio.run(main()) == [2.0, 2.0, 2.0] else 3)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status), flush=True)
    """, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "child exit 0" in result.stdout, (result.stdout, result.stderr)


# ---- exit: a running job is abandoned, as daemon threads are ---------------------

@pytest.mark.parametrize("loop", ["asyncio", "uvloop", "trio"])
@pytest.mark.parametrize("awaited", [False, True])
def test_the_end_of_a_run_abandons_a_running_python_job(loop, awaited):
    import time as clock

    started = clock.monotonic()
    result = run_python(f"""
        import asyncio, time
        import trio, uvloop
        import emlx_async as ea

        async def main():
            q = ea.get_runtime().default_queue()
            job = q.run(time.sleep, 20)
            queued = q.run(lambda: print("a queued job ran", flush=True))
            sleep = trio.sleep if "{loop}" == "trio" else asyncio.sleep
            if {awaited}:
                if "{loop}" == "trio":
                    with trio.move_on_after(0.3):
                        await job
                else:
                    try:
                        await asyncio.wait_for(job, 0.3)
                    except asyncio.TimeoutError:
                        pass
            else:
                await sleep(0.3)
            print("leaving", flush=True)

        {{"asyncio": asyncio.run, "uvloop": uvloop.run, "trio": trio.run}}["{loop}"](
            main if "{loop}" == "trio" else main())
        print("run ended", flush=True)
    """, timeout=60)
    _assert_quick_clean_exit(result, clock.monotonic() - started, 5.0)
    assert "leaving" in result.stdout and "run ended" in result.stdout
    assert "a queued job ran" not in result.stdout


def test_interpreter_exit_abandons_a_running_job_of_an_unclosed_runtime():
    import time as clock

    started = clock.monotonic()
    result = run_python("""
        import asyncio, time
        import emlx_async as ea

        async def main():
            rt = ea.Runtime()  # never closed: the exit hook finds its worker busy
            rt.default_queue().run(time.sleep, 20)
            await asyncio.sleep(0.3)

        asyncio.run(main())
        print("run ended", flush=True)
    """, timeout=60)
    _assert_quick_clean_exit(result, clock.monotonic() - started, 5.0)
    assert "run ended" in result.stdout


def test_the_end_of_a_run_abandons_a_running_native_job():
    import time as clock

    started = clock.monotonic()
    result = run_python("""
        import asyncio, time
        import mlx.core as mx
        import emlx_async as ea

        async def main():
            a = mx.random.normal((3000, 3000))
            mx.eval(a)
            product = ea.ops.matmul(a, a)  # many seconds on a small CPU
            await asyncio.sleep(0.3)
            print("leaving; done:", product.done(), flush=True)

        asyncio.run(main())
        print("run ended", flush=True)
    """, timeout=120)
    _assert_quick_clean_exit(result, clock.monotonic() - started, 10.0)
    assert "run ended" in result.stdout
