/* Completion channel: where workers report finished jobs to the event loop.
 *
 * One channel per runtime. Workers append records under a mutex and signal an
 * eventfd (Linux) or a pipe (macOS) only when the list goes from empty to
 * non-empty, so a burst of completions costs the loop one wake-up. */

typedef struct emlx_channel emlx_channel;

/* Record status values: every status a record can carry, whoever posts it. */
#define EMLX_DONE 0          /* the job finished */
#define EMLX_FAILED 1        /* a native error; see error_kind (EMLX_ERR_*, common.h) and message */
#define EMLX_DROPPED 2       /* the job was dropped before it started */
#define EMLX_PY_FAILED 3     /* a Python job raised; the exception is kept in Python */
#define EMLX_STOPPED 4       /* the worker reached its stop marker and left this channel */
#define EMLX_HOST_REQUEST 5  /* a host-call node wants an answer (host_call.h); job_id is the request id */
#define EMLX_HOST_FREED 6    /* a host-call node was freed (host_call.h); job_id is its call id */

/* payload_kind values. */
#define EMLX_PAYLOAD_RESULTS 0  /* an op job's outputs */
#define EMLX_PAYLOAD_RESTORE 1  /* a failed or dropped op job's donated inputs, in input order */

typedef struct {
    uint64_t job_id;
    int32_t status;
    int32_t error_kind;
    char *message; /* malloc'd, or NULL; release with emlx_message_free */
    void *payload; /* an op job's arrays, or NULL; see emlx_publish_results */
    int32_t payload_kind;
    /* When the worker started and finished the job, in ns on the clock of
     * Python's time.monotonic_ns(); 0 for records of jobs that never started
     * (dropped) and for other record kinds. */
    uint64_t started_ns;
    uint64_t finished_ns;
} emlx_completion;

emlx_channel *emlx_channel_new(void);
/* Closes the channel: records posted later (a worker finishing, a host-call
 * node evaluated after its runtime closed) are refused, never written to
 * freed memory. Workers and nodes keep the closed object alive. */
void emlx_channel_free(emlx_channel *channel);
/* The fd the event loop watches for readability. */
int emlx_channel_fd(emlx_channel *channel);
/* Move up to `capacity` records into `out`; returns how many. */
size_t emlx_channel_drain(emlx_channel *channel, emlx_completion *out, size_t capacity);
void emlx_message_free(char *message);
/* Make the fd readable with no record (a closed channel: nothing), so that a
 * loop-side task waiting on it wakes and re-checks what it waits for. */
void emlx_channel_signal(emlx_channel *channel);
