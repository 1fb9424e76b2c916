"""The op spec: one record per native op, the one place its facts live.

Everything about an op derives from its record here:

* build_ffi.py generates the C++ dispatch from it (a switch over op codes,
  the positions in OPS) and bakes a digest of it into the shim, so a shim
  built from another spec is refused at import (emlx_async/_submit.py);
* tools/gen_api.py generates the public mlx-signature functions
  (emlx_async/_generated_*.py) from each record's `mlx` functions;
* emlx_async/_submit.py encodes options by their kinds (KINDS), and the
  queue shapes results by `outputs`;
* tests/ops/test_op_table.py checks that every op is reached where it says.

Data and the small helpers that build it, importing nothing of the package:
the builder loads this file on its own (runpy), before the package can be
imported.

A record is op(name, arrays, params, C++ expression, outputs=, mlx=, via=):
* arrays: how many array inputs, or VARIADIC for a list (then named `xs`);
  inputs are `x0, x1, ...` in the expression;
* params: (name, kind, default) keyword-only options, decoded in order into
  `p0, p1, ...`; a kind is a key of KINDS, optionally with a rule after a
  colon: a key of RULES ("int:positive"; for a list, each element), which
  both sides enforce (MLX divides by zero group sizes, groups and strides),
  or ":required" for a kind that takes None ("dtype:required"): None is
  refused with mlx's own TypeError (mlx's parameter has no default). Every
  integer is range-checked against the C++ type it lands in;
* the expression builds the result on stream `s` (the worker's default
  stream for its device) or `sc` (the worker thread's CPU stream, for ops
  MLX runs on the CPU only). It returns an array, a pair, a tuple or a vector;
* outputs: how the results reach Python (OUTPUTS);
* mlx: the public functions that submit this op: a path ("cummax",
  "linalg.inv", "random.key") whose mlx parameters are the op's arrays and
  options of the same name (`direct` when mlx names the arrays otherwise),
  or `adapter(path, fn, *leading)` when emlx_async/_adapters.fn translates
  mlx's parameters (an adapter may submit other ops too);
* via: where an op that is not the target of an mlx function is submitted:
  a module ("fast") or an adapter ("_adapters.roll"); "submit" for ops
  reached only through ea.ops.submit. Every op has `mlx` functions or a `via`.
"""

import hashlib
import pathlib
import runpy
from typing import NamedTuple


def _spec_error(message: str) -> Exception:
    """A mistake in the spec itself (a developer's), as an InvalidArgument.

    _errors is imported only here, on the error path: the spec loads before
    the package and must not import it. Loaded on its own (the builders), it loads
    _errors.py on its own too (that file imports nothing).
    """
    if __package__:
        from . import _errors
        errors = vars(_errors)
    else:
        errors = runpy.run_path(str(pathlib.Path(__file__).with_name("_errors.py")))
    return errors["InvalidArgument"](message)


VARIADIC = -1


class Kind(NamedTuple):
    """A parameter kind: how the C++ side decodes it and how Python encodes it."""

    decoder: str  # the Params method in cffi_src/ops.cpp that decodes it
    words: str  # what a value must be, for messages
    bits: int = 0  # integer kinds: the width of the C++ integer a value lands in
    nullable: bool = False  # takes None (so ":required" applies)


KINDS = {
    "int": Kind("integer", "an int", 32),
    "int64": Kind("int64", "an int", 64),
    "bool": Kind("boolean", "a bool"),
    "float": Kind("real", "a number"),
    "axis": Kind("axis", "an int or None", 32, nullable=True),  # an optional int
    "axes": Kind("axes", "an int, a sequence of ints or None", 32, nullable=True),  # optional int list
    "shape": Kind("shape", "a sequence of ints", 32),  # 32-bit int list (MLX's Shape)
    "strides": Kind("strides", "a sequence of ints", 64),  # 64-bit int list (MLX's Strides)
    "dtype": Kind("dtype", "an mlx dtype or None", nullable=True),
    "str": Kind("str", "a str"),
}

# Rules an integer kind may add: (words, condition on the value `v`). The
# condition is both valid Python and valid C++; build_ffi.py generates the
# C++ check from it, and Python evaluates the same text.
RULES = {"positive": ("positive", "v > 0"), "nonneg": ("non-negative", "v >= 0"), "nonzero": ("nonzero", "v != 0")}
RULE_TESTS = {rule: eval(f"lambda v: {condition}") for rule, (_, condition) in RULES.items()}  # noqa: S307 - the table's own text


def int_range(kind: str) -> tuple[str, int, int]:
    """(words, low, high) of the C++ integer an integer kind lands in."""
    bits = KINDS[kind].bits
    return f"a {bits}-bit int", -2 ** (bits - 1), 2 ** (bits - 1) - 1


def split_kind(full_kind: str) -> tuple[str, str]:
    """("int", "positive") from "int:positive", refusing what KINDS and RULES do not have."""
    kind, _, rule = full_kind.partition(":")
    if kind not in KINDS:
        raise _spec_error(f"op spec: unknown parameter kind {full_kind!r}")
    if rule == "required" and not KINDS[kind].nullable:
        raise _spec_error(f"op spec: kind {kind!r} never takes None, so it cannot be required")
    if rule not in ("", "required") and (rule not in RULES or not KINDS[kind].bits):
        raise _spec_error(f"op spec: kind {kind!r} takes no rule {rule!r}")
    return kind, rule


# How an op's results reach Python, as mlx.core returns them: one array, a
# tuple or a list; "_OR_ARRAY": one array when there is a single result
# (svd with compute_uv=False, atleast_1d of one array, unique with no extras).
ARRAY, TUPLE, LIST, TUPLE_OR_ARRAY, LIST_OR_ARRAY = "array", "tuple", "list", "tuple|array", "list|array"
OUTPUTS = (ARRAY, TUPLE, LIST, TUPLE_OR_ARRAY, LIST_OR_ARRAY)


class Fn(NamedTuple):
    """A public mlx function that submits an op (see `mlx` in the module docstring)."""

    path: str  # "cummax", "linalg.inv": its namespace and name (mx.<path>)
    adapter: str | None = None  # the function of emlx_async/_adapters.py that translates its parameters
    leading: tuple = ()  # constant leading arguments of that adapter
    arrays: tuple | None = None  # a direct function's array parameters, when not mlx's first ones
    returns: str | None = None  # its return annotation, where mlx's own text is wrong


def adapter(path: str, fn: str, *leading) -> Fn:
    return Fn(path, adapter=fn, leading=leading)


def direct(path: str, arrays: tuple | None = None, returns: str | None = None) -> Fn:
    return Fn(path, arrays=arrays, returns=returns)


class Op(NamedTuple):
    name: str
    arrays: int
    params: tuple
    cpp: str
    outputs: str = ARRAY
    mlx: tuple = ()  # Fn records
    via: tuple = ()
    weak: tuple = ()  # (i, j) array positions typed as a weak pair


def op(name: str, arrays: int, params, cpp: str, *, outputs: str = ARRAY, mlx=(), via=(), weak=()) -> Op:
    if outputs not in OUTPUTS:
        raise _spec_error(f"op spec: {name}: unknown outputs {outputs!r}")
    for pname, full_kind, _ in params:
        split_kind(full_kind)
    if not mlx and not via:
        raise _spec_error(f"op spec: {name} says neither which mlx function nor what else submits it")
    functions = tuple(f if isinstance(f, Fn) else Fn(f) for f in mlx)
    return Op(name, arrays, tuple(tuple(p) for p in params), cpp, outputs, functions, tuple(via), tuple(weak))


# At-call functions: no job at all (mlx's exact signature, no runtime keywords);
# emlx_async/_adapters.fn(params...) answers them with an already resolved
# JobFuture (their answer is not arrays and needs no queue). path -> fn
ANSWERED_AT_CALL = {"einsum_path": "einsum_path"}

_UNARY = [
    "abs", "negative", "sign", "floor", "ceil", "exp", "expm1", "log", "log2", "log10", "log1p",
    "sqrt", "rsqrt", "square", "reciprocal", "sin", "cos", "tan", "arcsin", "arccos", "arctan",
    "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh", "erf", "erfinv", "sigmoid", "real",
    "imag", "conjugate", "isnan", "isinf", "isfinite", "logical_not", "bitwise_invert",
    "stop_gradient", "copy", "degrees", "radians",
]

_BINARY = [
    "add", "subtract", "multiply", "divide", "floor_divide", "remainder", "power", "maximum",
    "minimum", "arctan2", "logaddexp", "equal", "not_equal", "greater", "greater_equal", "less",
    "less_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
    "left_shift", "right_shift", "matmul", "outer", "inner", "kron",
]

# Integer division guarded against INT_MIN / -1 (see ops.cpp: int_division).
_BINARY_EXPRESSIONS = {"floor_divide": "int_division(x0, x1, true, s)",
                       "remainder": "int_division(x0, x1, false, s)"}

# mlx's weak typing (python/src/utils.cpp: to_arrays): in an op's `weak`
# pairs (i, j) of array positions, a Python scalar or NumPy value beside an
# mx.array takes the array's dtype where it can (emlx_async/_convert.py);
# other inputs convert alone. The binary ops with a weak pair:
_WEAK_BINARY = [
    "add", "subtract", "multiply", "divide", "floor_divide", "remainder", "power", "maximum", "minimum",
    "arctan2", "logaddexp", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
]
PAIR = ((0, 1),)

# mlx's aliases of these, under their own names and signatures
_ALIASES = {"arccos": ("acos",), "arccosh": ("acosh",), "arcsin": ("asin",), "arcsinh": ("asinh",),
            "arctan": ("atan",), "arctan2": ("atan2",), "arctanh": ("atanh",), "left_shift": ("bitwise_left_shift",),
            "right_shift": ("bitwise_right_shift",), "conjugate": ("conj",), "power": ("pow",),
            "copy": ("positive",)}

_REDUCE = ["sum", "prod", "max", "min", "mean", "all", "any", "logsumexp"]

KEEPDIMS = ("keepdims", "bool", False)
AXES = ("axis", "axes", None)

OPS = (
    [op(name, 1, [], f"mx::{name}(x0, s)", mlx=(name, *_ALIASES.get(name, ()))) for name in _UNARY]
    + [op(name, 2, [], _BINARY_EXPRESSIONS.get(name, f"mx::{name}(x0, x1, s)"),
          mlx=(name, *_ALIASES.get(name, ())), weak=PAIR if name in _WEAK_BINARY else ()) for name in _BINARY]
    + [op(name, 1, [AXES, KEEPDIMS], f"mx::{name}(x0, all_axes(p0, x0), p1, s)", mlx=(name,)) for name in _REDUCE]
    + [
        # creation
        op("zeros", 0, [("shape", "shape", ()), ("dtype", "dtype", None)],
           "mx::zeros(p0, p1.value_or(mx::float32), s)", mlx=("zeros", "empty")),
        op("ones", 0, [("shape", "shape", ()), ("dtype", "dtype", None)],
           "mx::ones(p0, p1.value_or(mx::float32), s)", mlx=("ones",)),
        op("full", 1, [("shape", "shape", ()), ("dtype", "dtype", None)],
           "p1 ? mx::full(p0, x0, *p1, s) : mx::full(p0, x0, s)",
           mlx=(adapter("full", "full"), adapter("full_like", "full_like"))),
        op("eye", 0, [("n", "int", 1), ("m", "axis", None), ("k", "int", 0), ("dtype", "dtype", None)],
           "mx::eye(p0, p1.value_or(p0), p2, p3.value_or(mx::float32), s)", mlx=("eye", "identity")),
        op("arange", 0, [("start", "float", 0.0), ("stop", "float", 0.0), ("step", "float", 1.0),
                         ("dtype", "dtype", None)],
           "mx::arange(p0, p1, p2, p3.value_or(mx::float32), s)", mlx=(adapter("arange", "arange"),)),
        op("linspace", 0, [("start", "float", 0.0), ("stop", "float", 1.0), ("num", "int", 50),
                           ("dtype", "dtype", None)],
           "mx::linspace(p0, p1, p2, p3.value_or(mx::float32), s)", via=("submit",)),
        op("tri", 0, [("n", "int", 1), ("m", "axis", None), ("k", "int", 0), ("dtype", "dtype", None)],
           "mx::tri(p0, p1.value_or(p0), p2, p3.value_or(mx::float32), s)", mlx=("tri",)),
        op("tril", 1, [("k", "int", 0)], "mx::tril(x0, p0, s)", mlx=("tril",)),
        op("triu", 1, [("k", "int", 0)], "mx::triu(x0, p0, s)", mlx=("triu",)),
        # conversion and shape
        op("contiguous", 1, [], "mx::contiguous(x0, false, s)", via=("submit",)),
        op("astype", 1, [("dtype", "dtype:required", None)], "mx::astype(x0, need(p0, \"astype\", \"dtype\"), s)",
           mlx=("astype",)),
        op("view", 1, [("dtype", "dtype:required", None)], "mx::view(x0, need(p0, \"view\", \"dtype\"), s)",
           mlx=("view",)),
        op("reshape", 1, [("shape", "shape", ())], "mx::reshape(x0, p0, s)", mlx=("reshape",)),
        op("flatten", 1, [("start_axis", "int", 0), ("end_axis", "int", -1)], "mx::flatten(x0, p0, p1, s)",
           mlx=("flatten",)),
        op("transpose", 1, [("axes", "axes", None)],
           "p0 ? mx::transpose(x0, *p0, s) : mx::transpose(x0, s)", mlx=("transpose", "permute_dims")),
        op("swapaxes", 1, [("axis1", "int", 0), ("axis2", "int", 1)], "mx::swapaxes(x0, p0, p1, s)",
           mlx=("swapaxes", adapter("matrix_transpose", "matrix_transpose"))),
        op("moveaxis", 1, [("source", "int", 0), ("destination", "int", 0)], "mx::moveaxis(x0, p0, p1, s)",
           mlx=("moveaxis",)),
        op("squeeze", 1, [("axis", "axes", None)], "p0 ? mx::squeeze(x0, *p0, s) : mx::squeeze(x0, s)",
           mlx=("squeeze",)),
        op("expand_dims", 1, [("axis", "axes:required", None)], "mx::expand_dims(x0, need(p0, \"expand_dims\", \"axis\"), s)",
           mlx=("expand_dims",)),
        op("broadcast_to", 1, [("shape", "shape", ())], "mx::broadcast_to(x0, p0, s)", mlx=("broadcast_to",)),
        op("flip", 1, [("axis", "axes", None)], "mx::flip(x0, all_axes(p0, x0), s)", mlx=("flip",)),
        op("tile", 1, [("reps", "shape", ())], "mx::tile(x0, std::vector<int>(p0.begin(), p0.end()), s)",
           mlx=("tile",)),
        op("repeat", 1, [("repeats", "int", 1), ("axis", "axis", None)],
           "p1 ? mx::repeat(x0, p0, *p1, s) : mx::repeat(x0, p0, s)", mlx=(direct("repeat", arrays=("array",)),)),
        op("roll", 1, [("shift", "int", 0), ("axis", "axis", None)],
           "p1 ? mx::roll(x0, p0, *p1, s) : mx::roll(x0, p0, s)", mlx=(adapter("roll", "roll"),)),
        op("pad", 1, [("pad_width", "shape", ()), ("constant_value", "float", 0.0)],
           "pad_pairs(x0, p0, p1, s)", via=("submit",)),
        op("concatenate", VARIADIC, [("axis", "int", 0)], "mx::concatenate(xs, p0, s)",
           mlx=(adapter("concatenate", "concatenate"), adapter("concat", "concatenate"))),
        op("stack", VARIADIC, [("axis", "int", 0)], "mx::stack(xs, p0, s)", mlx=(adapter("stack", "stack"),)),
        op("split", 1, [("sections", "axis", None), ("indices", "shape", ()), ("axis", "int", 0)],
           "p0 ? mx::split(x0, *p0, p2, s) : mx::split(x0, p1, p2, s)", outputs=LIST, mlx=(adapter("split", "split"),)),
        op("as_strided", 1, [("shape", "shape", ()), ("strides", "strides", ()), ("offset", "int64:nonneg", 0)],
           "validate::as_strided(x0, p0, p1, p2, s)", mlx=(adapter("as_strided", "as_strided"),)),
        op("slice", 1, [("start", "shape", ()), ("stop", "shape", ()), ("strides", "shape:nonzero", ())],
           "p2.empty() ? mx::slice(x0, p0, p1, s) : mx::slice(x0, p0, p1, p2, s)", mlx=(adapter("slice", "slice"),)),
        op("slice_update", 2, [("start", "shape", ()), ("stop", "shape", ()), ("strides", "shape:nonzero", ())],
           "p2.empty() ? mx::slice_update(x0, x1, p0, p1, s) : mx::slice_update(x0, x1, p0, p1, p2, s)",
           mlx=(adapter("slice_update", "slice_update"),)),
        # elementwise with options
        op("where", 3, [], "mx::where(x0, x1, x2, s)", mlx=("where",), weak=((1, 2),)),
        op("clip", 3, [], "mx::clip(x0, x1, x2, s)", mlx=(adapter("clip", "clip"),), weak=((0, 1), (0, 2))),
        op("round", 1, [("decimals", "int", 0)], "mx::round(x0, p0, s)", mlx=("round",)),
        op("isclose", 2, [("rtol", "float", 1e-5), ("atol", "float", 1e-8), ("equal_nan", "bool", False)],
           "mx::isclose(x0, x1, p0, p1, p2, s)", mlx=("isclose",)),
        op("allclose", 2, [("rtol", "float", 1e-5), ("atol", "float", 1e-8), ("equal_nan", "bool", False)],
           "mx::allclose(x0, x1, p0, p1, p2, s)", mlx=("allclose",)),
        op("array_equal", 2, [("equal_nan", "bool", False)], "mx::array_equal(x0, x1, p0, s)",
           mlx=("array_equal",), weak=PAIR),
        op("nan_to_num", 1, [("nan", "float", 0.0)], "mx::nan_to_num(x0, p0, std::nullopt, std::nullopt, s)",
           via=("submit",)),
        # reductions and scans with an axis
        op("var", 1, [AXES, KEEPDIMS, ("ddof", "int", 0)], "mx::var(x0, all_axes(p0, x0), p1, p2, s)", mlx=("var",)),
        op("std", 1, [AXES, KEEPDIMS, ("ddof", "int", 0)], "mx::std(x0, all_axes(p0, x0), p1, p2, s)", mlx=("std",)),
        op("argmax", 1, [("axis", "axis", None), KEEPDIMS],
           "p0 ? mx::argmax(x0, *p0, p1, s) : mx::argmax(x0, p1, s)", mlx=("argmax",)),
        op("argmin", 1, [("axis", "axis", None), KEEPDIMS],
           "p0 ? mx::argmin(x0, *p0, p1, s) : mx::argmin(x0, p1, s)", mlx=("argmin",)),
        op("cumsum", 1, [("axis", "axis", None), ("reverse", "bool", False), ("inclusive", "bool", True)],
           "p0 ? mx::cumsum(x0, *p0, p1, p2, std::nullopt, s) : mx::cumsum(x0, p1, p2, std::nullopt, s)",
           via=("submit",)),
        op("cumprod", 1, [("axis", "axis", None), ("reverse", "bool", False), ("inclusive", "bool", True)],
           "p0 ? mx::cumprod(x0, *p0, p1, p2, std::nullopt, s) : mx::cumprod(x0, p1, p2, std::nullopt, s)",
           via=("submit",)),
        op("cummax", 1, [("axis", "axis", None), ("reverse", "bool", False), ("inclusive", "bool", True)],
           "p0 ? mx::cummax(x0, *p0, p1, p2, s) : mx::cummax(x0, p1, p2, s)", mlx=("cummax",)),
        op("cummin", 1, [("axis", "axis", None), ("reverse", "bool", False), ("inclusive", "bool", True)],
           "p0 ? mx::cummin(x0, *p0, p1, p2, s) : mx::cummin(x0, p1, p2, s)", mlx=("cummin",)),
        op("softmax", 1, [AXES, ("precise", "bool", False)], "mx::softmax(x0, all_axes(p0, x0), p1, s)",
           mlx=("softmax",)),
        op("sort", 1, [("axis", "axis", -1)], "p0 ? mx::sort(x0, *p0, s) : mx::sort(x0, s)", mlx=("sort",)),
        op("argsort", 1, [("axis", "axis", -1)], "p0 ? mx::argsort(x0, *p0, s) : mx::argsort(x0, s)", mlx=("argsort",)),
        op("topk", 1, [("k", "int", 1), ("axis", "axis", -1)],
           "p1 ? mx::topk(x0, p0, *p1, s) : mx::topk(x0, p0, s)", mlx=("topk",)),
        # indexing
        op("take", 2, [("axis", "axis", None)], "p0 ? mx::take(x0, x1, *p0, s) : mx::take(x0, x1, s)",
           mlx=(adapter("take", "take"),)),
        op("take_along_axis", 2, [("axis", "axis", None)],
           "p0 ? mx::take_along_axis(x0, x1, *p0, s) : mx::take_along_axis(mx::flatten(x0, s), x1, 0, s)",
           mlx=(adapter("take_along_axis", "take_along_axis"),)),
        op("put_along_axis", 3, [("axis", "int", 0)], "mx::put_along_axis(x0, x1, x2, p0, s)",
           mlx=(adapter("put_along_axis", "put_along_axis"),)),
        op("scatter", VARIADIC, [("axes", "axes", None)], "scatter_like(xs, p0, ScatterKind::assign, s)", via=("ops",)),
        op("scatter_add", VARIADIC, [("axes", "axes", None)], "scatter_like(xs, p0, ScatterKind::add, s)",
           via=("ops",)),
        op("gather", VARIADIC, [("axes", "axes", None), ("slice_sizes", "shape", ())],
           "mx::gather(xs[0], std::vector<mx::array>(xs.begin() + 1, xs.end()), need(p0, \"gather\", \"axes\"), p1, s)",
           via=("ops",)),
        # select-and-scatter for pooling gradients: xs = [operand, source]
        op("window_scatter_max", 2, [("window", "shape", ()), ("strides", "shape", ()), ("padding", "shape", ())],
           "window_scatter(x0, x1, p0, p1, p2, true, s)", via=("ops",)),
        op("window_scatter_min", 2, [("window", "shape", ()), ("strides", "shape", ()), ("padding", "shape", ())],
           "window_scatter(x0, x1, p0, p1, p2, false, s)", via=("ops",)),
        # extent: how many elements from each index on are read (gather's slice size along the axis)
        op("check_bounds", 1, [("size", "int64", 0), ("op", "str", ""), ("extent", "int64:positive", 1)],
           "check_bounds(x0, p0, p1, p2, s)", via=("_submit",)),
        # linear algebra and contractions
        op("tensordot", 2, [("axes", "int", 2)], "mx::tensordot(x0, x1, p0, s)",
           mlx=(adapter("tensordot", "tensordot"),)),
        op("einsum", VARIADIC, [("subscripts", "str", "")], "mx::einsum(p0, xs, s)",
           mlx=(adapter("einsum", "einsum"),)),
        op("addmm", 3, [("alpha", "float", 1.0), ("beta", "float", 1.0)], "mx::addmm(x0, x1, x2, p0, p1, s)",
           mlx=("addmm",)),
        op("conv_general", 2, [("stride", "shape", ()), ("padding_lo", "shape", ()), ("padding_hi", "shape", ()),
                               ("kernel_dilation", "shape", ()), ("input_dilation", "shape", ()),
                               ("groups", "int:nonzero", 1), ("flip", "bool", False)],
           "conv_general(x0, x1, p0, p1, p2, p3, p4, p5, p6, s)", mlx=(adapter("conv_general", "conv_general"),)),
        op("linalg_inv", 1, [], "mx::linalg::inv(x0, sc)", mlx=("linalg.inv",)),
        op("linalg_tri_inv", 1, [("upper", "bool", False)], "mx::linalg::tri_inv(x0, p0, sc)", mlx=("linalg.tri_inv",)),
        op("linalg_pinv", 1, [], "mx::linalg::pinv(x0, sc)", mlx=("linalg.pinv",)),
        op("linalg_cholesky", 1, [("upper", "bool", False)], "mx::linalg::cholesky(x0, p0, sc)",
           mlx=("linalg.cholesky",)),
        op("linalg_qr", 1, [], "mx::linalg::qr(x0, sc)", outputs=TUPLE, mlx=("linalg.qr",)),
        op("linalg_svd", 1, [("compute_uv", "bool", True)], "mx::linalg::svd(x0, p0, sc)",
           outputs=TUPLE_OR_ARRAY, mlx=(direct("linalg.svd", returns="tuple[array, array, array] | array"),)),
        op("linalg_lu", 1, [], "mx::linalg::lu(x0, sc)", outputs=TUPLE, mlx=("linalg.lu",)),
        op("linalg_eigh", 1, [("UPLO", "str", "L")], "mx::linalg::eigh(x0, p0, sc)",
           outputs=TUPLE, mlx=("linalg.eigh",)),
        op("linalg_eigvalsh", 1, [("UPLO", "str", "L")], "mx::linalg::eigvalsh(x0, p0, sc)", mlx=("linalg.eigvalsh",)),
        op("linalg_solve", 2, [], "mx::linalg::solve(x0, x1, sc)", mlx=("linalg.solve",)),
        op("linalg_solve_triangular", 2, [("upper", "bool", False)], "mx::linalg::solve_triangular(x0, x1, p0, sc)",
           mlx=("linalg.solve_triangular",)),
        op("linalg_norm", 1, [AXES, KEEPDIMS],
           "p0 ? mx::linalg::norm(x0, *p0, p1, s) : mx::linalg::norm(x0, std::nullopt, p1, s)",
           mlx=(adapter("linalg.norm", "norm"), adapter("matrix_norm", "norm"))),
        op("fft_fft", 1, [("axis", "int", -1)], "mx::fft::fft(x0, p0, kBackward, sc)", via=("submit",)),
        op("fft_ifft", 1, [("axis", "int", -1)], "mx::fft::ifft(x0, p0, kBackward, sc)", via=("submit",)),
        op("fft_fft2", 1, [("axes", "axes", None)], "mx::fft::fft2(x0, p0.value_or(std::vector<int>{-2, -1}), kBackward, sc)",
           via=("submit",)),
        op("fft_ifft2", 1, [("axes", "axes", None)], "mx::fft::ifft2(x0, p0.value_or(std::vector<int>{-2, -1}), kBackward, sc)",
           via=("submit",)),
        op("fft_rfft", 1, [("axis", "int", -1)], "mx::fft::rfft(x0, p0, kBackward, sc)", via=("submit",)),
        op("fft_irfft", 1, [("axis", "int", -1)], "mx::fft::irfft(x0, p0, kBackward, sc)", via=("submit",)),
        # mlx::core::fast
        op("fast_rms_norm", 2, [("eps", "float", 1e-5)], "mx::fast::rms_norm(x0, x1, p0, s)", via=("fast",)),
        op("fast_layer_norm", 3, [("eps", "float", 1e-5)], "mx::fast::layer_norm(x0, x1, x2, p0, s)", via=("fast",)),
        op("fast_layer_norm_no_bias", 2, [("eps", "float", 1e-5)],
           "mx::fast::layer_norm(x0, x1, std::nullopt, p0, s)", via=("fast",)),
        op("fast_rope", 1, [("dims", "int", 0), ("traditional", "bool", False), ("base", "float", 10000.0),
                            ("scale", "float", 1.0), ("offset", "int", 0)],
           "mx::fast::rope(x0, p0, p1, static_cast<float>(p2), p3, p4, std::nullopt, s)", via=("fast",)),
        op("fast_rope_offsets", 2, [("dims", "int", 0), ("traditional", "bool", False), ("base", "float", 10000.0),
                                    ("scale", "float", 1.0)],
           "mx::fast::rope(x0, p0, p1, static_cast<float>(p2), p3, x1, std::nullopt, s)", via=("fast",)),
        op("fast_rope_freqs", 2, [("dims", "int", 0), ("traditional", "bool", False), ("scale", "float", 1.0),
                                  ("offset", "int", 0)],
           "mx::fast::rope(x0, p0, p1, std::nullopt, p2, p3, x1, s)", via=("fast",)),
        op("fast_rope_positions", 2, [("dims", "int", 0), ("traditional", "bool", False), ("base", "float", 10000.0),
                                      ("scale", "float", 1.0)],
           "rope_positions(x0, x1, p0, p1, static_cast<float>(p2), static_cast<float>(p3), s)", via=("fast",)),
        op("fast_swiglu", 2, [], "mx::multiply(mx::multiply(x0, mx::sigmoid(x0, s), s), x1, s)", via=("fast",)),
        op("fast_sdpa_causal_key_mask", 4, [("scale", "float", 1.0)], "causal_key_mask_sdpa(x0, x1, x2, x3, p0, s)",
           via=("fast",)),
        op("fast_sdpa", 3, [("scale", "float", 1.0), ("mask", "str", "")],
           "mx::fast::scaled_dot_product_attention(x0, x1, x2, p0, p1, std::nullopt, std::nullopt, false, s)",
           via=("fast",)),
        op("fast_sdpa_masked", 4, [("scale", "float", 1.0)],
           "mx::fast::scaled_dot_product_attention(x0, x1, x2, p0, \"array\", x3, std::nullopt, false, s)",
           via=("fast",)),
        op("fast_sdpa_sinks", 4, [("scale", "float", 1.0), ("mask", "str", "")],
           "mx::fast::scaled_dot_product_attention(x0, x1, x2, p0, p1, std::nullopt, x3, false, s)", via=("fast",)),
        # fused KV-cache update + causal attention (see ops.cpp: kv_attention);
        # xs = [q, k, v, k_cache, v_cache(, key_mask)]; returns (out, k_cache', v_cache')
        op("kv_cache_attention", VARIADIC, [("offset", "int", 0), ("scale", "float", 1.0)],
           "kv_attention(xs, p0, static_cast<float>(p1), s)", outputs=TUPLE, via=("attention",)),
        # quantization
        op("quantize", 1, [("group_size", "axis:positive", None), ("bits", "axis:positive", None),
                           ("mode", "str", "affine")],
           "mx::quantize(x0, p0, p1, p2, std::nullopt, s)", outputs=LIST, mlx=(adapter("quantize", "quantize"),)),
        op("dequantize", VARIADIC, [("group_size", "axis:positive", None), ("bits", "axis:positive", None),
                                    ("mode", "str", "affine")],
           "mx::dequantize(xs[0], xs[1], optional_at(xs, 2), p0, p1, p2, std::nullopt, std::nullopt, s)",
           mlx=(adapter("dequantize", "dequantize"),)),
        op("quantized_matmul", VARIADIC, [("transpose", "bool", True), ("group_size", "axis:positive", None),
                                          ("bits", "axis:positive", None), ("mode", "str", "affine")],
           "quantized_matmul(xs, p0, p1, p2, p3, s)", mlx=(adapter("quantized_matmul", "quantized_matmul"),)),
    ]
)

# ---- mlx-signature variants and additions (helpers in cffi_src/ops_extra.cpp) ----
# The variants carry options the entries above lack (pad modes, dynamic
# slices, fft sizes and norms, ...); emlx_async/_adapters.py picks an entry
# per call. random_* ops always get a key: without one, the Python side
# draws it from MLX's global random state, as mx.random does.
_SHAPE = ("shape", "shape", ())
_DTYPE = ("dtype", "dtype", None)
_SCAN = [("axis", "axis", None), ("reverse", "bool", False), ("inclusive", "bool", True)]

OPS += [
    op("pad_mode", 2, [("pad_width", "shape", ()), ("mode", "str", "constant")], "extra::pad_mode(x0, x1, p0, p1, s)",
       mlx=(adapter("pad", "pad"),)),
    op("slice_dynamic", 2, [("axes", "shape", ()), ("slice_size", "shape", ())],
       "mx::slice(x0, x1, extra::ints(p0), p1, s)", via=("_adapters.slice",)),
    op("slice_update_dynamic", 3, [("axes", "shape", ())], "mx::slice_update(x0, x1, x2, extra::ints(p0), s)",
       via=("_adapters.slice_update",)),
    op("tensordot_axes", 2, [("axes_a", "shape", ()), ("axes_b", "shape", ())],
       "mx::tensordot(x0, x1, extra::ints(p0), extra::ints(p1), s)", via=("_adapters.tensordot",)),
    op("linspace_endpoint", 0, [("start", "float", 0.0), ("stop", "float", 1.0), ("num", "int", 50),
                                ("endpoint", "bool", True), _DTYPE],
       "mx::linspace(p0, p1, p2, p3, p4.value_or(mx::float32), s)", mlx=(adapter("linspace", "linspace"),)),
    op("nan_to_num_inf", 1, [("nan", "float", 0.0), ("has_posinf", "bool", False), ("posinf", "float", 0.0),
                             ("has_neginf", "bool", False), ("neginf", "float", 0.0)],
       "mx::nan_to_num(x0, static_cast<float>(p0), extra::opt_float(p1, p2), extra::opt_float(p3, p4), s)",
       mlx=(adapter("nan_to_num", "nan_to_num"),)),
    op("cumsum_dtype", 1, _SCAN + [_DTYPE],
       "p0 ? mx::cumsum(x0, *p0, p1, p2, p3, s) : mx::cumsum(x0, p1, p2, p3, s)",
       mlx=(adapter("cumsum", "cumsum"), adapter("cumulative_sum", "cumsum"))),
    op("cumprod_dtype", 1, _SCAN + [_DTYPE],
       "p0 ? mx::cumprod(x0, *p0, p1, p2, p3, s) : mx::cumprod(x0, p1, p2, p3, s)",
       mlx=(adapter("cumprod", "cumprod"), adapter("cumulative_prod", "cumprod"))),
    op("contiguous_col_major", 1, [("allow_col_major", "bool", False)], "mx::contiguous(x0, p0, s)",
       mlx=(adapter("contiguous", "contiguous"),)),
    op("fft_any", 1, [("kind", "int", 0), ("n", "axes", None), ("axes", "shape", ()), ("norm", "str", "backward")],
       "extra::fft_any(x0, p0, p1, p2, p3, sc)",
       mlx=(adapter("fft.fft", "fft1", "fft"), adapter("fft.ifft", "fft1", "ifft"),
            adapter("fft.rfft", "fft1", "rfft"), adapter("fft.irfft", "fft1", "irfft"),
            adapter("fft.fft2", "fftn", "fft", "fft2"), adapter("fft.fftn", "fftn", "fft", "fftn"),
            adapter("fft.ifft2", "fftn", "ifft", "ifft2"), adapter("fft.ifftn", "fftn", "ifft", "ifftn"),
            adapter("fft.rfft2", "fftn", "rfft", "rfft2"), adapter("fft.rfftn", "fftn", "rfft", "rfftn"),
            adapter("fft.irfft2", "fftn", "irfft", "irfft2"), adapter("fft.irfftn", "fftn", "irfft", "irfftn"))),
    op("norm_ord", 1, [("ord", "float", 2.0), AXES, KEEPDIMS], "mx::linalg::norm(x0, p0, p1, p2, s)",
       via=("_adapters.norm",)),
    op("norm_str", 1, [AXES, KEEPDIMS, ("ord", "str", "fro")], "mx::linalg::norm(x0, p2, p0, p1, s)",
       via=("_adapters.norm",)),
    # mx.random
    op("random_key", 0, [("seed", "str", "0")], "mx::random::key(std::stoull(p0))",
       mlx=(adapter("random.key", "random_key"),)),
    op("random_split", 1, [("num", "int", 2)], "mx::random::split(x0, p0, s)",
       mlx=(adapter("random.split", "random_split"),)),
    op("random_uniform", 3, [_SHAPE, _DTYPE], "mx::random::uniform(x0, x1, p0, p1.value_or(mx::float32), x2, s)",
       mlx=(adapter("random.uniform", "random_uniform"),)),
    op("random_normal", VARIADIC, [_SHAPE, _DTYPE, ("has_loc", "bool", False), ("has_scale", "bool", False)],
       "extra::random_normal(xs, p0, p1.value_or(mx::float32), p2, p3, s)",
       mlx=(adapter("random.normal", "random_normal"),)),
    op("random_randint", 3, [_SHAPE, _DTYPE], "mx::random::randint(x0, x1, p0, p1.value_or(mx::int32), x2, s)",
       mlx=(adapter("random.randint", "random_randint"),)),
    op("random_bernoulli", 2, [("shape", "axes", None)],
       "p0 ? mx::random::bernoulli(x0, *extra::opt_shape(p0), x1, s) : mx::random::bernoulli(x0, x1, s)",
       mlx=(adapter("random.bernoulli", "random_bernoulli"),)),
    op("random_truncated_normal", 3, [("shape", "axes", None), _DTYPE],
       "p0 ? mx::random::truncated_normal(x0, x1, *extra::opt_shape(p0), p1.value_or(mx::float32), x2, s)"
       " : mx::random::truncated_normal(x0, x1, p1.value_or(mx::float32), x2, s)",
       mlx=(adapter("random.truncated_normal", "random_truncated_normal"),)),
    op("random_gumbel", 1, [_SHAPE, _DTYPE], "mx::random::gumbel(p0, p1.value_or(mx::float32), x0, s)",
       mlx=(adapter("random.gumbel", "random_gumbel"),)),
    op("random_categorical", 2, [("axis", "int", -1), ("shape", "axes", None), ("num_samples", "axis", None)],
       "extra::categorical(x0, x1, p0, p1, p2, s)", mlx=(adapter("random.categorical", "random_categorical"),)),
    op("random_permutation", 2, [("axis", "int", 0)], "mx::random::permutation(x0, p0, x1, s)",
       mlx=(adapter("random.permutation", "random_permutation"),)),
    op("random_permutation_n", 1, [("n", "int", 0)], "mx::random::permutation(p0, x0, s)",
       via=("_adapters.random_permutation",)),
    op("random_laplace", 1, [_SHAPE, _DTYPE, ("loc", "float", 0.0), ("scale", "float", 1.0)],
       "mx::random::laplace(p0, p1.value_or(mx::float32), static_cast<float>(p2), static_cast<float>(p3), x0, s)",
       mlx=(adapter("random.laplace", "random_laplace"),)),
    # convolutions
    op("conv_nd", 2, [("stride", "shape", ()), ("padding", "shape", ()), ("dilation", "shape", ()),
                      ("groups", "int:nonzero", 1)], "extra::conv_nd(x0, x1, p0, p1, p2, p3, s)",
       mlx=(adapter("conv1d", "conv1d"), adapter("conv2d", "conv2d"), adapter("conv3d", "conv3d"))),
    op("conv_transpose_nd", 2, [("stride", "shape", ()), ("padding", "shape", ()), ("dilation", "shape", ()),
                                ("output_padding", "shape", ()), ("groups", "int:nonzero", 1)],
       "extra::conv_transpose_nd(x0, x1, p0, p1, p2, p3, p4, s)",
       mlx=(adapter("conv_transpose1d", "conv_transpose1d"), adapter("conv_transpose2d", "conv_transpose2d"),
            adapter("conv_transpose3d", "conv_transpose3d"))),
    # more of mlx.core
    op("zeros_like", 1, [], "mx::zeros_like(x0, s)",
       mlx=(adapter("zeros_like", "zeros_like"), adapter("empty_like", "zeros_like"))),
    op("ones_like", 1, [], "mx::ones_like(x0, s)", mlx=(adapter("ones_like", "ones_like"),)),
    op("isposinf", 1, [], "mx::isposinf(x0, s)", mlx=("isposinf",)),
    op("isneginf", 1, [], "mx::isneginf(x0, s)", mlx=("isneginf",)),
    op("searchsorted", 2, [("side", "str", "left")], "mx::searchsorted(x0, x1, p0, s)", mlx=("searchsorted",)),
    op("median", 1, [AXES, KEEPDIMS], "mx::median(x0, all_axes(p0, x0), p1, s)", mlx=("median",)),
    op("partition", 1, [("kth", "int", 0), ("axis", "axis", -1)],
       "p1 ? mx::partition(x0, p0, *p1, s) : mx::partition(x0, p0, s)", mlx=("partition",)),
    op("argpartition", 1, [("kth", "int", 0), ("axis", "axis", -1)],
       "p1 ? mx::argpartition(x0, p0, *p1, s) : mx::argpartition(x0, p0, s)", mlx=("argpartition",)),
    op("diff", 1, [("n", "int", 1), ("axis", "int", -1)], "mx::diff(x0, p0, p1, s)", mlx=("diff",)),
    op("trace", 1, [("offset", "int", 0), ("axis1", "int", 0), ("axis2", "int", 1), _DTYPE],
       "p3 ? mx::trace(x0, p0, p1, p2, *p3, s) : mx::trace(x0, p0, p1, p2, s)", mlx=("trace",)),
    op("diagonal", 1, [("offset", "int", 0), ("axis1", "int", 0), ("axis2", "int", 1)],
       "mx::diagonal(x0, p0, p1, p2, s)", mlx=("diagonal",)),
    op("diag", 1, [("k", "int", 0)], "mx::diag(x0, p0, s)", mlx=("diag",)),
    op("logcumsumexp", 1, _SCAN, "p0 ? mx::logcumsumexp(x0, *p0, p1, p2, s) : mx::logcumsumexp(x0, p1, p2, s)",
       mlx=("logcumsumexp",)),
    op("hadamard_transform", 1, [("has_scale", "bool", False), ("scale", "float", 1.0)],
       "mx::hadamard_transform(x0, extra::opt_float(p0, p1), s)",
       mlx=(adapter("hadamard_transform", "hadamard_transform"),)),
    op("convolve", 2, [("mode", "str", "full")], "extra::convolve(x0, x1, p0, s)", mlx=("convolve",)),
    op("trunc", 1, [], "mx::trunc(x0, s)", mlx=("trunc",)),
    op("count_nonzero", 1, [AXES, KEEPDIMS], "mx::count_nonzero(x0, all_axes(p0, x0), p1, s)", mlx=("count_nonzero",)),
    # integer divmod by its two halves (see ops.cpp: guarded_divmod)
    op("divmod", 2, [], "guarded_divmod(x0, x1, s)", outputs=LIST, mlx=("divmod",), weak=PAIR),
    op("vecdot", 2, [("axis", "int", -1)], "mx::vecdot(x0, x1, p0, s)", mlx=("vecdot",)),
    op("minmax", 1, [AXES, KEEPDIMS], "mx::minmax(x0, all_axes(p0, x0), p1, s)", outputs=TUPLE, mlx=("minmax",)),
    op("unflatten", 1, [("axis", "int", 0), _SHAPE], "mx::unflatten(x0, p0, p1, s)", mlx=("unflatten",)),
    op("unstack", 1, [("axis", "int", 0)], "mx::unstack(x0, p0, s)", outputs=TUPLE, mlx=("unstack",)),
    op("meshgrid", VARIADIC, [("sparse", "bool", False), ("indexing", "str", "xy")], "mx::meshgrid(xs, p0, p1, s)",
       outputs=TUPLE, mlx=(adapter("meshgrid", "meshgrid"),)),
    op("atleast_nd", VARIADIC, [("ndim", "int", 1)],
       "p0 == 1 ? mx::atleast_1d(xs, s) : p0 == 2 ? mx::atleast_2d(xs, s) : mx::atleast_3d(xs, s)",
       outputs=LIST_OR_ARRAY, mlx=(adapter("atleast_1d", "atleast_1d"), adapter("atleast_2d", "atleast_2d"),
            adapter("atleast_3d", "atleast_3d"))),
    op("broadcast_arrays", VARIADIC, [], "mx::broadcast_arrays(xs, s)",
       outputs=LIST, mlx=(adapter("broadcast_arrays", "broadcast_arrays"),)),
    op("window", 0, [("kind", "int", 0), ("M", "int", 1)],  # kind: _adapters._WINDOWS
       "p0 == 0 ? mx::hanning(p1, s) : p0 == 1 ? mx::hamming(p1, s) : p0 == 2 ? mx::bartlett(p1, s)"
       " : mx::blackman(p1, s)",
       mlx=(adapter("hanning", "window", "hanning"), adapter("hamming", "window", "hamming"),
            adapter("bartlett", "window", "bartlett"), adapter("blackman", "window", "blackman"))),
    op("gather_mm", VARIADIC, [("has_lhs", "bool", False), ("has_rhs", "bool", False),
                               ("sorted_indices", "bool", False)], "extra::gather_mm(xs, p0, p1, p2, s)",
       mlx=(adapter("gather_mm", "gather_mm"),)),
    op("block_masked_mm", VARIADIC, [("block_size", "int", 64), ("has_out", "bool", False),
                                     ("has_lhs", "bool", False), ("has_rhs", "bool", False)],
       "extra::block_masked_mm(xs, p0, p1, p2, p3, s)", mlx=(adapter("block_masked_mm", "block_masked_mm"),)),
    op("segmented_mm", 3, [], "mx::segmented_mm(x0, x1, x2, s)", mlx=(adapter("segmented_mm", "segmented_mm"),)),
    op("linalg_cholesky_inv", 1, [("upper", "bool", False)], "mx::linalg::cholesky_inv(x0, p0, sc)",
       mlx=("linalg.cholesky_inv",)),
    op("linalg_cross", 2, [("axis", "int", -1)], "mx::linalg::cross(x0, x1, p0, s)", mlx=("linalg.cross",)),
    op("linalg_det", 1, [], "mx::linalg::det(x0, sc)", mlx=("linalg.det",)),
    op("linalg_slogdet", 1, [], "mx::linalg::slogdet(x0, sc)", outputs=TUPLE, mlx=("linalg.slogdet",)),
    op("linalg_eig", 1, [], "mx::linalg::eig(x0, sc)", outputs=TUPLE, mlx=("linalg.eig",)),
    op("linalg_eigvals", 1, [], "mx::linalg::eigvals(x0, sc)", mlx=("linalg.eigvals",)),
    op("linalg_lu_factor", 1, [], "mx::linalg::lu_factor(x0, sc)", outputs=TUPLE, mlx=("linalg.lu_factor",)),
    op("fft_shift", 1, [("inverse", "bool", False), ("axes", "axes", None)],
       "p1 ? (p0 ? mx::fft::ifftshift(x0, *p1, sc) : mx::fft::fftshift(x0, *p1, sc))"
       " : (p0 ? mx::fft::ifftshift(x0, sc) : mx::fft::fftshift(x0, sc))",
       mlx=(adapter("fft.fftshift", "fftshift", False), adapter("fft.ifftshift", "fftshift", True))),
    op("fft_freq", 0, [("n", "int", 1), ("d", "float", 1.0), ("real", "bool", False)],
       "p2 ? mx::fft::rfftfreq(p0, p1, sc) : mx::fft::fftfreq(p0, p1, sc)",
       mlx=(adapter("fft.fftfreq", "fftfreq", False), adapter("fft.rfftfreq", "fftfreq", True))),
    op("concatenate_flat", VARIADIC, [], "mx::concatenate(xs, s)", via=("_adapters.concatenate",)),
    op("roll_axes", 1, [("shift", "shape", ()), ("scalar_shift", "bool", False), ("one_axis", "bool", False),
                        ("axis", "axes", None)],
       "extra::roll(x0, p0, p1, p2, p3, s)", via=("_adapters.roll",)),
    op("put_along_axis_flat", 3, [],  # mx.put_along_axis with axis=None: on the flattened array, reshaped back
       "mx::reshape(mx::put_along_axis(mx::flatten(x0, s), mx::flatten(x1, s), mx::flatten(x2, s), 0, s),"
       " x0.shape(), s)", via=("_adapters.put_along_axis",)),
    op("quantize_scaled", 2, [("group_size", "axis:positive", None), ("bits", "axis:positive", None), ("mode", "str", "affine")],
       "mx::quantize(x0, p0, p1, p2, x1, s)", outputs=LIST, via=("_adapters.quantize",)),
    op("dequantize_full", VARIADIC, [("group_size", "axis:positive", None), ("bits", "axis:positive", None), ("mode", "str", "affine"),
                                     ("has_biases", "bool", False), ("has_global_scale", "bool", False), _DTYPE],
       "extra::dequantize_full(xs, p0, p1, p2, p3, p4, p5, s)", via=("_adapters.dequantize",)),
    op("unique", VARIADIC, [("size", "int", 0), ("return_index", "bool", False), ("return_inverse", "bool", False),
                            ("return_counts", "bool", False)],
       "mx::unique(xs.at(0), p0, p1, p2, p3, optional_at(xs, 1), s)",  # xs = [a, fill_value?]
       outputs=TUPLE_OR_ARRAY, mlx=(adapter("unique", "unique"),)),
    op("to_fp8", 1, [], "mx::to_fp8(x0, s)", mlx=("to_fp8",)),
    op("from_fp8", 1, [_DTYPE], "mx::from_fp8(x0, p0.value_or(mx::bfloat16), s)", mlx=("from_fp8",)),
    op("gather_qmm", VARIADIC, [("has_biases", "bool", False), ("has_lhs", "bool", False), ("has_rhs", "bool", False),
                                ("has_global_scale", "bool", False), ("transpose", "bool", True),
                                ("group_size", "axis:positive", None), ("bits", "axis:positive", None), ("mode", "str", "affine"),
                                ("sorted_indices", "bool", False)],
       "extra::gather_qmm(xs, p0, p1, p2, p3, p4, p5, p6, p7, p8, s)", mlx=(adapter("gather_qmm", "gather_qmm"),)),
    # qqmm: x quantized on the fly, w quantized already (scales given) or on the fly.
    op("qqmm", VARIADIC, [("has_scales", "bool", False), ("group_size", "axis:positive", None),
                          ("bits", "axis:positive", None), ("mode", "str", "nvfp4"), ("has_global_scale_x", "bool", False),
                          ("has_global_scale_w", "bool", False)],
       "extra::qqmm(xs, p0, p1, p2, p3, p4, p5, s)", mlx=(adapter("qqmm", "qqmm"),)),
    op("gather_qqmm", VARIADIC, [("has_scales", "bool", False), ("has_lhs", "bool", False), ("has_rhs", "bool", False),
                                 ("group_size", "axis:positive", None), ("bits", "axis:positive", None),
                                 ("mode", "str", "nvfp4"), ("has_global_scale_x", "bool", False),
                                 ("has_global_scale_w", "bool", False), ("sorted_indices", "bool", False)],
       "extra::gather_qqmm(xs, p0, p1, p2, p3, p4, p5, p6, p7, p8, s)", mlx=(adapter("gather_qqmm", "gather_qqmm"),)),
    op("random_multivariate_normal", 3, [_SHAPE, _DTYPE],
       "mx::random::multivariate_normal(x0, x1, p0, p1.value_or(mx::float32), x2, sc)",
       mlx=(adapter("random.multivariate_normal", "random_multivariate_normal"),)),
    op("fft_stft", VARIADIC, [("n_fft", "int", 2048), ("hop_length", "axis", None), ("win_length", "axis", None),
                              ("center", "bool", True), ("norm", "int", 0), ("has_onesided", "bool", False),
                              ("onesided", "bool", False), ("pad_mode", "str", "reflect")],
       "extra::stft(xs, p0, p1, p2, p3, p4, p5, p6, p7, sc)", mlx=(adapter("fft.stft", "stft"),)),
    op("fft_istft", VARIADIC, [("n_fft", "axis", None), ("hop_length", "axis", None), ("win_length", "axis", None),
                               ("center", "bool", True), ("norm", "int", 0), ("has_onesided", "bool", False),
                               ("onesided", "bool", False), ("length", "axis", None)],
       "extra::istft(xs, p0, p1, p2, p3, p4, p5, p6, p7, sc)", mlx=(adapter("fft.istft", "istft"),)),
]

# Replay of a traced function (cffi_src/replay.cpp; emlx_async/replay.py):
# xs are its inputs, `function` the id emlx_replay_register gave it; `fed`
# (a function made by TracedFunction.chain): its chained inputs come from the
# previous call on this worker thread.
OPS += [
    op("replay", VARIADIC, [("function", "int64", 0), ("fed", "bool", False)], "replay_call(xs, p0, p1, s, sc)",
       via=("replay",)),
    # the same for a function of several outputs (they come back as a tuple)
    op("replay_multi", VARIADIC, [("function", "int64", 0), ("fed", "bool", False)],
       "replay_call(xs, p0, p1, s, sc)", outputs=TUPLE, via=("replay",)),
]

if len({o.name for o in OPS}) != len(OPS):
    raise _spec_error("op spec: two ops share a name")

WEAK_PAIRS = {o.name: o.weak for o in OPS if o.weak}  # for emlx_async/_convert.py's inputs()


def dispatch_digest(ops=None) -> str:
    """A digest of everything the C++ dispatch is generated from (of OPS, or of `ops`).

    build_ffi.py bakes it into the shim; at import the package compares it
    with this spec's, so a shim built from another spec (op codes are
    positions) is refused instead of running the wrong op. Defaults are left
    out: only Python applies them.
    """
    facts = ([(o.name, o.arrays, [(p, kind) for p, kind, _ in o.params], o.cpp) for o in (OPS if ops is None else ops)],
             sorted((name, kind.decoder) for name, kind in KINDS.items()), sorted(RULES.items()))
    return hashlib.sha256(repr(facts).encode()).hexdigest()[:16]
