"""The compiled shim: loading, version check, process liveness (exit, fork),
and the one helper that turns a native status into an exception.

Bottom layer: imports nothing of the package but errors and the version.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

# libmlx.so must be loaded (by mlx.core) before the shim, which links it.
import mlx.core as mx

from ._errors import EMLXError, ForkedProcessError, RuntimeClosed, native_error
from ._version import __version__

try:
    from ._emlx_native import ffi, lib
except ImportError as exc:  # pragma: no cover - a build problem, not a runtime one
    raise ImportError(
        "emlx_async's native shim is not built; install the package with pip "
        "(see README) so that build_ffi.py compiles it"
    ) from exc


def _verify_versions() -> None:
    shim = ffi.string(lib.emlx_version()).decode()
    if shim != __version__:
        raise ImportError(f"emlx_async {__version__} found a shim built for {shim}; reinstall the package")
    built_against = ffi.string(lib.emlx_mlx_version()).decode()
    installed = mx.__version__.split(".dev")[0]
    if built_against != installed:
        raise ImportError(
            f"emlx_async's shim was built against MLX {built_against} but MLX {installed} is "
            "installed; reinstall emlx_async so it is rebuilt for this MLX"
        )


_verify_versions()


def last_error() -> str:
    """The shim's message for the last failed call made on *this* thread."""
    return ffi.string(lib.emlx_last_error()).decode(errors="replace")


def error(what: str | None = None, cls: type[Exception] | None = None) -> Exception:
    """The exception for the last failed native call on this thread.

    Its class comes from the kind the shim recorded with the message
    (``emlx_last_error_kind``: MLX's ``std::invalid_argument`` is an
    ``MLXValueError``, and so on), unless `cls` is given. `what` prefixes
    the message with what was being done.
    """
    message = last_error()
    if what:
        message = f"{what}: {message}" if message else what
    return cls(message) if cls is not None else native_error(lib.emlx_last_error_kind(), message)


def ensure(status: int, what: str | None = None, cls: type[Exception] | None = None) -> int:
    """Raise ``error(what, cls)`` unless `status` is 0 or more; return it (pynacl's ``ensure``).

    Call it on the thread that made the native call: the message is thread-local.
    """
    if status < 0:
        raise error(what, cls)
    return status


def check_pointer(pointer, what: str | None = None, cls: type[Exception] | None = None):
    """``ensure`` for calls that return a pointer: return it, or raise when it is NULL."""
    if pointer == ffi.NULL:
        raise error(what, cls)
    return pointer


# ---- process liveness ---------------------------------------------------------

_exiting = False  # set once emlx_shutdown has run: every worker pointer is gone


def exiting() -> bool:
    """True once the interpreter's exit hook has stopped every worker."""
    return _exiting


def ensure_not_exiting() -> None:
    if _exiting:
        raise RuntimeClosed("the interpreter is exiting; emlx_async's workers are stopped")


def _shutdown_at_exit() -> None:
    # Stop every worker (parked ones included). A worker inside a job, Python
    # or native, is left detached at once, as a daemon thread is: the job is
    # abandoned, its result dropped, and exit never waits for it (a native
    # kernel stops with the process). Idle workers are joined. While such a
    # worker is still in MLX when exit() comes, the shim ends the process
    # there with exit()'s status, skipping the C++ teardown (worker.cpp).
    # (In a fork child the shim has already forgotten the parent's workers, which have no
    # thread there: this returns at once.)
    global _exiting
    _exiting = True
    lib.emlx_shutdown(2000)


atexit.register(_shutdown_at_exit)


# A fork child inherits MLX's scheduler, but not its stream threads: once the
# parent has evaluated anything, MLX work in the child waits forever (plain
# MLX hangs there too). Checked right after a fork (the hook below, when only
# the forking thread exists), at import, and on a runtime's creation in a
# process other than the one last checked (a fork the hook missed: the parent
# had not imported emlx_async yet, or fork() was called from C).
_forked_after_mlx = False
_checked_pid = 0  # the process the stream threads were last found in


def _after_fork_in_child() -> None:
    global _forked_after_mlx, _checked_pid
    if lib.emlx_mlx_stream_threads() > 0:
        _forked_after_mlx = True
    _checked_pid = os.getpid()


def _thread_ids() -> list[int] | None:
    """The ids of this process's OS threads (as threading.get_native_id gives them), or None."""
    capacity = 256
    while True:
        ids = ffi.new("uint64_t[]", capacity)
        count = lib.emlx_process_thread_ids(ids, capacity)
        if count < 0:
            return None
        if count <= capacity:
            return list(ids[0:count])
        capacity = count + 64  # threads were started meanwhile


def _stream_threads_missing() -> bool:
    """Whether MLX's scheduler holds stream threads that do not exist in this process.

    MLX never ends a stream's thread, so in a process that was not forked
    each one it counts is a live thread of this process; in a fork child
    they are the parent's, gone. So the threads that are neither the main
    one nor started by Python's threading are at least as many as the stream
    threads in a normal process, and fewer in a fork child (it has none but
    what it started from C since: a child that starts native threads before
    importing emlx_async can hide the fork).
    """
    streams = lib.emlx_mlx_stream_threads()  # before the threads: a stream's thread exists once counted
    if streams == 0:
        return False
    ids = _thread_ids()
    if ids is None:
        return False
    python_made = {t.native_id for t in threading.enumerate() if not isinstance(t, threading._DummyThread)}
    if threading.current_thread() is threading.main_thread():
        python_made.add(threading.get_native_id())  # Python 3.11 keeps its parent's id after a fork
    if sys.platform.startswith("linux"):
        python_made.add(os.getpid())  # the initial thread (the forking one in a fork child)
    return sum(1 for tid in ids if tid not in python_made) < streams


def _check_for_fork() -> None:
    global _forked_after_mlx, _checked_pid
    pid = os.getpid()
    if _checked_pid != pid:
        _checked_pid = pid
        if _stream_threads_missing():
            _forked_after_mlx = True


_check_for_fork()  # the parent may have used MLX before this process imported emlx_async
os.register_at_fork(after_in_child=_after_fork_in_child)

FORK_ADVICE = ("start child processes that use emlx_async with the 'spawn' or 'forkserver' method "
               "(multiprocessing.get_context('spawn')), or fork before the parent uses MLX")


def ensure_mlx_usable() -> None:
    """Refuse at once in a fork child of a process that had used MLX (it would hang)."""
    _check_for_fork()  # one getpid() unless this process was not checked yet
    if _forked_after_mlx:
        raise ForkedProcessError(
            "this process was forked from one that had used MLX; the parent's MLX stream threads do not "
            f"exist here, so any MLX evaluation in this process would wait forever: {FORK_ADVICE}")


__all__ = ["FORK_ADVICE", "check_pointer", "ensure", "ensure_mlx_usable", "ensure_not_exiting", "error", "exiting",
           "ffi", "last_error", "lib"]
