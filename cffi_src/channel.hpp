#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "shim.hpp"

namespace emlx {

// The completion channel proper. Workers and host-call nodes hold it through
// a shared_ptr, so a record posted after the runtime closed its end lands on
// a live object that refuses it, never on freed memory.
class Channel {
 public:
  Channel();
  ~Channel();
  // Takes ownership of the record's message and payload. Returns false (and
  // frees them) when the channel is closed.
  bool post(const emlx_completion& record);
  size_t drain(emlx_completion* out, size_t capacity);
  // A wake-up with no record; nothing once closed.
  void wake();
  // No more records are accepted; pending ones are freed and the fds closed.
  void close();
  int fd() const { return read_fd_; }

 private:
  void signal();
  void clear_signal();
  static void release(emlx_completion& record);

  int read_fd_ = -1;
  int write_fd_ = -1;
  bool closed_ = false;
  // Posts signalling outside the mutex; close() waits for them before it
  // closes the fds, so a signal never writes to a closed (or reused) fd.
  std::atomic<int> signalling_{0};
  std::mutex mutex_;
  std::vector<emlx_completion> records_;
};

}  // namespace emlx

// The opaque handle Python holds: its reference to the shared channel.
struct emlx_channel {
  std::shared_ptr<emlx::Channel> impl;
};
