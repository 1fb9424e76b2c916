#pragma once
// Helpers for the mlx-signature ops at the end of emlx_async/_op_table.py.
// Declared in namespace emlx so the generated dispatch (inside ops.cpp) finds them.

#include <optional>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/device.h"
#include "mlx/random.h"  // the random_* entries call mlx::core::random directly
#include "mlx/stream.h"

namespace emlx::extra {

namespace mx = mlx::core;

std::vector<int> ints(const mx::Shape& shape);
std::optional<mx::Shape> opt_shape(const std::optional<std::vector<int>>& values);
std::optional<float> opt_float(bool present, double value);

// mx.pad: `flat` holds a (before, after) pair per axis; `value` is the constant.
mx::array pad_mode(const mx::array& x, const mx::array& value, const mx::Shape& flat, const std::string& mode,
                   mx::Stream s);
// kind: 0 fftn, 1 ifftn, 2 rfftn, 3 irfftn; `n` the sizes per axis (None: the input's).
mx::array fft_any(const mx::array& x, int kind, const std::optional<std::vector<int>>& n, const mx::Shape& axes,
                  const std::string& norm, mx::Stream s);
// xs = [key, loc?, scale?]
mx::array random_normal(const std::vector<mx::array>& xs, const mx::Shape& shape, mx::Dtype dtype, bool has_loc,
                        bool has_scale, mx::Stream s);
mx::array categorical(const mx::array& logits, const mx::array& key, int axis,
                      const std::optional<std::vector<int>>& shape, std::optional<int> num_samples, mx::Stream s);
// Stride, padding and dilation per spatial axis (1, 2 or 3 of them).
mx::array conv_nd(const mx::array& x, const mx::array& w, const mx::Shape& stride, const mx::Shape& padding,
                  const mx::Shape& dilation, int groups, mx::Stream s);
mx::array conv_transpose_nd(const mx::array& x, const mx::array& w, const mx::Shape& stride,
                            const mx::Shape& padding, const mx::Shape& dilation, const mx::Shape& output_padding,
                            int groups, mx::Stream s);

// mx.convolve: numpy's 1-D convolution ("full", "same" or "valid").
mx::array convolve(mx::array a, mx::array v, const std::string& mode, mx::Stream s);
// xs = [a, b, lhs_indices?, rhs_indices?]
mx::array gather_mm(const std::vector<mx::array>& xs, bool has_lhs, bool has_rhs, bool sorted, mx::Stream s);
// xs = [a, b, mask_out?, mask_lhs?, mask_rhs?]
mx::array block_masked_mm(const std::vector<mx::array>& xs, int block_size, bool has_out, bool has_lhs,
                          bool has_rhs, mx::Stream s);
// mx.roll with a tuple shift and/or axes (scalar_shift: shift holds one int, applied as mlx applies an int;
// one_axis: axes holds mlx's int axis, along which mlx rolls by the shifts' sum).
mx::array roll(const mx::array& a, const mx::Shape& shift, bool scalar_shift, bool one_axis,
               const std::optional<std::vector<int>>& axes, mx::Stream s);
// xs = [w, scales, biases?, global_scale?]
mx::array dequantize_full(const std::vector<mx::array>& xs, std::optional<int> group_size, std::optional<int> bits,
                          const std::string& mode, bool has_biases, bool has_global_scale,
                          std::optional<mx::Dtype> dtype, mx::Stream s);
// Throws for what MLX's quantized_matmul/gather_qmm leave unchecked (ops_extra.cpp).
void check_quantized(const char* op, const std::vector<mx::array>& xs, size_t n_sb, std::optional<int> group_size,
                     std::optional<int> bits, const std::string& mode, bool same_ndim_only = false);
// xs = [x, w, scales, biases?, lhs_indices?, rhs_indices?, global_scale?]
mx::array gather_qmm(const std::vector<mx::array>& xs, bool has_biases, bool has_lhs, bool has_rhs, bool has_gs,
                     bool transpose, std::optional<int> group_size, std::optional<int> bits, const std::string& mode,
                     bool sorted, mx::Stream s);
// xs = [x, w, scales?, global_scale_x?, global_scale_w?]
mx::array qqmm(const std::vector<mx::array>& xs, bool has_scales, std::optional<int> group_size,
               std::optional<int> bits, const std::string& mode, bool has_gs_x, bool has_gs_w, mx::Stream s);
// xs = [x, w, scales?, lhs_indices?, rhs_indices?, global_scale_x?, global_scale_w?]
mx::array gather_qqmm(const std::vector<mx::array>& xs, bool has_scales, bool has_lhs, bool has_rhs,
                      std::optional<int> group_size, std::optional<int> bits, const std::string& mode, bool has_gs_x,
                      bool has_gs_w, bool sorted, mx::Stream s);
// xs = [x, window?]; norm: 0 backward, 1 ortho, 2 forward
mx::array stft(const std::vector<mx::array>& xs, int n_fft, std::optional<int> hop, std::optional<int> win,
               bool center, int norm, bool has_onesided, bool onesided, const std::string& pad_mode, mx::Stream s);
mx::array istft(const std::vector<mx::array>& xs, std::optional<int> n_fft, std::optional<int> hop,
                std::optional<int> win, bool center, int norm, bool has_onesided, bool onesided,
                std::optional<int> length, mx::Stream s);

}  // namespace emlx::extra
