#include <cxxabi.h>

#include <iterator>

#include "mlx/version.h"
#include "shim.hpp"

namespace emlx {

namespace {
thread_local std::string last_error;
thread_local int last_error_kind = EMLX_ERR_RUNTIME;
}

void set_last_error(const std::string& message, int kind) {
  last_error = message;
  last_error_kind = kind;
}

void set_last_error(const CaughtError& error) { set_last_error(error.message, error.kind); }

CaughtError classify(std::exception_ptr error) {
  CaughtError out;
  try {
    std::rethrow_exception(error);
  } catch (const std::overflow_error& e) {
    out = {EMLX_ERR_OVERFLOW, e.what()};
  } catch (const std::invalid_argument& e) {
    out = {EMLX_ERR_INVALID_ARGUMENT, e.what()};
  } catch (const std::out_of_range& e) {
    out = {EMLX_ERR_OUT_OF_RANGE, e.what()};
  } catch (const std::exception& e) {
    bool closed = std::strncmp(e.what(), kClosedTag, std::strlen(kClosedTag)) == 0;
    out = {closed ? EMLX_ERR_CLOSED : EMLX_ERR_RUNTIME, e.what()};
  } catch (...) {
    out = {EMLX_ERR_OTHER, "unknown C++ exception"};
  }
  return out;
}

char* copy_message(const std::string& message) {
  char* out = static_cast<char*>(std::malloc(message.size() + 1));
  if (out) std::memcpy(out, message.c_str(), message.size() + 1);
  return out;
}

mlx::core::Dtype dtype_of(int code) {
  namespace mx = mlx::core;
  // In mlx::core::Dtype::Val order; emlx_async/_host_call.py uses the same.
  static const mx::Dtype table[] = {mx::bool_,   mx::uint8,   mx::uint16,   mx::uint32, mx::uint64,
                                    mx::int8,    mx::int16,   mx::int32,    mx::int64,  mx::float16,
                                    mx::float32, mx::float64, mx::bfloat16, mx::complex64};
  if (code < 0 || code >= static_cast<int>(std::size(table)))
    throw std::invalid_argument("[emlx] unknown dtype code " + std::to_string(code));
  return table[code];
}

}  // namespace emlx

extern "C" {

const char* emlx_version(void) { return EMLX_SHIM_VERSION; }

const char* emlx_mlx_version(void) {
  // The headers we compiled against; Python compares with mlx.core.__version__.
#define EMLX_STR2(x) #x
#define EMLX_STR(x) EMLX_STR2(x)
  return EMLX_STR(MLX_VERSION_MAJOR) "." EMLX_STR(MLX_VERSION_MINOR) "." EMLX_STR(MLX_VERSION_PATCH);
}

const char* emlx_last_error(void) { return emlx::last_error.c_str(); }

int emlx_last_error_kind(void) { return emlx::last_error_kind; }

}  // extern "C"
