"""The package reads bottom-up: each module imports only modules below it.

Layers (DESIGN and STYLE): native binding, errors and dtypes -> completion
channel -> queue -> context -> runtime and pools -> routing -> host-call
server -> the public API and ops -> llm -> serve. A module-level or function-level
import of a later module fails this test, so the order stays true.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "emlx_async"

# Bottom-up; a module may import only modules listed before it.
ORDER = [
    "_version", "_errors", "_emlx_native", "_native", "_backend", "_dtypes", "_devices", "_trees", "_interop", "_op_table",
    "_convert", "_channel", "_queue", "_context", "_runtime", "_routing", "_host_call",
    "_api", "memory", "_submit", "_adapters", "_generated_ops", "_generated_linalg", "_generated_fft", "_generated_random",
    "ops", "attention", "fast", "fft", "linalg", "random", "ipc", "testing", "replay", "distributed",
    "__init__", "llm", "serve",
]


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem  # llm/* is one layer


def _imports(path: pathlib.Path) -> set[str]:
    """Package modules (top-level names) that `path` imports, outside TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    package = ["emlx_async", *path.relative_to(PACKAGE).parts[:-1]]
    found: set[str] = set()

    def add(absolute: list[str], names: list[str]) -> None:
        if absolute[:1] != ["emlx_async"]:
            return
        if len(absolute) > 1:
            found.add(absolute[1])
        else:  # `from . import ops` or `import emlx_async`
            found.update(names or ["__init__"])

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            add(module, [] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name.split("."), [])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_every_module_has_a_layer():
    names = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    assert names <= set(ORDER), f"modules without a layer in ORDER: {sorted(names - set(ORDER))}"


def test_imports_point_down_only():
    rank = {name: i for i, name in enumerate(ORDER)}
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        me = _module_name(path)
        for imported in _imports(path):
            if imported == me or imported not in rank:
                continue
            if rank[imported] >= rank[me]:
                violations.append(f"{path.relative_to(PACKAGE)} imports {imported}")
    assert not violations, "imports that point up a layer:\n" + "\n".join(violations)


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    # A planted violation must be reported (the test can fail).
    fake = tmp_path / "emlx_async"
    fake.mkdir()
    (fake / "_queue.py").write_text("from ._runtime import Runtime\n")
    (fake / "_runtime.py").write_text("from ._queue import CommandQueue\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    try:
        test_imports_point_down_only()
    except AssertionError as exc:
        assert "_queue.py imports _runtime" in str(exc)
    else:
        raise AssertionError("the upward import was not reported")
