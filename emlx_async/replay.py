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

import contextlib
import hashlib
import math
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Callable

import mlx.core as mx

from . import _interop
from . import ops as _ops
from ._dtypes import DTYPE_CODES, DTYPES
from ._errors import InvalidArgumentType, InvalidInputType, MLXValueError, NotTraceable, mlx_error
from ._native import ffi, last_error, lib
from ._routing import route
from ._runtime import get_runtime
from ._submit import donation_indices, index_value
from ._trees import iter_arrays

__all__ = ["TracedFunction", "CompiledFunction", "trace", "load_traced", "compile"]

# "replay_multi" results come back as a tuple (its outputs in the op spec,
# emlx_async/_op_table.py); "replay" is for functions of one output.


def _check(status: int) -> None:
    if status != 0:
        raise MLXValueError(last_error())


def _check_flag(where: str, name: str, value: Any) -> None:
    """A flag is a bool: "yes" or 1 would count as true, "" or 0 as false."""
    if value is not True and value is not False:
        raise InvalidArgumentType(f"[{where}] {name} must be True or False, got {value!r}")


def _check_callable(where: str, fn: Any) -> None:
    if not callable(fn):
        raise InvalidArgumentType(f"[{where}] the function must be callable, got {type(fn).__name__}")


Spec = tuple[tuple[int, ...], mx.Dtype]

# Our export files end with an integrity record: this marker, then the
# SHA-256 of every byte before it. MLX's importer stops reading after the
# last function, so plain mx.import_function still reads the file.
_SEAL = b"\0emlx-async-sha256\0"
_SEAL_SIZE = len(_SEAL) + 32


def _seal(path: str) -> None:
    """Append the integrity record to the export file at `path`."""
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).digest()
    with open(path, "ab") as f:
        f.write(_SEAL + digest)


def _read_export(path: str) -> bytes:
    """The bytes MLX should see from the export file at `path`.

    Only a regular file is opened (a FIFO or device would block or never
    end). A file with our integrity record must match it, and loses it here.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # a FIFO opens at once
    try:
        # Before fdopen: it refuses a directory without closing the descriptor.
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MLXValueError(f"[load_traced] {path} is not a regular file")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        data = f.read()
    if len(data) >= _SEAL_SIZE and data[-_SEAL_SIZE:-32] == _SEAL:
        body = data[:-_SEAL_SIZE]
        if hashlib.sha256(body).digest() != data[-32:]:
            raise MLXValueError(f"[load_traced] {path} does not match its integrity record: it changed after it "
                                "was written (corrupted or truncated)")
        return body
    return data


def _verify_in_child(path: str, data: bytes, timeout: float) -> None:
    """Load `data` and replay each of its traces once on zeros in a child process.

    MLX's kernels trust the graph: what the checks of the file cannot rule
    out ends the process that runs it, so it is tried in one that may die.
    """
    child = [sys.executable, "-c", "from emlx_async.replay import _verify_main; _verify_main()"]
    # This very package, wherever it was imported from.
    home = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [home, os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run(child, input=data, capture_output=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise MLXValueError(f"[load_traced] verifying {path}: replaying it did not finish within {timeout} s") \
            from exc
    out = done.stdout.decode(errors="replace")
    if done.returncode == 0 and out.rstrip().endswith(_VERIFIED):
        return
    if _REFUSED in out:  # a clean error there: the same one here
        raise MLXValueError(out[out.index(_REFUSED) + len(_REFUSED):].strip())
    code = done.returncode
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
    detail = (done.stderr.decode(errors="replace").strip() or out.strip())[-600:]
    raise MLXValueError(f"[load_traced] verifying {path}: the process that replayed it {how} before it finished"
                        + (f": {detail}" if detail else ""))


_VERIFIED = "emlx-async: verified"
_REFUSED = "emlx-async: refused: "


def _verify_main() -> None:
    """The child of _verify_in_child: the file's bytes on stdin."""
    import asyncio

    async def replay_each_trace() -> None:
        from ._runtime import Runtime

        f = _register(sys.stdin.buffer.read())
        # A group's all_sum markers (ea.distributed.Group.trace) run as their input here: no peers.
        _check(lib.emlx_replay_set_group(f.function_id, b""))
        async with Runtime(pool_size=1) as rt:
            for specs, _ in f.traces:
                await f(*(mx.zeros(shape, dtype=dtype) for shape, dtype in specs), queue=rt.default_queue())

    try:
        asyncio.run(replay_each_trace())
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        print(_REFUSED + str(exc), flush=True)
        sys.exit(3)
    print(_VERIFIED, flush=True)


class TracedFunction:
    """A registered traced graph; call it to replay it natively on a queue.

    ``await f(*arrays, queue=None, lazy=False, nowait=False)`` gives the
    outputs: one array, or a tuple for several. Inputs must match a traced
    signature in count and dtype, and in shape unless traced
    ``shapeless=True`` (then in number of axes); otherwise ``MLXValueError``
    names what was expected. ``traces`` lists the signatures (input specs,
    output count); a file made by ``mx.exporter`` can hold several, and then
    ``input_specs`` is None, and ``n_outputs`` 0 unless their counts agree.
    The graph is freed when the handle is collected, which a submitted job
    delays until it is over; ``release()`` frees it at once (jobs still
    queued then fail with ``MLXValueError``).
    """

    def __init__(self, function_id: int, path: str | None = None, returned: int | None = None):
        self._id = function_id
        self._finalizer = weakref.finalize(self, lib.emlx_replay_release, function_id)
        shapeless, n_traces, n_bound = ffi.new("int *"), ffi.new("int64_t *"), ffi.new("int64_t *")
        _check(lib.emlx_replay_info(function_id, shapeless, n_traces, n_bound))
        self.shapeless = bool(shapeless[0])
        self.traces: list[tuple[list[Spec], int]] = [_trace(function_id, k, n_bound[0]) for k in range(n_traces[0])]
        # A chained function's calls give its `returned` outputs only.
        counts = {n for _, n in self.traces} if returned is None else {returned}
        # An output index below this exists whichever trace a call matches.
        self._fewest_outputs = min(counts)
        # Likewise an input index (bound inputs included) for chain().
        self._fewest_inputs = min(len(specs) for specs, _ in self.traces) + n_bound[0]
        self.n_outputs = self._fewest_outputs if len(counts) == 1 else 0
        self.input_specs = self.traces[0][0] if len(self.traces) == 1 else None
        self._op = "replay" if self.n_outputs == 1 else "replay_multi"
        self.path = path
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
        _check_flag("replay", "fed", fed)
        if fed and not self._chained:
            raise MLXValueError("[replay] fed=True needs a function made by chain()")
        if not self._finalizer.alive:
            raise MLXValueError("[replay] this traced function was released")
        if donate:
            given, donate = donate, donation_indices("replay", donate)
            for index, result in donate.items():
                if not (0 <= index < len(arrays) and 0 <= result < self._fewest_outputs):
                    raise MLXValueError(f"[replay] donate={given!r} names an input or output that does not exist "
                                        f"({len(arrays)} input(s) given; the function makes {self._fewest_outputs} "
                                        "output(s))")
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
            raise MLXValueError("[replay] this traced function was released")
        for k, x in enumerate(arrays):
            if not isinstance(x, mx.array):
                raise InvalidInputType(f"[replay] bound array {k} must be an mx.array, got {type(x).__name__}")
        out = ffi.new("int64_t *")
        _check(lib.emlx_replay_bind(self._id, _interop.handles(list(arrays)), len(arrays), out))
        bound = TracedFunction(out[0], self.path, None if not self._chained else self.n_outputs)
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
            raise MLXValueError("[replay] this traced function was released")
        if not isinstance(inputs, dict):
            raise InvalidArgumentType(f"[replay] chain's inputs must be a dict {{input index: output index}}, "
                                      f"got {type(inputs).__name__}")
        given = list(returned)
        # A bool is no index (True would name 1); NumPy's ints are.
        pairs = [(index_value(i), index_value(o)) for i, o in inputs.items()]
        returned = [index_value(k) for k in given]
        if any(v is None for pair in pairs for v in pair) or any(k is None for k in returned):
            raise InvalidArgumentType(f"[replay] chain({inputs!r}, returned={tuple(given)!r}): input and output "
                                      "indices must be ints")
        known = range(self._fewest_outputs)
        if not pairs or not all(o in known and i in range(self._fewest_inputs) for i, o in pairs) or \
                not returned or not all(k in known for k in returned):
            raise MLXValueError(f"[replay] chain({inputs!r}, returned={tuple(given)!r}) names inputs or outputs "
                                f"that do not exist (the function takes {self._fewest_inputs} input(s) and makes "
                                f"{self._fewest_outputs} output(s))")
        out = ffi.new("int64_t *")
        _check(lib.emlx_replay_chain(self._id, ffi.new("int[]", [i for i, _ in pairs]),
                                     ffi.new("int[]", [o for _, o in pairs]), len(pairs),
                                     ffi.new("int[]", list(returned)), len(returned), out))
        chained = TracedFunction(out[0], self.path, len(returned))
        chained._chained = True
        return chained

    def release(self) -> None:
        """Free the graph now (every worker's copy); later calls raise."""
        self._finalizer()

    @property
    def function_id(self) -> int:
        """The shim's id of this graph (what a call's job names)."""
        return self._id

    def __repr__(self) -> str:
        specs = "unknown inputs" if self.input_specs is None else ", ".join(
            f"{shape}:{dtype}" for shape, dtype in self.input_specs)
        return f"<TracedFunction {self._id} ({specs}){' shapeless' if self.shapeless else ''}>"


def _trace(function_id: int, k: int, n_bound: int) -> tuple[list[Spec], int]:
    """Trace `k` of a registered function: its unbound inputs' specs and its output count."""
    n_inputs, n_outputs, n_dims = ffi.new("int64_t *"), ffi.new("int64_t *"), ffi.new("int64_t *")
    _check(lib.emlx_replay_trace_info(function_id, k, n_inputs, n_outputs, n_dims))
    ndims, dims = ffi.new("int[]", max(n_inputs[0], 1)), ffi.new("int64_t[]", max(n_dims[0], 1))
    codes = ffi.new("int[]", max(n_inputs[0], 1))
    _check(lib.emlx_replay_trace_inputs(function_id, k, ndims, dims, codes))
    specs, at = [], 0
    for j in range(n_inputs[0]):
        specs.append((tuple(dims[at + d] for d in range(ndims[j])), DTYPES[codes[j]]))
        at += ndims[j]
    return specs[:len(specs) - n_bound], n_outputs[0]


def _register(data: bytes, path: str | None = None, caller: str = "load_traced") -> TracedFunction:
    out = ffi.new("int64_t *")
    if lib.emlx_replay_register(ffi.from_buffer(data), len(data), out) != 0:
        message = last_error()
        # The shim's file checks speak as load_traced; a file ea.trace made is trace's.
        if caller != "load_traced" and message.startswith("[load_traced] "):
            message = f"[{caller}] " + message[len("[load_traced] "):]
        raise MLXValueError(message)
    return TracedFunction(out[0], path)


def load_traced(path: str | os.PathLike, *, verify: bool = False, verify_timeout: float = 120.0) -> TracedFunction:
    """Register an ``mx.export_function`` file; calls must match one of its traces.

    The file is checked before MLX reads it: every count and size against
    the file's length, every node's shapes, dtypes and parameters against
    what its inputs imply (``MLXValueError`` names the first problem). A
    file written by ``ea.trace(save=...)`` carries a digest of its bytes,
    and must match it. Files from elsewhere can still hold what no check
    of the file rules out (a kernel fed inconsistent data, changed
    constants): ``verify=True`` first loads the file in a child process and
    replays each trace once there, on zeros of its example shapes, and
    refuses the file if that process dies or does not finish within
    `verify_timeout` seconds (it costs a process start, a second or two).

    Reads the file on the calling thread (from a loop, a large one is better
    loaded with ``await q.run(ea.load_traced, path)``).
    """
    path = os.fspath(path)
    _check_flag("load_traced", "verify", verify)
    if verify and not (isinstance(verify_timeout, (int, float)) and not isinstance(verify_timeout, bool)
                       and 0 < verify_timeout < math.inf):
        raise MLXValueError("[load_traced] verify_timeout must be a positive number of seconds, "
                            f"got {verify_timeout!r}")
    data = _read_export(path)
    if verify:
        _verify_in_child(path, data, verify_timeout)
    return _register(data, path)


# MLX cannot serialize its Contiguous primitive, and mlx-lm's state-space models
# (qwen3_next, qwen3_5, kimi_linear, olmo_hybrid, ...) pass their conv state through
# mx.contiguous in every step. While a trace is built, mx.contiguous is a flatten and
# reshape: the same values, row-contiguous (a non-contiguous input is copied), from ops
# that export. It is a correct mx.contiguous for any other thread calling it meanwhile.
_MLX_CONTIGUOUS = mx.contiguous
_exporting_lock = threading.Lock()
_exporting = 0


def _exportable_contiguous(a: mx.array, /, allow_col_major: bool = False, *, stream=None) -> mx.array:
    return mx.reshape(mx.flatten(a, stream=stream), a.shape, stream=stream)


@contextlib.contextmanager
def _exportable_ops():
    global _exporting
    with _exporting_lock:
        _exporting += 1
        mx.contiguous = _exportable_contiguous
    try:
        yield
    finally:
        with _exporting_lock:
            _exporting -= 1
            if not _exporting:
                mx.contiguous = _MLX_CONTIGUOUS


def _outputs(result: Any) -> list:
    return list(result) if isinstance(result, (list, tuple)) else [result]


# MLX's refusal to evaluate an array while a transformation traces it: what
# .item(), .tolist(), float(), np.array(...) or mx.eval inside fn raise (a
# ValueError, a RuntimeError through the buffer protocol).
_EVAL_WHILE_TRACING = "[eval] Attempting to eval an array during function transformations"


def reads_a_value(exc: BaseException) -> bool:
    """Whether `exc` is MLX's refusal of a value read (``.item()``, ``np.array`` ...) while a
    function is traced (export, ``mx.compile``)."""
    return type(exc) in (ValueError, RuntimeError) and str(exc).startswith(_EVAL_WHILE_TRACING)


def _not_traceable(caller: str) -> NotTraceable:
    # MLX's message names neither the caller nor what fn did; its text stays the cause.
    return NotTraceable(
        f"[{caller}] the function reads an array's value while it is being traced (.item(), "
        ".tolist(), float(), np.array(), mx.eval, ...): a traced graph has no values to read "
        "until it runs, so it cannot depend on one read back on the host; compute it with array "
        "ops (mx.where, ...) or read it before tracing and pass it in as an input")


async def trace(fn: Callable[..., Any], *examples: mx.array, shapeless: bool = False, queue=None,
                save: str | os.PathLike | None = None) -> TracedFunction:
    """Trace ``fn`` on `examples` (on a queue: routed like an op) and register it for replay.

    ``fn`` takes arrays and returns an array or a tuple/list of arrays;
    arrays it closes over (weights) are baked in as constants. ``save=``
    also keeps the export file there (``load_traced`` reads it back).
    What ``fn`` raises comes back as it is, except that reading an array's
    value inside it (``.item()``, ``.tolist()``, ``np.array``) raises
    ``NotTraceable``, MLX's refusal as its cause.
    """
    _check_callable("trace", fn)
    _check_flag("trace", "shapeless", shapeless)
    for k, x in enumerate(examples):
        if not isinstance(x, mx.array):
            raise InvalidInputType(f"[trace] example {k} must be an mx.array, got {type(x).__name__}")
        if x.dtype not in DTYPE_CODES:
            raise MLXValueError(f"[trace] example {k}: unsupported dtype {x.dtype}")
    if save is not None:
        try:
            mode = os.stat(save).st_mode
        except OSError:
            mode = None  # a new file; MLX names any problem creating it
        # MLX's exporter opens it holding the GIL: a FIFO would block the whole process for ever.
        if mode is not None and not stat.S_ISREG(mode):
            raise MLXValueError(f"[trace] save={os.fspath(save)!r} exists and is not a regular file")
    target = route(list(examples), queue, runtime=get_runtime)
    with tempfile.TemporaryDirectory(prefix="emlx-trace-") as tmp:
        path = os.fspath(save) if save is not None else os.path.join(tmp, "function.mlxfn")

        raised = []  # what fn raised comes back as it is; what MLX raised, as this package's class

        def traced(*a):
            try:
                return _outputs(fn(*a))
            except BaseException as exc:
                raised.append(exc)
                raise

        def export(*xs):
            try:
                with _exportable_ops():
                    mx.export_function(path, traced, *xs, shapeless=shapeless)
            except Exception as exc:
                if reads_a_value(exc):
                    raise _not_traceable("trace") from exc
                if raised and exc is raised[-1]:
                    raise
                raise mlx_error(exc) from exc
            if save is not None:
                _seal(path)
            return _register(_read_export(path), caller="trace")

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
    function on the routed queue's thread. A function that reads an array's
    value (``.item()``, ``np.array`` ...) raises ``NotTraceable``, as ``trace``. MLX's compiled graphs belong to the
    thread that traced them, so each worker gets its own compiled function,
    made lazily the first time that worker runs it.
    """

    def __init__(self, fn: Callable[..., Any], *, shapeless: bool = False):
        # Refused here: mx.compile takes anything and fails only when the result is called.
        _check_callable("compile", fn)
        _check_flag("compile", "shapeless", shapeless)
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
        target = route(iter_arrays((args, kwargs)), queue, runtime=get_runtime)

        def job(*a, **k):
            try:
                return self.compiled_here()(*a, **k)
            except (ValueError, RuntimeError) as exc:
                if reads_a_value(exc):  # mx.compile traces fn at its first call (and each new shape)
                    raise _not_traceable("compile") from exc
                raise

        return target.run(job, *args, lazy=lazy, nowait=nowait, **kwargs)


def compile(fn: Callable[..., Any] | None = None, *, shapeless: bool = False):  # noqa: A001 - MLX's name
    """``ea.compile(fn)`` (or ``@ea.compile``): see CompiledFunction."""
    _check_flag("compile", "shapeless", shapeless)
    if fn is None:
        return lambda f: CompiledFunction(f, shapeless=shapeless)
    return CompiledFunction(fn, shapeless=shapeless)
