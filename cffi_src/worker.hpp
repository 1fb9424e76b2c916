#pragma once
// Internal C++ side of the worker area (worker.h is its C ABI), for the
// areas that queue their own kinds of job on a worker.

#include <cstdint>
#include <memory>
#include <vector>

#include "mlx/array.h"
#include "ops.hpp"
#include "shim.hpp"

namespace emlx {

// Queues op job `job_id` on `worker`, donating `donated` (positions in
// `arrays`). Returns 0, the arrays then moved into the job; or -1
// (emlx_last_error) when the worker is stopping, the arrays left with the caller.
int submit_op_job(emlx_worker* worker, uint64_t job_id, std::shared_ptr<OpCall> call,
                  std::vector<mlx::core::array>& arrays, std::vector<size_t> donated);

}  // namespace emlx
