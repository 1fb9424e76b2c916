/* Shared-memory export and import of arrays (POSIX shm), and raw pointers.
 *
 * Names must be "/emlx-" followed by 1 to 249 of [A-Za-z0-9._-]. Functions
 * returning int give 0 on success, EMLX_SHM_OS_ERROR (an OS or MLX failure),
 * EMLX_SHM_BAD_VALUE (a bad name, permissions or shape) or EMLX_SHM_OVERFLOW
 * (a dimension or byte size too large), with the message in emlx_last_error()
 * of the calling thread. */
#define EMLX_SHM_OS_ERROR -1 /* SharedMemoryError */
#define EMLX_SHM_BAD_VALUE -2 /* ValueError */
#define EMLX_SHM_OVERFLOW -3 /* OverflowError */
#define EMLX_SHM_ABANDONED 1 /* to_shm: the caller gave up; nothing is left behind */

/* Export states, in an int shared by the exporting job and its caller. */
#define EMLX_SHM_RUNNING 0 /* the export has not handed its segment over */
#define EMLX_SHM_GIVEN_UP 1 /* the caller gave up: the export removes its segment */
#define EMLX_SHM_HANDED_OVER 2 /* the segment exists and belongs to the caller */

/* Copy an evaluated, row-contiguous array into a new shm object `name`,
 * created exclusively with mode `permissions` (owner read-write, others at
 * most read) and written with pwrite, so a full filesystem is an error. The
 * job ends by moving *state from RUNNING to HANDED_OVER; if the caller set
 * GIVEN_UP first, the object is removed and EMLX_SHM_ABANDONED returned.
 * Returns 0 and the byte count, EMLX_SHM_ABANDONED, or an error code. */
int emlx_to_shm(void *array, const char *name, int permissions, int *state, size_t *nbytes);
/* The caller gives up on an export: moves *state from RUNNING to GIVEN_UP
 * and returns the state it found (HANDED_OVER: the caller must unlink). */
int emlx_shm_give_up(int *state);
/* Read shm object `name` (one of ours: owned by this user, not writable by
 * group or others, exactly the size the shape and dtype need) into a new
 * array placed in the mx.array `placeholder`, unlinking the name once it is
 * checked. A segment that shrinks while being read is an error, not a crash.
 * Returns 0 or an error code. */
int emlx_from_shm(const char *name, const int64_t *shape, int ndim, int dtype, void *placeholder);
/* Remove shm object `name`; 0 also when it no longer exists. */
int emlx_shm_unlink(const char *name);
/* Address of an evaluated array's data (its offset included). */
uintptr_t emlx_data_ptr(void *array);
/* Wrap `data` (C-contiguous, of the given shape and dtype code) as an mx.array
 * in `placeholder` without copying where MLX can; `owner` (a PyObject such as
 * the NumPy array) stays referenced until MLX no longer needs the memory. */
int emlx_wrap_buffer(void *data, const int64_t *shape, int ndim, int dtype, void *owner, void *placeholder);
