"""Generate emlx_async/_generated_{ops,linalg,fft,random}.py from mlx's own signatures.

    python tools/gen_api.py           # rewrite the files
    python tools/gen_api.py --check   # exit 1 if a checked-in file differs

Each public function gets mlx's signature (names, order, kinds, defaults,
annotations), read from the installed mlx (``__nb_signature__``), plus the
runtime's keyword-only ``queue=``, ``device=``, ``lazy=``, ``nowait=`` and
``check_finite=``; mlx's ``stream=`` stays where mlx has it. Which functions
exist and what their bodies call come from the op spec (each op's `mlx`
functions in emlx_async/_op_table.py): the op directly when mlx's parameters
are its options of the same name, or an adapter in emlx_async/_adapters.py.
"""

from __future__ import annotations

import ast
import pathlib
import re
import runpy
import sys
import textwrap

import mlx.core as mx

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "emlx_async"

SPEC = runpy.run_path(str(PACKAGE / "_op_table.py"))  # the op spec, loaded on its own


# ---- what each namespace exposes, from the op spec's `mlx` functions ----------------
# ("table", op, arrays): mlx's first parameters (or the ones named) are the op's
# arrays, the others options of the same name.
# ("adapter", fn, leading): the body calls _adapters.fn(leading..., params..., rt).
# ("at_call", fn): no job at all: mlx's exact signature (no runtime keywords), the
# body returns _adapters.fn(params...), an already resolved JobFuture.

def _namespaces() -> dict[str, dict[str, tuple]]:
    entries: dict[str, dict[str, tuple]] = {"ops": {}, "linalg": {}, "fft": {}, "random": {}}

    def add(path: str, how: tuple) -> None:
        namespace, _, name = path.rpartition(".")
        namespace = namespace or "ops"
        if name in entries[namespace]:
            raise SystemExit(f"op spec: mx.{path} is declared twice")
        entries[namespace][name] = how

    for op in SPEC["OPS"]:
        for fn in op.mlx:
            if fn.adapter:
                add(fn.path, ("adapter", fn.adapter, fn.leading))
            else:
                add(fn.path, ("table", op.name, fn.arrays))
    for path, fn in SPEC["ANSWERED_AT_CALL"].items():
        add(path, ("at_call", fn))
    return entries


ENTRIES = _namespaces()
NAMESPACES = {namespace: (module, ENTRIES[namespace])
              for namespace, module in (("ops", mx), ("linalg", mx.linalg), ("fft", mx.fft), ("random", mx.random))}

# Signatures mlx does not give in one piece: `copy` is not in mlx.core (it is
# `mx.array(a)`); `slice`/`slice_update` also keep the runtime's static form
# (start=, stop=, strides=).
OVERRIDES = {
    ("ops", "copy"): ("def copy(a: array, /, *, stream: StreamOrDevice = None) -> array",
                      "A copy of the array (``mx.array(a)`` in mlx.core)."),
    # mlx's text leaves the operands and the result unannotated; its docstring gives them.
    ("ops", "einsum_path"): ("def einsum_path(subscripts: str, *operands: array) -> tuple[list[tuple[int, int]], str]",
                             None),
    ("ops", "slice"): ("def slice(a: array, start_indices: array | Sequence[int] | None = None, "
                       "axes: Sequence[int] | None = None, slice_size: Sequence[int] | None = None, *, "
                       "start: Sequence[int] | None = None, stop: Sequence[int] | None = None, "
                       "strides: Sequence[int] | None = None, stream: StreamOrDevice = None) -> array",
                      "Extract a sub-array: mlx's form (start_indices, axes, slice_size), or the static form "
                      "start=, stop= and strides= (Python slice bounds, one per axis)."),
    ("ops", "slice_update"): ("def slice_update(a: array, update: array, "
                              "start_indices: array | Sequence[int] | None = None, "
                              "axes: Sequence[int] | None = None, *, start: Sequence[int] | None = None, "
                              "stop: Sequence[int] | None = None, strides: Sequence[int] | None = None, "
                              "stream: StreamOrDevice = None) -> array",
                              "Update a sub-array: mlx's form (start_indices, axes), or the static form start=, "
                              "stop= and strides= (Python slice bounds, one per axis)."),
}

# mlx functions of several overloads (nanobind tries them in order): typed
# overload stubs, and one function taking ``*args, **kwargs`` that hands them
# to the adapter, which resolves them as nanobind does (_adapters.resolve).
# mlx's own signature text omits overload 1's ``step`` default; mlx has it.
OVERLOADS = {
    ("ops", "arange"): ["def arange(start: int | float, stop: int | float | None, step: int | float | None = None, "
                        "dtype: Dtype | None = None, *, stream: StreamOrDevice = None) -> array",
                        "def arange(stop: int | float, step: int | float | None = None, dtype: Dtype | None = None, "
                        "*, stream: StreamOrDevice = None) -> array"],
}

# Return annotations where mlx's own text says otherwise than what mlx returns
# (and so these do): a list for an op whose outputs are a list, not one array
# or a tuple; else the function's own `returns` in the spec (svd's one array
# when compute_uv=False: an array unpacks too, so `u, s, vt = ...` still checks).
# tests/ops/test_mlx_parity.py checks every call's result against its annotation.
def _returns() -> dict[tuple[str, str], str]:
    out = {}
    for op in SPEC["OPS"]:
        for fn in op.mlx:
            namespace, _, name = fn.path.rpartition(".")
            returns = fn.returns or ("list[array]" if op.outputs == SPEC["LIST"] else None)
            if returns:
                out[(namespace or "ops", name)] = returns
    return out


RETURNS = _returns()

RUNTIME_PARAMS = ("queue: CommandQueue | None = None, device: DeviceLike = None, lazy: bool = False, "
                  "nowait: bool = False, check_finite: bool | None = None")
RUNTIME_DOC = ("Awaitable ``{path}``, built and run natively on a queue: returns a JobFuture. Also takes "
               "``queue=``, ``device=``, ``lazy=``, ``nowait=`` and ``check_finite=`` (see emlx_async.ops); "
               "``stream=`` picks a queue of that stream's device.")

AT_CALL_DOC = ("Awaitable ``{path}``, answered at the call: it reads only the operands' shapes and returns no "
               "arrays, so no job runs; the JobFuture is already resolved and mlx's errors raise at the call.")

# Bare dtype names in mlx's defaults (float32, bfloat16, ...) are mx attributes here.
_DEFAULT_NAMES = {name: f"mx.{name}" for name in dir(mx) if isinstance(getattr(mx, name), mx.Dtype)}


def mlx_signature(module, name: str) -> tuple[str, str]:
    """(signature text with defaults filled in, docstring) of mlx's function `name`."""
    text, doc, defaults = getattr(module, name).__nb_signature__[0]
    if defaults:
        text = re.sub(r"\\(\d+)", lambda m: repr(defaults[int(m.group(1))]), text)
    text = text.replace("mlx.core.", "").replace("collections.abc.", "")
    text = re.sub(r"stream: [^=]*= None", "stream: StreamOrDevice = None", text)
    return text, doc or ""


def _parameters(text: str) -> list[str]:
    """The parameter names of a signature text."""
    args = parse(text).args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)] + \
        ([args.vararg.arg] if args.vararg else []) + ([args.kwarg.arg] if args.kwarg else [])


def parse(text: str) -> ast.FunctionDef:
    fn = ast.parse(text + ": ...").body[0]
    assert isinstance(fn, ast.FunctionDef)
    return fn


def first_paragraph(doc: str) -> str:
    paragraph = textwrap.dedent(doc).strip().split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def render(fn: ast.FunctionDef, runtime_keywords: bool = True) -> tuple[str, list[str]]:
    """The signature with the runtime keywords added, and mlx's parameter names (stream aside)."""
    args = fn.args
    parts: list[str] = []
    names: list[str] = []

    def one(arg: ast.arg, default) -> str:
        names.append(arg.arg)
        out = arg.arg + (f": {ast.unparse(arg.annotation)}" if arg.annotation else "")
        if default is not None:
            value = ast.unparse(default)
            out += f" = {_DEFAULT_NAMES.get(value, value)}"
        return out

    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for k, (arg, default) in enumerate(zip(positional, defaults)):
        parts.append(one(arg, default))
        if k == len(args.posonlyargs) - 1:
            parts.append("/")
    if args.vararg:
        annotation = f": {ast.unparse(args.vararg.annotation)}" if args.vararg.annotation else ""
        parts.append(f"*{args.vararg.arg}{annotation}")
        names.append("*" + args.vararg.arg)
    elif runtime_keywords or args.kwonlyargs:
        parts.append("*")
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        parts.append(one(arg, default))
    if runtime_keywords:
        if "stream" not in names:  # mx.random.key has none; every op here takes one
            parts.append("stream: StreamOrDevice = None")
        parts.append(RUNTIME_PARAMS)
    returns = ast.unparse(fn.returns) if fn.returns else "array"
    names = [n for n in names if n != "stream"]
    return f"def {{name}}({', '.join(parts)}) -> JobFuture[{returns}]:", names


def body(namespace: str, name: str, how, params: list[str], arrays_count: dict) -> list[str]:
    plain = [p.lstrip("*") for p in params]
    if how[0] == "at_call":
        return [f"    return _ad.{how[1]}({', '.join(plain)})"]
    lines = ["    _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)"]
    if how[0] == "adapter":
        _, fn, leading = how
        args = [repr(v) for v in leading] + plain + ["_rt"]
        lines.append(f"    return _ad.{fn}({', '.join(args)})")
        return lines
    _, table_name, arrays = how
    count, table_params = arrays_count[table_name]
    if count < 0:
        raise SystemExit(f"{namespace}.{name}: a variadic table op needs an adapter")
    arrays = list(arrays) if arrays is not None else plain[:count]
    if len(arrays) != count:
        raise SystemExit(f"{namespace}.{name}: {count} arrays in the table, mlx has {arrays}")
    options = [p for p in plain if p not in arrays]
    for p in options:
        if p not in table_params:
            raise SystemExit(f"{namespace}.{name}: mlx option {p!r} is not in the table entry {table_name!r}")
    passed = ", ".join(f"{p}={p}" for p in options)
    lines.append(f"    return _ad.op({table_name!r}, [{', '.join(arrays)}], _rt{', ' + passed if passed else ''})")
    return lines


def generate(namespace: str) -> str:
    module, entries = NAMESPACES[namespace]
    arrays_count = {op.name: (op.arrays, {p[0] for p in op.params}) for op in SPEC["OPS"]}
    path = "mx." + (namespace + "." if namespace != "ops" else "")
    out = [
        f'"""``{path.rstrip(".")}`` with mlx\'s own signatures, as awaitables. GENERATED, do not edit.',
        "",
        "Regenerate with ``python tools/gen_api.py`` (from mlx "
        f"{mx.__version__}'s signatures and emlx_async/_op_table.py);",
        "the test test_generated_files_are_current checks this file is current.",
        '"""',
        "",
        "# ruff: noqa: A001, A002, E501",
        "from __future__ import annotations",
        "",
        "from collections.abc import Sequence",
        "from typing import TYPE_CHECKING, Any, Literal, overload",
        "",
        "import mlx.core as mx",
        "from mlx.core import Dtype, array",
        "",
        "from . import _adapters as _ad",
        "from ._adapters import StreamOrDevice, scalar",
        "",
        "if TYPE_CHECKING:",
        "    from ._backend import JobFuture",
        "    from ._devices import DeviceLike",
        "    from ._queue import CommandQueue",
        "",
        "__all__ = [" + ", ".join(repr(n) for n in sorted(entries)) + "]",
        "_keep = (Any, Sequence, Literal, overload, mx, Dtype, array, scalar, StreamOrDevice)  # names the annotations use",
    ]
    for name in sorted(entries):
        how = entries[name]
        if (namespace, name) in OVERLOADS:
            out += overloaded(module, namespace, name, how, path)
            continue
        override = OVERRIDES.get((namespace, name))
        if override:
            text, doc = override
            if doc is None:
                doc = mlx_signature(module, name)[1]
        else:
            text, doc = mlx_signature(module, name)
        fn = parse(text)
        if (namespace, name) in RETURNS:
            fn.returns = ast.parse(RETURNS[(namespace, name)], mode="eval").body
        signature, params = render(fn, runtime_keywords=how[0] != "at_call")
        signature = signature.replace("{name}", name, 1)  # aliases: mlx's text names the original
        summary = first_paragraph(doc) if doc else ""
        docstring = textwrap.fill(summary, 100, initial_indent="    ", subsequent_indent="    ").strip()
        runtime_doc = textwrap.fill((AT_CALL_DOC if how[0] == "at_call" else RUNTIME_DOC).format(path=path + name),
                                    100, initial_indent="    ", subsequent_indent="    ")
        out += ["", "", signature, f'    """{docstring}', "", runtime_doc, '    """']
        lines = body(namespace, name, how, params, arrays_count)
        if how[0] != "at_call" and (not override or hasattr(module, name)):
            # mlx's own message for an option (or stream=) of a type it refuses; an override's
            # parameters of its own (slice's static start=/stop=/strides=) are no part of mlx's call:
            # a call that gives one keeps our message
            own = [p.lstrip("*") for p in params]
            theirs = own if not override else [p for p in own if p in _parameters(mlx_signature(module, name)[0])]
            extra = [p for p in own if p not in theirs]
            values = ", ".join(f"{p}={p}" for p in [*theirs, "stream"])
            guard = ([f"        if {' or '.join(f'{p} is not None' for p in extra)}:", "            raise"]
                     if extra else [])
            lines = ["    try:", *("    " + line for line in lines),
                     "    except _ad.OptionTypeError as _error:", *guard,
                     f"        raise _ad.mlx_type_error({path + name!r}, {name}, dict({values}), _error) from None"]
        out += lines
    return "\n".join(out) + "\n"


def overloaded(module, namespace: str, name: str, how, path: str) -> list[str]:
    """Typed stubs for each of mlx's overloads, then the function that resolves them at the call."""
    out = []
    for text in OVERLOADS[(namespace, name)]:
        signature, _ = render(parse(text))
        out += ["", "", "@overload", signature.replace("{name}", name, 1) + " ..."]
    doc = first_paragraph(mlx_signature(module, name)[1])
    docstring = textwrap.fill(doc, 100, initial_indent="    ", subsequent_indent="    ").strip()
    runtime_doc = textwrap.fill(RUNTIME_DOC.format(path=path + name) + " mlx's overloads are resolved as mlx "
                                "resolves them.", 100, initial_indent="    ", subsequent_indent="    ")
    out += ["", "", f"def {name}(*args: Any, stream: StreamOrDevice = None, {RUNTIME_PARAMS}, **kwargs: Any) "
            "-> JobFuture[array]:", f'    """{docstring}', "", runtime_doc, '    """',
            "    _rt = _ad.runtime(stream, queue, device, lazy, nowait, check_finite)",
            f"    return _ad.{how[1]}(_ad.resolve({name}, {path + name!r}, args, kwargs), _rt)"]
    return out


def target(namespace: str) -> pathlib.Path:
    return PACKAGE / f"_generated_{namespace}.py"


def main(argv: list[str]) -> int:
    stale = []
    for namespace in NAMESPACES:
        text = generate(namespace)
        if "--check" in argv:
            if not target(namespace).exists() or target(namespace).read_text() != text:
                stale.append(target(namespace).name)
        else:
            target(namespace).write_text(text)
    if stale:
        print("out of date (run python tools/gen_api.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
