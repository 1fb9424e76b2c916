// The shim's reliance on MLX internals, in one file (see mlx_internals.hpp).
#include "mlx_internals.hpp"

#include <Python.h>

#include <pthread.h>
#include <time.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/scheduler.h"

namespace emlx::mlx_internals {

namespace mx = mlx::core;

int32_t nanobind_offset(void* obj) {
  int32_t offset;
  std::memcpy(&offset, static_cast<char*>(obj) + sizeof(PyObject), sizeof(offset));
  return offset;
}

bool plausible_array_object(void* obj) {
  int32_t offset = nanobind_offset(obj);
  return offset >= static_cast<int32_t>(sizeof(PyObject)) && offset <= 256;
}

mx::array& array_of(void* obj) {
  return *reinterpret_cast<mx::array*>(static_cast<char*>(obj) + nanobind_offset(obj));
}

// The stream is a plain member the primitive exposes by const reference;
// the caller holds the only references to the nodes it rebinds.
mx::Stream& stream_of(mx::Primitive& primitive) { return const_cast<mx::Stream&>(primitive.stream()); }

// MLX keeps its stream threads in the scheduler's private map, and nothing
// public says whether any exists. An explicit instantiation may name a
// private member (C++20 [temp.spec.general]), which is how this reads the
// map's size.
namespace {

struct ThreadsTag {
  using type = std::unordered_map<int, std::unique_ptr<mx::scheduler::StreamThread>> mx::scheduler::Scheduler::*;
  friend type member(ThreadsTag);
};
template <typename Tag, typename Tag::type M>
struct Expose {
  friend typename Tag::type member(Tag) { return M; }
};
template struct Expose<ThreadsTag, &mx::scheduler::Scheduler::threads_>;

struct ThreadsMutexTag {
  using type = std::shared_mutex mx::scheduler::Scheduler::*;
  friend type member(ThreadsMutexTag);
};
template struct Expose<ThreadsMutexTag, &mx::scheduler::Scheduler::threads_mtx_>;

// MLX 0.32 defines StreamThread in scheduler.cpp, not in a header; it begins
// with these members, in this order (0.32.0 to 0.32.4).
struct StreamThreadPrefix {
  std::mutex mtx;
  std::queue<std::function<void()>> q;
  std::condition_variable cond;
  bool stop;
  std::thread thread;
};

// Whether `handle` names a live thread of this process. A fork child keeps
// the parent's thread descriptors but none of the threads: glibc marks them
// free (no thread id), and a thread id of the parent is not one of this
// process's (the kernel refuses its CPU clock); macOS no longer lists them.
bool thread_alive(pthread_t handle) {
#ifdef __APPLE__
  return pthread_kill(handle, 0) == 0;
#else
  clockid_t clock;
  if (pthread_getcpuclockid(handle, &clock) != 0) return false;
  timespec ts{};
  return clock_gettime(clock, &ts) == 0;
#endif
}

}  // namespace

size_t stream_threads() { return (mx::scheduler::scheduler().*member(ThreadsTag{})).size(); }

int missing_stream_threads() {
  auto& scheduler = mx::scheduler::scheduler();
  auto& mutex = scheduler.*member(ThreadsMutexTag{});
  // Held for writing only while a stream's thread is being made; in a fork
  // child it may be held for good by a thread that is gone: do not wait long.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (!mutex.try_lock_shared()) {
    if (std::chrono::steady_clock::now() >= until) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::shared_lock<std::shared_mutex> lock(mutex, std::adopt_lock);
  int missing = 0;
  for (auto& [index, stream_thread] : scheduler.*member(ThreadsTag{})) {
    auto& thread = reinterpret_cast<StreamThreadPrefix*>(stream_thread.get())->thread;
    if (!thread.joinable()) continue;  // never so in MLX: not evidence either way
    if (!thread_alive(thread.native_handle())) ++missing;
  }
  return missing;
}

void dispatch_cpu_task(const mx::Stream& stream, const std::vector<mx::array>& inputs,
                       std::vector<mx::array>& outputs, std::function<void()> task) {
  auto& encoder = mx::cpu::get_command_encoder(stream);
  for (auto& in : inputs) encoder.set_input_array(in);
  for (auto& out : outputs) encoder.set_output_array(out);
  encoder.dispatch(std::move(task));
}

bool is_loaded_constant(const mx::array& a) {
  return a.has_primitive() && std::string(a.primitive().name()) == "Load";
}

}  // namespace emlx::mlx_internals
