#pragma once

#include <mutex>
#include <vector>

#include "shim.hpp"

struct emlx_channel {
  emlx_channel();
  ~emlx_channel();
  void post(const emlx_completion& record);
  size_t drain(emlx_completion* out, size_t capacity);

  int read_fd = -1;
  int write_fd = -1;

 private:
  void signal();
  void clear_signal();
  std::mutex mutex;
  std::vector<emlx_completion> records;
};
