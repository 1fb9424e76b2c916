"""Process-level behaviour, each in a fresh interpreter: exit, fork, implicit runtime."""

from __future__ import annotations

import platform
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


# The end of the fork scripts below: the child (its `use()` defined, `started` taken) exits 0
# once refused, 3 if it ran; the parent reports the child's exit.
_CHILD_REFUSED_OR_RAN = """
            try:
                asyncio.run(use())
            except ea.ForkedProcessError as exc:
                print("refused in %.1fs:" % (time.monotonic() - started), exc, flush=True)
                os._exit(0)
            os._exit(3)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status), flush=True)"""


def _assert_the_child_was_refused_at_once(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr
    assert "child exit 0" in result.stdout, result.stdout
    assert "refused in 0.0s" in result.stdout, result.stdout
    assert "'spawn'" in result.stdout and "'forkserver'" in result.stdout


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
{_CHILD_REFUSED_OR_RAN}
    """, timeout=60)
    _assert_the_child_was_refused_at_once(result)


@pytest.mark.parametrize("child_use", ["op", "runtime"])
def test_a_fork_child_of_a_plain_mlx_process_that_imports_emlx_async_only_there_is_refused(child_use):
    """No at-fork hook ran (the parent never imported emlx_async): the import itself finds the
    parent's stream threads missing. The op used to hang the loop thread for good."""
    result = run_python(f"""
        import asyncio, os, signal, time
        import mlx.core as mx

        mx.eval(mx.ones(3) + 1)  # plain MLX: the scheduler has a stream thread
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)  # a hang ends the child instead of its parent's wait
            import emlx_async as ea
            started = time.monotonic()
            async def use():
                if "{child_use}" == "runtime":
                    ea.Runtime()
                return await asyncio.wait_for(ea.ops.add(mx.ones(2), 1), 10)
{_CHILD_REFUSED_OR_RAN}
    """, timeout=60)
    _assert_the_child_was_refused_at_once(result)


def test_a_process_that_used_plain_mlx_on_many_streams_and_threads_is_not_taken_for_a_fork_child():
    """The import's check counts stream threads against live ones: many streams, made from
    other threads, with Python and native threads around, must not look like a fork child."""
    result = run_python("""
        import asyncio, threading
        import numpy as np
        import mlx.core as mx

        def evaluate_on_new_streams():
            for _ in range(3):
                mx.eval(mx.add(mx.ones(2), 1, stream=mx.new_stream(mx.cpu)))

        threads = [threading.Thread(target=evaluate_on_new_streams) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        mx.eval(mx.ones(3) + 1)
        np.ones((64, 64)) @ np.ones((64, 64))  # BLAS threads
        idle = threading.Event()
        waiting = [threading.Thread(target=idle.wait, daemon=True) for _ in range(4)]
        for thread in waiting:
            thread.start()

        import emlx_async as ea

        async def use():
            return (await ea.ops.add(mx.ones(2), 1)).tolist()

        print("got", asyncio.run(use()), flush=True)
        idle.set()
    """, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "got [2.0, 2.0]" in result.stdout, result.stdout


def test_a_fork_child_that_exits_normally_keeps_its_status_and_output_and_waits_for_no_worker():
    """The parent's workers have no thread in a fork child: its exit hook must not wait for
    them to leave their loops (it waited its whole 2 s timeout for each exit)."""
    result = run_python("""
        import asyncio, os, signal, sys, time
        import mlx.core as mx
        import emlx_async as ea

        async def use():
            assert (await ea.ops.add(mx.ones(3), 1.0)).tolist() == [2.0, 2.0, 2.0]

        asyncio.run(use())
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)  # a hang ends the child instead of its parent's wait
            print("child output", flush=False)  # flushed by the child's own exit
            sys.exit(7)
        _, status = os.waitpid(pid, 0)
        print("child exit %d in %.1fs" % (os.waitstatus_to_exitcode(status), time.monotonic() - started))
    """, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "child output" in result.stdout, result.stdout
    assert "child exit 7 in 0." in result.stdout, result.stdout


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


@pytest.mark.parametrize("parent", ["imported", "runtime closed", "runtime open", "job run"])
@pytest.mark.parametrize("child", ["exits", "uses a runtime"])
def test_a_fork_child_of_a_parent_that_never_evaluated_is_as_fast_as_a_plain_child(parent, child):
    """The parent's workers have no thread in the child: a new lease must not take a parked one
    (its jobs never ran) and the child's exit must not wait for them (it waited 2 s)."""
    result = run_python(f"""
        import asyncio, os, signal, sys, time
        import mlx.core as mx
        import emlx_async as ea

        async def start():
            rt = ea.Runtime()
            q = rt.default_queue()
            if "{parent}" == "job run":
                assert await q.run(lambda: 1) == 1  # a Python job: nothing evaluated on a stream
            if "{parent}" != "runtime open":
                await rt.close()
            return rt

        loop = asyncio.new_event_loop()
        if "{parent}" != "imported":
            runtime = loop.run_until_complete(start())
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)  # a hang ends the child instead of its parent's wait
            if "{child}" == "uses a runtime":
                async def use():
                    async with ea.Runtime():
                        return (await ea.ops.add(mx.ones(3), 1.0)).tolist()
                print("child got", asyncio.run(use()), flush=True)
            sys.exit(5)
        _, status = os.waitpid(pid, 0)
        print("child exit %d in %.3fs" % (os.waitstatus_to_exitcode(status), time.monotonic() - started))
    """, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "terminate" not in result.stderr, result.stderr
    exit_line = next(line for line in result.stdout.splitlines() if line.startswith("child exit"))
    assert exit_line.startswith("child exit 5 in "), result.stdout
    assert float(exit_line.split()[-1][:-1]) < 0.8, result.stdout  # a plain child: tens of ms; it was 2 s
    if child == "uses a runtime":
        assert "child got [2.0, 2.0, 2.0]" in result.stdout, result.stdout


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


@pytest.mark.parametrize("left", ["queued", "running"])
def test_runs_that_end_with_a_job_in_flight_reuse_the_abandoned_worker(left):
    """An abandoned worker parks, with its stream, once its job returns (at once if it only had
    queued jobs). MLX never frees a stream's thread: each worker left for good kept one OS
    thread, and the queue object, per run that ended with a job in flight."""
    result = run_python(f"""
        import asyncio, time
        import mlx.core as mx
        import emlx_async as ea
        from emlx_async import _queue, testing

        async def body():
            await ea.ops.add(mx.ones(10), 1)  # the worker's stream has its thread now
            q = ea.get_runtime().default_queue()
            if "{left}" == "running":
                q.run(time.sleep, 0.02)
                await asyncio.sleep(0.005)  # running when the run ends
            else:
                q.run(time.sleep, 0.001)  # still queued when the run ends

        def run_once():
            asyncio.run(body())
            deadline = time.monotonic() + 10
            while testing.parked_workers() < 1 or testing.active_workers():  # its job has returned
                assert time.monotonic() < deadline, "the abandoned worker never parked"
                time.sleep(0.001)

        for _ in range(3):
            run_once()
        threads = testing.thread_count()
        for _ in range(20):
            run_once()
        print("threads", threads, testing.thread_count(), "parked", testing.parked_workers(),
              "abandoned", len(_queue._abandoned), flush=True)
    """, timeout=120)
    assert result.returncode == 0, result.stderr
    counts = result.stdout.split()
    assert counts[1] == counts[2], result.stdout  # grew by one per run
    assert int(counts[4]) == 1, result.stdout
    assert int(counts[6]) <= 1, result.stdout  # only the last run's, if its job had not returned


# ---- exit while a worker is still inside MLX: status, output, no abort ------------
#
# A worker left detached in a job runs in MLX while the process ends. Without
# care, exit() tears MLX's C++ statics down under it, and CPython ends a
# Python job returning from mx.eval with pthread_exit, which the binding's
# noexcept frames turn into std::terminate: SIGABRT instead of the status.

needs_glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                                 reason="exit without C++ teardown needs glibc's on_exit")

_EXIT_SCRIPT = """
    import asyncio, atexit, ctypes, sys, time
    # Registered before emlx_async's own exit hooks, so they run after them.
    atexit.register(lambda: print("earlier atexit handler ran"))
    # A C exit handler registered first runs last in exit()'s teardown, with
    # the C++ static destructors: it ends the process with status 42.
    libc = ctypes.CDLL(None)
    libc.__cxa_atexit.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    libc.__cxa_atexit(ctypes.cast(libc._exit, ctypes.c_void_p), 42, None)

    import mlx.core as mx
    import emlx_async as ea

    def evals_until_cut_off():  # a Python job that spends its time inside mx.eval
        a = mx.random.normal((300, 300))
        end = time.monotonic() + 20
        while time.monotonic() < end:
            mx.eval(a @ a)

    async def native_chain(q):  # one native job: a chain of matmuls, many seconds here
        a = mx.random.normal((1000, 1000))
        x = a
        for _ in range(200):
            x = await ea.ops.matmul(x, a, lazy=True, queue=q)
        return q.eval(x)

    async def main():
        q = ea.get_runtime().default_queue()
        job = q.run(evals_until_cut_off) if "{job}" == "python" else await native_chain(q)
        await asyncio.sleep(0.5)
        print("job running:", not job.done())  # no flush: exit must still write it
        print("leaving at", time.time(), file=sys.stderr, flush=True)

    if "{job}" != "none":
        asyncio.run(main())
    else:
        async def idle():
            async with ea.Runtime() as rt:
                await rt.default_queue().run(mx.eval, mx.ones(3) + 1)
        asyncio.run(idle())
        print("job running: False")
        print("leaving at", time.time(), file=sys.stderr, flush=True)
    {end}
"""


def _exit_while(job: str, end: str) -> tuple[subprocess.CompletedProcess, float]:
    import time as clock

    result = run_python(_EXIT_SCRIPT.format(job=job, end=end), timeout=120)
    ended = clock.time()
    left = [line for line in result.stderr.splitlines() if line.startswith("leaving at")]
    assert left, (result.returncode, result.stderr)
    return result, ended - float(left[0].split()[-1])


@needs_glibc
@pytest.mark.parametrize("job", ["python", "native"])
@pytest.mark.parametrize("end, status", [("sys.exit(3)", 3), ("raise KeyError('boom')", 1), ("", 0)])
def test_exit_while_a_job_runs_in_mlx_keeps_the_status_and_the_output(job, end, status):
    result, exit_took = _exit_while(job, end)
    assert result.returncode == status, result.stderr
    assert "job running: True" in result.stdout, result.stdout
    assert "earlier atexit handler ran" in result.stdout, result.stdout
    assert exit_took < 3.0, f"exit took {exit_took:.1f}s with a 20 s job running"
    assert "terminate" not in result.stderr and "Fatal" not in result.stderr, result.stderr
    if status == 1:
        assert "KeyError: 'boom'" in result.stderr, result.stderr


@needs_glibc
def test_repeated_exits_while_a_python_job_is_inside_mx_eval_never_abort():
    # Before the fix nearly every run ended in SIGABRT.
    for _ in range(4):
        result, _took = _exit_while("python", "sys.exit(3)")
        assert result.returncode == 3, result.stderr
        assert "terminate called" not in result.stderr, result.stderr


@needs_glibc
def test_an_exit_with_no_job_running_keeps_the_normal_teardown():
    # The planted C exit handler (status 42) runs: exit()'s teardown was not skipped.
    result, exit_took = _exit_while("none", "sys.exit(3)")
    assert result.returncode == 42, result.stderr
    assert "earlier atexit handler ran" in result.stdout, result.stdout
    assert exit_took < 3.0
