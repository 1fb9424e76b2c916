/* Replay of traced functions (MLX's export_function files), run natively as
 * the "replay" op of the op table.
 *
 * emlx_replay_register takes a file's bytes, checks them (every count, id,
 * shape, dtype and node against what its inputs imply: MLX's importer
 * trusts them), and returns an id; every worker thread that calls the
 * function imports its own copy on first use (an imported graph is bound to
 * the streams of the thread that runs it). Each call's inputs must match one
 * of the file's traces. Returns 0 or -1 (message in emlx_last_error). */
int emlx_replay_register(const char *data, size_t size, int64_t *id);
/* Whether the function is shapeless, how many traces its file holds, and how
 * many of its last inputs are bound (emlx_replay_bind). 0 or -1. */
int emlx_replay_info(int64_t id, int *shapeless, int64_t *n_traces, int64_t *n_bound);
/* Trace `trace`: its input and output counts (bound inputs included) and the
 * total number of dimensions of its inputs. 0 or -1. */
int emlx_replay_trace_info(int64_t id, int64_t trace, int64_t *n_inputs, int64_t *n_outputs, int64_t *n_dims);
/* Trace `trace`'s inputs: ndims[n_inputs], their dimensions flattened into
 * dims[n_dims], and dtype codes (the op table's) in dtypes[n_inputs]. 0 or -1. */
int emlx_replay_trace_inputs(int64_t id, int64_t trace, int *ndims, int64_t *dims, int *dtypes);
/* A new function `bound_id`: `id` with its last `count` inputs fixed to these
 * arrays (evaluated ones; held until it is released), so a call passes only
 * the leading inputs: the weights of a model, say. 0 or -1. */
int emlx_replay_bind(int64_t id, void **arrays, size_t count, int64_t *bound_id);
/* A new function `chained_id`: `id` whose calls made with fed=1 take input
 * inputs[k] from output outputs[k] of the previous chained call on the same
 * worker thread (a decode step's token, key and KV caches from the step
 * before, so the next step can be queued before that one ends; an output
 * smaller than the input's spec is padded with zeros after its end: a cache
 * moving to a longer trace). Every call keeps those outputs on its thread
 * and returns only outputs `returned`. Every index is checked against the
 * function's input and output counts, here and again at each call. 0 or -1. */
int emlx_replay_chain(int64_t id, const int *inputs, const int *outputs, size_t count, const int *returned,
                      size_t n_returned, int64_t *chained_id);
/* Function `id`'s all_sum markers (mx.depends([x], [x]): MLX cannot export
 * a collective) become all_sum over the group of `backend` (started already)
 * in each call's graph; backend "" keeps them as they are (their input: a
 * verification run). A function with markers and no such call is refused at
 * its first call. For functions traced by ea.distributed.Group.trace; bind
 * and chain copy it. 0 or -1. */
int emlx_replay_set_group(int64_t id, const char *backend);
/* Drop the calling thread's chained outputs (a stream's last step is done):
 * run it as a job on the chain's queue. */
void emlx_replay_end_chain(void);
/* Forget function `id` and every thread's copy (jobs already running keep
 * theirs until they finish). 0, or -1 when the id is unknown. */
int emlx_replay_release(int64_t id);
/* How many functions are registered (for tests of release). */
int64_t emlx_replay_count(void);
