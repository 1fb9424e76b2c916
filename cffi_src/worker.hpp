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

// True when `a` can be used on `worker`'s thread as it is: evaluated (or
// being evaluated), or a lazy graph of the worker's own stream. A lazy graph
// of any other stream must be made usable first (_routing.prepare_inputs).
bool usable_on(const emlx_worker* worker, const mlx::core::array& a);

}  // namespace emlx
