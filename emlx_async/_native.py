"""The compiled shim: loading, version check, process liveness, and the one
helper that turns a native status into an exception.

Bottom layer: imports nothing of the package but errors and the version.
"""

from __future__ import annotations

import atexit

# libmlx.so must be loaded (by mlx.core) before the shim, which links it.
import mlx.core as mx

from ._errors import EMLXError, RuntimeClosed
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


def ensure(status: int, what: str, cls: type[Exception] = EMLXError) -> None:
    """Raise `cls` with the shim's message unless `status` is 0 (pynacl's ``ensure``).

    Call it on the thread that made the native call: the message is thread-local.
    """
    if status != 0:
        message = last_error()
        raise cls(f"{what}: {message}" if message else what)


def check_pointer(pointer, what: str, cls: type[Exception] = EMLXError):
    """Return `pointer`, or raise `cls` with the shim's message when it is NULL."""
    if pointer == ffi.NULL:
        raise cls(f"{what}: {last_error()}")
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
    # Stop every worker (parked ones included). Workers stuck in a long native
    # job are left detached, so interpreter exit never hangs on them.
    global _exiting
    _exiting = True
    lib.emlx_shutdown(2000)


atexit.register(_shutdown_at_exit)


__all__ = ["ffi", "lib", "check_pointer", "ensure", "ensure_not_exiting", "exiting", "last_error"]
