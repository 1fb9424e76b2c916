"""Every exception the package raises to users is defined in emlx_async/_errors.py, and is an EMLXError.

The walk reads the source (at any depth, like tests/packaging/test_layers.py): a public
class (no leading ``_``) that derives from an exception, defined anywhere but
``_errors.py``, is a stray. A class counts as an exception when one of its
bases is a builtin exception, an exception class of the package, or a name
that says so (``...Error``, ``...Exception``, ``...Warning``). The check first
proves, on planted strays, that it can fail.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import pathlib

import pytest

import emlx_async as ea
from emlx_async import _errors
from support.helpers import on_every_loop

PACKAGE = pathlib.Path(ea.__file__).resolve().parent
ERRORS = "_errors.py"

# Public exceptions that stay where they are, each with its reason.
KEPT_OUTSIDE = {
    # An HTTP answer the service raises to its own app, which turns it into
    # the response; it never reaches a library caller.
    ("serve/protocol.py", "APIError"),
}

_BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items()
                       if isinstance(value, type) and issubclass(value, BaseException)}
_EXCEPTION_SUFFIXES = ("Error", "Exception", "Warning")


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _classes(package: pathlib.Path):
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                yield path.relative_to(package).as_posix(), node.name, [_base_name(b) for b in node.bases]


def stray_exceptions(package: pathlib.Path) -> list[tuple[str, str]]:
    """(file, class) for each public exception class defined outside ``_errors.py``."""
    classes = list(_classes(package))
    exceptions = set(_BUILTIN_EXCEPTIONS)
    grown = True
    while grown:  # a class deriving from one of the package's exceptions is one too
        grown = False
        for _, name, bases in classes:
            if name not in exceptions and any(b in exceptions or b.endswith(_EXCEPTION_SUFFIXES) for b in bases):
                exceptions.add(name)
                grown = True
    return [(file, name) for file, name, bases in classes
            if file != ERRORS and not name.startswith("_") and name in exceptions
            and (file, name) not in KEPT_OUTSIDE]


def test_no_public_exception_is_defined_outside_errors():
    strays = stray_exceptions(PACKAGE)
    assert not strays, f"define these in emlx_async/{ERRORS} (an EMLXError) and re-export them: {strays}"


def test_every_kept_exception_still_exists():
    present = {(file, name) for file, name, _ in _classes(PACKAGE)}
    assert KEPT_OUTSIDE <= present, f"gone; remove from KEPT_OUTSIDE: {sorted(KEPT_OUTSIDE - present)}"


def test_the_walk_sees_a_planted_stray(tmp_path):
    package = tmp_path / "emlx_async"
    (package / "llm").mkdir(parents=True)
    (package / ERRORS).write_text("class EMLXError(Exception): ...\nclass QueueFull(EMLXError): ...\n")
    (package / "ipc.py").write_text("from ._errors import EMLXError\nclass LeakError(EMLXError, OSError): ...\n"
                                    "class _Private(Exception): ...\nclass Handle: ...\n")
    (package / "llm" / "types.py").write_text(
        "from .. import QueueFull\nclass Busy(QueueFull): ...\n"  # no Error in its name: found through its base
        "def f():\n    class Inner(ValueError): ...\n")          # nested, too
    assert stray_exceptions(package) == [("ipc.py", "LeakError"), ("llm/types.py", "Busy"),
                                         ("llm/types.py", "Inner")]


# ---- what the package raises ------------------------------------------------------------

# Builtins the package may still raise itself, each for its reason: the CLI's
# exit, a missing optional dependency (what Python users catch for one), a
# path that is not there or already taken (OSError's own kinds), and the
# protocols Python defines by exception.
BUILTINS_KEPT = {"SystemExit", "ImportError", "FileNotFoundError", "FileExistsError",
                 "NotImplementedError", "StopIteration", "StopAsyncIteration", "AttributeError"}


def builtin_raises(package: pathlib.Path) -> list[tuple[str, int, str]]:
    """(file, line, class) for each ``raise`` of a builtin exception class by name, outside BUILTINS_KEPT."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = _base_name(raised) if isinstance(raised, (ast.Name, ast.Attribute)) else ""
            if name in _BUILTIN_EXCEPTIONS and name not in BUILTINS_KEPT:
                found.append((path.relative_to(package).as_posix(), node.lineno, name))
    return sorted(found)


def test_the_package_raises_only_its_own_classes():
    raised = builtin_raises(PACKAGE)
    assert not raised, ("raise an EMLXError from emlx_async/_errors.py (InvalidArgument, InvalidArgumentType, "
                        f"InvalidState, an MLX* class for mlx's own message) instead of: {raised}")


def test_the_raise_walk_sees_planted_builtins(tmp_path):
    package = tmp_path / "emlx_async"
    package.mkdir()
    (package / "a.py").write_text(
        "import builtins\n"
        "def f(x):\n"
        "    if x: raise ValueError(f'bad {x}')\n"          # a call
        "    raise TypeError\n"                              # a bare class
        "def g():\n"
        "    try: pass\n"
        "    except KeyError as e: raise builtins.RuntimeError('x') from e\n"  # through the module
        "def h(e):\n"
        "    raise e\n"                                      # a variable: not a class by name
        "def k():\n"
        "    raise SystemExit(2)\n"                          # kept
        "    raise InvalidArgument('ours')\n")
    assert builtin_raises(package) == [("a.py", 3, "ValueError"), ("a.py", 4, "TypeError"),
                                       ("a.py", 7, "RuntimeError")]


# ---- what _errors holds ------------------------------------------------------------------

_DEFINED = [value for value in vars(_errors).values()
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == _errors.__name__]


@pytest.mark.parametrize("cls", _DEFINED, ids=lambda c: c.__name__)
def test_every_exception_is_an_emlx_error(cls):
    assert issubclass(cls, ea.EMLXError)


# Each keeps the builtin (or the package base) users catch, and the import path users know.
MOVED = [
    ("emlx_async.ipc", "SharedMemoryError", OSError),
    ("emlx_async.llm", "GrammarError", ValueError),
    ("emlx_async.llm.grammar", "GrammarError", ValueError),
    ("emlx_async.llm", "GrammarStateError", RuntimeError),
    ("emlx_async.llm.grammar", "GrammarStateError", RuntimeError),
    ("emlx_async.llm", "BatchDriverError", RuntimeError),
    ("emlx_async.llm.types", "BatchDriverError", RuntimeError),
    ("emlx_async.llm", "BatchingRefused", ValueError),
    ("emlx_async.llm.engine", "BatchingRefused", ValueError),
    ("emlx_async.llm", "EngineBusy", ea.QueueFull),
    ("emlx_async.llm.engine", "EngineBusy", ea.QueueFull),
    ("emlx_async.llm.replay_step", "NotTraceable", ValueError),
    ("emlx_async.llm", "InvalidOption", ValueError),
    ("emlx_async.llm.penalties", "InvalidOption", ValueError),
    ("emlx_async._convert", "OptionTypeError", TypeError),
]


@pytest.mark.parametrize("module, name, builtin", MOVED, ids=lambda v: v if isinstance(v, str) else "")
def test_moved_exceptions_keep_their_import_path_and_builtin(module, name, builtin):
    cls = getattr(importlib.import_module(module), name)
    assert cls is getattr(_errors, name)
    assert issubclass(cls, (ea.EMLXError, builtin)) and issubclass(cls, builtin)
    assert cls is getattr(ea, name, cls)  # the top-level name, where there is one, is the same class


def test_every_public_exception_is_exported_at_the_top_level():
    public = {cls.__name__ for cls in _DEFINED}
    missing = sorted(name for name in public if name not in ea.__all__)
    assert not missing, f"add to emlx_async/__init__.py: {missing}"


@on_every_loop
async def test_use_after_close_says_the_runtime_is_closed():
    rt = ea.Runtime(pool_size=2)
    await rt.close()
    with pytest.raises(ea.RuntimeClosed, match="^the emlx_async runtime is closed$"):
        rt.default_queue()
    assert str(ea.RuntimeClosed()) == "the emlx_async runtime is closed"  # the one spelling of it
    assert str(ea.RuntimeClosed("the interpreter is exiting")) == "the interpreter is exiting"


@pytest.mark.parametrize("raised, ours", [(RuntimeError("[eval] x"), ea.MLXRuntimeError),
                                          (ValueError("[reshape] x"), ea.MLXValueError),
                                          (IndexError("[take] x"), ea.MLXIndexError),
                                          (OverflowError("[arange] x"), ea.MLXOverflowError)])
def test_mlx_error_gives_mlxs_builtin_as_ours_with_its_message(raised, ours):
    converted = _errors.mlx_error(raised)
    assert type(converted) is ours and str(converted) == str(raised)
    assert _errors.mlx_error(ea.QueueClosed("q")).args == ("q",)  # ours stay as they are
    other = KeyError("k")
    assert _errors.mlx_error(other) is other
