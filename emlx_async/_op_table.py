"""The op table: one line per native op, read by both sides.

build_ffi.py generates the C++ dispatch (a switch over op codes) from it, and
emlx_async/ops.py generates the Python awaitables. Plain data only: the
builder loads this file on its own, before the package can be imported.

An entry is (name, arrays, params, C++ expression):
* arrays: how many array inputs, or VARIADIC for a list (then named `xs`);
  inputs are `x0, x1, ...` in the expression;
* params: (name, kind, default) keyword-only options, decoded in order into
  `p0, p1, ...`; kinds: "int" (32-bit), "int64", "bool", "float", "axis"
  (optional int), "axes" (optional int list; `all_axes(p, x)` turns None into
  every axis), "shape" (32-bit int list), "strides" (64-bit int list), "dtype"
  (optional dtype), "str". An integer kind may add a rule, "int:positive",
  "int:nonneg" or "axis:nonzero" (for a list, each element): both sides refuse
  a value that breaks it (MLX divides by zero group sizes, groups and strides);
  every integer is range-checked against the C++ type it lands in;
  "dtype:required" and "axes:required" refuse None (mlx's parameter has no
  default), with mlx's own TypeError;
* the expression builds the result on stream `s` (the worker's default
  stream for its device) or `sc` (the worker thread's CPU stream, for ops
  MLX runs on the CPU only). It returns an array, a pair or a vector.
"""

VARIADIC = -1

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

# mlx's weak typing (python/src/utils.cpp: to_arrays): in these ops a Python
# scalar or NumPy value beside an mx.array takes the array's dtype where it can
# (emlx_async/_convert.py). (i, j) are array positions; other inputs convert alone.
_WEAK_BINARY = [
    "add", "subtract", "multiply", "divide", "floor_divide", "remainder", "power", "maximum", "minimum",
    "arctan2", "logaddexp", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "divmod", "array_equal",
]
WEAK_PAIRS = {**{name: ((0, 1),) for name in _WEAK_BINARY}, "where": ((1, 2),), "clip": ((0, 1), (0, 2))}

_REDUCE = ["sum", "prod", "max", "min", "mean", "all", "any", "logsumexp"]

KEEPDIMS = ("keepdims", "bool", False)
AXES = ("axis", "axes", None)

OPS = (
    [(name, 1, [], f"mx::{name}(x0, s)") for name in _UNARY]
    + [(name, 2, [], _BINARY_EXPRESSIONS.get(name, f"mx::{name}(x0, x1, s)")) for name in _BINARY]
    + [(name, 1, [AXES, KEEPDIMS], f"mx::{name}(x0, all_axes(p0, x0), p1, s)") for name in _REDUCE]
    + [
        # creation
        ("zeros", 0, [("shape", "shape", ()), ("dtype", "dtype", None)],
         "mx::zeros(p0, p1.value_or(mx::float32), s)"),
        ("ones", 0, [("shape", "shape", ()), ("dtype", "dtype", None)],
         "mx::ones(p0, p1.value_or(mx::float32), s)"),
        ("full", 1, [("shape", "shape", ()), ("dtype", "dtype", None)],
         "p1 ? mx::full(p0, x0, *p1, s) : mx::full(p0, x0, s)"),
        ("eye", 0, [("n", "int", 1), ("m", "axis", None), ("k", "int", 0), ("dtype", "dtype", None)],
         "mx::eye(p0, p1.value_or(p0), p2, p3.value_or(mx::float32), s)"),
        ("arange", 0, [("start", "float", 0.0), ("stop", "float", 0.0), ("step", "float", 1.0),
                       ("dtype", "dtype", None)],
         "mx::arange(p0, p1, p2, p3.value_or(mx::float32), s)"),
        ("linspace", 0, [("start", "float", 0.0), ("stop", "float", 1.0), ("num", "int", 50),
                         ("dtype", "dtype", None)],
         "mx::linspace(p0, p1, p2, p3.value_or(mx::float32), s)"),
        ("tri", 0, [("n", "int", 1), ("m", "axis", None), ("k", "int", 0), ("dtype", "dtype", None)],
         "mx::tri(p0, p1.value_or(p0), p2, p3.value_or(mx::float32), s)"),
        ("tril", 1, [("k", "int", 0)], "mx::tril(x0, p0, s)"),
        ("triu", 1, [("k", "int", 0)], "mx::triu(x0, p0, s)"),
        # conversion and shape
        ("contiguous", 1, [], "mx::contiguous(x0, false, s)"),
        ("astype", 1, [("dtype", "dtype:required", None)], "mx::astype(x0, need(p0, \"astype\", \"dtype\"), s)"),
        ("view", 1, [("dtype", "dtype:required", None)], "mx::view(x0, need(p0, \"view\", \"dtype\"), s)"),
        ("reshape", 1, [("shape", "shape", ())], "mx::reshape(x0, p0, s)"),
        ("flatten", 1, [("start_axis", "int", 0), ("end_axis", "int", -1)], "mx::flatten(x0, p0, p1, s)"),
        ("transpose", 1, [("axes", "axes", None)],
         "p0 ? mx::transpose(x0, *p0, s) : mx::transpose(x0, s)"),
        ("swapaxes", 1, [("axis1", "int", 0), ("axis2", "int", 1)], "mx::swapaxes(x0, p0, p1, s)"),
        ("moveaxis", 1, [("source", "int", 0), ("destination", "int", 0)], "mx::moveaxis(x0, p0, p1, s)"),
        ("squeeze", 1, [("axis", "axes", None)], "p0 ? mx::squeeze(x0, *p0, s) : mx::squeeze(x0, s)"),
        ("expand_dims", 1, [("axis", "axes:required", None)], "mx::expand_dims(x0, need(p0, \"expand_dims\", \"axis\"), s)"),
        ("broadcast_to", 1, [("shape", "shape", ())], "mx::broadcast_to(x0, p0, s)"),
        ("flip", 1, [("axis", "axes", None)], "mx::flip(x0, all_axes(p0, x0), s)"),
        ("tile", 1, [("reps", "shape", ())], "mx::tile(x0, std::vector<int>(p0.begin(), p0.end()), s)"),
        ("repeat", 1, [("repeats", "int", 1), ("axis", "axis", None)],
         "p1 ? mx::repeat(x0, p0, *p1, s) : mx::repeat(x0, p0, s)"),
        ("roll", 1, [("shift", "int", 0), ("axis", "axis", None)],
         "p1 ? mx::roll(x0, p0, *p1, s) : mx::roll(x0, p0, s)"),
        ("pad", 1, [("pad_width", "shape", ()), ("constant_value", "float", 0.0)],
         "pad_pairs(x0, p0, p1, s)"),
        ("concatenate", VARIADIC, [("axis", "int", 0)], "mx::concatenate(xs, p0, s)"),
        ("stack", VARIADIC, [("axis", "int", 0)], "mx::stack(xs, p0, s)"),
        ("split", 1, [("sections", "axis", None), ("indices", "shape", ()), ("axis", "int", 0)],
         "p0 ? mx::split(x0, *p0, p2, s) : mx::split(x0, p1, p2, s)"),
        ("as_strided", 1, [("shape", "shape", ()), ("strides", "strides", ()), ("offset", "int64:nonneg", 0)],
         "validate::as_strided(x0, p0, p1, p2, s)"),
        ("slice", 1, [("start", "shape", ()), ("stop", "shape", ()), ("strides", "shape:nonzero", ())],
         "p2.empty() ? mx::slice(x0, p0, p1, s) : mx::slice(x0, p0, p1, p2, s)"),
        ("slice_update", 2, [("start", "shape", ()), ("stop", "shape", ()), ("strides", "shape:nonzero", ())],
         "p2.empty() ? mx::slice_update(x0, x1, p0, p1, s) : mx::slice_update(x0, x1, p0, p1, p2, s)"),
        # elementwise with options
        ("where", 3, [], "mx::where(x0, x1, x2, s)"),
        ("clip", 3, [], "mx::clip(x0, x1, x2, s)"),
        ("round", 1, [("decimals", "int", 0)], "mx::round(x0, p0, s)"),
        ("isclose", 2, [("rtol", "float", 1e-5), ("atol", "float", 1e-8), ("equal_nan", "bool", False)],
         "mx::isclose(x0, x1, p0, p1, p2, s)"),
        ("allclose", 2, [("rtol", "float", 1e-5), ("atol", "float", 1e-8), ("equal_nan", "bool", False)],
         "mx::allclose(x0, x1, p0, p1, p2, s)"),
        ("array_equal", 2, [("equal_nan", "bool", False)], "mx::array_equal(x0, x1, p0, s)"),
        ("nan_to_num", 1, [("nan", "float", 0.0)], "mx::nan_to_num(x0, p0, std::nullopt, std::nullopt, s)"),
        # reductions and scans with an axis
        ("var", 1, [AXES, KEEPDIMS, ("ddof", "int", 0)], "mx::var(x0, all_axes(p0, x0), p1, p2, s)"),
        ("std", 1, [AXES, KEEPDIMS, ("ddof", "int", 0)], "mx::std(x0, all_axes(p0, x0), p1, p2, s)"),
        ("argmax", 1, [("axis", "axis", None), KEEPDIMS],
         "p0 ? mx::argmax(x0, *p0, p1, s) : mx::argmax(x0, p1, s)"),
        ("argmin", 1, [("axis", "axis", None), KEEPDIMS],
         "p0 ? mx::argmin(x0, *p0, p1, s) : mx::argmin(x0, p1, s)"),
        ("cumsum", 1, [("axis", "axis", None), ("reverse", "bool", False), ("inclusive", "bool", True)],
         "p0 ? mx::cumsum(x0, *p0, p1, p2, std::nullopt, s) : mx::cumsum(x0, p1, p2, std::nullopt, s)"),
        ("cumprod", 1, [("axis", "axis", None), ("reverse", "bool", False), ("inclusive", "bool", True)],
         "p0 ? mx::cumprod(x0, *p0, p1, p2, std::nullopt, s) : mx::cumprod(x0, p1, p2, std::nullopt, s)"),
        ("cummax", 1, [("axis", "axis", None), ("reverse", "bool", False), ("inclusive", "bool", True)],
         "p0 ? mx::cummax(x0, *p0, p1, p2, s) : mx::cummax(x0, p1, p2, s)"),
        ("cummin", 1, [("axis", "axis", None), ("reverse", "bool", False), ("inclusive", "bool", True)],
         "p0 ? mx::cummin(x0, *p0, p1, p2, s) : mx::cummin(x0, p1, p2, s)"),
        ("softmax", 1, [AXES, ("precise", "bool", False)], "mx::softmax(x0, all_axes(p0, x0), p1, s)"),
        ("sort", 1, [("axis", "axis", -1)], "p0 ? mx::sort(x0, *p0, s) : mx::sort(x0, s)"),
        ("argsort", 1, [("axis", "axis", -1)], "p0 ? mx::argsort(x0, *p0, s) : mx::argsort(x0, s)"),
        ("topk", 1, [("k", "int", 1), ("axis", "axis", -1)],
         "p1 ? mx::topk(x0, p0, *p1, s) : mx::topk(x0, p0, s)"),
        # indexing
        ("take", 2, [("axis", "axis", None)], "p0 ? mx::take(x0, x1, *p0, s) : mx::take(x0, x1, s)"),
        ("take_along_axis", 2, [("axis", "axis", None)],
         "p0 ? mx::take_along_axis(x0, x1, *p0, s) : mx::take_along_axis(mx::flatten(x0, s), x1, 0, s)"),
        ("put_along_axis", 3, [("axis", "int", 0)], "mx::put_along_axis(x0, x1, x2, p0, s)"),
        ("scatter", VARIADIC, [("axes", "axes", None)], "scatter_like(xs, p0, ScatterKind::assign, s)"),
        ("scatter_add", VARIADIC, [("axes", "axes", None)], "scatter_like(xs, p0, ScatterKind::add, s)"),
        ("gather", VARIADIC, [("axes", "axes", None), ("slice_sizes", "shape", ())],
         "mx::gather(xs[0], std::vector<mx::array>(xs.begin() + 1, xs.end()), need(p0, \"gather\", \"axes\"), p1, s)"),
        # select-and-scatter for pooling gradients: xs = [operand, source]
        ("window_scatter_max", 2, [("window", "shape", ()), ("strides", "shape", ()), ("padding", "shape", ())],
         "window_scatter(x0, x1, p0, p1, p2, true, s)"),
        ("window_scatter_min", 2, [("window", "shape", ()), ("strides", "shape", ()), ("padding", "shape", ())],
         "window_scatter(x0, x1, p0, p1, p2, false, s)"),
        # extent: how many elements from each index on are read (gather's slice size along the axis)
        ("check_bounds", 1, [("size", "int64", 0), ("op", "str", ""), ("extent", "int64:positive", 1)],
         "check_bounds(x0, p0, p1, p2, s)"),
        # linear algebra and contractions
        ("tensordot", 2, [("axes", "int", 2)], "mx::tensordot(x0, x1, p0, s)"),
        ("einsum", VARIADIC, [("subscripts", "str", "")], "mx::einsum(p0, xs, s)"),
        ("addmm", 3, [("alpha", "float", 1.0), ("beta", "float", 1.0)], "mx::addmm(x0, x1, x2, p0, p1, s)"),
        ("conv_general", 2, [("stride", "shape", ()), ("padding_lo", "shape", ()), ("padding_hi", "shape", ()),
                             ("kernel_dilation", "shape", ()), ("input_dilation", "shape", ()),
                             ("groups", "int:positive", 1), ("flip", "bool", False)],
         "conv_general(x0, x1, p0, p1, p2, p3, p4, p5, p6, s)"),
        ("linalg_inv", 1, [], "mx::linalg::inv(x0, sc)"),
        ("linalg_tri_inv", 1, [("upper", "bool", False)], "mx::linalg::tri_inv(x0, p0, sc)"),
        ("linalg_pinv", 1, [], "mx::linalg::pinv(x0, sc)"),
        ("linalg_cholesky", 1, [("upper", "bool", False)], "mx::linalg::cholesky(x0, p0, sc)"),
        ("linalg_qr", 1, [], "mx::linalg::qr(x0, sc)"),
        ("linalg_svd", 1, [("compute_uv", "bool", True)], "mx::linalg::svd(x0, p0, sc)"),
        ("linalg_lu", 1, [], "mx::linalg::lu(x0, sc)"),
        ("linalg_eigh", 1, [("UPLO", "str", "L")], "mx::linalg::eigh(x0, p0, sc)"),
        ("linalg_eigvalsh", 1, [("UPLO", "str", "L")], "mx::linalg::eigvalsh(x0, p0, sc)"),
        ("linalg_solve", 2, [], "mx::linalg::solve(x0, x1, sc)"),
        ("linalg_solve_triangular", 2, [("upper", "bool", False)], "mx::linalg::solve_triangular(x0, x1, p0, sc)"),
        ("linalg_norm", 1, [AXES, KEEPDIMS],
         "p0 ? mx::linalg::norm(x0, *p0, p1, s) : mx::linalg::norm(x0, std::nullopt, p1, s)"),
        ("fft_fft", 1, [("axis", "int", -1)], "mx::fft::fft(x0, p0, kBackward, sc)"),
        ("fft_ifft", 1, [("axis", "int", -1)], "mx::fft::ifft(x0, p0, kBackward, sc)"),
        ("fft_fft2", 1, [("axes", "axes", None)], "mx::fft::fft2(x0, p0.value_or(std::vector<int>{-2, -1}), kBackward, sc)"),
        ("fft_ifft2", 1, [("axes", "axes", None)], "mx::fft::ifft2(x0, p0.value_or(std::vector<int>{-2, -1}), kBackward, sc)"),
        ("fft_rfft", 1, [("axis", "int", -1)], "mx::fft::rfft(x0, p0, kBackward, sc)"),
        ("fft_irfft", 1, [("axis", "int", -1)], "mx::fft::irfft(x0, p0, kBackward, sc)"),
        # mlx::core::fast
        ("fast_rms_norm", 2, [("eps", "float", 1e-5)], "mx::fast::rms_norm(x0, x1, p0, s)"),
        ("fast_layer_norm", 3, [("eps", "float", 1e-5)], "mx::fast::layer_norm(x0, x1, x2, p0, s)"),
        ("fast_layer_norm_no_bias", 2, [("eps", "float", 1e-5)],
         "mx::fast::layer_norm(x0, x1, std::nullopt, p0, s)"),
        ("fast_rope", 1, [("dims", "int", 0), ("traditional", "bool", False), ("base", "float", 10000.0),
                          ("scale", "float", 1.0), ("offset", "int", 0)],
         "mx::fast::rope(x0, p0, p1, static_cast<float>(p2), p3, p4, std::nullopt, s)"),
        ("fast_rope_offsets", 2, [("dims", "int", 0), ("traditional", "bool", False), ("base", "float", 10000.0),
                                  ("scale", "float", 1.0)],
         "mx::fast::rope(x0, p0, p1, static_cast<float>(p2), p3, x1, std::nullopt, s)"),
        ("fast_rope_freqs", 2, [("dims", "int", 0), ("traditional", "bool", False), ("scale", "float", 1.0),
                                ("offset", "int", 0)],
         "mx::fast::rope(x0, p0, p1, std::nullopt, p2, p3, x1, s)"),
        ("fast_rope_positions", 2, [("dims", "int", 0), ("traditional", "bool", False), ("base", "float", 10000.0),
                                    ("scale", "float", 1.0)],
         "rope_positions(x0, x1, p0, p1, static_cast<float>(p2), static_cast<float>(p3), s)"),
        ("fast_swiglu", 2, [], "mx::multiply(mx::multiply(x0, mx::sigmoid(x0, s), s), x1, s)"),
        ("fast_sdpa_causal_key_mask", 4, [("scale", "float", 1.0)], "causal_key_mask_sdpa(x0, x1, x2, x3, p0, s)"),
        ("fast_sdpa", 3, [("scale", "float", 1.0), ("mask", "str", "")],
         "mx::fast::scaled_dot_product_attention(x0, x1, x2, p0, p1, std::nullopt, std::nullopt, false, s)"),
        ("fast_sdpa_masked", 4, [("scale", "float", 1.0)],
         "mx::fast::scaled_dot_product_attention(x0, x1, x2, p0, \"array\", x3, std::nullopt, false, s)"),
        ("fast_sdpa_sinks", 4, [("scale", "float", 1.0), ("mask", "str", "")],
         "mx::fast::scaled_dot_product_attention(x0, x1, x2, p0, p1, std::nullopt, x3, false, s)"),
        # fused KV-cache update + causal attention (see ops.cpp: kv_attention);
        # xs = [q, k, v, k_cache, v_cache(, key_mask)]; returns (out, k_cache', v_cache')
        ("kv_cache_attention", VARIADIC, [("offset", "int", 0), ("scale", "float", 1.0)],
         "kv_attention(xs, p0, static_cast<float>(p1), s)"),
        # quantization
        ("quantize", 1, [("group_size", "axis:positive", None), ("bits", "axis:positive", None),
                         ("mode", "str", "affine")],
         "mx::quantize(x0, p0, p1, p2, std::nullopt, s)"),
        ("dequantize", VARIADIC, [("group_size", "axis:positive", None), ("bits", "axis:positive", None),
                                  ("mode", "str", "affine")],
         "mx::dequantize(xs[0], xs[1], optional_at(xs, 2), p0, p1, p2, std::nullopt, std::nullopt, s)"),
        ("quantized_matmul", VARIADIC, [("transpose", "bool", True), ("group_size", "axis:positive", None),
                                        ("bits", "axis:positive", None), ("mode", "str", "affine")],
         "quantized_matmul(xs, p0, p1, p2, p3, s)"),
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
    ("pad_mode", 2, [("pad_width", "shape", ()), ("mode", "str", "constant")], "extra::pad_mode(x0, x1, p0, p1, s)"),
    ("slice_dynamic", 2, [("axes", "shape", ()), ("slice_size", "shape", ())],
     "mx::slice(x0, x1, extra::ints(p0), p1, s)"),
    ("slice_update_dynamic", 3, [("axes", "shape", ())], "mx::slice_update(x0, x1, x2, extra::ints(p0), s)"),
    ("tensordot_axes", 2, [("axes_a", "shape", ()), ("axes_b", "shape", ())],
     "mx::tensordot(x0, x1, extra::ints(p0), extra::ints(p1), s)"),
    ("linspace_endpoint", 0, [("start", "float", 0.0), ("stop", "float", 1.0), ("num", "int", 50),
                              ("endpoint", "bool", True), _DTYPE],
     "mx::linspace(p0, p1, p2, p3, p4.value_or(mx::float32), s)"),
    ("nan_to_num_inf", 1, [("nan", "float", 0.0), ("has_posinf", "bool", False), ("posinf", "float", 0.0),
                           ("has_neginf", "bool", False), ("neginf", "float", 0.0)],
     "mx::nan_to_num(x0, static_cast<float>(p0), extra::opt_float(p1, p2), extra::opt_float(p3, p4), s)"),
    ("cumsum_dtype", 1, _SCAN + [_DTYPE],
     "p0 ? mx::cumsum(x0, *p0, p1, p2, p3, s) : mx::cumsum(x0, p1, p2, p3, s)"),
    ("cumprod_dtype", 1, _SCAN + [_DTYPE],
     "p0 ? mx::cumprod(x0, *p0, p1, p2, p3, s) : mx::cumprod(x0, p1, p2, p3, s)"),
    ("contiguous_col_major", 1, [("allow_col_major", "bool", False)], "mx::contiguous(x0, p0, s)"),
    ("fft_any", 1, [("kind", "int", 0), ("n", "axes", None), ("axes", "shape", ()), ("norm", "str", "backward")],
     "extra::fft_any(x0, p0, p1, p2, p3, sc)"),
    ("norm_ord", 1, [("ord", "float", 2.0), AXES, KEEPDIMS], "extra::norm_ord(x0, p0, p1, p2, s)"),
    ("norm_str", 1, [AXES, KEEPDIMS, ("ord", "str", "fro")], "extra::norm_str(x0, p2, p0, p1, s)"),
    # mx.random
    ("random_key", 0, [("seed", "str", "0")], "mx::random::key(std::stoull(p0))"),
    ("random_split", 1, [("num", "int", 2)], "mx::random::split(x0, p0, s)"),
    ("random_uniform", 3, [_SHAPE, _DTYPE], "mx::random::uniform(x0, x1, p0, p1.value_or(mx::float32), x2, s)"),
    ("random_normal", VARIADIC, [_SHAPE, _DTYPE, ("has_loc", "bool", False), ("has_scale", "bool", False)],
     "extra::random_normal(xs, p0, p1.value_or(mx::float32), p2, p3, s)"),
    ("random_randint", 3, [_SHAPE, _DTYPE], "mx::random::randint(x0, x1, p0, p1.value_or(mx::int32), x2, s)"),
    ("random_bernoulli", 2, [("shape", "axes", None)],
     "p0 ? mx::random::bernoulli(x0, *extra::opt_shape(p0), x1, s) : mx::random::bernoulli(x0, x1, s)"),
    ("random_truncated_normal", 3, [("shape", "axes", None), _DTYPE],
     "p0 ? mx::random::truncated_normal(x0, x1, *extra::opt_shape(p0), p1.value_or(mx::float32), x2, s)"
     " : mx::random::truncated_normal(x0, x1, p1.value_or(mx::float32), x2, s)"),
    ("random_gumbel", 1, [_SHAPE, _DTYPE], "mx::random::gumbel(p0, p1.value_or(mx::float32), x0, s)"),
    ("random_categorical", 2, [("axis", "int", -1), ("shape", "axes", None), ("num_samples", "axis", None)],
     "extra::categorical(x0, x1, p0, p1, p2, s)"),
    ("random_permutation", 2, [("axis", "int", 0)], "mx::random::permutation(x0, p0, x1, s)"),
    ("random_permutation_n", 1, [("n", "int", 0)], "mx::random::permutation(p0, x0, s)"),
    ("random_laplace", 1, [_SHAPE, _DTYPE, ("loc", "float", 0.0), ("scale", "float", 1.0)],
     "mx::random::laplace(p0, p1.value_or(mx::float32), static_cast<float>(p2), static_cast<float>(p3), x0, s)"),
    # convolutions
    ("conv_nd", 2, [("stride", "shape", ()), ("padding", "shape", ()), ("dilation", "shape", ()),
                    ("groups", "int:positive", 1)], "extra::conv_nd(x0, x1, p0, p1, p2, p3, s)"),
    ("conv_transpose_nd", 2, [("stride", "shape", ()), ("padding", "shape", ()), ("dilation", "shape", ()),
                              ("output_padding", "shape", ()), ("groups", "int:positive", 1)],
     "extra::conv_transpose_nd(x0, x1, p0, p1, p2, p3, p4, s)"),
    # more of mlx.core
    ("zeros_like", 1, [], "mx::zeros_like(x0, s)"),
    ("ones_like", 1, [], "mx::ones_like(x0, s)"),
    ("isposinf", 1, [], "mx::isposinf(x0, s)"),
    ("isneginf", 1, [], "mx::isneginf(x0, s)"),
    ("searchsorted", 2, [("side", "str", "left")], "mx::searchsorted(x0, x1, p0, s)"),
    ("median", 1, [AXES, KEEPDIMS], "mx::median(x0, all_axes(p0, x0), p1, s)"),
    ("partition", 1, [("kth", "int", 0), ("axis", "axis", -1)],
     "p1 ? mx::partition(x0, p0, *p1, s) : mx::partition(x0, p0, s)"),
    ("argpartition", 1, [("kth", "int", 0), ("axis", "axis", -1)],
     "p1 ? mx::argpartition(x0, p0, *p1, s) : mx::argpartition(x0, p0, s)"),
    ("diff", 1, [("n", "int", 1), ("axis", "int", -1)], "mx::diff(x0, p0, p1, s)"),
    ("trace", 1, [("offset", "int", 0), ("axis1", "int", 0), ("axis2", "int", 1), _DTYPE],
     "p3 ? mx::trace(x0, p0, p1, p2, *p3, s) : mx::trace(x0, p0, p1, p2, s)"),
    ("diagonal", 1, [("offset", "int", 0), ("axis1", "int", 0), ("axis2", "int", 1)],
     "mx::diagonal(x0, p0, p1, p2, s)"),
    ("diag", 1, [("k", "int", 0)], "mx::diag(x0, p0, s)"),
    ("logcumsumexp", 1, _SCAN, "p0 ? mx::logcumsumexp(x0, *p0, p1, p2, s) : mx::logcumsumexp(x0, p1, p2, s)"),
    ("hadamard_transform", 1, [("has_scale", "bool", False), ("scale", "float", 1.0)],
     "mx::hadamard_transform(x0, extra::opt_float(p0, p1), s)"),
    ("convolve", 2, [("mode", "str", "full")], "extra::convolve(x0, x1, p0, s)"),
    ("trunc", 1, [], "mx::trunc(x0, s)"),
    ("count_nonzero", 1, [AXES, KEEPDIMS], "mx::count_nonzero(x0, all_axes(p0, x0), p1, s)"),
    # integer divmod by its two halves (see ops.cpp: guarded_divmod)
    ("divmod", 2, [], "guarded_divmod(x0, x1, s)"),
    ("vecdot", 2, [("axis", "int", -1)], "mx::vecdot(x0, x1, p0, s)"),
    ("minmax", 1, [AXES, KEEPDIMS], "extra::minmax(x0, all_axes(p0, x0), p1, s)"),
    ("unflatten", 1, [("axis", "int", 0), _SHAPE], "mx::unflatten(x0, p0, p1, s)"),
    ("unstack", 1, [("axis", "int", 0)], "mx::unstack(x0, p0, s)"),
    ("meshgrid", VARIADIC, [("sparse", "bool", False), ("indexing", "str", "xy")], "mx::meshgrid(xs, p0, p1, s)"),
    ("atleast_nd", VARIADIC, [("ndim", "int", 1)], "extra::atleast(xs, p0, s)"),
    ("broadcast_arrays", VARIADIC, [], "mx::broadcast_arrays(xs, s)"),
    ("window", 0, [("kind", "int", 0), ("M", "int", 1)], "extra::window(p0, p1, s)"),
    ("gather_mm", VARIADIC, [("has_lhs", "bool", False), ("has_rhs", "bool", False),
                             ("sorted_indices", "bool", False)], "extra::gather_mm(xs, p0, p1, p2, s)"),
    ("block_masked_mm", VARIADIC, [("block_size", "int", 64), ("has_out", "bool", False),
                                   ("has_lhs", "bool", False), ("has_rhs", "bool", False)],
     "extra::block_masked_mm(xs, p0, p1, p2, p3, s)"),
    ("segmented_mm", 3, [], "mx::segmented_mm(x0, x1, x2, s)"),
    ("linalg_cholesky_inv", 1, [("upper", "bool", False)], "mx::linalg::cholesky_inv(x0, p0, sc)"),
    ("linalg_cross", 2, [("axis", "int", -1)], "mx::linalg::cross(x0, x1, p0, s)"),
    ("linalg_det", 1, [], "mx::linalg::det(x0, sc)"),
    ("linalg_slogdet", 1, [], "mx::linalg::slogdet(x0, sc)"),
    ("linalg_eig", 1, [], "mx::linalg::eig(x0, sc)"),
    ("linalg_eigvals", 1, [], "mx::linalg::eigvals(x0, sc)"),
    ("linalg_lu_factor", 1, [], "mx::linalg::lu_factor(x0, sc)"),
    ("fft_shift", 1, [("inverse", "bool", False), ("axes", "axes", None)], "extra::fftshift(x0, p0, p1, sc)"),
    ("fft_freq", 0, [("n", "int", 1), ("d", "float", 1.0), ("real", "bool", False)],
     "p2 ? mx::fft::rfftfreq(p0, p1, sc) : mx::fft::fftfreq(p0, p1, sc)"),
    ("concatenate_flat", VARIADIC, [], "mx::concatenate(xs, s)"),
    ("roll_axes", 1, [("shift", "shape", ()), ("scalar_shift", "bool", False), ("one_axis", "bool", False),
                      ("axis", "axes", None)],
     "extra::roll(x0, p0, p1, p2, p3, s)"),
    ("put_along_axis_flat", 3, [], "extra::put_along_flat(x0, x1, x2, s)"),
    ("quantize_scaled", 2, [("group_size", "axis:positive", None), ("bits", "axis:positive", None), ("mode", "str", "affine")],
     "extra::quantize_scaled(x0, x1, p0, p1, p2, s)"),
    ("dequantize_full", VARIADIC, [("group_size", "axis:positive", None), ("bits", "axis:positive", None), ("mode", "str", "affine"),
                                   ("has_biases", "bool", False), ("has_global_scale", "bool", False), _DTYPE],
     "extra::dequantize_full(xs, p0, p1, p2, p3, p4, p5, s)"),
    ("unique", VARIADIC, [("size", "int", 0), ("return_index", "bool", False), ("return_inverse", "bool", False),
                          ("return_counts", "bool", False)], "extra::unique(xs, p0, p1, p2, p3, s)"),
    ("to_fp8", 1, [], "mx::to_fp8(x0, s)"),
    ("from_fp8", 1, [_DTYPE], "mx::from_fp8(x0, p0.value_or(mx::bfloat16), s)"),
    ("gather_qmm", VARIADIC, [("has_biases", "bool", False), ("has_lhs", "bool", False), ("has_rhs", "bool", False),
                              ("has_global_scale", "bool", False), ("transpose", "bool", True),
                              ("group_size", "axis:positive", None), ("bits", "axis:positive", None), ("mode", "str", "affine"),
                              ("sorted_indices", "bool", False)],
     "extra::gather_qmm(xs, p0, p1, p2, p3, p4, p5, p6, p7, p8, s)"),
    # qqmm: x quantized on the fly, w quantized already (scales given) or on the fly.
    ("qqmm", VARIADIC, [("has_scales", "bool", False), ("group_size", "axis:positive", None),
                        ("bits", "axis:positive", None), ("mode", "str", "nvfp4"), ("has_global_scale_x", "bool", False),
                        ("has_global_scale_w", "bool", False)],
     "extra::qqmm(xs, p0, p1, p2, p3, p4, p5, s)"),
    ("gather_qqmm", VARIADIC, [("has_scales", "bool", False), ("has_lhs", "bool", False), ("has_rhs", "bool", False),
                               ("group_size", "axis:positive", None), ("bits", "axis:positive", None),
                               ("mode", "str", "nvfp4"), ("has_global_scale_x", "bool", False),
                               ("has_global_scale_w", "bool", False), ("sorted_indices", "bool", False)],
     "extra::gather_qqmm(xs, p0, p1, p2, p3, p4, p5, p6, p7, p8, s)"),
    ("random_multivariate_normal", 3, [_SHAPE, _DTYPE],
     "mx::random::multivariate_normal(x0, x1, p0, p1.value_or(mx::float32), x2, sc)"),
    ("fft_stft", VARIADIC, [("n_fft", "int", 2048), ("hop_length", "axis", None), ("win_length", "axis", None),
                            ("center", "bool", True), ("norm", "int", 0), ("has_onesided", "bool", False),
                            ("onesided", "bool", False), ("pad_mode", "str", "reflect")],
     "extra::stft(xs, p0, p1, p2, p3, p4, p5, p6, p7, sc)"),
    ("fft_istft", VARIADIC, [("n_fft", "axis", None), ("hop_length", "axis", None), ("win_length", "axis", None),
                             ("center", "bool", True), ("norm", "int", 0), ("has_onesided", "bool", False),
                             ("onesided", "bool", False), ("length", "axis", None)],
     "extra::istft(xs, p0, p1, p2, p3, p4, p5, p6, p7, sc)"),
]

# Replay of a traced function (cffi_src/replay.cpp; emlx_async/replay.py):
# xs are its inputs, `function` the id emlx_replay_register gave it; `fed`
# (a function made by TracedFunction.chain): its chained inputs come from the
# previous call on this worker thread.
OPS += [
    ("replay", VARIADIC, [("function", "int64", 0), ("fed", "bool", False)], "replay_call(xs, p0, p1, s, sc)"),
    # the same for a function of several outputs (they come back as a tuple)
    ("replay_multi", VARIADIC, [("function", "int64", 0), ("fed", "bool", False)],
     "replay_call(xs, p0, p1, s, sc)"),
]
