#pragma once

#include <string>
#include <vector>

#include "mlx/device.h"
#include "shim.hpp"

namespace emlx {
namespace mx = mlx::core;  // scoped: a header's alias would reach every file that includes it
}  // namespace emlx

namespace emlx {

// An op job's call, as emlx_submit_op received it; its worker runs it (run_op).
struct OpCall {
  int op = 0;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::string text;
  bool evaluate = true;
  bool check_finite = false;
};

// Builds op `op` (a position in emlx_async/_op_table.py) on this thread's
// stream for `device`; throws MLX's exceptions unchanged.
std::vector<mx::array> run_op(int op, mx::Device device, const std::vector<mx::array>& xs,
                              const int64_t* ints, size_t n_ints, const double* floats, size_t n_floats,
                              const std::string& text);
int op_count();
// The digest of the op spec the dispatch was generated from (_op_table.dispatch_digest).
const char* op_spec_digest();

// Throws if a floating-point output holds a NaN or an infinity.
void check_finite(const std::vector<mx::array>& outputs, const char* op);

}  // namespace emlx

#include "ops_extra.hpp"  // helpers the generated op dispatch uses
