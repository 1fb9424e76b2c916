// Host calls: a custom MLX primitive whose CPU task blocks on the event loop.
//
// eval_cpu runs before the inputs are computed, so the work is a task
// dispatched on the stream (mlx_internals::dispatch_cpu_task); an exception it
// throws comes back out of mx::eval on the worker.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <iterator>
#include <limits>
#include <memory>
#include <sstream>

#include "channel.hpp"
#include "mlx_internals.hpp"
#include "mlx/allocator.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/stream.h"

namespace mx = mlx::core;

namespace {

struct HostRequest {
  uint64_t id;
  uint64_t call_id;
  std::vector<mx::array> inputs;         // available copies, safe on any thread
  std::vector<mx::Shape> out_shapes;
  std::vector<mx::Dtype> out_dtypes;
  std::vector<mx::array> results;
  std::mutex mutex;
  std::condition_variable cv;
  bool answered = false;
  std::string error;
};

std::mutex requests_mutex;
std::map<uint64_t, std::shared_ptr<HostRequest>> requests;
std::atomic<uint64_t> next_request{1};

std::shared_ptr<HostRequest> find_request(uint64_t id) {
  std::lock_guard<std::mutex> lock(requests_mutex);
  auto it = requests.find(id);
  return it == requests.end() ? nullptr : it->second;
}

mx::array available_copy(const mx::array& in) {
  mx::array out(mx::allocator::malloc(in.nbytes()), in.shape(), in.dtype());
  if (in.nbytes()) std::memcpy(out.data<char>(), in.data<char>(), in.nbytes());
  return out;
}

class HostCall : public mx::Primitive {
 public:
  HostCall(mx::Stream stream, std::shared_ptr<emlx::Channel> channel, uint64_t call_id, int backstop_ms)
      : mx::Primitive(stream), channel_(std::move(channel)), call_id_(call_id), backstop_ms_(backstop_ms) {}

  // The loop keeps the callback of each node until its request comes; a node
  // freed unevaluated would keep it for ever (nothing once the runtime closed).
  // An evaluated one is freed before its task asks: its request pops it.
  ~HostCall() override {
    if (evaluated_) return;
    try {
      channel_->post({call_id_, EMLX_HOST_FREED, 0, nullptr, nullptr, 0, 0, 0});
    } catch (...) {  // a destructor must not throw (bad_alloc): the record then stays until the runtime closes
    }
  }

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    evaluated_ = true;
    for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
    emlx::mlx_internals::dispatch_cpu_task(
        stream(), inputs, outputs, [channel = channel_, call_id = call_id_, backstop = backstop_ms_, inputs,
                                    outputs]() mutable { run(channel, call_id, backstop, inputs, outputs); });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("[host_call] host calls run on CPU streams only");
  }

  const char* name() const override { return "HostCall"; }

 private:
  // Runs on MLX's stream thread with the inputs computed.
  static void run(const std::shared_ptr<emlx::Channel>& channel, uint64_t call_id, int backstop_ms,
                  const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
    auto request = std::make_shared<HostRequest>();
    request->id = next_request.fetch_add(1);
    request->call_id = call_id;
    for (const auto& in : inputs) request->inputs.push_back(available_copy(in));
    for (const auto& out : outputs) {
      request->out_shapes.push_back(out.shape());
      request->out_dtypes.push_back(out.dtype());
    }
    {
      std::lock_guard<std::mutex> lock(requests_mutex);
      requests[request->id] = request;
    }
    if (!channel->post({request->id, EMLX_HOST_REQUEST, 0, nullptr, nullptr, 0, 0, 0})) {
      std::lock_guard<std::mutex> lock(requests_mutex);
      requests.erase(request->id);
      throw emlx::ClosedError("[host_call] the runtime that built this host call is closed; "
                              "build the graph again on an open runtime");
    }
    bool answered;
    {
      std::unique_lock<std::mutex> lock(request->mutex);
      auto ready = [&] { return request->answered; };
      if (backstop_ms > 0) {
        answered = request->cv.wait_for(lock, std::chrono::milliseconds(backstop_ms), ready);
      } else {
        request->cv.wait(lock, ready);
        answered = true;
      }
    }
    {
      std::lock_guard<std::mutex> lock(requests_mutex);
      requests.erase(request->id);
    }
    if (!answered) {
      throw std::runtime_error("[host_call] the event loop never answered request " +
                               std::to_string(request->id));
    }
    if (!request->error.empty()) throw std::runtime_error(request->error);
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].nbytes())
        std::memcpy(outputs[i].data<char>(), request->results[i].data<char>(), outputs[i].nbytes());
    }
  }

  // Shared: the node may outlive its runtime (a lazy output kept after close).
  std::shared_ptr<emlx::Channel> channel_;
  uint64_t call_id_;
  int backstop_ms_;
  bool evaluated_ = false;
};

std::string describe(const mx::Shape& shape, mx::Dtype dtype) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) out += ",";
  std::ostringstream name;
  name << dtype;
  return out + ") " + name.str();
}

int reply(uint64_t request_id, void** outputs, size_t n_outputs, const char* error);

}  // namespace

extern "C" {

int emlx_host_call_build(emlx_channel* channel, uint64_t call_id, void** inputs, size_t n_inputs,
                         const int64_t* shapes, const int* ndims, const int* dtypes, size_t n_outputs,
                         void** out_placeholders, int backstop_ms) {
  try {
    emlx::GilGuard gil;
    // The node lives on this thread's CPU stream; inputs are made
    // row-contiguous in the graph so the task can copy them flat.
    mx::Stream stream = mx::default_stream(mx::Device::cpu);
    std::vector<mx::array> in;
    for (size_t i = 0; i < n_inputs; ++i) in.push_back(mx::contiguous(emlx::array_of(inputs[i]), false, stream));
    std::vector<mx::Shape> out_shapes;
    std::vector<mx::Dtype> out_dtypes;
    for (size_t i = 0, at = 0; i < n_outputs; at += ndims[i], ++i) {
      for (int k = 0; k < ndims[i]; ++k) {
        // MLX shapes hold int32 entries: a larger one would be truncated.
        if (shapes[at + k] < 0 || shapes[at + k] > std::numeric_limits<int32_t>::max())
          throw std::overflow_error("[host_call] output " + std::to_string(i) + " dimension " +
                                    std::to_string(shapes[at + k]) + " does not fit MLX's int32 shape");
      }
      out_shapes.emplace_back(shapes + at, shapes + at + ndims[i]);
      out_dtypes.push_back(emlx::dtype_of(dtypes[i]));
    }
    auto outputs = mx::array::make_arrays(
        out_shapes, out_dtypes, std::make_shared<HostCall>(stream, channel->impl, call_id, backstop_ms), in);
    for (size_t i = 0; i < n_outputs; ++i) emlx::array_of(out_placeholders[i]) = outputs[i];
    return 0;
  } catch (...) {
    emlx::set_last_error(emlx::classify(std::current_exception()));
    return -1;
  }
}

int emlx_host_request_reply(uint64_t request_id, void** outputs, size_t n_outputs, const char* error) {
  return emlx::guarded([&] { return reply(request_id, outputs, n_outputs, error); });
}

uint64_t emlx_host_request_call(uint64_t request_id) {
  auto request = find_request(request_id);
  return request ? request->call_id : 0;
}

size_t emlx_host_request_inputs(uint64_t request_id) {
  auto request = find_request(request_id);
  return request ? request->inputs.size() : 0;
}

int emlx_host_request_input(uint64_t request_id, size_t index, void* placeholder) {
  return emlx::guarded([&] {
    auto request = find_request(request_id);
    if (!request || index >= request->inputs.size()) {
      emlx::set_last_error("[host_call] no input " + std::to_string(index) + " in request " +
                           std::to_string(request_id), EMLX_ERR_OUT_OF_RANGE);
      return -1;
    }
    emlx::GilGuard gil;
    emlx::array_of(placeholder) = request->inputs[index];
    return 0;
  });
}

}  // extern "C"

namespace {

int reply(uint64_t request_id, void** outputs, size_t n_outputs, const char* error) {
  auto request = find_request(request_id);
  if (!request) {
    emlx::set_last_error("[host_call] request " + std::to_string(request_id) + " is no longer waiting");
    return -1;
  }
  std::vector<mx::array> results;
  if (error == nullptr) {
    if (n_outputs != request->out_shapes.size()) {
      emlx::set_last_error("[host_call] expected " + std::to_string(request->out_shapes.size()) +
                           " outputs, got " + std::to_string(n_outputs), EMLX_ERR_INVALID_ARGUMENT);
      return -1;
    }
    emlx::GilGuard gil;
    for (size_t i = 0; i < n_outputs; ++i) {
      const mx::array& a = emlx::array_of(outputs[i]);
      if (a.shape() != request->out_shapes[i] || a.dtype() != request->out_dtypes[i]) {
        emlx::set_last_error("[host_call] output " + std::to_string(i) + " must be " +
                             describe(request->out_shapes[i], request->out_dtypes[i]) + ", got " +
                             describe(a.shape(), a.dtype()), EMLX_ERR_INVALID_ARGUMENT);
        return -1;
      }
      if (!a.is_available() || !a.flags().row_contiguous || a.data_size() != a.size()) {
        emlx::set_last_error("[host_call] output " + std::to_string(i) +
                             " must be evaluated and row-contiguous", EMLX_ERR_INVALID_ARGUMENT);
        return -1;
      }
      results.push_back(a);
    }
  }
  {
    std::lock_guard<std::mutex> lock(request->mutex);
    request->results = std::move(results);
    if (error != nullptr) request->error = *error ? error : "[host_call] failed";
    request->answered = true;
  }
  request->cv.notify_all();
  return 0;
}

}  // namespace
