"""The package reads bottom-up: each module imports only modules below it.

Layers (DESIGN and STYLE): native binding, errors and dtypes -> completion
channel -> routing rule -> queue -> context -> runtime and pools -> host-call
server -> the public API and ops -> llm -> serve. A module-level or function-level
import of a later module fails this test, so the order stays true.

Inside a subpackage (llm/, serve/) the modules have an order of their own,
checked the same way, and their imports must form no cycle. Across units (the
core, each subpackage) only public names travel: no module imports another
unit's private module or ``_name``, and none writes a private attribute
(``other._x = ...``) of an object whose class lives in another module.
Every check first proves, on a planted violation, that it can fail.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

from support import ROOT

PACKAGE = ROOT / "emlx_async"

# Bottom-up; a module may import only modules listed before it.
ORDER = [
    "_version", "_errors", "_emlx_native", "_native", "_backend", "_dtypes", "_devices", "_trees", "_interop", "_op_table",
    "_convert", "_channel", "_routing", "_queue", "_context", "_runtime", "_host_call",
    "_api", "memory", "_submit", "_adapters", "_generated_ops", "_generated_linalg", "_generated_fft", "_generated_random",
    "ops", "attention", "fast", "fft", "linalg", "random", "ipc", "testing", "replay", "distributed",
    "__init__", "llm", "serve",
]

# Each subpackage's modules, bottom-up, the same way.
SUBPACKAGE_ORDER = {
    "llm": [
        "_gguf", "types", "prompt_cache", "cache_options", "penalties", "traced", "schema_check", "grammar", "replay_step",
        "state", "sampling",
        "text", "model_fixes", "loading",
        "decoding", "traces", "constrained", "parallel", "batching", "batch_prefill", "batch_replay", "sharded_replay", "save",
        "engine", "sharded", "__init__",
    ],
    "serve": ["metrics", "stored_responses", "xml_arguments", "literal_arguments", "tools", "protocol", "middleware",
              "connections", "models", "service", "common", "anthropic", "responses", "openapi", "app", "cli",
              "__init__", "__main__"],
}

# Known crossings in code this test does not change, each with its reason to go:
# (check, file, what). A fixed one must leave this list (the test says so).
ALLOWED = {
    # The queue sets the job a future stands for (JobFuture lives in _backend).
    ("private write", "_queue.py", "future._job"),
    # The runtime installs its own exit hook on a runtime object built elsewhere.
    ("private write", "_runtime.py", "runtime._shutdown_hook"),
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_name(path: pathlib.Path, package: pathlib.Path) -> str:
    rel = path.relative_to(package)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem  # llm/* is one layer


def _unit(parts: list[str], package: pathlib.Path) -> str:
    """The core (top-level modules) or the subpackage a module path belongs to."""
    return parts[0] if parts and (package / parts[0]).is_dir() else "core"


def _is_module(parts: list[str], package: pathlib.Path) -> bool:
    where = package.joinpath(*parts)
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists() or \
        bool(list(where.parent.glob(where.name + ".*.so")))


def _package_imports(path: pathlib.Path, package: pathlib.Path) -> Iterator[tuple[int, list[str], str | None]]:
    """(line, module path inside the package, name imported from it or None) for
    each import of the package in `path`, at any depth, outside TYPE_CHECKING.
    A name that is itself a module comes as that module (name None)."""
    tree = ast.parse(path.read_text())
    here = ["emlx_async", *path.relative_to(package).parts[:-1]]
    found: list[tuple[int, list[str], str | None]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.ImportFrom):
            base = here[: len(here) - (node.level - 1)] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            if module[:1] == ["emlx_async"]:
                for alias in node.names:
                    inner = [*module[1:], alias.name]
                    if _is_module(inner, package):
                        found.append((node.lineno, inner, None))
                    else:
                        found.append((node.lineno, module[1:], alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "emlx_async":
                    found.append((node.lineno, parts[1:], None))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return iter(found)


def _imports(path: pathlib.Path, package: pathlib.Path = PACKAGE) -> set[str]:
    """Package modules (top-level names) that `path` imports, outside TYPE_CHECKING."""
    return {parts[0] if parts else "__init__" for _, parts, _ in _package_imports(path, package)}


def _rel(path: pathlib.Path, package: pathlib.Path) -> str:
    return path.relative_to(package).as_posix()


# ---- the checks: each returns (check, file, what) for every violation ---------------


def upward_imports(package: pathlib.Path) -> list[tuple[str, str, str]]:
    rank = {name: i for i, name in enumerate(ORDER)}
    found = []
    for path in sorted(package.rglob("*.py")):
        me = _module_name(path, package)
        for imported in _imports(path, package):
            if imported != me and imported in rank and rank[imported] >= rank.get(me, -1):
                found.append(("upward import", _rel(path, package), imported))
    return found


def _subpackage_edges(package: pathlib.Path, sub: str) -> Iterator[tuple[pathlib.Path, str, str]]:
    """(file, its module, a module of the same subpackage it imports)."""
    for path in sorted((package / sub).glob("*.py")):
        for _, parts, _ in _package_imports(path, package):
            if parts[:1] == [sub]:
                target = parts[1] if len(parts) > 1 else "__init__"
                if target != path.stem:
                    yield path, path.stem, target


def upward_imports_in_subpackages(package: pathlib.Path, orders: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    found = []
    for sub, order in orders.items():
        rank = {name: i for i, name in enumerate(order)}
        for path, me, target in _subpackage_edges(package, sub):
            if target in rank and me in rank and rank[target] >= rank[me]:
                found.append(("upward import", _rel(path, package), f"{sub}.{target}"))
    return found


def import_cycles(package: pathlib.Path) -> list[tuple[str, str, str]]:
    """Cycles among one subpackage's modules (module- or function-level imports)."""
    found = []
    for sub in sorted(p.name for p in package.iterdir() if (p / "__init__.py").exists()):
        graph: dict[str, set[str]] = {}
        for _, me, target in _subpackage_edges(package, sub):
            graph.setdefault(me, set()).add(target)
        seen: set[tuple[str, ...]] = set()

        def walk(node: str, path: list[str]) -> None:
            for nxt in sorted(graph.get(node, ())):
                if nxt in path:
                    cycle = path[path.index(nxt):]
                    start = cycle.index(min(cycle))
                    key = tuple(cycle[start:] + cycle[:start])  # one report per cycle
                    if key not in seen:
                        seen.add(key)
                        found.append(("import cycle", f"{sub}/", " -> ".join([*key, key[0]])))
                elif len(path) < len(graph) + 1:
                    walk(nxt, [*path, nxt])

        for start in sorted(graph):
            walk(start, [start])
    return found


def private_imports(package: pathlib.Path) -> list[tuple[str, str, str]]:
    """A private module or ``_name`` of another unit (the core, a subpackage) imported."""
    found = []
    for path in sorted(package.rglob("*.py")):
        me = _unit(list(path.relative_to(package).parts), package)
        for _, parts, name in _package_imports(path, package):
            if _unit(parts, package) == me:
                continue
            if any(_is_private(part) for part in parts) or (name is not None and _is_private(name)):
                what = ".".join(["emlx_async", *parts]) + (f".{name}" if name is not None and _is_private(name) else "")
                found.append(("private import", _rel(path, package), what))
    return found


def private_writes(package: pathlib.Path) -> list[tuple[str, str, str]]:
    """``obj._x = ...`` (or setattr) on an object other than self/cls, where no class of
    this module sets ``self._x``: a private attribute of another module's class."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        own = {node.attr for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
               and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")}
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                    and isinstance(node.args[1].value, str):
                targets = [ast.Attribute(value=node.args[0], attr=node.args[1].value, ctx=ast.Store())]
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            for target in flat:
                if not isinstance(target, ast.Attribute) or not _is_private(target.attr):
                    continue
                if isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"):
                    continue
                if target.attr not in own:
                    found.append(("private write", _rel(path, package), ast.unparse(target)))
    return found


# ---- the package ----------------------------------------------------------------


def test_every_module_has_a_layer():
    names = {_module_name(p, PACKAGE) for p in PACKAGE.rglob("*.py")}
    assert names <= set(ORDER), f"modules without a layer in ORDER: {sorted(names - set(ORDER))}"
    for sub, order in SUBPACKAGE_ORDER.items():
        names = {p.stem for p in (PACKAGE / sub).glob("*.py")}
        assert names <= set(order), f"{sub}/ modules without a place in SUBPACKAGE_ORDER: {sorted(names - set(order))}"
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert subpackages == set(SUBPACKAGE_ORDER), "every subpackage has an order"


def _unexpected(found: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    return [v for v in found if v not in ALLOWED]


def test_imports_point_down_only():
    violations = upward_imports(PACKAGE)
    assert not violations, "imports that point up a layer:\n" + "\n".join(map(str, violations))


def test_imports_inside_subpackages_point_down_only():
    violations = upward_imports_in_subpackages(PACKAGE, SUBPACKAGE_ORDER)
    assert not violations, "imports that point up inside a subpackage:\n" + "\n".join(map(str, violations))


def test_no_import_cycles_inside_subpackages():
    cycles = import_cycles(PACKAGE)
    assert not cycles, "import cycles:\n" + "\n".join(map(str, cycles))


def test_no_private_imports_across_units():
    violations = _unexpected(private_imports(PACKAGE))
    assert not violations, "private names imported across units:\n" + "\n".join(map(str, violations))


def test_no_writes_into_other_modules_private_attributes():
    violations = _unexpected(private_writes(PACKAGE))
    assert not violations, "private attributes written from outside:\n" + "\n".join(map(str, violations))


def test_every_allowed_crossing_still_exists():
    # A fixed crossing leaves ALLOWED, so the list never hides a new one.
    present = set(private_imports(PACKAGE)) | set(private_writes(PACKAGE))
    assert ALLOWED <= present, f"fixed; remove from ALLOWED: {sorted(ALLOWED - present)}"


# ---- each check reports a planted violation ---------------------------------------


def _plant(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    package = tmp_path / "emlx_async"
    for name, source in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return package


def test_the_checker_sees_an_upward_import(tmp_path):
    package = _plant(tmp_path, {"_queue.py": "from ._runtime import Runtime\n",
                                "_runtime.py": "from ._queue import CommandQueue\n"})
    assert upward_imports(package) == [("upward import", "_queue.py", "_runtime")]


def test_the_checker_sees_an_upward_import_inside_a_subpackage(tmp_path):
    package = _plant(tmp_path, {
        "llm/__init__.py": "",
        "llm/types.py": "def f():\n    from .engine import Engine\n",  # function-level counts too
        "llm/engine.py": "from .types import Delta\n",
    })
    found = upward_imports_in_subpackages(package, {"llm": ["types", "engine", "__init__"]})
    assert found == [("upward import", "llm/types.py", "llm.engine")]


def test_the_checker_sees_an_import_cycle_inside_a_subpackage(tmp_path):
    # engine <-> save, as it once was: save imported engine inside a function.
    package = _plant(tmp_path, {
        "llm/__init__.py": "from .engine import Engine\n",
        "llm/engine.py": "from . import save\nclass Engine: ...\n",
        "llm/save.py": "def convert():\n    from .engine import load_model_files\n",
        "llm/text.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .engine import Engine\n",
    })
    assert import_cycles(package) == [("import cycle", "llm/", "engine -> save -> engine")]


def test_the_checker_sees_a_private_import_across_units(tmp_path):
    package = _plant(tmp_path, {
        "_errors.py": "class DistributedError(Exception): ...\n",
        "llm/__init__.py": "",
        "llm/_gguf.py": "",
        "llm/engine.py": "from . import _gguf\nfrom .. import _errors\n",   # its own private: fine
        "llm/sharded.py": "from .._errors import DistributedError\n",
        "serve/__init__.py": "",
        "serve/app.py": "from emlx_async.llm.engine import _encode\nfrom ..llm import _gguf\n",
    })
    assert private_imports(package) == [
        ("private import", "llm/engine.py", "emlx_async._errors"),
        ("private import", "llm/sharded.py", "emlx_async._errors"),
        ("private import", "serve/app.py", "emlx_async.llm.engine._encode"),
        ("private import", "serve/app.py", "emlx_async.llm._gguf"),
    ]


def test_the_checker_sees_a_write_into_another_modules_private_attribute(tmp_path):
    package = _plant(tmp_path, {"llm/__init__.py": "", "llm/sharded.py": (
        "class Sharded:\n"
        "    def __init__(self):\n"
        "        self._ticker = None\n"
        "    def start(self, engine, other):\n"
        "        other._ticker = 1\n"           # a private attribute of this module's class: fine
        "        engine._batcher = None\n"
        "        engine._replay, n = None, 0\n"
        "        engine.decoding.replay = None\n"    # public: fine
        "        setattr(engine, '_slots', 2)\n"
    )})
    assert private_writes(package) == [
        ("private write", "llm/sharded.py", "engine._batcher"),
        ("private write", "llm/sharded.py", "engine._replay"),
        ("private write", "llm/sharded.py", "engine._slots"),
    ]
