// Validation in front of MLX (see validate.hpp). Each guard names the MLX
// behaviour it prevents; the crash classes were each reproduced with plain
// mlx.core (0.32) in a process of its own.
#include "validate.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "mlx/memory.h"
#include "mlx/ops.h"
#include "mlx/utils.h"
#include "mlx_internals.hpp"

namespace mx = mlx::core;

namespace emlx::validate {

namespace {

[[noreturn]] void refuse(const char* op, const std::string& why) {
  throw std::invalid_argument(std::string("[") + op + "] " + why);
}

// conv_general: x {N, spatial..., C_in}, w {C_out, kernel..., C_in / groups}.
// MLX's CPU convolution divides by the input channels (SIGFPE when there are
// none), and a zero-sized kernel reaches BLAS's sgemm with a zero leading
// dimension: BLAS's error handler ends the process with status 0.
void conv_kernel(const char* op, const std::vector<mx::array>& xs) {
  const auto &x = xs[0], &w = xs[1];
  if (x.ndim() < 2 || w.ndim() != x.ndim()) return;  // MLX's own shape checks answer these
  if (x.shape(0) == 0 || w.shape(0) == 0) return;       // an empty result: no kernel runs (see outputs())
  if (x.shape(-1) == 0) refuse(op, "input has no channels (shape " + shape_text(x.shape()) + ")");
  for (int k = 1; k < static_cast<int>(w.ndim()); ++k)
    if (w.shape(k) == 0) refuse(op, "zero-sized kernel (weight shape " + shape_text(w.shape()) + ")");
}

// Variadic ops index their arrays (xs[0], xs[1], ...): too few would read
// past the list.
struct Arity {
  const char* op;
  size_t min, max;
};
const Arity kArity[] = {
    {"dequantize", 2, 3}, {"quantized_matmul", 3, 4}, {"gather", 1, SIZE_MAX},
    {"scatter", 3, SIZE_MAX}, {"scatter_add", 3, SIZE_MAX}, {"kv_cache_attention", 5, 6},
};  // concatenate and stack check for no arrays themselves, with MLX's message

// scaled_dot_product_attention {B, N, T, D}: MLX takes the query heads
// modulo the key heads; keys with no heads are a SIGFPE.
void attention_heads(const char* op, const std::vector<mx::array>& xs) {
  if (xs.size() >= 2 && xs[1].ndim() == 4 && xs[1].shape(1) == 0)
    refuse(op, "keys have no heads (shape " + shape_text(xs[1].shape()) + ")");
}

// kv_cache_attention: q, k, v and the caches are {B, T, N, D}; the same
// division by the key heads, after its transposes.
void cache_heads(const char* op, const std::vector<mx::array>& xs) {
  if (xs.size() >= 4 && xs[3].ndim() == 4 && xs[3].shape(2) == 0)
    refuse(op, "the key cache has no heads (shape " + shape_text(xs[3].shape()) + ")");
}

struct Guard {
  const char* op;
  void (*check)(const char* op, const std::vector<mx::array>& xs);
};

// Guards that need the input arrays, by op. Guards on option values alone
// live in the op table as rules on the option's kind (":positive",
// ":nonzero"): zero group sizes, groups and strides, which MLX divides by
// (SIGFPE). Empty inputs, empty results and oversized allocations are
// handled for every op by inputs() and outputs().
const Guard kGuards[] = {
    {"conv_general", conv_kernel},
    {"conv_nd", conv_kernel},  // conv1d..conv_transpose3d reach the same kernels
    {"conv_transpose_nd", conv_kernel},
    {"fast_sdpa", attention_heads},
    {"fast_sdpa_masked", attention_heads},
    {"fast_sdpa_sinks", attention_heads},
    {"fast_sdpa_causal_key_mask", attention_heads},
    {"kv_cache_attention", cache_heads},
};

// Empty inputs: MLX's CPU reduction of an empty, non-row-contiguous array
// (e.g. a transposed {0, 2, 5, 3}) can loop forever, hanging the worker for
// good. An empty array holds no data, so fresh zeros are the same value.
bool is_empty(const mx::array& x) { return x.size() == 0; }

}  // namespace

std::string shape_text(const mx::Shape& shape) {
  std::string out = "(";
  for (size_t k = 0; k < shape.size(); ++k) out += (k ? ", " : "") + std::to_string(shape[k]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

std::string dtype_text(mx::Dtype dtype) {
  std::ostringstream out;
  out << dtype;
  return out.str();
}

size_t allocation_limit() {
  static const size_t physical = [] {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page)
                                 : std::numeric_limits<size_t>::max();
  }();
  size_t limit = mx::get_memory_limit();
  return limit > 0 && limit < physical ? limit : physical;
}

namespace {

size_t checked_nbytes_within(const char* op, const mx::Shape& shape, size_t itemsize, size_t limit) {
  // MLX's own size() wraps on overflow, and a failed allocation is a SIGSEGV
  // in MLX's allocator (even under set_memory_limit): refuse both here.
  uint64_t n = itemsize;
  bool overflow = false;
  for (int d : shape) {
    if (d < 0) refuse(op, "negative dimension in shape " + shape_text(shape));
    overflow = overflow || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n);
  }
  bool empty = false;
  for (int d : shape) empty = empty || d == 0;
  if (empty) return 0;
  if (overflow || n > limit)
    throw std::runtime_error(std::string("[") + op + "] an array of shape " + shape_text(shape) + " needs " +
                             (overflow ? std::string("more than 2**64") : std::to_string(n)) +
                             " bytes, over the allocation limit of " + std::to_string(limit) +
                             " bytes (MLX's memory limit, at most physical memory)");
  return n;
}

}  // namespace

size_t checked_nbytes(const char* op, const mx::Shape& shape, size_t itemsize) {
  return checked_nbytes_within(op, shape, itemsize, allocation_limit());
}

int dim_add(const char* op, int64_t a, int64_t b) {
  int64_t r = a + b;  // both are 32-bit values here: no 64-bit overflow
  if (r < 0 || r > std::numeric_limits<int>::max())
    refuse(op, "dimension " + std::to_string(a) + " + " + std::to_string(b) + " is outside [0, 2**31)");
  return static_cast<int>(r);
}

int dim_mul(const char* op, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r) || r < 0 || r > std::numeric_limits<int>::max())
    refuse(op, "dimension " + std::to_string(a) + " * " + std::to_string(b) + " is outside [0, 2**31)");
  return static_cast<int>(r);
}

std::vector<mx::array> inputs(const char* op, const std::vector<mx::array>& xs, mx::Stream s) {
  for (const auto& arity : kArity)
    if (std::strcmp(arity.op, op) == 0 && (xs.size() < arity.min || xs.size() > arity.max))
      refuse(op, "got " + std::to_string(xs.size()) + " arrays, expects " + std::to_string(arity.min) +
                     (arity.max == SIZE_MAX ? " or more" : " to " + std::to_string(arity.max)));
  for (const auto& guard : kGuards)
    if (std::strcmp(guard.op, op) == 0) guard.check(op, xs);
  bool any_empty = false;
  for (const auto& x : xs) any_empty = any_empty || is_empty(x);
  if (!any_empty) return xs;
  std::vector<mx::array> out;
  out.reserve(xs.size());
  for (const auto& x : xs) out.push_back(is_empty(x) ? mx::zeros(x.shape(), x.dtype(), s) : x);
  return out;
}

namespace {

// The largest node of the graphs of `outs` not yet evaluated (stopping at `xs`);
// throws (naming `op`) for one that overflows or exceeds `limit`.
size_t largest_node(const char* op, const std::vector<mx::array>& outs, const std::vector<mx::array>& xs,
                    size_t limit, bool views_free) {
  std::unordered_set<std::uintptr_t> seen;
  for (const auto& x : xs) seen.insert(x.id());
  std::vector<mx::array> stack(outs.begin(), outs.end());
  size_t largest = 0;
  while (!stack.empty()) {
    mx::array a = stack.back();
    stack.pop_back();
    if (!seen.insert(a.id()).second) continue;
    if (a.status() != mx::array::Status::unscheduled || !a.has_primitive()) continue;  // allocated already
    if (!(views_free && mlx_internals::is_view(a)))
      largest = std::max(largest, checked_nbytes_within(op, a.shape(), a.itemsize(), limit));
    for (const auto& in : a.inputs()) stack.push_back(in);
    for (const auto& sib : a.siblings()) stack.push_back(sib);
  }
  return largest;
}

}  // namespace

void check_fits(const char* op, const std::vector<mx::array>& outs, const std::vector<mx::array>& xs) {
  // Every node this op added (stopping at its inputs and at evaluated
  // arrays) must fit the allocation limit: creation ops, broadcast, tile,
  // pad, repeat and friends ask for their whole output at once.
  size_t limit = allocation_limit();  // once: MLX's limit is read under a lock
  size_t largest = largest_node(op, outs, xs, limit, false);
  // The limit counts this process's live arrays too: MLX's CPU allocator
  // neither waits nor fails cleanly past it (two 16 GB results on a 23 GB
  // machine end the process). Cached buffers are released to make room.
  size_t active = mx::get_active_memory();
  if (largest > 0 && (active > limit || largest > limit - active))
    throw std::runtime_error(std::string("[") + op + "] needs " + std::to_string(largest) + " bytes at once, but " +
                             std::to_string(active) + " of the allocation limit of " + std::to_string(limit) +
                             " bytes are held by live arrays");
  if (largest > 0 && largest + active + mx::get_cache_memory() > limit) mx::clear_cache();
}

void check_evaluable(const char* op, const std::vector<mx::array>& outs) {
  largest_node(op, outs, {}, allocation_limit(), true);
}

std::vector<mx::array> outputs(const char* op, std::vector<mx::array> outs, const std::vector<mx::array>& xs,
                               mx::Stream s) {
  check_fits(op, outs, xs);
  // Results that are all empty need no kernel, and some MLX kernels crash
  // on them (linalg.inv, lu and solve of 0x0 matrices: SIGFPE in LAPACK
  // set-up): zeros of the same shapes and dtypes are the exact answer.
  bool all_empty = !outs.empty();
  for (const auto& o : outs) all_empty = all_empty && is_empty(o);
  if (all_empty)
    for (auto& o : outs) o = mx::zeros(o.shape(), o.dtype(), s);
  return outs;
}

mx::array as_strided(const mx::array& x, const mx::Shape& shape, const mx::Strides& strides, int64_t offset,
                     mx::Stream s) {
  const char* op = "as_strided";
  if (shape.size() != strides.size())
    refuse(op, "shape " + shape_text(shape) + " and strides need the same length");
  // Lowest and highest element the view reaches, in the flattened input.
  __int128 lo = offset, hi = offset;
  bool empty = false;
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] < 0) refuse(op, "Negative dimensions not allowed.");  // mlx's message
    empty = empty || shape[k] == 0;
    __int128 reach = static_cast<__int128>(shape[k] == 0 ? 0 : shape[k] - 1) * strides[k];
    (reach < 0 ? lo : hi) += reach;
  }
  if (!empty && (lo < 0 || hi >= static_cast<__int128>(x.size())))
    refuse(op, "the view reaches elements outside the input's " + std::to_string(x.size()) +
                   " elements (offset " + std::to_string(offset) + "); MLX would read out of bounds");
  return mx::as_strided(x, shape, strides, static_cast<size_t>(offset), s);
}

}  // namespace emlx::validate
