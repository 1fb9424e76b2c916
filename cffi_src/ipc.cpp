// POSIX shared memory for arrays: export copies once; import maps the object and
// hands it to MLX's no-copy constructor (the Linux CPU backend copies it once).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "mlx/ops.h"
#include "shim.hpp"

namespace mx = mlx::core;

namespace {

int fail(const std::string& message) {
  emlx::set_last_error(message);
  return -1;
}

std::string os_error(const std::string& what, const char* name) {
  return "[shm] " + what + " '" + name + "': " + std::strerror(errno);
}

}  // namespace

extern "C" {

int emlx_to_shm(void* array, const char* name, int permissions, size_t* nbytes) {
  mx::array a = [&] {
    emlx::GilGuard gil;
    return emlx::array_of(array);
  }();
  if (!a.is_available()) return fail("[to_shm] the array must be evaluated first");
  if (!a.flags().row_contiguous || a.data_size() != a.size())
    return fail("[to_shm] the array must be row-contiguous");
  size_t size = a.nbytes();
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, static_cast<mode_t>(permissions));
  if (fd < 0) return fail(os_error("cannot create", name));
  if (size > 0) {
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
      auto message = os_error("cannot size", name);
      close(fd);
      shm_unlink(name);
      return fail(message);
    }
    void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      auto message = os_error("cannot map", name);
      close(fd);
      shm_unlink(name);
      return fail(message);
    }
    std::memcpy(map, a.data<char>(), size);
    munmap(map, size);
  }
  close(fd);
  *nbytes = size;
  return 0;
}

int emlx_from_shm(const char* name, const int64_t* shape, int ndim, int dtype, void* placeholder) {
  try {
    mx::Shape dims(shape, shape + ndim);
    mx::Dtype type = emlx::dtype_of(dtype);
    size_t count = 1;
    for (auto d : dims) {
      if (d < 0) return fail("[from_shm] negative dimension in the shape");
      count *= static_cast<size_t>(d);
    }
    size_t size = count * mx::size_of(type);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return fail(os_error("no shared memory", name));
    struct stat info;
    if (fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) != size) {
      close(fd);
      return fail("[from_shm] '" + std::string(name) + "' holds " + std::to_string(info.st_size) +
                  " bytes, but the shape and dtype need " + std::to_string(size));
    }
    void* map = size ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : nullptr;
    close(fd);
    if (size && map == MAP_FAILED) return fail(os_error("cannot map", name));
    shm_unlink(name);  // the mapping keeps the memory alive
    mx::array out = size ? mx::array(map, dims, type, [size](void* p) { munmap(p, size); })
                         : mx::zeros(dims, type);
    emlx::GilGuard gil;
    emlx::array_of(placeholder) = out;
    return 0;
  } catch (...) {
    return fail(emlx::classify(std::current_exception()).message);
  }
}

int emlx_shm_unlink(const char* name) {
  if (shm_unlink(name) == 0 || errno == ENOENT) return 0;
  return fail(os_error("cannot unlink", name));
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
    return fail(emlx::classify(std::current_exception()).message);
  }
}
