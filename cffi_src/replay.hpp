#pragma once

#include <cstdint>
#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"

namespace emlx {
namespace mx = mlx::core;  // scoped: a header's alias would reach every file that includes it
}  // namespace emlx

namespace emlx {

// Calls registered function `id` (cffi_src/replay.h) on this worker thread:
// inputs are checked against the traced specs, the thread's own import of
// the graph is bound to stream `s` (CPU-recorded nodes to `sc`), and the
// lazy outputs are returned for the op job to evaluate.
// Drops this thread's chain (emlx_replay_end_chain): the worker does at the end of each lease.
void end_chain();

std::vector<mx::array> replay_call(const std::vector<mx::array>& xs, int64_t id, bool fed, mx::Stream s,
                                   mx::Stream sc);

}  // namespace emlx
