"""The compiled shim: loading, version check, and the one error helper."""

from __future__ import annotations

# libmlx.so must be loaded (by mlx.core) before the shim, which links it.
import mlx.core as mx

from ._errors import EMLXError
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
    return ffi.string(lib.emlx_last_error()).decode(errors="replace")


def check_pointer(pointer, what: str, cls: type[EMLXError] = EMLXError):
    """Return `pointer`, or raise `cls` with the shim's message when it is NULL."""
    if pointer == ffi.NULL:
        raise cls(f"{what}: {last_error()}")
    return pointer


__all__ = ["ffi", "lib", "check_pointer", "last_error"]
