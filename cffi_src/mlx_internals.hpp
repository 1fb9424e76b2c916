#pragma once
// Every reliance of the shim on MLX internals: what MLX's public API does
// not promise across versions (private members, the Python binding's object
// layout, primitive names). Each is defined in mlx_internals.cpp and nowhere
// else, and the whole shim compiles only against the MLX versions below
// (shim.hpp includes this header), so a new MLX is checked here, in one file.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "mlx/array.h"
#include "mlx/primitives.h"
#include "mlx/stream.h"
#include "mlx/version.h"

// The MLX versions these internals were checked against, as MLX_VERSION_NUMERIC
// (100000 * major + 1000 * minor + patch). build_ffi.py reads these lines to
// refuse another MLX before compiling, naming both versions.
#define EMLX_MLX_SUPPORTED_MIN 32000
#define EMLX_MLX_SUPPORTED_MAX 32999
#define EMLX_MLX_SUPPORTED "0.32.x"

#if MLX_VERSION_NUMERIC < EMLX_MLX_SUPPORTED_MIN || MLX_VERSION_NUMERIC > EMLX_MLX_SUPPORTED_MAX
#error "emlx_async does not support the MLX version of these headers: see EMLX_MLX_SUPPORTED in cffi_src/mlx_internals.hpp"
#endif

namespace emlx::mlx_internals {

// nanobind's instance layout for mx.array: the PyObject header, then an
// int32 offset from the object to the C++ mlx::core::array it holds.
int32_t nanobind_offset(void* obj);

// Whether `obj`'s offset lies where nanobind puts the C++ object (right
// after the header): a sanity check before array_of dereferences it.
bool plausible_array_object(void* obj);

// The mlx::core::array inside an mx.array object (the caller holds the GIL:
// an in-place op such as `a += b` swaps it).
mlx::core::array& array_of(void* obj);

// A primitive's stream, writable: MLX exposes it by const reference only,
// and a replayed graph's nodes must be rebound to the calling worker's stream.
mlx::core::Stream& stream_of(mlx::core::Primitive& primitive);

// How many stream threads MLX's scheduler holds (its private map).
size_t stream_threads();

// Run `task` on `stream`'s CPU thread once `inputs` are computed, from a
// custom primitive's eval_cpu (which MLX 0.32 calls before its inputs are
// computed), through the stream's command encoder (a backend header, not
// public API). An exception `task` throws comes back out of mx::eval.
void dispatch_cpu_task(const mlx::core::Stream& stream, const std::vector<mlx::core::array>& inputs,
                       std::vector<mlx::core::array>& outputs, std::function<void()> task);

// Whether `a` is a constant an imported export file loads (MLX's "Load" primitive).
bool is_loaded_constant(const mlx::core::array& a);

// Whether `a`'s primitive makes a view of its input (broadcast, slice,
// transpose...): evaluating it allocates no buffer of its own.
bool is_view(const mlx::core::array& a);

}  // namespace emlx::mlx_internals
