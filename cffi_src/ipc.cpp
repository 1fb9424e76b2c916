// POSIX shared memory for arrays. Export writes the array with pwrite and
// import reads it with pread: a full filesystem, or a sender that shrinks the
// segment, becomes an error code instead of SIGBUS on a mapping.
#include <fcntl.h>
#include <sys/mman.h>  // shm_open, shm_unlink
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <limits>

#include "mlx/allocator.h"
#include "mlx/ops.h"
#include "shim.hpp"

namespace mx = mlx::core;

namespace {

constexpr char kPrefix[] = "/emlx-";
constexpr size_t kPrefixLength = sizeof(kPrefix) - 1;
constexpr size_t kMaxName = 255;             // NAME_MAX, the leading '/' included
constexpr size_t kChunk = size_t{1} << 26;   // 64 MiB per pwrite: a given-up export stops soon

int fail(int code, const std::string& message) {
  emlx::set_last_error(message);
  return code;
}

int os_fail(const char* where, const std::string& what, const char* name, int error) {
  return fail(EMLX_SHM_OS_ERROR, std::string("[") + where + "] " + what + " '" + name + "': " + std::strerror(error));
}

// Only names this package hands out (and callers chose with its prefix) are
// ever created, opened or unlinked, never another program's segments.
bool is_ours(const char* name) {
  size_t length = strnlen(name, kMaxName + 1);
  if (length <= kPrefixLength || length > kMaxName || std::strncmp(name, kPrefix, kPrefixLength) != 0)
    return false;
  return std::all_of(name + kPrefixLength, name + length, [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

int bad_name(const char* where, const char* name) {
  return fail(EMLX_SHM_BAD_VALUE, std::string("[") + where + "] '" + name +
                                      "' is not an emlx_async shared-memory name (\"/emlx-\" and [A-Za-z0-9._-])");
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

std::atomic_ref<int> state_of(int* state) { return std::atomic_ref<int>(*state); }

}  // namespace

extern "C" {

int emlx_to_shm(void* array, const char* name, int permissions, int* state, size_t* nbytes) {
  if (!is_ours(name)) return bad_name("to_shm", name);
  // Receivers only read: group and others may get read access, never write.
  if ((permissions & ~0644) != 0 || (permissions & 0600) != 0600)
    return fail(EMLX_SHM_BAD_VALUE, "[to_shm] permissions must be 0600 plus read bits for group or others");
  if (state_of(state).load() != EMLX_SHM_RUNNING) return EMLX_SHM_ABANDONED;
  try {
    mx::array a = [&] {
      emlx::GilGuard gil;
      return emlx::array_of(array);
    }();
    if (!a.is_available()) return fail(EMLX_SHM_OS_ERROR, "[to_shm] the array must be evaluated first");
    if (!a.flags().row_contiguous || a.data_size() != a.size())
      return fail(EMLX_SHM_OS_ERROR, "[to_shm] the array must be row-contiguous");
    const size_t size = a.nbytes();
    const char* data = a.data<char>();
    // Owner-only until written; fchmod then sets the exact mode, whatever the umask.
    Fd file{shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600)};
    if (file.fd < 0) return os_fail("to_shm", "cannot create", name, errno);
    auto discard = [&](int code) {
      shm_unlink(name);
      return code;
    };
    size_t done = 0;
    while (done < size) {
      if (state_of(state).load() != EMLX_SHM_RUNNING) return discard(EMLX_SHM_ABANDONED);
      ssize_t n = pwrite(file.fd, data + done, std::min(size - done, kChunk), static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return discard(os_fail("to_shm", "cannot write", name, n < 0 ? errno : ENOSPC));
      done += static_cast<size_t>(n);
    }
    if (fchmod(file.fd, static_cast<mode_t>(permissions)) != 0)
      return discard(os_fail("to_shm", "cannot set the mode of", name, errno));
    int expected = EMLX_SHM_RUNNING;
    if (!state_of(state).compare_exchange_strong(expected, EMLX_SHM_HANDED_OVER))
      return discard(EMLX_SHM_ABANDONED);  // the caller gave up while we wrote
    *nbytes = size;
    return 0;
  } catch (...) {
    return fail(EMLX_SHM_OS_ERROR, emlx::classify(std::current_exception()).message);
  }
}

int emlx_shm_give_up(int* state) {
  int expected = EMLX_SHM_RUNNING;
  state_of(state).compare_exchange_strong(expected, EMLX_SHM_GIVEN_UP);
  return expected;
}

int emlx_from_shm(const char* name, const int64_t* shape, int ndim, int dtype, void* placeholder) {
  if (!is_ours(name)) return bad_name("from_shm", name);
  if (ndim < 0) return fail(EMLX_SHM_BAD_VALUE, "[from_shm] negative number of dimensions");
  try {
    mx::Dtype type = emlx::dtype_of(dtype);
    // MLX shapes hold int32 entries; the byte size must fit size_t and off_t.
    size_t count = 1;
    bool overflow = false;
    for (int i = 0; i < ndim; ++i) {
      if (shape[i] < 0) return fail(EMLX_SHM_BAD_VALUE, "[from_shm] negative dimension in the shape");
      if (shape[i] > INT32_MAX)
        return fail(EMLX_SHM_OVERFLOW, "[from_shm] dimension " + std::to_string(i) + " is " +
                                           std::to_string(shape[i]) + ", more than an int32 shape entry holds");
      overflow |= __builtin_mul_overflow(count, static_cast<size_t>(shape[i]), &count);
    }
    size_t size = 0;
    if (overflow || __builtin_mul_overflow(count, mx::size_of(type), &size) ||
        size > static_cast<size_t>(std::numeric_limits<off_t>::max()))
      return fail(EMLX_SHM_OVERFLOW, "[from_shm] the shape's byte size overflows");
    mx::Shape dims(shape, shape + ndim);

    // O_NONBLOCK: a FIFO under our name would block the open until a writer came.
    Fd file{shm_open(name, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0)};
    if (file.fd < 0) return os_fail("from_shm", "no shared memory", name, errno);
    struct stat info;
    if (fstat(file.fd, &info) != 0) return os_fail("from_shm", "cannot stat", name, errno);
    // Ours only: a regular object of this user that nobody else could have written.
    if (!S_ISREG(info.st_mode))
      return fail(EMLX_SHM_OS_ERROR, "[from_shm] '" + std::string(name) + "' is not a shared-memory object "
                                         "(a directory, FIFO or device); refusing it");
    if (info.st_uid != geteuid())
      return fail(EMLX_SHM_OS_ERROR, "[from_shm] '" + std::string(name) + "' is owned by uid " +
                                         std::to_string(info.st_uid) + ", not by this process's user");
    if ((info.st_mode & 022) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(info.st_mode & 07777));
      return fail(EMLX_SHM_OS_ERROR, "[from_shm] '" + std::string(name) + "' is writable by group or others (mode " +
                                         mode + "); refusing it");
    }
    if (static_cast<size_t>(info.st_size) != size)
      return fail(EMLX_SHM_OS_ERROR, "[from_shm] '" + std::string(name) + "' holds " + std::to_string(info.st_size) +
                                         " bytes, but the shape and dtype need " + std::to_string(size));

    mx::array out(mx::allocator::malloc(size), dims, type);  // throws when memory is short
    shm_unlink(name);  // checked and committed to: nobody else opens it from here on
    char* into = out.data<char>();
    size_t done = 0;
    while (done < size) {
      ssize_t n = pread(file.fd, into + done, std::min(size - done, kChunk), static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return os_fail("from_shm", "cannot read", name, errno);
      if (n == 0)
        return fail(EMLX_SHM_OS_ERROR, "[from_shm] '" + std::string(name) + "' shrank while being read: got " +
                                           std::to_string(done) + " of " + std::to_string(size) + " bytes");
      done += static_cast<size_t>(n);
    }
    emlx::GilGuard gil;
    emlx::array_of(placeholder) = out;
    return 0;
  } catch (...) {
    return fail(EMLX_SHM_OS_ERROR, emlx::classify(std::current_exception()).message);
  }
}

int emlx_shm_unlink(const char* name) {
  if (!is_ours(name)) return bad_name("shm_unlink", name);
  if (shm_unlink(name) == 0 || errno == ENOENT) return 0;
  return os_fail("shm_unlink", "cannot unlink", name, errno);
}

uintptr_t emlx_data_ptr(void* array) {
  emlx::GilGuard gil;
  const mx::array& a = emlx::array_of(array);
  return a.is_available() ? reinterpret_cast<uintptr_t>(a.data<void>()) : 0;
}

}  // extern "C"

extern "C" int emlx_wrap_buffer(void* data, const int64_t* shape, int ndim, int dtype, void* owner,
                                void* placeholder) {
  try {
    mx::Shape dims(shape, shape + ndim);
    mx::Dtype type = emlx::dtype_of(dtype);
    emlx::GilGuard gil;
    PyObject* keep = static_cast<PyObject*>(owner);
    Py_INCREF(keep);
    mx::array out(data, dims, type, [keep](void*) {
      if (!Py_IsInitialized()) return;  // interpreter gone: nothing left to release
      emlx::GilGuard release_gil;
      Py_DECREF(keep);
    });
    emlx::array_of(placeholder) = out;
    return 0;
  } catch (...) {
    return fail(EMLX_SHM_OS_ERROR, emlx::classify(std::current_exception()).message);
  }
}
