// Checks of MLX export files and their graphs (cffi_src/export_file.hpp).
//
// The layout (mlx/export.cpp, MLX 0.32): a header (version string, function
// count, shapeless flag, metadata string), then per function: keyword names,
// input ids, inputs (shape, dtype), output ids, and a tape of nodes in
// dependency order. A node is its id and either a primitive (input ids,
// stream, name, the primitive's state, then its outputs' ids, shapes and
// dtypes) or a constant (shape, dtype, raw bytes) or a function input.
// Primitive states are read with the state types of MLX's own headers, so
// this reader follows whatever MLX writes for each primitive.
#include "export_file.hpp"
#include "mlx_internals.hpp"

#include <algorithm>
#include <any>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <variant>

#include "mlx/device.h"
#include "mlx/fast_primitives.h"
#include "mlx/memory.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"
#include "mlx/utils.h"
#include "validate.hpp"

namespace mx = mlx::core;

namespace emlx::export_file {

namespace {

using namespace mlx::core;
using namespace mlx::core::fast;

[[noreturn]] void bad(const std::string& why) { throw std::invalid_argument("[load_traced] " + why); }

// ---- a bounded reader of the file's values ---------------------------------------

template <typename, typename = void>
constexpr bool is_iterable = false;
template <typename T>
constexpr bool is_iterable<T, std::void_t<decltype(std::declval<T>().begin()), decltype(std::declval<T>().end())>> =
    true;
template <template <typename...> class T, typename U>
constexpr bool is_instance = false;
template <template <typename...> class T, typename... Us>
constexpr bool is_instance<T, T<Us...>> = true;
template <typename T>
constexpr bool is_pair_or_tuple = is_instance<std::pair, T> || is_instance<std::tuple, T>;

// The fewest bytes a value of T takes in the file: bounds a count by what is left.
template <typename T>
constexpr size_t min_bytes() {
  if constexpr (std::is_same_v<T, mx::Dtype>) return 5;
  else if constexpr (std::is_arithmetic_v<T>) return sizeof(T);
  else if constexpr (std::is_enum_v<T>) return sizeof(int);
  else if constexpr (std::is_same_v<T, std::string> || is_iterable<T>) return sizeof(uint64_t);
  else if constexpr (is_pair_or_tuple<T>)
    return std::apply([](auto... x) { return (size_t{0} + ... + min_bytes<decltype(x)>()); }, T{});
  else if constexpr (is_instance<std::optional, T>) return 1;
  else if constexpr (is_instance<std::variant, T>) return sizeof(int) + 1;
  else return 0;
}

struct Reader {
  const char* data;
  size_t size;
  size_t at = 0;

  size_t left() const { return size - at; }

  void need(size_t n, const char* what) {
    if (n > left()) bad(std::string("the file ends inside ") + what + " (truncated or corrupted)");
  }

  void skip(size_t n, const char* what) {
    need(n, what);
    at += n;
  }

  template <typename T>
  T scalar(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data + at, sizeof(T));
    at += sizeof(T);
    if constexpr (std::is_same_v<T, bool>) {
      unsigned char byte;
      std::memcpy(&byte, data + at - 1, 1);
      if (byte > 1) bad(std::string("a flag in ") + what + " is neither 0 nor 1");
    }
    return v;
  }

  // A count of values that each take at least `each` bytes.
  uint64_t count(size_t each, const char* what) {
    auto n = scalar<uint64_t>(what);
    if (n > left() / std::max<size_t>(each, 1))
      bad(std::string("a count in ") + what + " (" + std::to_string(n) + ") exceeds what the file holds");
    return n;
  }

  std::string text(const char* what) {
    auto n = count(1, what);
    std::string s(data + at, n);
    at += n;
    return s;
  }

  mx::Dtype dtype(const char* what) {
    auto val = scalar<int>(what);
    auto size = scalar<uint8_t>(what);
    static const mx::Dtype known[] = {mx::bool_,   mx::uint8,   mx::uint16,  mx::uint32,   mx::uint64,
                                      mx::int8,    mx::int16,   mx::int32,   mx::int64,    mx::float16,
                                      mx::float32, mx::float64, mx::bfloat16, mx::complex64};
    for (auto t : known)
      if (static_cast<int>(t.val()) == val) {
        if (t.size() != size) bad(std::string("a dtype in ") + what + " has the wrong item size");
        return t;
      }
    bad(std::string("unknown dtype code ") + std::to_string(val) + " in " + what);
  }

  template <typename T>
  T value(const char* what) {
    if constexpr (std::is_same_v<T, mx::Dtype>) {
      return dtype(what);
    } else if constexpr (std::is_arithmetic_v<T>) {
      return scalar<T>(what);
    } else if constexpr (std::is_enum_v<T>) {
      return static_cast<T>(scalar<int>(what));
    } else if constexpr (std::is_same_v<T, std::nullptr_t>) {
      return nullptr;
    } else if constexpr (std::is_same_v<T, std::string>) {
      return text(what);
    } else if constexpr (is_iterable<T>) {
      T v;
      auto n = count(min_bytes<typename T::value_type>(), what);
      v.reserve(n);
      for (uint64_t i = 0; i < n; ++i) v.push_back(value<typename T::value_type>(what));
      return v;
    } else if constexpr (is_pair_or_tuple<T>) {
      return tuple_of<T>(what, std::make_index_sequence<std::tuple_size_v<T>>{});
    } else if constexpr (is_instance<std::optional, T>) {
      if (scalar<bool>(what)) return T{value<typename T::value_type>(what)};
      return std::nullopt;
    } else if constexpr (is_instance<std::variant, T>) {
      switch (scalar<int>(what)) {
        case 0: return T{scalar<int>(what)};
        case 1: return T{scalar<float>(what)};
        case 2: return T{scalar<bool>(what)};
        default: bad(std::string("unknown value tag in ") + what);
      }
    } else {
      static_assert(std::is_same_v<T, void>, "a primitive state MLX serializes but this reader does not");
    }
  }

  template <typename T, size_t... I>
  T tuple_of(const char* what, std::index_sequence<I...>) {
    return T{value<std::tuple_element_t<I, T>>(what)...};  // braces: read in order
  }

  mx::Shape shape(const char* what) {
    auto dims = value<mx::Shape>(what);
    for (auto d : dims)
      if (d < 0) bad(std::string("a negative dimension in ") + what);
    return dims;
  }
};

// The bytes of an array of `shape` and `dtype`, or none when it is beyond `limit`.
std::optional<uint64_t> nbytes_within(const mx::Shape& shape, mx::Dtype dtype, uint64_t limit) {
  unsigned __int128 n = dtype.size();
  for (auto d : shape) {
    n *= static_cast<uint64_t>(d);
    if (n > limit) return std::nullopt;
  }
  return static_cast<uint64_t>(n);
}

// ---- primitives and their parameters ---------------------------------------------
//
// Each primitive's parameters are read as the type its state() returns (so
// the reader follows MLX's headers). Most primitive classes are not exported
// by libmlx, so they cannot be built here: a node is checked as a Node (its
// kind, parameters, and its inputs' and outputs' shapes and dtypes), the
// same way whether it comes from the file or from a graph MLX built.

template <typename, typename = void>
constexpr bool has_state = false;
template <typename T>
constexpr bool has_state<T, std::void_t<decltype(std::declval<T>().state())>> = true;

template <typename T>
using State = std::decay_t<decltype(std::declval<T>().state())>;

template <typename T>
std::any read_state(Reader& in) {
  if constexpr (has_state<T>) return in.value<State<T>>("a primitive's parameters");
  else return {};
}

template <typename T>
std::any state_of(const mx::Primitive& p) {
  if constexpr (has_state<T>) return static_cast<const T&>(p).state();
  else return {};
}

struct Kind {
  std::any (*read)(Reader&);
  std::any (*state)(const mx::Primitive&);
  bool unary;  // a UnaryPrimitive: exactly one output
};

// Every primitive MLX 0.32 exports, by the name it writes.
#define EMLX_PRIMITIVES(X)                                                                                       \
  X(Abs) X(Add) X(AddMM) X(Arange) X(ArcCos) X(ArcCosh) X(ArcSin) X(ArcSinh) X(ArcTan) X(ArcTan2) X(ArcTanh)     \
  X(ArgPartition) X(ArgReduce) X(ArgSort) X(AsStrided) X(AsType) X(BitwiseBinary) X(BlockMaskedMM) X(Broadcast) \
  X(BroadcastAxes) X(Ceil) X(Cholesky) X(Concatenate) X(Conjugate) X(Convolution) X(Copy) X(Cos) X(Cosh)        \
  X(CustomKernel) X(Depends) X(DivMod) X(Divide) X(DynamicSlice) X(DynamicSliceUpdate) X(Eig) X(Eigh) X(Equal)  \
  X(Erf) X(ErfInv) X(Exp) X(ExpandDims) X(Expm1) X(FFT) X(Flatten) X(Floor) X(Full) X(Gather) X(GatherAxis)     \
  X(GatherMM) X(GatherQMM) X(Greater) X(GreaterEqual) X(Hadamard) X(Imag) X(Inverse) X(LayerNorm)               \
  X(LayerNormVJP) X(Less) X(LessEqual) X(Log) X(Log1p) X(LogAddExp) X(LogSumExp) X(LogicalAnd) X(LogicalNot)    \
  X(LogicalOr) X(MaskedScatter) X(Matmul) X(Maximum) X(Minimum) X(Multiply) X(Negative) X(NotEqual)             \
  X(NumberOfElements) X(Pad) X(Partition) X(Power) X(QRF) X(Quantize) X(QuantizedMatmul) X(RMSNorm)             \
  X(RMSNormVJP) X(RandomBits) X(Real) X(Reduce) X(Remainder) X(Reshape) X(RoPE) X(Round) X(SVD)                 \
  X(ScaledDotProductAttention) X(Scan) X(Scatter) X(ScatterAxis) X(SearchSorted) X(Select) X(Sigmoid) X(Sign)   \
  X(Sin) X(Sinh) X(Slice) X(SliceUpdate) X(Softmax) X(Sort) X(Split) X(Sqrt) X(Square) X(Squeeze)               \
  X(StopGradient) X(Subtract) X(Tan) X(Tanh) X(Transpose) X(Unflatten) X(View)

const std::unordered_map<std::string, Kind>& kinds() {
#define EMLX_KIND(T) {#T, Kind{&read_state<T>, &state_of<T>, std::is_base_of_v<mx::UnaryPrimitive, T>}},
  static const std::unordered_map<std::string, Kind> table = {EMLX_PRIMITIVES(EMLX_KIND)};
#undef EMLX_KIND
  return table;
}

// The names a primitive gives itself that MLX's exporter writes as its class (mlx/export.cpp).
const std::string& class_name(const std::string& name) {
  static const std::unordered_map<std::string, std::string> remap = {
      {"BitwiseAnd", "BitwiseBinary"}, {"BitwiseOr", "BitwiseBinary"}, {"BitwiseXor", "BitwiseBinary"},
      {"LeftShift", "BitwiseBinary"},  {"RightShift", "BitwiseBinary"}, {"NaNEqual", "Equal"},
      {"Log2", "Log"},                 {"Log10", "Log"},               {"And", "Reduce"},
      {"Or", "Reduce"},                {"Sum", "Reduce"},              {"Prod", "Reduce"},
      {"Min", "Reduce"},               {"Max", "Reduce"},              {"CumSum", "Scan"},
      {"CumProd", "Scan"},             {"CumMin", "Scan"},             {"CumMax", "Scan"},
      {"CumLogaddexp", "Scan"},        {"Rsqrt", "Sqrt"}};
  auto it = remap.find(name);
  return it == remap.end() ? name : it->second;
}

void read_stream(Reader& in) {
  in.scalar<int>("a node's stream");  // MLX maps every index to a stream of the device
  auto type = in.scalar<int>("a node's stream");
  auto index = in.scalar<int>("a node's stream");
  if (type != static_cast<int>(mx::Device::cpu) && type != static_cast<int>(mx::Device::gpu))
    bad("a node names an unknown device type " + std::to_string(type));
  if (index != 0 || !mx::is_available(mx::Device(static_cast<mx::Device::DeviceType>(type), index)))
    bad(std::string("a node runs on ") + (type ? "gpu" : "cpu") + ":" + std::to_string(index) +
        ", which this machine lacks");
}

// ---- node checks -----------------------------------------------------------------

struct Meta {
  mx::Shape shape;
  mx::Dtype dtype;
  const mx::array* array = nullptr;  // in a graph MLX built (a Gather's constant indices are read)
  const char* data = nullptr;        // a constant's bytes in the file
  size_t size() const {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    return n;
  }
};

struct Node {
  std::string name;  // the class name, as the file writes it
  std::any state;
  bool unary = false;
  std::vector<Meta> ins, outs;
};

// The least and greatest of `count` integers of `dtype` at `data` (a constant's bytes).
std::pair<int64_t, int64_t> integer_range(const char* data, mx::Dtype dtype, size_t count) {
  int64_t low = INT64_MAX, high = INT64_MIN;
  auto scan = [&]<typename T>(T) {
    for (size_t k = 0; k < count; ++k) {
      T v;
      std::memcpy(&v, data + k * sizeof(T), sizeof(T));
      // uint64 beyond int64 saturates: it is out of range either way.
      int64_t w = static_cast<int64_t>(v);
      if constexpr (std::is_same_v<T, uint64_t>) w = v > uint64_t{INT64_MAX} ? INT64_MAX : w;
      low = std::min(low, w), high = std::max(high, w);
    }
  };
  switch (dtype.val()) {
    case mx::Dtype::Val::int8: scan(int8_t{}); break;
    case mx::Dtype::Val::int16: scan(int16_t{}); break;
    case mx::Dtype::Val::int32: scan(int32_t{}); break;
    case mx::Dtype::Val::int64: scan(int64_t{}); break;
    case mx::Dtype::Val::uint8: scan(uint8_t{}); break;
    case mx::Dtype::Val::uint16: scan(uint16_t{}); break;
    case mx::Dtype::Val::uint32: scan(uint32_t{}); break;
    case mx::Dtype::Val::uint64: scan(uint64_t{}); break;
    default: break;  // not indices: refused by the dtype check
  }
  return {low, high};
}

// Whether a constant index array (of the file, or of a graph MLX built) lies
// in [low, high]; indices that are inputs are the caller's, unchecked as in
// plain MLX.
bool constant_within(const Meta& idx, int64_t low, int64_t high, mx::Stream sc) {
  if (idx.size() == 0) return true;
  if (idx.data) {
    auto [least, most] = integer_range(idx.data, idx.dtype, idx.size());
    return least >= low && most <= high;
  }
  const auto* a = idx.array;
  // A constant of the trace is available, or a Load node read once from the export.
  if (a == nullptr || !(a->is_available() || mlx_internals::is_loaded_constant(*a)))
    return true;
  auto wide = mx::astype(*a, mx::int64, sc);
  auto least = mx::min(wide, false, sc), most = mx::max(wide, false, sc);
  mx::eval({least, most});
  return least.item<int64_t>() >= low && most.item<int64_t>() <= high;
}

// The values of a small constant integer array (of the file, or of a graph
// MLX built), or none when it is not a constant (the caller's input).
std::optional<std::vector<int64_t>> constant_values(const Meta& idx, mx::Stream sc) {
  if (idx.size() > 64 || !mx::issubdtype(idx.dtype, mx::integer)) return std::nullopt;
  std::vector<int64_t> values;
  if (idx.data) {
    for (size_t k = 0; k < idx.size(); ++k)
      values.push_back(integer_range(idx.data + k * idx.dtype.size(), idx.dtype, 1).first);
    return values;
  }
  const auto* a = idx.array;
  if (a == nullptr || !(a->is_available() || mlx_internals::is_loaded_constant(*a)))
    return std::nullopt;
  auto wide = mx::astype(mx::flatten(*a, sc), mx::int64, sc);
  mx::eval({wide});
  values.assign(wide.data<int64_t>(), wide.data<int64_t>() + wide.size());
  return values;
}

// The element count of a strided slice along one axis, or -1 when it reads outside [0, dim).
int64_t slice_count(int64_t lo, int64_t hi, int64_t step, int64_t dim) {
  // The length MLX's normalize_slice gives: negative bounds count from the axis's end and
  // are clamped to it (MLX keeps the stop as given: x[:, 6:20] or a split at -3).
  int64_t start = lo < 0 ? lo + dim : lo, stop = hi < 0 ? hi + dim : hi, count = 0;
  if (step < 0) {
    start = std::min(start, dim - 1);
    stop = std::min(std::max<int64_t>(stop, -1), start);
    count = (start - stop - step - 1) / -step;
  } else {
    start = std::clamp<int64_t>(start, 0, dim);
    stop = std::max(std::clamp<int64_t>(stop, 0, dim), start);
    count = (stop - start + step - 1) / step;
  }
  // The kernel reads from the start the file holds: every element read lies inside the axis.
  int64_t last = lo + (count - 1) * step;
  if (count > 0 && (lo < 0 || lo >= dim || last < 0 || last >= dim)) return -1;
  return count;
}

template <typename T>
const State<T>& param(const Node& n) {
  return std::any_cast<const State<T>&>(n.state);
}

const std::unordered_set<std::string>& binary_names() {
  static const std::unordered_set<std::string> names = {
      "Add", "Subtract", "Multiply", "Divide", "Maximum", "Minimum", "Power", "Equal", "NotEqual", "Greater",
      "GreaterEqual", "Less", "LessEqual", "LogicalAnd", "LogicalOr", "LogAddExp", "ArcTan2", "Remainder",
      "DivMod", "BitwiseBinary"};
  return names;
}

const std::unordered_set<std::string>& comparison_names() {
  static const std::unordered_set<std::string> names = {"Equal", "NotEqual",  "Greater",    "GreaterEqual",
                                                        "Less",  "LessEqual", "LogicalAnd", "LogicalOr"};
  return names;
}

// Element-wise nodes of one input whose output has the input's shape and dtype.
const std::unordered_set<std::string>& unary_names() {
  static const std::unordered_set<std::string> names = {
      "ArcCos", "ArcCosh", "ArcSin", "ArcSinh", "ArcTan", "ArcTanh", "Ceil", "Conjugate", "Copy", "Cos", "Cosh",
      "Erf", "ErfInv", "Exp", "Expm1", "Floor", "Log", "Log1p", "LogicalNot", "Negative", "Round", "Sigmoid",
      "Sign", "Sin", "Sinh", "Softmax", "Sqrt", "Square", "StopGradient", "Tan", "Tanh"};
  return names;
}

void check(const Node& n, mx::Stream sc) {
  const auto& name = n.name;
  const auto& ins = n.ins;
  const auto& outs = n.outs;
  const auto& out = outs.at(0);
  auto fail = [&](const std::string& why) {
    std::string shapes;
    for (const auto& in : ins) shapes += (shapes.empty() ? "" : ", ") + validate::shape_text(in.shape);
    throw std::invalid_argument("[replay] these input shapes do not fit the traced function: its " + name +
                                " node " + why + " (inputs " + shapes + "; output " +
                                validate::shape_text(out.shape) + ")");
  };
  auto axis_in = [&](int axis, size_t ndim) {
    if (axis < 0 || axis >= static_cast<int>(ndim)) fail("has an axis " + std::to_string(axis) + " out of range");
    return axis;
  };
  auto inputs = [&](size_t count) {
    if (ins.size() != count) fail("needs " + std::to_string(count) + " input(s), has " + std::to_string(ins.size()));
  };
  auto same_dtype = [&](size_t from) {
    for (size_t k = from; k < ins.size(); ++k)
      if (ins[k].dtype != ins[from].dtype) fail("needs inputs of one dtype");
  };
  auto makes = [&](const mx::Shape& want) {
    if (out.shape != want) fail("makes " + validate::shape_text(want) + " from these inputs");
  };
  if (n.unary && outs.size() != 1) fail("makes one output, not " + std::to_string(outs.size()));

  if (binary_names().count(name) || name == "Select") {
    size_t first = name == "Select" ? 1 : 0;
    inputs(first + 2);
    if (name == "DivMod" && outs.size() != 2) fail("makes two outputs");
    for (const auto& in : ins)
      if (in.shape != out.shape) fail("needs inputs of equal shapes");
    same_dtype(first);
    if (first && ins[0].dtype != mx::bool_) fail("needs a bool condition");
    auto want = comparison_names().count(name) ? mx::bool_ : ins[first].dtype;
    for (const auto& o : outs)
      if (o.shape != out.shape || o.dtype != want)
        fail("makes " + validate::dtype_text(want) + " of its inputs' shape");
  } else if (unary_names().count(name) || name == "Abs" || name == "AsType") {
    inputs(1);
    makes(ins[0].shape);
    bool keeps_dtype = name != "AsType" && !(name == "Abs" && ins[0].dtype == mx::complex64);
    if (keeps_dtype && out.dtype != ins[0].dtype) fail("keeps its input's dtype");
    if (name == "AsType" && out.dtype != param<mx::AsType>(n)) fail("makes another dtype than it names");
  } else if (name == "Matmul" || name == "AddMM") {
    inputs(name == "AddMM" ? 3 : 2);
    const auto &x = ins[0].shape, &w = ins[1].shape;
    if (x.size() < 2 || w.size() < 2 || x.size() != w.size() || x.back() != w[w.size() - 2])
      fail("needs (..., M, K) @ (..., K, N)");
    for (size_t k = 0; k + 2 < x.size(); ++k)
      if (x[k] != w[k]) fail("needs equal batch dimensions");
    auto want = x;
    want.back() = w.back();
    makes(want);
    same_dtype(0);
    if (out.dtype != ins[0].dtype) fail("keeps its inputs' dtype");
  } else if (name == "Gather") {
    const auto& [axes, slice_sizes] = param<mx::Gather>(n);
    if (ins.empty() || ins.size() != axes.size() + 1) fail("needs an index array per indexed axis");
    const auto& operand = ins[0];
    size_t ndim = operand.shape.size();
    // Slices and constant indices (take(x, [2]) traced on a bigger x) must
    // stay inside the operand's shape; indices that are inputs are the
    // caller's, unchecked as in plain MLX.
    if (slice_sizes.size() != ndim) fail("needs a slice size per axis of its operand");
    for (auto axis : axes) axis_in(axis, ndim);
    // MLX keeps the traced slice sizes: along an axis that is not indexed a
    // take's slice was the whole axis, and a different size now would give
    // a silently cropped (or overlong) result.
    for (size_t k = 0; k < ndim; ++k) {
      bool indexed = std::find(axes.begin(), axes.end(), static_cast<int>(k)) != axes.end();
      if (slice_sizes[k] < 0 || slice_sizes[k] > operand.shape[k] || (!indexed && slice_sizes[k] != operand.shape[k]))
        fail("was traced for slices of " + validate::shape_text(slice_sizes) + " along axes it does not index");
    }
    auto want = ins.size() > 1 ? ins[1].shape : mx::Shape{};
    for (size_t j = 1; j < ins.size(); ++j) {
      if (ins[j].shape != want) fail("needs index arrays of one shape");
      if (!mx::issubdtype(ins[j].dtype, mx::integer)) fail("needs integer indices");
    }
    want.insert(want.end(), slice_sizes.begin(), slice_sizes.end());
    makes(want);
    if (out.dtype != operand.dtype) fail("keeps its operand's dtype");
    for (size_t j = 0; j + 1 < ins.size(); ++j) {
      int64_t size = operand.shape[axes[j]], extent = slice_sizes[axes[j]];
      if (!constant_within(ins[j + 1], -size, size - extent, sc)) fail("reads a constant index outside its operand");
    }
  } else if (name == "GatherAxis" || name == "ScatterAxis") {
    bool gather = name == "GatherAxis";
    inputs(gather ? 2 : 3);
    const auto &src = ins[0].shape, &idx = ins[1].shape;
    int axis = gather ? param<mx::GatherAxis>(n) : param<mx::ScatterAxis>(n).second;
    if (!gather && (param<mx::ScatterAxis>(n).first < 0 || param<mx::ScatterAxis>(n).first > 1))
      fail("has an unknown kind");
    axis_in(axis, src.size());
    if (idx.size() != src.size() || !mx::issubdtype(ins[1].dtype, mx::integer)) fail("needs integer indices per axis");
    if (!gather && (ins[2].shape != idx || ins[2].dtype != ins[0].dtype)) fail("needs updates shaped as its indices");
    makes(gather ? idx : src);
    if (out.dtype != ins[0].dtype) fail("keeps its input's dtype");
    if (!constant_within(ins[1], -src[axis], src[axis] - 1, sc)) fail("reads a constant index outside its operand");
  } else if (name == "Slice") {
    inputs(1);
    const auto& [start, stop, strides] = param<mx::Slice>(n);
    const auto& x = ins[0].shape;
    if (start.size() != x.size() || stop.size() != x.size() || strides.size() != x.size())
      fail("needs a start, stop and stride per axis");
    mx::Shape want;
    for (size_t k = 0; k < x.size(); ++k) {
      if (strides[k] == 0) fail("has a zero stride");
      // Every element read, first and last, lies inside the axis.
      auto count = slice_count(start[k], stop[k], strides[k], x[k]);
      if (count < 0) fail("reads outside its input");
      want.push_back(static_cast<int>(count));
    }
    makes(want);
    if (out.dtype != ins[0].dtype) fail("keeps its input's dtype");
  } else if (name == "Split") {
    // Its kernel makes views at offsets indices[k] along the axis, and the outputs' shapes are the file's.
    inputs(1);
    const auto& [indices, axis] = param<mx::Split>(n);
    const auto& x = ins[0].shape;
    axis_in(axis, x.size());
    if (outs.size() != indices.size() + 1) fail("makes one output per part");
    auto bounds = indices;
    bounds.insert(bounds.begin(), 0);
    bounds.push_back(x[axis]);
    if (!std::is_sorted(bounds.begin(), bounds.end()))
      fail("splits at indices out of order or outside its axis");
    for (size_t k = 0; k < outs.size(); ++k) {
      auto want = x;
      want[axis] = bounds[k + 1] - bounds[k];
      if (outs[k].shape != want || outs[k].dtype != ins[0].dtype) fail("makes parts of another shape or dtype");
    }
  } else if (name == "SliceUpdate") {
    inputs(2);
    const auto& [kind, start, stop, strides] = param<mx::SliceUpdate>(n);
    const auto &x = ins[0].shape, &update = ins[1].shape;
    if (kind < 0 || kind > 4) fail("has an unknown kind");
    if (start.size() != x.size() || stop.size() != x.size() || strides.size() != x.size() ||
        update.size() != x.size())
      fail("needs a start, stop and stride per axis");
    for (size_t k = 0; k < x.size(); ++k) {
      if (strides[k] == 0) fail("has a zero stride");
      if (slice_count(start[k], stop[k], strides[k], x[k]) != update[k]) fail("writes outside its input");
    }
    makes(x);
    if (out.dtype != ins[0].dtype || ins[1].dtype != ins[0].dtype) fail("keeps its input's dtype");
  } else if (name == "DynamicSlice" || name == "DynamicSliceUpdate") {
    bool update = name == "DynamicSliceUpdate";
    inputs(update ? 3 : 2);
    const auto& x = ins[0].shape;
    const auto& start = ins[update ? 2 : 1];
    auto axes = update ? param<mx::DynamicSliceUpdate>(n) : param<mx::DynamicSlice>(n).first;
    mx::Shape size = update ? ins[1].shape : param<mx::DynamicSlice>(n).second;
    if (size.size() != x.size() || start.size() != axes.size()) fail("needs a size per axis and a start per axis");
    for (size_t k = 0; k < x.size(); ++k)
      if (size[k] < 0 || size[k] > x[k]) fail("is larger than its input");
    for (int axis : axes) axis_in(axis, x.size());
    makes(update ? x : size);
    if (out.dtype != ins[0].dtype) fail("keeps its input's dtype");
    // The kernel reads starts as unsigned offsets: a constant start must keep the slice inside.
    if (auto starts = constant_values(start, sc))
      for (size_t j = 0; j < axes.size(); ++j)
        if ((*starts)[j] < 0 || (*starts)[j] > x[axes[j]] - size[axes[j]])
          fail("starts at a constant offset outside its input");
  } else if (name == "Reduce" || name == "ArgReduce" || name == "Scan" || name == "Sort" || name == "ArgSort" ||
             name == "Partition" || name == "ArgPartition") {
    inputs(1);
    const auto& x = ins[0].shape;
    std::vector<int> axes;
    int kind = 0, count = 1;
    if (name == "Reduce") {
      const auto& [k, reduced] = param<mx::Reduce>(n);
      kind = k, count = 6, axes = reduced;
    } else if (name == "ArgReduce") {
      const auto& [k, axis] = param<mx::ArgReduce>(n);
      kind = k, count = 2, axes = {axis};
    } else if (name == "Scan") {
      kind = std::get<0>(param<mx::Scan>(n)), count = 5, axes = {std::get<1>(param<mx::Scan>(n))};
    } else if (name == "Sort") {
      axes = {param<mx::Sort>(n)};
    } else if (name == "ArgSort") {
      axes = {param<mx::ArgSort>(n)};
    } else {
      auto [kth, axis] = name == "Partition" ? param<mx::Partition>(n) : param<mx::ArgPartition>(n);
      axes = {axis_in(axis, x.size())};
      if (kth < 0 || kth >= std::max(x[axis], 1)) fail("partitions at " + std::to_string(kth) + ", outside its axis");
    }
    if (kind < 0 || kind >= count) fail("has an unknown kind " + std::to_string(kind));
    // Their kernels write indices (uint32) or the input's values.
    bool indices = name == "ArgReduce" || name == "ArgSort" || name == "ArgPartition";
    if (indices && out.dtype != mx::uint32) fail("makes uint32 indices");
    if ((name == "Sort" || name == "Partition") && out.dtype != ins[0].dtype) fail("keeps its input's dtype");
    auto want = x;
    std::unordered_set<int> seen;
    for (int axis : axes) {
      if (!seen.insert(axis_in(axis, x.size())).second) fail("names an axis twice");
      if (name == "Reduce" || name == "ArgReduce") want[axis] = 1;
    }
    makes(want);
  } else if (name == "Reshape") {
    inputs(1);
    if (out.size() != ins[0].size()) fail("changes the number of elements");
    if (out.dtype != ins[0].dtype) fail("keeps its input's dtype");
  } else if (name == "Broadcast") {
    if (ins.empty()) fail("needs an input");
    for (const auto& in : ins) {
      if (out.shape.size() < in.shape.size()) fail("is not a broadcast of its inputs");
      for (size_t k = 1; k <= in.shape.size(); ++k) {
        auto d = in.shape[in.shape.size() - k];
        if (d != 1 && d != out.shape[out.shape.size() - k]) fail("is not a broadcast of its inputs");
      }
    }
    if (out.dtype != ins[0].dtype) fail("keeps its input's dtype");
  } else if (name == "Transpose") {
    inputs(1);
    const auto& perm = param<mx::Transpose>(n);
    const auto& x = ins[0].shape;
    if (perm.size() != x.size()) fail("needs a permutation of its input's axes");
    std::vector<bool> used(x.size());
    mx::Shape want;
    for (int axis : perm) {
      if (used[axis_in(axis, x.size())]) fail("needs a permutation of its input's axes");
      used[axis] = true;
      want.push_back(x[axis]);
    }
    makes(want);
    if (out.dtype != ins[0].dtype) fail("keeps its input's dtype");
  } else if (name == "Squeeze" || name == "ExpandDims") {
    inputs(1);
    const auto& axes = name == "Squeeze" ? param<mx::Squeeze>(n) : param<mx::ExpandDims>(n);
    const auto& x = ins[0].shape;
    size_t ndim = name == "Squeeze" ? x.size() : x.size() + axes.size();
    std::vector<bool> named(ndim);
    for (int axis : axes) {
      if (named[axis_in(axis, ndim)]) fail("names an axis twice");
      named[axis] = true;
    }
    mx::Shape want;
    for (size_t k = 0, j = 0; k < ndim; ++k) {
      if (name == "Squeeze") {
        if (!named[k]) want.push_back(x[k]);
        else if (x[k] != 1) fail("squeezes an axis that is not 1");
      } else {
        want.push_back(named[k] ? 1 : x[j++]);
      }
    }
    makes(want);
    if (out.dtype != ins[0].dtype) fail("keeps its input's dtype");
  } else if (name == "Flatten" || name == "Unflatten") {
    inputs(1);
    const auto& x = ins[0].shape;
    if (out.size() != ins[0].size()) fail("changes the number of elements");
    if (name == "Flatten") {
      auto [from, to] = param<mx::Flatten>(n);
      if (axis_in(from, x.size()) > axis_in(to, x.size())) fail("has its axes out of order");
      if (out.shape.size() != x.size() - (to - from)) fail("makes another number of axes");
    } else {
      const auto& [axis, shape] = param<mx::Unflatten>(n);
      axis_in(axis, x.size());
      if (shape.empty() || out.shape.size() != x.size() - 1 + shape.size()) fail("makes another number of axes");
    }
    if (out.dtype != ins[0].dtype) fail("keeps its input's dtype");
  } else if (name == "Concatenate") {
    if (ins.empty()) fail("needs an input");
    const auto& x = ins[0].shape;
    int axis = axis_in(param<mx::Concatenate>(n), x.size());
    auto want = x;
    int64_t total = 0;
    for (const auto& in : ins) {
      for (size_t k = 0; k < x.size(); ++k)
        if (in.shape.size() != x.size() || (static_cast<int>(k) != axis && in.shape[k] != x[k]))
          fail("needs inputs that differ along its axis only");
      total += in.shape[axis];
    }
    if (total > INT32_MAX) fail("makes an axis too long");
    want[axis] = static_cast<int>(total);
    makes(want);
    same_dtype(0);
    if (out.dtype != ins[0].dtype) fail("keeps its inputs' dtype");
  } else if (name == "Pad") {
    inputs(2);
    const auto& [axes, low, high] = param<mx::Pad>(n);
    const auto& x = ins[0].shape;
    if (axes.size() != low.size() || axes.size() != high.size()) fail("needs low and high pads per axis");
    auto want = x;
    for (size_t k = 0; k < axes.size(); ++k) {
      int axis = axis_in(axes[k], x.size());
      if (low[k] < 0 || high[k] < 0) fail("has a negative pad");
      want[axis] += low[k] + high[k];
    }
    makes(want);
    if (ins[1].size() != 1 || out.dtype != ins[0].dtype) fail("needs a scalar pad value");
  } else if (name == "Convolution") {
    inputs(2);
    const auto& [strides, lo, hi, kernel_dilation, input_dilation, groups, flip] = param<mx::Convolution>(n);
    const auto &x = ins[0].shape, &w = ins[1].shape;
    size_t spatial = x.size() >= 2 ? x.size() - 2 : 0;
    if (x.size() < 3 || w.size() != x.size() || out.shape.size() != x.size() || strides.size() != spatial ||
        lo.size() != spatial || hi.size() != spatial || kernel_dilation.size() != spatial ||
        input_dilation.size() != spatial)
      fail("needs parameters per spatial axis");
    // A zero-sized kernel makes BLAS end the process (DESIGN.md 7).
    if (groups <= 0 || ins[1].size() == 0 || x.back() % groups || x.back() != w.back() * groups)
      fail("needs a non-empty kernel and whole groups");
    for (size_t k = 0; k < spatial; ++k)
      if (strides[k] <= 0 || kernel_dilation[k] <= 0 || input_dilation[k] <= 0 || lo[k] < 0 || hi[k] < 0)
        fail("needs positive strides and dilations");
    if (out.shape[0] != x[0] || out.shape.back() != w[0]) fail("makes another batch or channel count");
    // The kernel reads the input at every output position times its stride: the file's
    // output sizes must be those the input, kernel and parameters give (MLX's conv_out_shape).
    for (size_t k = 0; k < spatial; ++k) {
      int64_t in = 1 + int64_t{input_dilation[k]} * (x[k + 1] - 1);
      int64_t kernel = 1 + int64_t{kernel_dilation[k]} * (w[k + 1] - 1);
      int64_t padded = in + lo[k] + hi[k];
      // An empty spatial input is MLX's to take (its output is the padding's); a dilated one has no size.
      if (in < 0 || w[k + 1] <= 0 || padded < kernel || out.shape[k + 1] != (padded - kernel) / strides[k] + 1)
        fail("makes another spatial size than its input, kernel and parameters give");
    }
    same_dtype(0);
  } else if (name == "AsStrided") {
    inputs(1);
    const auto& [shape, strides, offset] = param<mx::AsStrided>(n);
    if (shape != out.shape || strides.size() != shape.size()) fail("needs a stride per axis of its output");
    // Every element it reads lies inside its input.
    int64_t lowest = offset, highest = offset;
    for (size_t k = 0; k < shape.size(); ++k) {
      if (shape[k] == 0) lowest = 0, highest = -1;
      int64_t reach = static_cast<int64_t>(shape[k] - 1) * strides[k];
      (reach < 0 ? lowest : highest) += reach;
    }
    if (highest >= lowest && (lowest < 0 || highest >= static_cast<int64_t>(ins[0].size())))
      fail("reads outside its input");
    if (out.dtype != ins[0].dtype) fail("keeps its input's dtype");
  }
}

Meta meta_of(const mx::array& a) { return Meta{a.shape(), a.dtype(), &a}; }

}  // namespace

void check_node(const mx::array& a, mx::Stream sc, bool read_constants) {
  Node n;
  std::string name = a.primitive().name();
  n.name = class_name(name.substr(0, name.find(' ')));
  auto kind = kinds().find(n.name);
  if (kind == kinds().end()) return;  // a kind the file could not hold (MLX built it)
  n.state = kind->second.state(a.primitive());
  n.unary = kind->second.unary;
  for (const auto& in : a.inputs()) {
    n.ins.push_back(meta_of(in));
    if (!read_constants) n.ins.back().array = nullptr;
  }
  for (const auto& o : a.outputs()) n.outs.push_back(Meta{o.shape(), o.dtype()});
  check(n, sc);
}

Summary check(const char* data, size_t size) {
  Reader in{data, size};
  Summary summary;
  in.text("the header");  // MLX version
  auto count = in.scalar<int>("the header");
  summary.shapeless = in.scalar<bool>("the header");
  in.text("the header");  // metadata
  if (count < 1 || static_cast<size_t>(count) > in.left())
    bad("the header declares " + std::to_string(count) + " traced functions");
  // Any one array is bounded by the memory MLX may use; a constant, by the file.
  uint64_t memory = std::max<uint64_t>(mx::get_memory_limit(), uint64_t{1} << 32);
  std::unordered_map<uint64_t, Meta> constants;  // shared between traces, written once
  auto sc = mx::Stream(0, mx::Device::cpu);
  for (int f = 0; f < count; ++f) {
    Trace trace;
    in.value<std::vector<std::string>>("keyword names");
    auto input_ids = in.value<std::vector<uint64_t>>("input ids");
    auto n_inputs = in.count(min_bytes<mx::Shape>() + 5, "the inputs");
    if (n_inputs != input_ids.size()) bad("the input ids do not match the inputs");
    std::unordered_map<uint64_t, Meta> arrays;
    for (uint64_t k = 0; k < n_inputs; ++k) {
      auto shape = in.shape("an input's shape");
      auto dtype = in.dtype("an input's dtype");
      if (!nbytes_within(shape, dtype, memory)) bad("an input is larger than the memory limit");
      if (!arrays.emplace(input_ids[k], Meta{shape, dtype}).second) bad("two inputs share an id");
      trace.inputs.push_back({std::move(shape), dtype});
    }
    auto output_ids = in.value<std::vector<uint64_t>>("output ids");
    if (output_ids.empty()) bad("a traced function has no outputs");
    trace.n_outputs = output_ids.size();
    auto tape = in.count(9, "the tape");
    for (uint64_t i = 0; i < tape; ++i) {
      auto id = in.scalar<uint64_t>("a node");
      if (!in.scalar<bool>("a node")) {
        if (!in.scalar<bool>("a node")) {
          if (!arrays.count(id)) bad("a node names an input that is not one");
          continue;
        }
        auto known = constants.find(id);
        if (known == constants.end()) {
          auto shape = in.shape("a constant's shape");
          auto dtype = in.dtype("a constant's dtype");
          auto nbytes = nbytes_within(shape, dtype, in.left());
          if (!nbytes) bad("a constant is larger than what is left of the file");
          const char* bytes = in.data + in.at;
          in.skip(*nbytes, "a constant");
          known = constants.emplace(id, Meta{shape, dtype, nullptr, bytes}).first;
        }
        arrays.emplace(id, known->second);  // MLX keeps the first array of an id
        continue;
      }
      Node node;
      for (auto input : in.value<std::vector<uint64_t>>("a node's inputs")) {
        auto it = arrays.find(input);
        if (it == arrays.end()) bad("a node reads an array that is not defined before it");
        node.ins.push_back(it->second);
      }
      read_stream(in);
      node.name = in.text("a primitive's name");
      auto kind = kinds().find(node.name);
      if (kind == kinds().end()) bad("unknown primitive " + node.name.substr(0, 64));
      node.state = kind->second.read(in);
      node.unary = kind->second.unary;
      auto siblings = in.scalar<uint64_t>("a node");
      std::vector<uint64_t> ids;
      if (siblings == 0) {
        ids = {id};
        auto shape = in.shape("a node's shape");
        node.outs.push_back(Meta{std::move(shape), in.dtype("a node's dtype")});
      } else {
        ids = in.value<std::vector<uint64_t>>("a node's outputs");
        auto shapes = in.value<std::vector<mx::Shape>>("a node's output shapes");
        auto dtypes = in.value<std::vector<mx::Dtype>>("a node's output dtypes");
        if (ids.size() != siblings + 1 || shapes.size() != ids.size() || dtypes.size() != ids.size() ||
            std::find(ids.begin(), ids.end(), id) == ids.end())
          bad("a node's outputs do not match their count");
        for (size_t k = 0; k < ids.size(); ++k) node.outs.push_back(Meta{shapes[k], dtypes[k]});
      }
      for (const auto& o : node.outs) {
        for (auto d : o.shape)
          if (d < 0) bad("a negative dimension in a node's shape");
        if (!nbytes_within(o.shape, o.dtype, memory)) bad("a " + node.name + " node larger than the memory limit");
      }
      try {
        check(node, sc);
      } catch (const std::invalid_argument& e) {
        std::string why = e.what();
        auto at = why.find("its ");
        bad("the file is inconsistent: " + (at == std::string::npos ? why : why.substr(at)));
      }
      for (size_t k = 0; k < ids.size(); ++k) arrays.emplace(ids[k], node.outs[k]);  // as MLX: the first stays
    }
    for (auto id : output_ids)
      if (!arrays.count(id)) bad("an output is not defined by the tape");
    summary.traces.push_back(std::move(trace));
  }
  if (in.left() != 0) bad(std::to_string(in.left()) + " unexpected bytes after the last traced function");
  return summary;
}

}  // namespace emlx::export_file
