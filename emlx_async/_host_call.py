"""Host calls: MLX graph nodes whose evaluation runs a callback on the event loop.

``ea.host_call(fn, *inputs, outputs=[(shape, dtype), ...])`` puts a node in
the graph of a queue. When a worker evaluates it, MLX's stream thread posts a
request on the runtime's completion channel and blocks; the loop runs
``fn(*inputs)`` (a plain or ``async`` function) as a task and hands the
results back, and the evaluation goes on.

Deadlock freedom: while a callback runs, ops it starts through emlx_async go
to the runtime's callback queue for the device (never behind the blocked
worker), and awaiting the blocked queue itself raises ``HostCallDeadlock``
at once. Several queues can wait on callbacks at the same time; each request
is independent.

Failure: a raising callback (any exception, a bare ``BaseException`` such
as ``GeneratorExit`` too), a wrong output shape or dtype, a timeout
(``timeout=`` per call, else the runtime's ``host_call_timeout``; ``inf``: no
limit) or a cancelled awaiter answers the request with an error at once; the
graph's evaluation fails with ``MLXRuntimeError`` whose ``__cause__`` is the
callback's exception (carried by identity on the job the worker was
running), and the queue keeps working. Evaluating a host-call output after
its runtime closed raises ``RuntimeClosed``.

A callback's ``KeyboardInterrupt`` or ``SystemExit`` answers the request the
same way, then goes on as it would from any task of the loop: under asyncio
(and uvloop) it ends the loop's run (``asyncio.run`` raises it; were the
loop run again, the job's awaiter gets the ``MLXRuntimeError``); under trio,
where the callback runs in a system task that must not raise, awaiting the
job whose graph called it raises it (itself, not an ``MLXRuntimeError``), so
it leaves ``trio.run`` through that task unless caught; with no task
awaiting that job, it is printed.

Layer: above the runtime and routing; the server attaches itself to the
runtime's completion channel on first use.
"""

from __future__ import annotations

import asyncio
import contextvars

import anyio
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from ._backend import wait_all
from ._convert import numeric_numpy
from ._dtypes import DTYPE_CODES, MAX_DIM
from ._errors import HostCallError, InvalidArgumentType, InvalidInputType, MLXOverflowError, MLXValueError
from ._native import ensure, ffi, lib
from ._native import error as native_call_error
from ._queue import CommandQueue, current_job, host_call_blocking
from ._routing import prepare_inputs, route, set_bound
from ._runtime import Runtime, check_host_call_timeout, get_runtime


_call_ids = itertools.count(1)


@dataclass
class _Call:
    fn: Callable[..., Any]
    queue: CommandQueue
    outputs: list[tuple[tuple[int, ...], mx.Dtype]]
    timeout: float | None


def _check_outputs(outputs: Sequence[tuple[Sequence[int], mx.Dtype]]) -> list[tuple[tuple[int, ...], mx.Dtype]]:
    try:
        outputs = list(outputs)
    except TypeError:  # a number, None: its TypeError named neither host_call nor outputs
        outputs = []
    if not outputs:
        raise MLXValueError("host_call needs outputs=[(shape, dtype), ...] with at least one entry")
    checked = []
    for i, spec in enumerate(outputs):
        try:
            shape, dtype = spec
            shape = tuple(operator.index(d) for d in shape)
        except (TypeError, ValueError):
            raise MLXValueError(f"host_call outputs[{i}] must be a (shape, dtype) pair, got {spec!r}") from None
        if any(d < 0 for d in shape):
            raise MLXValueError(f"host_call outputs[{i}] has a negative dimension: {shape}")
        if any(d > MAX_DIM for d in shape) or math.prod(shape) > 2**62:
            raise MLXOverflowError(f"host_call outputs[{i}] shape {shape} does not fit MLX's int32 dimensions")
        if not isinstance(dtype, mx.Dtype) or dtype not in DTYPE_CODES:  # an unhashable one raised TypeError
            raise MLXValueError(f"host_call outputs[{i}] has unsupported dtype {dtype!r}")
        checked.append((shape, dtype))
    return checked


def host_call(fn: Callable[..., Any], /, *inputs: mx.array,
              outputs: Sequence[tuple[Sequence[int], mx.Dtype]],
              queue: CommandQueue | None = None, timeout: float | None = None):
    """Arrays whose evaluation calls ``fn(*inputs)`` on the event loop.

    Inside a queue job (``q.run(...)``) it returns the lazy output arrays at
    once, for the graph being built there. On the event loop it returns an
    awaitable resolving to those arrays, lazy and owned by the queue (routed
    like any op: ``queue=``, owner of a lazy input, bound, default).

    ``fn`` receives evaluated mx.arrays, whatever the inputs' layout, and
    returns one array (or anything ``mx.array`` accepts, such as a NumPy
    array) per declared output, as a single value or a tuple/list.

    ``timeout`` bounds an async ``fn``'s await: seconds up to 1e6 (about 11
    days), ``inf`` for no limit, or None for the runtime's
    ``host_call_timeout``. See the module docstring for failures.

    Example:
        >>> masked, = await ea.host_call(keep_allowed, logits, outputs=[(logits.shape, mx.float32)])
        >>> await ea.eval(masked)
    """
    if not callable(fn):
        raise InvalidArgumentType(f"host_call needs a callable, got {type(fn).__name__}")
    specs = _check_outputs(outputs)
    for i, x in enumerate(inputs):
        if not isinstance(x, mx.array):
            raise InvalidInputType(f"host_call inputs must be mx.arrays; input {i} is {type(x).__name__}")
    check_host_call_timeout("timeout", timeout, "the runtime's host_call_timeout")
    job = current_job()
    if job is not None:  # on a worker thread, inside a queue job
        return _build(job.queue, fn, inputs, specs, timeout)
    target = route(inputs, queue, runtime=get_runtime)
    return target.run(_build, target, fn, inputs, specs, timeout, lazy=True)


def _build(queue: CommandQueue, fn, inputs, specs, timeout) -> list[mx.array]:
    """On the worker thread: put the node in this thread's graph."""
    server = _server_of(queue)
    runtime = server.runtime
    call_id = next(_call_ids)
    server.calls[call_id] = _Call(fn, queue, specs, timeout)
    effective = timeout if timeout is not None else runtime.host_call_timeout
    # The worker's own bound on the wait, in case the loop never answers (0: none).
    backstop_ms = int((effective * 2 + 10) * 1000) if effective and effective != math.inf else 0
    placeholders = [mx.array(0) for _ in specs]
    shapes = [d for shape, _ in specs for d in shape]
    status = lib.emlx_host_call_build(
        queue._channel.native, call_id, [ffi.cast("void*", id(x)) for x in inputs], len(inputs),
        ffi.new("int64_t[]", shapes), ffi.new("int[]", [len(s) for s, _ in specs]),
        ffi.new("int[]", [DTYPE_CODES[d] for _, d in specs]), len(specs),
        [ffi.cast("void*", id(p)) for p in placeholders], backstop_ms)
    if status != 0:
        server.calls.pop(call_id, None)
        ensure(status, cls=HostCallError)
    return placeholders


def _server_of(queue: CommandQueue) -> HostCallServer:
    """The host-call server of `queue`'s runtime, attached to its channel on first use."""
    channel = queue._channel
    if channel.host_server is None:
        runtime = channel.owner() if channel.owner is not None else None
        if runtime is None:
            raise HostCallError("host calls need the queue's runtime to be open")
        channel.host_server = HostCallServer(runtime)
    return channel.host_server


class HostCallServer:
    """The loop side: runs callbacks for requests posted on the channel."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.calls: dict[int, _Call] = {}  # call id -> the node's callback, until it is evaluated
        self._tasks: dict[int, tuple[Any, CommandQueue]] = {}  # request id -> (task handle, blocked queue)

    def request(self, request_id: int) -> None:
        """A worker is waiting for request `request_id` (called from the channel's drain)."""
        # A node is evaluated once, so its record is done with after this.
        call = self.calls.pop(lib.emlx_host_request_call(request_id), None)
        if call is None:
            self._reply_error(request_id, "[host_call] unknown call (its runtime state is gone)")
            return
        inputs = []
        for i in range(lib.emlx_host_request_inputs(request_id)):
            placeholder = mx.array(0)
            if lib.emlx_host_request_input(request_id, i, ffi.cast("void*", id(placeholder))) != 0:
                self._reply_error(request_id, str(native_call_error(f"[host_call] cannot read input {i}")))
                return
            inputs.append(placeholder)
        context = contextvars.copy_context()
        context.run(host_call_blocking.set, call.queue)
        handle = self.runtime._backend.spawn(lambda: self._serve(request_id, call, inputs), context=context)
        self._tasks[request_id] = (handle, call.queue)  # both backends start the task later, never inline

    def freed(self, call_id: int) -> None:
        """A node was freed (called from the channel's drain): unevaluated, its callback is not needed."""
        self.calls.pop(call_id, None)

    async def _serve(self, request_id: int, call: _Call, inputs: list[mx.array]) -> None:
        name = getattr(call.fn, "__qualname__", repr(call.fn))
        set_bound(self.runtime.callback_queue(call.queue.device))  # its own MLX work goes here
        timeout = call.timeout if call.timeout is not None else self.runtime.host_call_timeout
        answered = False  # the worker blocks until the request is answered: every exit answers it
        try:
            try:
                result = call.fn(*inputs)
                if asyncio.iscoroutine(result) or hasattr(result, "__await__"):
                    with anyio.fail_after(timeout):
                        result = await result
            except TimeoutError as exc:
                answered = True
                self._fail(request_id, call, exc, f"[host_call] {name} timed out after {timeout}s")
                return
            except anyio.get_cancelled_exc_class():
                answered = True
                self._reply_error(request_id, f"[host_call] {name} was cancelled")
                raise
            except BaseException as exc:  # noqa: BLE001 - chained onto the graph's error
                # Also a bare BaseException (GeneratorExit, a custom one): it is the callback's failure.
                answered = True
                self._fail(request_id, call, exc, f"[host_call] {name} raised {type(exc).__name__}: {exc}")
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    if self.runtime._backend.name != "trio":
                        raise  # asyncio ends its run with it, as it does for any task's
                    # A trio system task must not raise it: the job's awaiter does (_with_host_cause).
                    job = call.queue.running_job()
                    if job is None or job.future.done() or not job.future.awaited():
                        self.runtime._backend.report_error(f"[host_call] {name} raised, no awaiter", exc)
                return
            try:
                arrays = await self._as_outputs(result, call)
            except Exception as exc:  # noqa: BLE001
                answered = True
                self._fail(request_id, call, exc, str(exc))
                return
            keep = arrays  # alive until the worker has copied them
            answered = True
            if lib.emlx_host_request_reply(request_id, [ffi.cast("void*", id(a)) for a in keep],
                                           len(keep), ffi.NULL) != 0:
                refused = native_call_error(cls=HostCallError)
                self._fail(request_id, call, HostCallError(f"{name}: {refused}"), f"{refused} from {name}")
        finally:
            self._tasks.pop(request_id, None)
            if not answered:  # cancelled or failed while preparing its outputs
                self._reply_error(request_id, f"[host_call] {name} ended without an answer")

    async def _as_outputs(self, result: Any, call: _Call) -> list[mx.array]:
        values = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(values) != len(call.outputs):
            raise HostCallError(f"[host_call] expected {len(call.outputs)} outputs, got {len(values)}")
        arrays = []
        for i, (value, (shape, dtype)) in enumerate(zip(values, call.outputs)):
            try:
                if isinstance(value, (np.ndarray, np.generic)):
                    value = numeric_numpy(value)
                array = value if isinstance(value, mx.array) else mx.array(value)
            except (ValueError, TypeError) as exc:  # not something mlx makes an array of
                why = "" if type(exc) is TypeError else f": {exc}"  # nanobind's TypeError lists its overloads
                raise HostCallError(f"[host_call] output {i} ({type(value).__name__}) is not an array{why}") from None
            if tuple(array.shape) != shape or array.dtype != dtype:
                raise HostCallError(f"[host_call] output {i} must be {shape} {dtype}, "
                                    f"got {tuple(array.shape)} {array.dtype}")
            arrays.append(array)
        # Evaluate lazy results where they live (their owner queue, or here),
        # then make them row-contiguous here: the worker copies them flat.
        await wait_all(prepare_inputs(self.runtime.channel, arrays, None))
        arrays = [mx.contiguous(a) for a in arrays]
        mx.eval(arrays)
        return arrays

    def _fail(self, request_id: int, call: _Call, exc: BaseException, message: str) -> None:
        """Fail the graph; the job the blocked worker runs carries `exc` as its cause."""
        job = call.queue.running_job()
        if job is not None:
            job.host_cause = exc
        self._reply_error(request_id, message)

    def _reply_error(self, request_id: int, message: str) -> None:
        lib.emlx_host_request_reply(request_id, ffi.NULL, 0, message.encode())

    def cancel_for(self, queue: CommandQueue) -> None:
        """The awaiter of `queue`'s running job gave up: stop its callbacks."""
        for handle, blocked in list(self._tasks.values()):
            if blocked is queue:
                handle.cancel()
