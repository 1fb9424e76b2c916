/* Start-up of MLX's communication backends with a deadline.
 *
 * MLX's distributed::init blocks until the other ranks connect (the ring
 * backend accepts its neighbour with no time limit), and mx.distributed.init
 * holds the GIL meanwhile, so a peer that never starts freezes the whole
 * process. emlx_distributed_start runs distributed::init(strict, backend) on
 * a thread of its own and waits for it up to timeout_s seconds (< 0: no
 * limit), without the GIL. Returns EMLX_DIST_STARTED (the group is MLX's
 * cached one now: mx.distributed.init returns it at once),
 * EMLX_DIST_TIMED_OUT (the thread stays parked in MLX, which cannot be
 * interrupted; do not start a backend again in this process), or
 * EMLX_DIST_BAD_VALUE / EMLX_DIST_FAILED (MLX's invalid_argument or other
 * error, message in emlx_last_error). */
#define EMLX_DIST_STARTED 0
#define EMLX_DIST_TIMED_OUT 1
#define EMLX_DIST_BAD_VALUE -1
#define EMLX_DIST_FAILED -2
int emlx_distributed_start(int strict, const char *backend, double timeout_s);
