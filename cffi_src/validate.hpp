#pragma once

// Validation in front of MLX for inputs that crash, hang or corrupt plain MLX
// (a crash there ends the whole process, a hang keeps a worker forever).
// run_op (ops.cpp) calls these around every op the table dispatches.

#include <cstdint>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"

namespace emlx {
namespace mx = mlx::core;  // scoped: a header's alias would reach every file that includes it
}  // namespace emlx

namespace emlx::validate {

// Before MLX sees the op: empty inputs become fresh row-contiguous zeros (same
// shape and dtype, so the same value), and the per-op guards of kGuards run.
std::vector<mx::array> inputs(const char* op, const std::vector<mx::array>& xs, mx::Stream s);

// Refuses (naming `op`) when a node of the graphs of `outs` that is not yet
// evaluated, stopping at `xs`, overflows or exceeds allocation_limit(), or
// when the largest does not fit beside the live arrays.
void check_fits(const char* op, const std::vector<mx::array>& outs, const std::vector<mx::array>& xs);

// For graphs the caller built (plain MLX code) that the runtime evaluates:
// refuses only a node that could never be allocated (overflow, or past the
// allocation limit alone, where MLX's allocator ends the process); views
// allocate nothing, and the live arrays are MLX's own business, as in plain MLX.
void check_evaluable(const char* op, const std::vector<mx::array>& outs);

// After the graph is built, before it is evaluated: refuses any new node whose
// size overflows or exceeds allocation_limit(); outputs that are all empty are
// replaced by zeros of their shapes and dtypes, so no kernel runs on them.
std::vector<mx::array> outputs(const char* op, std::vector<mx::array> outs, const std::vector<mx::array>& xs,
                               mx::Stream s);

// The largest single allocation an op may ask for: MLX's memory limit, at
// most the machine's physical memory.
size_t allocation_limit();

// Bytes of an array of `shape` and `itemsize`; throws (naming `op`) when the
// element count overflows 64 bits or the bytes exceed allocation_limit().
size_t checked_nbytes(const char* op, const mx::Shape& shape, size_t itemsize);

// "(2, 3)", as Python prints a shape.
std::string shape_text(const mx::Shape& shape);

// "float32", as MLX prints a dtype.
std::string dtype_text(mx::Dtype dtype);

// a + b and a * b for shape arithmetic that must stay a 32-bit MLX dimension.
int dim_add(const char* op, int64_t a, int64_t b);
int dim_mul(const char* op, int64_t a, int64_t b);

// mx::as_strided reads any address its arguments reach: checks that every
// element of the view lies inside the (flattened) input first.
mx::array as_strided(const mx::array& x, const mx::Shape& shape, const mx::Strides& strides, int64_t offset,
                     mx::Stream s);

}  // namespace emlx::validate
