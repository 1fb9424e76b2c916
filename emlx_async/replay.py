"""Trace once, replay natively: MLX functions that run without the GIL.

``f = await ea.trace(fn, *examples)`` traces ``fn`` once with
``mx.export_function`` and registers the graph in the shim. ``await f(*arrays)``
then runs it as ONE native op job (the table's ``replay`` op): the graph is
rebuilt and evaluated in C++ on the queue's worker, so a busy event loop (or
any thread holding the GIL) cannot slow it down, unlike ``q.run(fn, ...)``,
whose Python needs the GIL at every op. Ordering, cancellation, errors and
backpressure are the op path's.

``ea.compile(fn)`` is ``mx.compile`` made safe across queues: one compiled
function per worker thread, made lazily inside the queue job.
"""

from __future__ import annotations

import os
import struct
import tempfile
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Callable

import mlx.core as mx

from . import _interop
from . import ops as _ops
from ._dtypes import DTYPE_CODES, DTYPES
from ._errors import MLXValueError
from ._native import ffi, last_error, lib
from ._routing import route
from ._trees import iter_arrays

__all__ = ["TracedFunction", "CompiledFunction", "trace", "load_traced", "compile"]

# "replay_multi" results come back as a tuple (it is in _queue's list of ops
# with several outputs); "replay" is for functions of one output.


def _check(status: int) -> None:
    if status != 0:
        raise MLXValueError(last_error())


def _read_specs(path: str) -> tuple[bool, list[tuple[tuple[int, ...], mx.Dtype]] | None]:
    """(shapeless, input specs) from an export file's header, or specs None when unknown.

    The layout is MLX's (mlx/export.cpp): version, count, shapeless, metadata,
    then the first function's keyword names and traced inputs. A file with
    several traces keeps MLX's own matching only (specs None).
    """
    with open(path, "rb") as f:
        data = f.read(1 << 20)
    at = 0

    def take(fmt: str):
        nonlocal at
        values = struct.unpack_from("<" + fmt, data, at)
        at += struct.calcsize("<" + fmt)
        return values if len(values) > 1 else values[0]

    def string() -> bytes:
        nonlocal at
        n = take("Q")
        at += n
        return data[at - n:at]

    try:
        string()  # MLX version
        count = take("i")
        shapeless = bool(take("?"))
        string()  # metadata
        if count != 1:
            return shapeless, None
        for _ in range(take("Q")):  # keyword names
            string()
        n_ids = take("Q")  # traced input ids (take moves `at` first)
        at += 8 * n_ids
        specs = []
        for _ in range(take("Q")):
            shape = tuple(take("i") for _ in range(take("Q")))
            code, _size = take("i"), take("B")
            if not 0 <= code < len(DTYPES):
                return shapeless, None
            specs.append((shape, DTYPES[code]))
        return shapeless, specs
    except struct.error:
        return False, None


class TracedFunction:
    """A registered traced graph; call it to replay it natively on a queue.

    ``await f(*arrays, queue=None, lazy=False, nowait=False)`` gives the
    outputs: one array, or a tuple for several. Inputs must match the traced
    ones in count and dtype, and in shape unless traced ``shapeless=True``
    (then in number of axes); otherwise ``MLXValueError`` names what was
    expected. The graph is freed when the handle is collected, which a
    submitted job delays until it is over; ``release()`` frees it at once
    (jobs still queued then fail with ``MLXValueError``).
    """

    def __init__(self, function_id: int, shapeless: bool, specs, n_outputs: int, path: str | None = None):
        self._id = function_id
        self.n_outputs = n_outputs
        self._op = "replay" if n_outputs == 1 else "replay_multi"
        self.shapeless = shapeless
        self.input_specs = specs
        self.path = path
        self._finalizer = weakref.finalize(self, lib.emlx_replay_release, function_id)
        self._chained = False

    def __call__(self, *arrays: Any, queue=None, device=None, lazy: bool = False, nowait: bool = False,
                 check_finite: bool | None = None, donate: dict[int, int] | None = None, fed: bool = False):
        """Replay on the routed queue; returns a JobFuture.

        ``donate={input index: output index}`` hands those inputs to the job
        (MLX may then update their buffers in place, a KV cache say) and
        publishes the outputs into the caller's input objects; the future
        then gives output 0 only (the op path's donation contract).
        ``fed=True`` (a function made by ``chain``): the chained inputs come
        from the previous chained call on the same queue; what is passed for
        them only stands in.
        """
        if fed and not self._chained:
            raise ValueError("[replay] fed=True needs a function made by chain()")
        if not self._finalizer.alive:
            raise ValueError("[replay] this traced function was released")
        if donate:
            for index, result in donate.items():
                if not 0 <= index < len(arrays) or (self.n_outputs and not 0 <= result < self.n_outputs):
                    raise ValueError(f"[replay] donate={donate!r} names an input or output that does not exist")
        future = _ops.submit(self._op, list(arrays), queue=queue, device=device, lazy=lazy, nowait=nowait,
                             check_finite=check_finite, donate=donate, function=self._id, fed=fed)
        # The job names the graph by id: keep the handle (and so the graph)
        # alive until the job is over.
        future.add_done_callback(lambda _f, _keep=self: None)
        return future

    def bind(self, *arrays: mx.array) -> TracedFunction:
        """This function with its last ``len(arrays)`` inputs fixed to `arrays`.

        A call then passes only the leading inputs, and the bound arrays
        travel to the worker without the loop touching them: a model's
        weights, say, bound once instead of submitted with every step. They
        must be evaluated (any worker reads them) and fit those inputs
        (``MLXValueError`` otherwise); the new function holds them until it
        is released, and shares nothing with this one (release each).
        """
        if not self._finalizer.alive:
            raise ValueError("[replay] this traced function was released")
        for k, x in enumerate(arrays):
            if not isinstance(x, mx.array):
                raise TypeError(f"[replay] bound array {k} must be an mx.array, got {type(x).__name__}")
        out = ffi.new("int64_t *")
        _check(lib.emlx_replay_bind(self._id, _interop.handles(list(arrays)), len(arrays), out))
        specs = None if self.input_specs is None else self.input_specs[:len(self.input_specs) - len(arrays)]
        bound = TracedFunction(out[0], self.shapeless, specs, self.n_outputs, self.path)
        bound._chained = self._chained
        return bound

    def chain(self, inputs: dict[int, int], returned: Sequence[int] = (0,)) -> TracedFunction:
        """This function with ``{input index: output index}`` carried from call to call
        on the worker: a stream of steps that never waits for the loop.

        A call with ``fed=True`` takes those inputs from the outputs of the
        previous chained call on the same queue (any function made by
        ``chain``; an output smaller than the input is padded with zeros
        after its end, so a KV cache can move to a longer trace), whatever
        was passed for them; a call without it starts a chain from the arrays
        given. So the next step can be queued before the one making its
        token and caches has ended, and the caches, held only by the chain,
        are updated in place. Calls return the outputs `returned` only;
        ``end_chain(queue)`` drops the chain's arrays. One chain per queue at
        a time. Releasing is separate, as for ``bind``.
        """
        if not self._finalizer.alive:
            raise ValueError("[replay] this traced function was released")
        pairs = list(inputs.items())
        known = range(self.n_outputs) if self.n_outputs else None
        if not pairs or not all(isinstance(i, int) and isinstance(o, int) for i, o in pairs) or \
                (known is not None and not all(o in known for _, o in pairs)) or \
                not returned or (known is not None and not all(k in known for k in returned)):
            raise ValueError(f"[replay] chain({inputs!r}, returned={returned!r}) names outputs that do not exist")
        out = ffi.new("int64_t *")
        _check(lib.emlx_replay_chain(self._id, ffi.new("int[]", [i for i, _ in pairs]),
                                     ffi.new("int[]", [o for _, o in pairs]), len(pairs),
                                     ffi.new("int[]", list(returned)), len(returned), out))
        chained = TracedFunction(out[0], self.shapeless, self.input_specs, len(returned), self.path)
        chained._chained = True
        return chained

    def release(self) -> None:
        """Free the graph now (every worker's copy); later calls raise."""
        self._finalizer()

    def __repr__(self) -> str:
        specs = "unknown inputs" if self.input_specs is None else ", ".join(
            f"{shape}:{dtype}" for shape, dtype in self.input_specs)
        return f"<TracedFunction {self._id} ({specs}){' shapeless' if self.shapeless else ''}>"


def _register(path: str, shapeless: bool, specs, n_outputs: int) -> TracedFunction:
    out = ffi.new("int64_t *")
    if specs is None:
        _check(lib.emlx_replay_register(path.encode(), int(shapeless), -1, ffi.NULL, ffi.NULL, ffi.NULL, out))
    else:
        ndims = [len(shape) for shape, _ in specs]
        flat = [d for shape, _ in specs for d in shape]
        codes = [DTYPE_CODES[dtype] for _, dtype in specs]
        _check(lib.emlx_replay_register(path.encode(), int(shapeless), len(specs), ffi.new("int[]", ndims),
                                        ffi.new("int64_t[]", flat), ffi.new("int[]", codes), out))
    return TracedFunction(out[0], shapeless, specs, n_outputs)


def load_traced(path: str | os.PathLike) -> TracedFunction:
    """Register an ``mx.export_function`` file (one trace: inputs checked; several: MLX matches).

    Reads the file on the calling thread (from a loop, a large one is better
    loaded with ``await q.run(ea.load_traced, path)``).
    """
    path = os.fspath(path)
    shapeless, specs = _read_specs(path)
    n_outputs = 0  # unknown: a tuple whatever the count
    if specs is not None:
        # Count the outputs on a lazy graph (built here, never evaluated).
        n_outputs = len(mx.import_function(path)(*(mx.zeros(s, dtype=d) for s, d in specs)))
    f = _register(path, shapeless, specs, n_outputs)
    f.path = path
    return f


def _outputs(result: Any) -> list:
    return list(result) if isinstance(result, (list, tuple)) else [result]


async def trace(fn: Callable[..., Any], *examples: mx.array, shapeless: bool = False, queue=None,
                save: str | os.PathLike | None = None) -> TracedFunction:
    """Trace ``fn`` on `examples` (on a queue: routed like an op) and register it for replay.

    ``fn`` takes arrays and returns an array or a tuple/list of arrays;
    arrays it closes over (weights) are baked in as constants. ``save=``
    also keeps the export file there (``load_traced`` reads it back).
    """
    for k, x in enumerate(examples):
        if not isinstance(x, mx.array):
            raise TypeError(f"[trace] example {k} must be an mx.array, got {type(x).__name__}")
        if x.dtype not in DTYPE_CODES:
            raise ValueError(f"[trace] example {k}: unsupported dtype {x.dtype}")
    target = route(list(examples), queue)
    specs = [(tuple(x.shape), x.dtype) for x in examples]
    with tempfile.TemporaryDirectory(prefix="emlx-trace-") as tmp:
        path = os.fspath(save) if save is not None else os.path.join(tmp, "function.mlxfn")

        counted = []

        def traced(*a):
            out = _outputs(fn(*a))
            counted.append(len(out))
            return out

        def export(*xs):
            mx.export_function(path, traced, *xs, shapeless=shapeless)
            return _register(path, shapeless, specs, counted[0])

        # On the worker: the tracer's nodes (and constants it evaluates) use
        # its stream, and reading a large export back does not block the loop.
        f = await target.run(export, *examples)
    if save is not None:
        f.path = path
    return f


trace.load = load_traced  # type: ignore[attr-defined]


def end_chain_here() -> None:
    """Drop the arrays the calling worker's chain carries: run it as a job on the
    chain's queue (``queue.run(end_chain_here)``) once its last step is queued."""
    lib.emlx_replay_end_chain()


class CompiledFunction:
    """``mx.compile(fn)`` once per worker thread, run as a queue job.

    ``await cfn(*args, queue=None, lazy=False, **kwargs)`` runs the compiled
    function on the routed queue's thread. MLX's compiled graphs belong to the
    thread that traced them, so each worker gets its own compiled function,
    made lazily the first time that worker runs it.
    """

    def __init__(self, fn: Callable[..., Any], *, shapeless: bool = False):
        self.fn = fn
        self.shapeless = shapeless
        self._per_thread: dict[tuple[int, str], Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self.__wrapped__ = fn
        self.__doc__ = getattr(fn, "__doc__", None)

    def compiled_here(self) -> Callable[..., Any]:
        """This thread's compiled function (made on first use)."""
        # A thread id can be reused by a later thread; its CPU stream cannot.
        key = (threading.get_ident(), repr(mx.default_stream(mx.cpu)))
        compiled = self._per_thread.get(key)
        if compiled is None:
            fn = self.fn
            # A fresh callable per thread: mx.compile's cache is keyed by the
            # function's identity, so threads must not share one.
            compiled = mx.compile(lambda *a, **k: fn(*a, **k), shapeless=self.shapeless)
            with self._lock:
                compiled = self._per_thread.setdefault(key, compiled)
        return compiled

    def __call__(self, *args: Any, queue=None, lazy: bool = False, nowait: bool = False, **kwargs: Any):
        target = route(iter_arrays((args, kwargs)), queue)

        def job(*a, **k):
            return self.compiled_here()(*a, **k)

        return target.run(job, *args, lazy=lazy, nowait=nowait, **kwargs)


def compile(fn: Callable[..., Any] | None = None, *, shapeless: bool = False):  # noqa: A001 - MLX's name
    """``ea.compile(fn)`` (or ``@ea.compile``): see CompiledFunction."""
    if fn is None:
        return lambda f: CompiledFunction(f, shapeless=shapeless)
    return CompiledFunction(fn, shapeless=shapeless)
