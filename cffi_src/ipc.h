/* Shared-memory export and import of arrays (POSIX shm), and raw pointers. */

/* Copy an evaluated, row-contiguous array into a new shm object `name`
 * created with `permissions` (e.g. 0600). Returns 0 and the byte count, or -1. */
int emlx_to_shm(void *array, const char *name, int permissions, size_t *nbytes);
/* Map shm object `name` as an array of the given shape and dtype code into
 * the mx.array `placeholder` (through MLX's no-copy constructor, which copies
 * where the backend cannot wrap external memory) and unlink the name.
 * Returns 0 or -1. */
int emlx_from_shm(const char *name, const int64_t *shape, int ndim, int dtype, void *placeholder);
/* Remove shm object `name`; 0 also when it no longer exists. */
int emlx_shm_unlink(const char *name);
/* Address of an evaluated array's data (its offset included). */
uintptr_t emlx_data_ptr(void *array);
/* Wrap `data` (C-contiguous, of the given shape and dtype code) as an mx.array
 * in `placeholder` without copying where MLX can; `owner` (a PyObject such as
 * the NumPy array) stays referenced until MLX no longer needs the memory. */
int emlx_wrap_buffer(void *data, const int64_t *shape, int ndim, int dtype, void *owner, void *placeholder);
