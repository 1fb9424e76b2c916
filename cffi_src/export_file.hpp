#pragma once

// Checks of MLX export files (.mlxfn) and of the graphs they describe,
// before MLX's own importer sees them. MLX's reader trusts the file: a
// corrupted count, id, shape, dtype or primitive parameter makes it allocate
// without bound, read past its vectors, or build nodes whose kernels read
// past their buffers (SIGSEGV, SIGABRT, or BLAS ending the process). These
// checks walk the same layout (mlx/export.cpp) with every length bounded by
// the bytes left, rebuild each node the way MLX would (never evaluated), and
// check it against what its inputs imply.

#include <cstdint>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"

namespace emlx {
namespace mx = mlx::core;  // scoped: a header's alias would reach every file that includes it
}  // namespace emlx

namespace emlx::export_file {

struct Spec {
  mx::Shape shape;
  mx::Dtype dtype;
};

// One traced signature of the file: MLX picks the trace whose inputs match a call.
struct Trace {
  std::vector<Spec> inputs;
  size_t n_outputs = 0;
};

struct Summary {
  bool shapeless = false;
  std::vector<Trace> traces;
};

// Walks the whole file; throws std::invalid_argument naming the first
// problem ("[load_traced] ..."). `size` bounds every count.
Summary check(const char* data, size_t size);

// Checks one graph node against its inputs (shapes, dtypes, input and
// output counts, parameters), as far as its kind is known here; throws
// std::invalid_argument "[replay] ...: its <Primitive> node ...". Constant
// indices of a Gather are read (evaluated on `sc`) when `read_constants`.
void check_node(const mx::array& a, mx::Stream sc, bool read_constants);

}  // namespace emlx::export_file
