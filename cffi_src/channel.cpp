#include "channel.hpp"

#include <cstdlib>
#include <thread>

#include <fcntl.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/eventfd.h>
#endif

#include <cerrno>

namespace emlx {

Channel::Channel() {
#ifdef __linux__
  read_fd_ = write_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (read_fd_ < 0) throw std::runtime_error("[emlx] eventfd failed");
#else
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("[emlx] pipe failed");
  for (int fd : fds) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  read_fd_ = fds[0];
  write_fd_ = fds[1];
#endif
}

Channel::~Channel() { close(); }

void Channel::release(emlx_completion& record) {
  std::free(record.message);
  delete static_cast<std::vector<mlx::core::array>*>(record.payload);
  record.message = nullptr;
  record.payload = nullptr;
}

void Channel::close() {
  std::vector<emlx_completion> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;  // from here no post signals, and drain reads nothing
    left.swap(records_);
  }
  while (signalling_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  ::close(read_fd_);
  if (write_fd_ != read_fd_) ::close(write_fd_);
  for (auto& r : left) release(r);
}

bool Channel::post(const emlx_completion& record) {
  bool was_empty;
  {
    std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
    lock_briefly_contended(lock);
    if (closed_) {
      lock.unlock();
      emlx_completion dropped = record;
      release(dropped);
      return false;
    }
    was_empty = records_.empty();
    records_.push_back(record);
    if (was_empty) signalling_.fetch_add(1, std::memory_order_relaxed);
  }
  // Coalesced (one wake-up per batch), and written after the unlock: the
  // write wakes the loop thread, whose drain would otherwise find the mutex
  // still held by this thread inside the system call. A drain that runs
  // before this write takes the record anyway; the wake-up then finds the
  // list empty, which is harmless.
  if (was_empty) {
    signal();
    signalling_.fetch_sub(1, std::memory_order_release);
  }
  return true;
}

void Channel::signal() {
  uint64_t one = 1;
  ssize_t n;
  do {
    n = write(write_fd_, &one, write_fd_ == read_fd_ ? sizeof(one) : 1);
  } while (n < 0 && errno == EINTR);
  // EAGAIN means the fd is already readable, which is all we need.
}

void Channel::clear_signal() {
  char buf[64];
  if (write_fd_ == read_fd_) {
    // One read resets an eventfd's counter; a second would only return EAGAIN
    // (a system call per drain on the loop thread).
    ssize_t n;
    do {
      n = read(read_fd_, buf, 8);
    } while (n < 0 && errno == EINTR);
    return;
  }
  while (read(read_fd_, buf, sizeof(buf)) > 0) {
  }
}

void Channel::wake() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!closed_) signal();
}

size_t Channel::drain(emlx_completion* out, size_t capacity) {
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
  lock_briefly_contended(lock);
  if (closed_) return 0;
  // Clear the fd first: a record posted after this point either lands in
  // this batch or signals again, so no wake-up is lost.
  clear_signal();
  size_t n = std::min(capacity, records_.size());
  std::copy(records_.begin(), records_.begin() + n, out);
  records_.erase(records_.begin(), records_.begin() + n);
  if (!records_.empty()) signal();  // the caller reads the rest on the next wake-up
  return n;
}

}  // namespace emlx

extern "C" {

emlx_channel* emlx_channel_new(void) {
  try {
    return new emlx_channel{std::make_shared<emlx::Channel>()};
  } catch (...) {
    emlx::set_last_error(emlx::classify(std::current_exception()));
    return nullptr;
  }
}

void emlx_channel_free(emlx_channel* channel) {
  if (channel == nullptr) return;
  channel->impl->close();  // workers and nodes still holding it see a closed channel
  delete channel;
}

int emlx_channel_fd(emlx_channel* channel) { return channel->impl->fd(); }

size_t emlx_channel_drain(emlx_channel* channel, emlx_completion* out, size_t capacity) {
  return channel->impl->drain(out, capacity);
}

void emlx_message_free(char* message) { std::free(message); }

void emlx_channel_signal(emlx_channel* channel) { channel->impl->wake(); }

}  // extern "C"
