"""cffi builder for the native shim (emlx_async._emlx_native).

Each area of the C ABI has its own header in cffi_src/; the cdef is their
concatenation, and the same text (with the `extern "Python+C"`
callbacks as plain declarations) is written out as the C header the C++ sources include.
Built by `pip install .` through setup.py's `cffi_modules`.
"""

from __future__ import annotations

import os
import pathlib
import re
import sys

from cffi import FFI

ROOT = pathlib.Path(__file__).resolve().parent
SRC = ROOT / "cffi_src"
AREAS = ["common.h", "channel.h", "worker.h", "interop.h", "host_call.h", "ops.h", "ipc.h", "replay.h", "distributed.h"]
SOURCES = ["mlx_internals.cpp", "common.cpp", "channel.cpp", "worker.cpp", "interop.cpp", "host_call.cpp", "ops.cpp", "validate.cpp",
           "ipc.cpp", "ops_extra.cpp", "replay.cpp",
           "export_file.cpp", "distributed.cpp"]


def _op_spec() -> dict:
    """emlx_async/_op_table.py, loaded on its own (the package cannot be imported before it is built)."""
    import runpy

    return runpy.run_path(str(ROOT / "emlx_async" / "_op_table.py"))


def _decoder(spec: dict, name: str, full_kind: str) -> str:
    """The Params call that decodes option `name` of kind `full_kind` (cffi_src/ops.cpp)."""
    kind, rule = spec["split_kind"](full_kind)
    if rule == "required":
        rule = ""  # Python's rule (mlx's TypeError for None); the expression's need() backs it
    rule_arg = f", Rule::{rule}" if rule else ""
    return f'p.{spec["KINDS"][kind].decoder}("{name}"{rule_arg})'


def _rules(spec: dict) -> list[str]:
    """The integer rules of the spec's RULES as C++: the enum and the check Params applies."""
    names = list(spec["RULES"])
    lines = ["enum class Rule { any, " + ", ".join(names) + " };", "",
             "// The words of the rule `v` breaks, or nullptr.",
             "inline const char* broken_rule(Rule rule, int64_t v) {", "  switch (rule) {"]
    for name, (words, condition) in spec["RULES"].items():
        lines.append(f'    case Rule::{name}: return {condition} ? nullptr : "{words}";')
    lines += ["    default: return nullptr;", "  }", "}"]
    return lines


def _package_version() -> str:
    text = (ROOT / "emlx_async" / "_version.py").read_text()
    match = re.search(r'__version__ = "([^"]+)"', text)
    assert match, "emlx_async/_version.py has no __version__"
    return match.group(1)


def _supported_mlx() -> tuple[int, int, str]:
    """The MLX versions the shim's MLX internals support (cffi_src/mlx_internals.hpp, the one place they are)."""
    text = (SRC / "mlx_internals.hpp").read_text()
    found = dict(re.findall(r"#define EMLX_MLX_SUPPORTED(\w*) (\S+)", text))
    return int(found["_MIN"]), int(found["_MAX"]), found[""].strip('"')


def _check_mlx_version(version: str) -> None:
    """Refuse, naming both, an MLX outside the versions mlx_internals.hpp supports."""
    low, high, words = _supported_mlx()
    major, minor, patch = (int(re.match(r"\d+", part).group()) for part in version.split(".")[:3])
    if not low <= 100000 * major + 1000 * minor + patch <= high:
        sys.exit(f"emlx_async build: MLX {version} is installed, but emlx_async supports MLX {words} "
                 "(cffi_src/mlx_internals.hpp: the MLX internals it relies on were checked against those); "
                 f"install mlx {words}")


def _mlx_dirs() -> tuple[str, str]:
    # `mlx` is a namespace package: locate it through mlx.core's file, which
    # also proves the wheel we build against is importable.
    import mlx.core

    _check_mlx_version(mlx.core.__version__)
    base = pathlib.Path(mlx.core.__file__).resolve().parent
    include, lib = base / "include", base / "lib"
    if not (include / "mlx" / "mlx.h").exists() or not list(lib.glob("libmlx.*")):
        sys.exit(f"emlx_async build: no MLX headers or libmlx in {base}; install mlx first")
    return str(include), str(lib)


def _rpath_args() -> list[str]:
    # The shim sits in site-packages/emlx_async/ and libmlx in site-packages/mlx/lib/
    # (from whichever package provides MLX's backend), so a run path relative
    # to the shim finds the runtime's MLX. Never the build's own MLX by absolute
    # path: pip builds in a throw-away environment. An editable install (the
    # shim in the source tree) finds libmlx because emlx_async/_native.py
    # imports mlx.core, which loads it, before the shim.
    origin = "@loader_path" if sys.platform == "darwin" else "$ORIGIN"
    return [f"-Wl,-rpath,{origin}/../mlx/lib"]


def _depends() -> list[str]:
    headers = sorted(p.relative_to(ROOT).as_posix() for p in SRC.glob("*.h*"))
    return headers + ["build_ffi.py", "emlx_async/_op_table.py", "emlx_async/_version.py"]


def _abi_text() -> tuple[str, str]:
    parts = [(SRC / name).read_text() for name in AREAS]
    cdef = "\n".join(parts)
    # The C header for the C++ side: `extern "Python+C"` becomes a plain
    # declaration inside extern "C", which also gives cffi's definition of the
    # callback C linkage in the C++ module.
    header = re.sub(r'extern "Python\+C" ', "", cdef)
    return cdef, header


def _op_dispatch() -> str:
    """C++ for the op switch, from the op spec."""
    spec = _op_spec()
    lines = ["std::vector<mx::array> dispatch(int op, const std::vector<mx::array>& xs, Params& p,",
             "                                mx::Stream s, mx::Stream sc) {",
             "  switch (op) {"]
    for code, op in enumerate(spec["OPS"]):
        body = [f"    case {code}: {{  // {op.name}", f'      p.op = "{op.name}";']
        if op.arrays != spec["VARIADIC"]:
            body.append(f'      if (xs.size() != {op.arrays}) throw std::invalid_argument("[{op.name}] expects '
                        f'{op.arrays} arrays");')
        for k in range(max(op.arrays, 0)):
            body.append(f"      const mx::array& x{k} = xs[{k}];")
        for k, (pname, kind, _) in enumerate(op.params):
            body.append(f"      auto p{k} = {_decoder(spec, pname, kind)};")
        body.append(f"      return results({op.cpp});")
        body.append("    }")
        lines += body
    lines += ['    default:', '      throw std::invalid_argument("[emlx] unknown op code " + std::to_string(op));',
              "  }", "}", "", f"constexpr int kOpCount = {len(spec['OPS'])};",
              "constexpr const char* kOpNames[] = {" + ", ".join(f'"{op.name}"' for op in spec["OPS"]) + "};",
              f'constexpr const char* kOpSpecDigest = "{spec["dispatch_digest"]()}";']
    return "/* GENERATED by build_ffi.py from emlx_async/_op_table.py; do not edit. */\n" + "\n".join(lines) + "\n"


def _make_ffi() -> FFI:
    include, lib = _mlx_dirs()
    cdef, header = _abi_text()
    gen = ROOT / "build" / "generated"
    gen.mkdir(parents=True, exist_ok=True)
    (gen / "emlx_abi.h").write_text(
        "/* GENERATED by build_ffi.py from the cffi_src/ headers; do not edit. */\n"
        "#pragma once\n#include <stddef.h>\n#include <stdint.h>\n"
        "#ifdef __cplusplus\nextern \"C\" {\n#endif\n" + header + "\n#ifdef __cplusplus\n}\n#endif\n"
    )
    (gen / "ops_table.inc").write_text(_op_dispatch())
    (gen / "op_rules.inc").write_text("/* GENERATED by build_ffi.py from emlx_async/_op_table.py (RULES); do not edit. */\n"
                                      + "\n".join(_rules(_op_spec())) + "\n")
    ffi = FFI()
    ffi.cdef(re.sub(r"#define (\w+) (-?\d+)\s*/\*.*?\*/", r"#define \1 \2", cdef))
    ffi.set_source(
        "emlx_async._emlx_native",
        '#include "emlx_abi.h"\n',
        source_extension=".cpp",
        sources=[f"cffi_src/{s}" for s in SOURCES],  # setuptools wants relative paths
        # setuptools rebuilds the shim only when one of its sources or these
        # is newer than it: the headers, the op table and version baked in.
        depends=_depends(),
        include_dirs=[str(SRC), str(gen), include],
        library_dirs=[lib],
        libraries=["mlx"],
        define_macros=[("EMLX_SHIM_VERSION", f'"{_package_version()}"')],
        # MLX headers need C++20; hidden visibility keeps our symbols (and the
        # inlined MLX templates) from clashing with mlx.core's.
        extra_compile_args=["-std=c++20", "-O2", "-fvisibility=hidden", "-fvisibility-inlines-hidden"],
        extra_link_args=_rpath_args(),
    )
    return ffi


os.chdir(ROOT)  # relative source paths below resolve against the project
ffibuilder = _make_ffi()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
