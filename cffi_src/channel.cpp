#include "channel.hpp"

#include <fcntl.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/eventfd.h>
#endif

#include <cerrno>

emlx_channel::emlx_channel() {
#ifdef __linux__
  read_fd = write_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (read_fd < 0) throw std::runtime_error("[emlx] eventfd failed");
#else
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("[emlx] pipe failed");
  for (int fd : fds) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  read_fd = fds[0];
  write_fd = fds[1];
#endif
}

emlx_channel::~emlx_channel() {
  for (auto& r : records) std::free(r.message);
  close(read_fd);
  if (write_fd != read_fd) close(write_fd);
}

void emlx_channel::post(const emlx_completion& record) {
  // Signal under the lock: once drain() can see the record the poster no
  // longer touches the channel, so the loop may free it right after.
  std::lock_guard<std::mutex> lock(mutex);
  bool was_empty = records.empty();
  records.push_back(record);
  if (was_empty) signal();  // coalesce: one wake-up per batch
}

void emlx_channel::signal() {
  uint64_t one = 1;
  ssize_t n;
  do {
    n = write(write_fd, &one, write_fd == read_fd ? sizeof(one) : 1);
  } while (n < 0 && errno == EINTR);
  // EAGAIN means the fd is already readable, which is all we need.
}

void emlx_channel::clear_signal() {
  char buf[64];
  while (read(read_fd, buf, write_fd == read_fd ? 8 : sizeof(buf)) > 0) {
  }
}

size_t emlx_channel::drain(emlx_completion* out, size_t capacity) {
  // Clear the fd first: a record posted after this point either lands in
  // this batch or signals again, so no wake-up is lost.
  clear_signal();
  std::lock_guard<std::mutex> lock(mutex);
  size_t n = std::min(capacity, records.size());
  std::copy(records.begin(), records.begin() + n, out);
  records.erase(records.begin(), records.begin() + n);
  if (!records.empty()) signal();  // the caller reads the rest on the next wake-up
  return n;
}

extern "C" {

emlx_channel* emlx_channel_new(void) {
  try {
    return new emlx_channel();
  } catch (...) {
    emlx::set_last_error(emlx::classify(std::current_exception()).message);
    return nullptr;
  }
}

void emlx_channel_free(emlx_channel* channel) { delete channel; }

int emlx_channel_fd(emlx_channel* channel) { return channel->read_fd; }

size_t emlx_channel_drain(emlx_channel* channel, emlx_completion* out, size_t capacity) {
  return channel->drain(out, capacity);
}

}  // extern "C"
