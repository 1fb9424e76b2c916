// Start-up of MLX's communication backends with a deadline (cffi_src/distributed.h).
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "emlx_abi.h"
#include "mlx/distributed/distributed.h"
#include "shim.hpp"

namespace {

// Shared by the caller and the starting thread, which may outlive the call.
struct Start {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  int status = EMLX_DIST_STARTED;
  std::string error;
};

}  // namespace

extern "C" int emlx_distributed_start(int strict, const char* backend, double timeout_s) {
  auto start = std::make_shared<Start>();
  std::string name(backend);
  try {
    std::thread([start, strict, name] {
      int status = EMLX_DIST_STARTED;
      std::string error;
      try {
        mlx::core::distributed::init(strict != 0, name);
      } catch (const std::invalid_argument& e) {
        status = EMLX_DIST_BAD_VALUE, error = e.what();
      } catch (const std::exception& e) {
        status = EMLX_DIST_FAILED, error = e.what();
      } catch (...) {
        status = EMLX_DIST_FAILED, error = "[distributed] unknown error";
      }
      std::lock_guard lock(start->mutex);
      start->status = status, start->error = std::move(error), start->done = true;
      start->done_cv.notify_all();
    }).detach();
  } catch (const std::exception& e) {
    emlx::set_last_error(std::string("[init] cannot start a thread: ") + e.what());
    return EMLX_DIST_FAILED;
  }
  std::unique_lock lock(start->mutex);
  if (timeout_s < 0) {
    start->done_cv.wait(lock, [&] { return start->done; });
  } else if (!start->done_cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                      [&] { return start->done; })) {
    return EMLX_DIST_TIMED_OUT;
  }
  if (start->status != EMLX_DIST_STARTED) emlx::set_last_error(start->error);
  return start->status;
}
