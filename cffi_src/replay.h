/* Replay of traced functions (MLX's export_function files), run natively as
 * the "replay" op of the op table.
 *
 * emlx_replay_register reads the file into memory and returns an id; every
 * worker thread that calls the function imports its own copy on first use
 * (an imported graph is bound to the streams of the thread that runs it).
 * The input specs (n_inputs shapes of ndims[k] dims, flattened, and dtype
 * codes) are checked before each call; n_inputs < 0 means unknown (MLX's
 * own matching still applies). Returns 0 or -1 (message in emlx_last_error). */
int emlx_replay_register(const char *path, int shapeless, int n_inputs, const int *ndims,
                         const int64_t *shapes, const int *dtypes, int64_t *id);
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
 * and returns only outputs `returned`. 0 or -1. */
int emlx_replay_chain(int64_t id, const int *inputs, const int *outputs, size_t count, const int *returned,
                      size_t n_returned, int64_t *chained_id);
/* Drop the calling thread's chained outputs (a stream's last step is done):
 * run it as a job on the chain's queue. */
void emlx_replay_end_chain(void);
/* Forget function `id` and every thread's copy (jobs already running keep
 * theirs until they finish). 0, or -1 when the id is unknown. */
int emlx_replay_release(int64_t id);
/* How many functions are registered (for tests of release). */
int64_t emlx_replay_count(void);
