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
AREAS = ["channel.h", "worker.h", "interop.h", "host_call.h", "ops.h", "ipc.h", "replay.h", "distributed.h"]
SOURCES = ["common.cpp", "channel.cpp", "worker.cpp", "interop.cpp", "host_call.cpp", "ops.cpp", "validate.cpp",
           "ipc.cpp", "ops_extra.cpp", "replay.cpp",
           "export_file.cpp", "distributed.cpp"]

# How each parameter kind of the op table is decoded (cffi_src/ops.cpp: Params).
# A kind may carry a rule after a colon ("int:positive"): the decoder
# enforces it, as emlx_async/ops.py's _encode does before submitting.
_DECODERS = {"int": "integer", "int64": "int64", "bool": "boolean", "float": "real", "axis": "axis",
             "axes": "axes", "shape": "shape", "strides": "strides", "dtype": "dtype", "str": "str"}
_RULES = {"": "Rule::any", "positive": "Rule::positive", "nonneg": "Rule::nonneg", "nonzero": "Rule::nonzero"}


def _decoder(name: str, kind: str) -> str:
    base, _, rule = kind.partition(":")
    if rule == "required" and base in ("dtype", "axes"):
        rule = ""  # Python's rule (mlx's TypeError for None); the expression's need() backs it
    if base not in _DECODERS or rule not in _RULES:
        raise ValueError(f"op table: unknown parameter kind {kind!r} for option {name!r}")
    if base in ("bool", "float", "dtype", "str") and rule:
        raise ValueError(f"op table: kind {base!r} takes no rule (option {name!r})")
    rule_arg = f", {_RULES[rule]}" if rule else ""
    return f'p.{_DECODERS[base]}("{name}"{rule_arg})'


def _package_version() -> str:
    text = (ROOT / "emlx_async" / "_version.py").read_text()
    match = re.search(r'__version__ = "([^"]+)"', text)
    assert match, "emlx_async/_version.py has no __version__"
    return match.group(1)


def _mlx_dirs() -> tuple[str, str]:
    # `mlx` is a namespace package: locate it through mlx.core's file, which
    # also proves the wheel we build against is importable.
    import mlx.core

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
    """C++ for the op switch, from emlx_async/_op_table.py (loaded on its own)."""
    import runpy

    table = runpy.run_path(str(ROOT / "emlx_async" / "_op_table.py"))
    lines = ["std::vector<mx::array> dispatch(int op, const std::vector<mx::array>& xs, Params& p,",
             "                                mx::Stream s, mx::Stream sc) {",
             "  switch (op) {"]
    for code, (name, arrays, params, expression) in enumerate(table["OPS"]):
        body = [f"    case {code}: {{  // {name}", f'      p.op = "{name}";']
        if arrays != table["VARIADIC"]:
            body.append(f'      if (xs.size() != {arrays}) throw std::invalid_argument("[{name}] expects {arrays} arrays");')
        for k in range(max(arrays, 0)):
            body.append(f"      const mx::array& x{k} = xs[{k}];")
        for k, (pname, kind, _) in enumerate(params):
            body.append(f"      auto p{k} = {_decoder(pname, kind)};")
        body.append(f"      return results({expression});")
        body.append("    }")
        lines += body
    lines += ['    default:', '      throw std::invalid_argument("[emlx] unknown op code " + std::to_string(op));',
              "  }", "}", "", f"constexpr int kOpCount = {len(table['OPS'])};",
              "constexpr const char* kOpNames[] = {" + ", ".join(f'"{op[0]}"' for op in table["OPS"]) + "};"]
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
