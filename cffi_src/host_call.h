/* Host calls: MLX graph nodes whose evaluation asks the event loop.
 *
 * emlx_host_call_build runs on a worker thread (inside a Python job) and
 * puts a node on that thread's CPU stream. When the node is evaluated, its
 * task posts an EMLX_HOST_REQUEST record (job_id = request id) to the
 * channel and blocks until the loop replies with emlx_host_request_reply. */

/* Builds the node. `shapes` holds the output shapes back to back (ndims[i]
 * entries each); `dtypes` are mlx::core::Dtype::Val values. Each output is
 * written into the mx.array placeholder out_placeholders[i]. Returns 0 or -1
 * (emlx_last_error). backstop_ms bounds the worker's wait if the loop never
 * answers (0: wait forever). */
int emlx_host_call_build(emlx_channel *channel, uint64_t call_id, void **inputs, size_t n_inputs,
                         const int64_t *shapes, const int *ndims, const int *dtypes, size_t n_outputs,
                         void **out_placeholders, int backstop_ms);

/* On the loop thread, for a posted request: */
uint64_t emlx_host_request_call(uint64_t request_id);
size_t emlx_host_request_inputs(uint64_t request_id);
/* Store a copy of input i (evaluated, contiguous) into an mx.array placeholder. */
int emlx_host_request_input(uint64_t request_id, size_t index, void *placeholder);
/* Answer: outputs (evaluated, row-contiguous mx.arrays, checked against the
 * declared shapes and dtypes) or, when error is not NULL, a failure whose
 * message the graph's evaluation raises. Returns -1 if the outputs do not
 * match (emlx_last_error says how); the request is then still open. */
int emlx_host_request_reply(uint64_t request_id, void **outputs, size_t n_outputs, const char *error);
