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
/* Forget function `id` and every thread's copy (jobs already running keep
 * theirs until they finish). 0, or -1 when the id is unknown. */
int emlx_replay_release(int64_t id);
/* How many functions are registered (for tests of release). */
int64_t emlx_replay_count(void);
