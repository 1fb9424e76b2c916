#include "mlx/primitives.h"
#include "mlx/stream.h"
#include "shim.hpp"
#include "validate.hpp"

using mlx::core::array;

extern "C" {

int emlx_probe_array(void* obj, int64_t* shape, int shape_capacity, int* ndim, int* itemsize,
                     int64_t* size) {
  emlx::GilGuard gil;
  if (!emlx::mlx_internals::plausible_array_object(obj)) return -1;
  const array& a = emlx::array_of(obj);
  *ndim = static_cast<int>(a.ndim());
  for (int i = 0; i < *ndim && i < shape_capacity; ++i) shape[i] = a.shape(i);
  *itemsize = static_cast<int>(a.itemsize());
  *size = static_cast<int64_t>(a.size());
  return 0;
}

int emlx_array_state(void* obj, int* device_type, int* stream_index) {
  emlx::GilGuard gil;
  array& a = emlx::array_of(obj);
  switch (a.status()) {
    case array::Status::unscheduled: {
      if (!a.has_primitive()) return EMLX_ARRAY_AVAILABLE;
      const auto& s = a.primitive().stream();
      *device_type = s.device.type == mlx::core::Device::gpu ? EMLX_DEVICE_GPU : EMLX_DEVICE_CPU;
      *stream_index = s.index;
      return EMLX_ARRAY_LAZY;
    }
    case array::Status::evaluated:
      return a.is_available() ? EMLX_ARRAY_AVAILABLE : EMLX_ARRAY_SCHEDULED;
    default:
      return EMLX_ARRAY_AVAILABLE;
  }
}

int emlx_check_evaluable(void** objs, size_t count, const char* what) {
  return emlx::guarded([&] {
    std::vector<array> arrays;
    arrays.reserve(count);
    {
      emlx::GilGuard gil;
      for (size_t i = 0; i < count; ++i) arrays.push_back(emlx::array_of(objs[i]));
    }
    emlx::validate::check_evaluable(what, arrays);
    return 0;
  });
}

}  // extern "C"

extern "C" int emlx_thread_stream_index(int device_type) {
  auto stream = mlx::core::peek_default_stream(
      device_type == EMLX_DEVICE_GPU ? mlx::core::Device::gpu : mlx::core::Device::cpu);
  return stream ? stream->index : -1;
}
