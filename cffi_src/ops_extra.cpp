// Helpers for the mlx-signature ops at the end of emlx_async/_op_table.py
// (the dispatch itself is generated into ops.cpp).
#include "ops_extra.hpp"

#include <map>
#include <stdexcept>

#include "mlx/fft.h"
#include "mlx/linalg.h"
#include "mlx/ops.h"
#include "mlx/random.h"
#include "validate.hpp"

namespace emlx::extra {

std::vector<int> ints(const mx::Shape& shape) { return std::vector<int>(shape.begin(), shape.end()); }

std::optional<mx::Shape> opt_shape(const std::optional<std::vector<int>>& values) {
  if (!values) return std::nullopt;
  return mx::Shape(values->begin(), values->end());
}

std::optional<float> opt_float(bool present, double value) {
  return present ? std::optional<float>(static_cast<float>(value)) : std::nullopt;
}

mx::array pad_mode(const mx::array& x, const mx::array& value, const mx::Shape& flat, const std::string& mode,
                   mx::Stream s) {
  if (flat.size() != 2 * x.ndim())
    throw std::invalid_argument("[pad] pad_width needs a (before, after) pair for each of the " +
                                std::to_string(x.ndim()) + " axes");
  std::vector<std::pair<int, int>> pairs;
  for (size_t k = 0; k < x.ndim(); ++k) {
    // MLX sums the padded size in 32 bits: check it here first.
    validate::dim_add("pad", validate::dim_add("pad", x.shape(k), flat[2 * k]), flat[2 * k + 1]);
    pairs.emplace_back(flat[2 * k], flat[2 * k + 1]);
  }
  return mx::pad(x, pairs, value, mode, s);
}

static mx::fft::FFTNorm fft_norm(const std::string& norm) {
  if (norm == "backward") return mx::fft::FFTNorm::Backward;
  if (norm == "ortho") return mx::fft::FFTNorm::Ortho;
  if (norm == "forward") return mx::fft::FFTNorm::Forward;
  throw std::invalid_argument("[fft] Invalid norm '" + norm + "'; expected backward, ortho or forward");
}

mx::array fft_any(const mx::array& x, int kind, const std::optional<std::vector<int>>& n, const mx::Shape& axes,
                  const std::string& norm, mx::Stream s) {
  auto ax = ints(axes);
  auto nm = fft_norm(norm);
  if (n) {
    mx::Shape sizes(n->begin(), n->end());
    switch (kind) {
      case 0: return mx::fft::fftn(x, sizes, ax, nm, s);
      case 1: return mx::fft::ifftn(x, sizes, ax, nm, s);
      case 2: return mx::fft::rfftn(x, sizes, ax, nm, s);
      default: return mx::fft::irfftn(x, sizes, ax, nm, s);
    }
  }
  switch (kind) {
    case 0: return mx::fft::fftn(x, ax, nm, s);
    case 1: return mx::fft::ifftn(x, ax, nm, s);
    case 2: return mx::fft::rfftn(x, ax, nm, s);
    default: return mx::fft::irfftn(x, ax, nm, s);
  }
}

mx::array random_normal(const std::vector<mx::array>& xs, const mx::Shape& shape, mx::Dtype dtype, bool has_loc,
                        bool has_scale, mx::Stream s) {
  if (xs.size() != 1u + has_loc + has_scale) throw std::invalid_argument("[normal] expects key, loc?, scale?");
  std::optional<mx::array> loc, scale;
  if (has_loc) loc = xs[1];
  if (has_scale) scale = xs[1 + has_loc];
  return mx::random::normal(shape, dtype, loc, scale, xs[0], s);
}

mx::array categorical(const mx::array& logits, const mx::array& key, int axis,
                      const std::optional<std::vector<int>>& shape, std::optional<int> num_samples, mx::Stream s) {
  if (shape && num_samples)
    throw std::invalid_argument("[categorical] At most one of shape or num_samples can be specified.");
  if (shape) return mx::random::categorical(logits, axis, mx::Shape(shape->begin(), shape->end()), key, s);
  if (num_samples) return mx::random::categorical(logits, axis, *num_samples, key, s);
  return mx::random::categorical(logits, axis, key, s);
}

static void check_spatial(const char* op, size_t n, const std::vector<const mx::Shape*>& params) {
  for (auto* p : params)
    if (p->size() != n) throw std::invalid_argument(std::string("[") + op + "] expects one value per spatial axis");
}

mx::array conv_nd(const mx::array& x, const mx::array& w, const mx::Shape& st, const mx::Shape& pd,
                  const mx::Shape& dl, int groups, mx::Stream s) {
  size_t n = st.size();
  check_spatial("conv", n, {&pd, &dl});
  if (n == 1) return mx::conv1d(x, w, st[0], pd[0], dl[0], groups, s);
  if (n == 2) return mx::conv2d(x, w, {st[0], st[1]}, {pd[0], pd[1]}, {dl[0], dl[1]}, groups, s);
  if (n == 3)
    return mx::conv3d(x, w, {st[0], st[1], st[2]}, {pd[0], pd[1], pd[2]}, {dl[0], dl[1], dl[2]}, groups, s);
  throw std::invalid_argument("[conv] expects 1, 2 or 3 spatial axes");
}

mx::array conv_transpose_nd(const mx::array& x, const mx::array& w, const mx::Shape& st, const mx::Shape& pd,
                            const mx::Shape& dl, const mx::Shape& op, int groups, mx::Stream s) {
  size_t n = st.size();
  check_spatial("conv_transpose", n, {&pd, &dl, &op});
  if (n == 1) return mx::conv_transpose1d(x, w, st[0], pd[0], dl[0], op[0], groups, s);
  if (n == 2)
    return mx::conv_transpose2d(x, w, {st[0], st[1]}, {pd[0], pd[1]}, {dl[0], dl[1]}, {op[0], op[1]}, groups, s);
  if (n == 3)
    return mx::conv_transpose3d(x, w, {st[0], st[1], st[2]}, {pd[0], pd[1], pd[2]}, {dl[0], dl[1], dl[2]},
                                {op[0], op[1], op[2]}, groups, s);
  throw std::invalid_argument("[conv_transpose] expects 1, 2 or 3 spatial axes");
}

}  // namespace emlx::extra

namespace emlx::extra {

mx::array convolve(mx::array a, mx::array v, const std::string& mode, mx::Stream s) {
  if (a.ndim() != 1 || v.ndim() != 1) throw std::invalid_argument("[convolve] Inputs must be 1D.");
  if (a.size() < v.size()) std::swap(a, v);
  int n = static_cast<int>(a.size()), k = static_cast<int>(v.size());
  int lo, hi;
  if (mode == "full") {
    lo = hi = k - 1;
  } else if (mode == "same") {  // numpy's: the centre of the full result, one more on the left for even k
    hi = (k - 1) / 2;
    lo = k - 1 - hi;
  } else if (mode == "valid") {
    lo = hi = 0;
  } else {
    throw std::invalid_argument("[convolve] Invalid mode: must be 'full', 'same' or 'valid'.");
  }
  // flip=true makes conv_general a convolution rather than a correlation.
  auto out = mx::conv_general(mx::reshape(a, {1, n, 1}, s), mx::reshape(v, {1, k, 1}, s), {1}, {lo}, {hi}, {1},
                              {1}, 1, true, s);
  return mx::reshape(out, {-1}, s);
}

}  // namespace emlx::extra

namespace emlx::extra {

mx::array gather_mm(const std::vector<mx::array>& xs, bool has_lhs, bool has_rhs, bool sorted, mx::Stream s) {
  if (xs.size() != 2u + has_lhs + has_rhs) throw std::invalid_argument("[gather_mm] expects a, b, lhs?, rhs?");
  std::optional<mx::array> lhs, rhs;
  if (has_lhs) lhs = xs[2];
  if (has_rhs) rhs = xs[2 + has_lhs];
  return mx::gather_mm(xs[0], xs[1], lhs, rhs, sorted, s);
}

mx::array block_masked_mm(const std::vector<mx::array>& xs, int block_size, bool has_out, bool has_lhs,
                          bool has_rhs, mx::Stream s) {
  if (xs.size() != 2u + has_out + has_lhs + has_rhs)
    throw std::invalid_argument("[block_masked_mm] expects a, b and the masks given");
  std::optional<mx::array> out, lhs, rhs;
  size_t k = 2;
  if (has_out) out = xs[k++];
  if (has_lhs) lhs = xs[k++];
  if (has_rhs) rhs = xs[k++];
  return mx::block_masked_mm(xs[0], xs[1], block_size, out, lhs, rhs, s);
}

}  // namespace emlx::extra

namespace emlx::extra {

mx::array roll(const mx::array& a, const mx::Shape& shift, bool scalar_shift, bool one_axis,
               const std::optional<std::vector<int>>& axes, mx::Stream s) {
  if (scalar_shift) return axes ? mx::roll(a, shift.at(0), *axes, s) : mx::roll(a, shift.at(0), s);
  if (one_axis) return mx::roll(a, shift, axes->at(0), s);  // mlx sums the shifts along that axis
  return axes ? mx::roll(a, shift, *axes, s) : mx::roll(a, shift, s);
}

mx::array dequantize_full(const std::vector<mx::array>& xs, std::optional<int> group_size, std::optional<int> bits,
                          const std::string& mode, bool has_biases, bool has_global_scale,
                          std::optional<mx::Dtype> dtype, mx::Stream s) {
  if (xs.size() != 2u + has_biases + has_global_scale)
    throw std::invalid_argument("[dequantize] expects w, scales, biases?, global_scale?");
  std::optional<mx::array> biases, global_scale;
  if (has_biases) biases = xs[2];
  if (has_global_scale) global_scale = xs[2 + has_biases];
  return mx::dequantize(xs[0], xs[1], biases, group_size, bits, mode, global_scale, dtype, s);
}

}  // namespace emlx::extra

namespace emlx::extra {

// What MLX's quantized_matmul and gather_qmm do not check, once they have
// built (so their own messages come first): scales and biases against w (the
// kernel reads past smaller ones), an empty inner dimension (SIGFPE at
// evaluation), and the pinned sizes of the mx/nv modes (MLX takes nvfp4
// with group_size 32). `n_sb` arrays after x and w are scales and biases.
void check_quantized(const char* op, const std::vector<mx::array>& xs, size_t n_sb, std::optional<int> group_size,
                     std::optional<int> bits, const std::string& mode, bool same_ndim_only) {
  static const std::map<std::string, std::pair<int, int>> defaults = {
      {"affine", {64, 4}}, {"mxfp4", {32, 4}}, {"mxfp8", {32, 8}}, {"nvfp4", {16, 4}}};
  auto found = defaults.find(mode);
  if (found == defaults.end()) return;  // MLX refused it already
  auto [dg, db] = found->second;
  if (mode != "affine" && ((group_size && *group_size != dg) || (bits && *bits != db)))
    throw std::invalid_argument(std::string("[") + op + "] mode '" + mode + "' needs group_size=" +
                                std::to_string(dg) + " and bits=" + std::to_string(db));
  const auto &x = xs[0], &w = xs[1];
  if (w.ndim() < 2) return;
  if (w.shape(-1) == 0 || (x.ndim() > 0 && x.shape(-1) == 0))
    throw std::invalid_argument(std::string("[") + op + "] the inner (contracted) dimension is empty");
  int64_t g = group_size.value_or(dg), b = bits.value_or(db);
  auto want = w.shape();
  want.back() = static_cast<int>(static_cast<int64_t>(w.shape(-1)) * 32 / b / g);
  for (size_t k = 2; k < 2 + n_sb; ++k)
    if (xs[k].shape() != want && !(same_ndim_only && xs[k].ndim() != w.ndim()))
      throw std::invalid_argument(std::string("[") + op + "] " + (k == 2 ? "scales" : "biases") + " have shape " +
                                  validate::shape_text(xs[k].shape()) + "; w of shape " +
                                  validate::shape_text(w.shape()) + " needs " + validate::shape_text(want));
}

mx::array gather_qmm(const std::vector<mx::array>& xs, bool has_biases, bool has_lhs, bool has_rhs, bool has_gs,
                     bool transpose, std::optional<int> group_size, std::optional<int> bits, const std::string& mode,
                     bool sorted, mx::Stream s) {
  if (xs.size() != 3u + has_biases + has_lhs + has_rhs + has_gs)
    throw std::invalid_argument("[gather_qmm] expects x, w, scales and the optional arrays given");
  std::optional<mx::array> biases, lhs, rhs, gs;
  size_t k = 3;
  if (has_biases) biases = xs[k++];
  if (has_lhs) lhs = xs[k++];
  if (has_rhs) rhs = xs[k++];
  if (has_gs) gs = xs[k++];
  auto out = mx::gather_qmm(xs[0], xs[1], xs[2], biases, lhs, rhs, transpose, group_size, bits, mode, gs, sorted, s);
  check_quantized("gather_qmm", xs, 1 + has_biases, group_size, bits, mode);
  return out;
}

// qqmm and gather_qqmm: the optional arrays in xs, in mlx's order, after x and w.
// An empty contracted dimension is refused before MLX sees it, as for
// quantized_matmul (ops.cpp) and gather_qmm, whose kernels trap on it; MLX's
// CPU backend does not run qqmm at all (it raises "NYI"), so its GPU kernels
// could not be tried here.
namespace {
struct OptionalArrays {
  const std::vector<mx::array>& xs;
  size_t next = 2;
  std::optional<mx::array> take(bool present) {
    if (!present) return std::nullopt;
    return xs.at(next++);
  }
};

void check_inner_dimension(const char* op, const mx::array& x, const mx::array& w) {
  if ((x.ndim() > 0 && x.shape(-1) == 0) || (w.ndim() > 0 && w.shape(-1) == 0))
    throw std::invalid_argument(std::string("[") + op + "] the inner (contracted) dimension is empty");
}
}  // namespace

mx::array qqmm(const std::vector<mx::array>& xs, bool has_scales, std::optional<int> group_size,
               std::optional<int> bits, const std::string& mode, bool has_gs_x, bool has_gs_w, mx::Stream s) {
  if (xs.size() != 2u + has_scales + has_gs_x + has_gs_w)
    throw std::invalid_argument("[qqmm] expects x, w and the optional arrays given");
  check_inner_dimension("qqmm", xs[0], xs[1]);
  OptionalArrays rest{xs};
  auto scales = rest.take(has_scales);
  auto gs_x = rest.take(has_gs_x);
  auto gs_w = rest.take(has_gs_w);
  return mx::qqmm(xs[0], xs[1], scales, group_size, bits, mode, gs_x, gs_w, s);
}

mx::array gather_qqmm(const std::vector<mx::array>& xs, bool has_scales, bool has_lhs, bool has_rhs,
                      std::optional<int> group_size, std::optional<int> bits, const std::string& mode, bool has_gs_x,
                      bool has_gs_w, bool sorted, mx::Stream s) {
  if (xs.size() != 2u + has_scales + has_lhs + has_rhs + has_gs_x + has_gs_w)
    throw std::invalid_argument("[gather_qqmm] expects x, w and the optional arrays given");
  check_inner_dimension("gather_qqmm", xs[0], xs[1]);
  OptionalArrays rest{xs};
  auto scales = rest.take(has_scales);
  auto lhs = rest.take(has_lhs);
  auto rhs = rest.take(has_rhs);
  auto gs_x = rest.take(has_gs_x);
  auto gs_w = rest.take(has_gs_w);
  return mx::gather_qqmm(xs[0], xs[1], scales, lhs, rhs, group_size, bits, mode, gs_x, gs_w, sorted, s);
}

static mx::fft::FFTNorm norm_code(int code) {
  return code == 1 ? mx::fft::FFTNorm::Ortho : code == 2 ? mx::fft::FFTNorm::Forward : mx::fft::FFTNorm::Backward;
}

mx::array stft(const std::vector<mx::array>& xs, int n_fft, std::optional<int> hop, std::optional<int> win,
               bool center, int norm, bool has_onesided, bool onesided, const std::string& pad_mode, mx::Stream s) {
  std::optional<mx::array> window;
  if (xs.size() > 1) window = xs[1];
  std::optional<bool> side = has_onesided ? std::optional<bool>(onesided) : std::nullopt;
  return mx::fft::stft(xs.at(0), n_fft, hop, win, window, center, pad_mode, norm_code(norm), side, s);
}

mx::array istft(const std::vector<mx::array>& xs, std::optional<int> n_fft, std::optional<int> hop,
                std::optional<int> win, bool center, int norm, bool has_onesided, bool onesided,
                std::optional<int> length, mx::Stream s) {
  std::optional<mx::array> window;
  if (xs.size() > 1) window = xs[1];
  std::optional<bool> side = has_onesided ? std::optional<bool>(onesided) : std::nullopt;
  return mx::fft::istft(xs.at(0), n_fft, hop, win, window, center, norm_code(norm), side, length, s);
}

}  // namespace emlx::extra
