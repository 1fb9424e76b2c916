// The shim's reliance on MLX internals, in one file (see mlx_internals.hpp).
#include "mlx_internals.hpp"

#include <Python.h>

#include <cstring>
#include <memory>
#include <string>
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

}  // namespace

size_t stream_threads() { return (mx::scheduler::scheduler().*member(ThreadsTag{})).size(); }

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

bool is_view(const mx::array& a) {
  if (!a.has_primitive()) return false;
  const char* name = const_cast<mx::array&>(a).primitive().name();  // typeinfo is not exported: by name
  for (const char* view : {"Broadcast", "BroadcastAxes", "AsStrided", "Slice", "Transpose", "ExpandDims", "Squeeze"})
    if (std::strcmp(name, view) == 0) return true;
  return false;
}

}  // namespace emlx::mlx_internals
