"""The C ABI's layout: each area's header beside a source of the same name, one status table, scoped aliases.

Each check returns what it found wrong in a cffi_src folder; the planted
tests prove it finds a violation in a copy of the sources with one put in.
"""

from __future__ import annotations

import ast
import pathlib
import re

from support import ROOT

SRC = ROOT / "cffi_src"
STATUSES = {"EMLX_DONE", "EMLX_FAILED", "EMLX_DROPPED", "EMLX_PY_FAILED", "EMLX_STOPPED", "EMLX_HOST_REQUEST",
            "EMLX_HOST_FREED"}


def _build_list(name: str) -> list[str]:
    """A list of build_ffi.py (read, not run: running it writes the shim's generated sources)."""
    tree = ast.parse((ROOT / "build_ffi.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"build_ffi.py has no {name}")


def _areas() -> list[str]:
    return _build_list("AREAS")


def _without_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def _declared(text: str) -> list[str]:
    """The C functions an area header declares (cffi's extern "Python" callbacks aside)."""
    text = _without_comments(text)
    return [m.group(1) for m in re.finditer(r"^(?!extern \"Python)[A-Za-z][^;(]*?\b(emlx_\w+)\(", text, re.M)]


def _defines(text: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^#define (EMLX_\w+) (-?\d+)", text, re.M)}


def misplaced_definitions(src: pathlib.Path) -> list[str]:
    problems = []
    for header in _areas():
        source = src / header.replace(".h", ".cpp")
        if not source.exists():
            problems.append(f"{header} has no {source.name}")
            continue
        text = _without_comments(source.read_text())
        for function in _declared((src / header).read_text()):
            # a definition starts at the line's first column (calls are indented or follow a `=`)
            if not re.search(rf"^[A-Za-z][^;=\n]*\b{function}\(", text, re.M):
                problems.append(f"{function} ({header}) is not defined in {source.name}")
    return problems


def split_tables(src: pathlib.Path) -> list[str]:
    defines = {header: _defines((src / header).read_text()) for header in _areas()}
    problems = [f"channel.h lacks the record status {s}" for s in sorted(STATUSES - set(defines["channel.h"]))]
    if len({defines["channel.h"].get(s) for s in STATUSES}) != len(STATUSES):
        problems.append("two record statuses share a value")
    kinds = {name: value for name, value in defines["common.h"].items() if name.startswith("EMLX_ERR_")}
    if len(kinds) < 6 or len(set(kinds.values())) != len(kinds):
        problems.append("common.h's error kinds are incomplete or share a value")
    for header, names in defines.items():
        if header != "channel.h" and STATUSES & set(names):
            problems.append(f"{header} defines a record status")
        if header != "common.h" and any(n.startswith("EMLX_ERR_") for n in names):
            problems.append(f"{header} defines an error kind")
    return problems


def global_aliases(src: pathlib.Path) -> list[str]:
    """`namespace mx = mlx::core;` at global scope in a header would alias it for every includer."""
    problems = []
    for header in sorted(src.glob("*.hpp")):
        depth = 0
        for line in _without_comments(header.read_text()).splitlines():
            if re.match(r"\s*namespace mx = ", line) and depth == 0:
                problems.append(f"{header.name} declares namespace mx at global scope")
            depth += line.count("{") - line.count("}")
    return problems


def test_each_area_is_defined_in_the_source_of_its_name():
    assert len(_areas()) >= 9
    assert misplaced_definitions(SRC) == []
    # and every source is compiled (one missing from SOURCES would fail only at link time, or never)
    assert sorted(_build_list("SOURCES")) == sorted(p.name for p in SRC.glob("*.cpp"))


def test_record_statuses_and_error_kinds_are_one_table_each():
    assert split_tables(SRC) == []


def test_headers_scope_their_mlx_alias():
    assert global_aliases(SRC) == []


def _copy_with(folder: pathlib.Path, name: str, old: str, new: str) -> pathlib.Path:
    """A copy of cffi_src in `folder`, with `old` replaced by `new` in file `name`."""
    folder.mkdir()
    for path in SRC.iterdir():
        if path.is_file():
            (folder / path.name).write_text(path.read_text())
    text = (folder / name).read_text()
    assert old in text
    (folder / name).write_text(text.replace(old, new, 1))
    return folder


def test_the_checks_catch_planted_violations(tmp_path):
    moved = _copy_with(tmp_path / "moved", "ops.cpp", "int emlx_op_count(void)", "int moved_op_count(void)")
    assert misplaced_definitions(moved) == ["emlx_op_count (ops.h) is not defined in ops.cpp"]
    status = _copy_with(tmp_path / "status", "host_call.h", "/* On the loop thread",
                        "#define EMLX_HOST_REQUEST 5\n/* On the loop thread")
    assert "host_call.h defines a record status" in split_tables(status)
    alias = _copy_with(tmp_path / "alias", "replay.hpp", "#include \"mlx/stream.h\"\n",
                       "#include \"mlx/stream.h\"\nnamespace mx = mlx::core;\n")
    assert global_aliases(alias) == ["replay.hpp declares namespace mx at global scope"]


# ---- MLX internals: in one file, behind one version gate ------------------------------------

# What only cffi_src/mlx_internals.cpp may do, by the text that does it.
INTERNALS = {
    r"const_cast<\s*(?:mx|mlx::core)::Stream": "writes a primitive's stream",
    r"\bthreads_\b": "reads the scheduler's private stream threads",
    r"sizeof\(PyObject\)": "reads nanobind's object layout",
    r"\"Load\"": "names MLX's Load primitive",
    r"mlx/backend/|get_command_encoder": "uses MLX's CPU command encoder",
}


def internals_outside(src: pathlib.Path) -> list[str]:
    problems = []
    for path in sorted(src.glob("*.[ch]pp")):
        if path.name.startswith("mlx_internals."):
            continue
        text = _without_comments(path.read_text())
        problems += [f"{path.name} {what}" for pattern, what in INTERNALS.items() if re.search(pattern, text)]
    return problems


def test_mlx_internals_live_in_one_file():
    assert internals_outside(SRC) == []
    text = (SRC / "mlx_internals.cpp").read_text()
    assert all(re.search(pattern, text) for pattern in INTERNALS)
    # every source sees the version gate: shim.hpp (which they include) includes it
    assert '#include "mlx_internals.hpp"' in (SRC / "shim.hpp").read_text()


def test_internals_check_catches_a_planted_one(tmp_path):
    planted = _copy_with(tmp_path / "internal", "replay.cpp", "auto& stream = mlx_internals::stream_of(a.primitive());",
                         "auto& stream = const_cast<mx::Stream&>(a.primitive().stream());")
    assert internals_outside(planted) == ["replay.cpp writes a primitive's stream"]
    planted = _copy_with(tmp_path / "encoder", "host_call.cpp", "emlx::mlx_internals::dispatch_cpu_task(",
                         "mx::cpu::get_command_encoder(stream()).dispatch(")
    assert internals_outside(planted) == ["host_call.cpp uses MLX's CPU command encoder"]


def _build_checks() -> dict:
    """build_ffi.py's version check alone (running the whole file would write the shim's generated sources)."""
    import sys

    tree = ast.parse((ROOT / "build_ffi.py").read_text())
    wanted = [node for node in tree.body
              if isinstance(node, ast.FunctionDef) and node.name in ("_supported_mlx", "_check_mlx_version")]
    scope = {"re": re, "sys": sys, "SRC": SRC}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), "build_ffi.py", "exec"), scope)  # noqa: S102 - our own file
    return scope


def test_one_version_gate_names_the_versions():
    import mlx.core as mx
    import pytest

    checks = _build_checks()
    low, high, words = checks["_supported_mlx"]()
    assert words == "0.32.x" and low == 32000 and high == 32999
    checks["_check_mlx_version"](mx.__version__)  # the MLX installed here is supported
    make = re.search(r"^MLX_VERSION := (\S+)", (ROOT / "Makefile").read_text(), re.M)
    checks["_check_mlx_version"](make.group(1))  # and the one the Makefile installs
    for outside in ("0.33.0", "0.31.9", "1.0.0.dev20260101"):
        with pytest.raises(SystemExit) as refused:
            checks["_check_mlx_version"](outside)
        assert f"MLX {outside} is installed" in str(refused.value) and "supports MLX 0.32.x" in str(refused.value)
