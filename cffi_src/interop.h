/* Zero-copy access to the mlx::core::array inside an mx.array object.
 *
 * nanobind stores the C++ object at (char*)obj + offset, where the int32
 * offset follows the PyObject header. The Python side validates this layout
 * at import (emlx_async/_interop.py) and uses the copying path if it fails. */

/* Layout probe: ndim, shape (up to shape_capacity), itemsize and size of the
 * array inside `obj`. Returns 0, or -1 if the layout looks wrong. */
int emlx_probe_array(void *obj, int64_t *shape, int shape_capacity, int *ndim,
                     int *itemsize, int64_t *size);

#define EMLX_ARRAY_AVAILABLE 0  /* evaluated: safe on any thread */
#define EMLX_ARRAY_LAZY 1       /* unscheduled graph, owned by its stream's thread */
#define EMLX_ARRAY_SCHEDULED 2  /* evaluation started, maybe not finished */
/* State of the array and, when lazy, the device type and stream index of
 * its primitive (its owner). */
int emlx_array_state(void *obj, int *device_type, int *stream_index);

/* Index of the calling thread's default stream on the device, or -1. */
int emlx_thread_stream_index(int device_type);

/* Whether the arrays `objs` (mx.array objects) can be evaluated: no node of
 * their graphs not yet evaluated overflows or exceeds the allocation limit
 * alone (a failed allocation ends the process in MLX's allocator; views count
 * nothing). 0, or -1 with a message naming `what` in emlx_last_error. */
int emlx_check_evaluable(void **objs, size_t count, const char *what);
