/* Native ops: one job builds an op's graph on the worker's stream, natively,
 * from the op spec, emlx_async/_op_table.py (op codes are its positions). */

/* Inputs whose entry of `donated` is non-zero (one per input; NULL: none) are donated: once the job is queued
 * it takes the only reference (the mx.array object is left holding a scalar
 * until the results are published into it), so MLX may update their buffers
 * in place. A job that is dropped, cancelled while queued or fails before its
 * graph is built hands them back (EMLX_PAYLOAD_RESTORE).
 * Parameters are decoded in table order from `ints` (flags, counts and
 * values), `floats` and one string. With evaluate=1 the outputs are
 * evaluated on the worker; with check_finite=1 as well, a NaN or infinity
 * in a floating-point output fails the job. The record's payload carries
 * the outputs. `arrays` are the input objects' addresses (Python's id()); with
 * check_ready=1 it returns 1 and queues nothing when an input is not usable on
 * the worker as it is, as emlx_submit_eval does (worker.h). */
int emlx_submit_op(emlx_worker *worker, uint64_t job_id, int op, const intptr_t *arrays, size_t n_arrays,
                   const int64_t *ints, size_t n_ints, const double *floats, size_t n_floats,
                   const char *text, int evaluate, int check_finite, const unsigned char *donated,
                   int check_ready);
int emlx_op_count(void);
/* The digest of the op spec the dispatch was generated from; the package
 * refuses a shim whose digest differs from its own spec's. */
const char *emlx_op_table_digest(void);
/* Number of arrays in a payload. */
size_t emlx_payload_size(void *payload);
/* Move the payload's arrays into mx.array placeholders (loop thread; NULL
 * entries are skipped) and free it. Returns 0 or -1. */
int emlx_publish_results(void *payload, void **placeholders, size_t count);
void emlx_payload_free(void *payload);
