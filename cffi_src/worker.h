/* Workers: OS threads that each own one MLX stream and run a FIFO job loop.
 *
 * MLX never frees a stream's scheduler thread, so workers are never destroyed
 * while the process runs: a released worker parks, keeping its stream, and the
 * next acquire on the same device reuses it. */

typedef struct emlx_worker emlx_worker;

#define EMLX_DEVICE_CPU 0
#define EMLX_DEVICE_GPU 1

/* Returns a worker reporting to `channel`, or NULL (see emlx_last_error). */
emlx_worker *emlx_worker_acquire(emlx_channel *channel, int device_type);
/* Queue a stop marker. Jobs before it run (drop_pending=0) or are reported
 * EMLX_DROPPED (drop_pending=1). When the marker is reached the worker posts
 * EMLX_STOPPED with `job_id`, leaves the channel and parks. */
int emlx_worker_release(emlx_worker *worker, uint64_t job_id, int drop_pending);
int emlx_worker_stream_index(emlx_worker *worker);
int emlx_worker_thread_id(emlx_worker *worker);

/* Jobs. Each returns 0, or -1 (emlx_last_error) when the worker is stopping
 * or the job could not be made. No C++ exception crosses this ABI. */
/* Evaluate the given mx.array objects (their addresses, Python's id()) on the
 * worker's stream. With check_ready=1 it first checks that each is usable on
 * the worker as it is (evaluated, or a lazy graph of the worker's stream);
 * if one is not, it queues nothing and returns 1, for the caller to make the
 * inputs usable (emlx_async/_routing.py) and submit again with check_ready=0.
 * Checking here saves the loop a native call per input. */
int emlx_submit_eval(emlx_worker *worker, uint64_t job_id, const intptr_t *arrays, size_t count,
                     int check_ready);
/* Call emlx_python_job(context, job_id) on the worker thread. */
int emlx_submit_python(emlx_worker *worker, uint64_t job_id, void *context);
/* Wait for all work on the worker's stream. */
int emlx_submit_synchronize(emlx_worker *worker, uint64_t job_id);
/* Drop a queued job: 1 if it was dropped (it will never run and no record is
 * posted), 0 if it already started or finished, -1 on error. For a dropped op
 * job with donated inputs, *restored receives them (a payload, in input
 * order) to publish back into the caller's arrays; otherwise NULL. */
int emlx_cancel(emlx_worker *worker, uint64_t job_id, void **restored);

/* Give up on a worker's jobs without waiting (a collective whose peer
 * stalled; the end of a loop's run): its queued jobs are discarded without
 * records, the record of the running one is discarded too, and it takes no
 * more jobs from this lease. It is not counted active; emlx_shutdown leaves
 * it at once while it is still inside its job. When that job returns (at
 * once if none was running) it parks with its stream for reuse.
 * Returns 0, or -1 if it was already released or abandoned. */
int emlx_worker_abandon(emlx_worker *worker);
/* 1 while an abandoned worker is still inside the job it was abandoned in
 * (the job may still use its queue's handle), else 0. */
int emlx_worker_retiring(emlx_worker *worker);

/* Counts for leak checks. */
int emlx_workers_active(void);
int emlx_workers_parked(void);
/* The ids of this process's live OS threads, as threading.get_native_id
 * gives them (Linux: /proc/self/task; macOS: task_threads), the first
 * `capacity` into `out`. Returns how many threads there are, or -1. */
int emlx_process_thread_ids(uint64_t *out, int capacity);
/* How many stream threads MLX's scheduler holds (any thread that evaluated
 * on a stream made one). In a fork child they are the parent's, gone: work
 * on their streams would wait forever. */
int emlx_mlx_stream_threads(void);
/* Stop every worker (interpreter exit). A worker running a job is left
 * detached at once, as a daemon thread is: its job is abandoned, its result
 * dropped, and exit never waits for it. Idle workers are joined, for at most
 * timeout_ms. Returns the number left behind. While a detached worker (left
 * here or abandoned) is still running at exit(), the process ends with
 * exit()'s status without C++ static destructors (glibc), and a detached
 * worker that CPython ends mid-job sleeps instead of aborting the process. */
int emlx_shutdown(int timeout_ms);

/* Implemented in Python (extern "Python"): runs job `job_id` for the queue
 * whose cffi handle is `context`. Returns EMLX_DONE or EMLX_PY_FAILED. */
extern "Python+C" int emlx_python_job(void *context, uint64_t job_id);
