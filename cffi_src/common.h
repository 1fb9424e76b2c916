/* Common to every area: the shim's versions, and the error of the last failed call.
 *
 * A call returning -1 or NULL leaves its message and kind on the calling
 * thread; the kind decides the Python exception class, never the message. */

/* The package version baked in at build, and the MLX headers it was compiled against. */
const char *emlx_version(void);
const char *emlx_mlx_version(void);

/* Error kinds: of the last failed call, and a record's error_kind for EMLX_FAILED. */
#define EMLX_ERR_RUNTIME 0
#define EMLX_ERR_INVALID_ARGUMENT 1
#define EMLX_ERR_OUT_OF_RANGE 2
#define EMLX_ERR_OTHER 3
#define EMLX_ERR_OVERFLOW 4  /* std::overflow_error: a value does not fit its C++ type */
#define EMLX_ERR_CLOSED 5    /* the runtime the work reports to was closed */

/* The message and kind (EMLX_ERR_*) of the last failed call on this thread. */
const char *emlx_last_error(void);
int emlx_last_error_kind(void);
