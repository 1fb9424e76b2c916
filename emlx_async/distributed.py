"""MLX's distributed collectives as awaitables (``ea.distributed``).

Built on MLX's own engine (``mx.distributed``: ring over TCP, MPI, JACCL,
NCCL on CUDA), started by ``mlx.launch``. ``init()`` returns a ``Group``;
``all_sum``, ``all_gather``, ``all_max``, ``all_min``, ``sum_scatter``,
``send``, ``recv`` and ``recv_like`` take MLX's arguments and return
awaitables, so the event loop stays free while the ranks wait for each other.

One queue per group. Every collective of a group runs on that group's own
queue (one worker thread), in the order the awaitables were created. MLX
requires every rank to issue a group's collectives in the same order: two
collectives issued from different threads can reach the wire in different
orders on different ranks, and each rank then waits for a message its peer
never sends (measured: it deadlocks). ``queue=`` overrides this for a call,
and the caller then owns the ordering (a timeout abandons that queue too).

How it runs. There is no native op for a collective (the C ABI cannot take
MLX's Python ``Group``), so each one is a Python job on the group's worker:
it builds ``mx.distributed.<op>(x, group=..., stream=...)`` and evaluates it
with ``mx.eval``, which releases the GIL while the bytes travel. Each awaited
collective costs a Python job's round trip: about 38 us at the median on a
loaded 2-core machine against 28 us for a bare ``q.run`` (benchmarks/RESULTS.md),
small next to a network round trip. Code that issues many collectives (a
sharded forward pass) runs them inside one ``group.run`` job instead, where
they cost what they cost in MLX.

Failure. A collective cannot be interrupted once MLX runs it. A peer that
dies makes the ring backend fail the pending collective ("connection to a
peer was lost"); a peer that stalls makes it wait forever. Both break the
group: with ``timeout=`` (per call, or the group's default from ``init``) the
awaiting task gets ``DistributedError`` when the time is up, every task
waiting on the group is released with it, the worker stuck in the collective
is abandoned (it is not waited for at runtime close or interpreter exit), and
every later collective on the group raises ``DistributedError`` at once.
Arguments MLX would reject are refused with ``InvalidArgument`` or
``InvalidArgumentType`` (a ``ValueError``, a ``TypeError``) before anything
runs; they do not break the group.

Start-up. ``init`` waits at most ``init_timeout`` seconds (default 60) for
the other ranks: MLX's ring backend accepts its neighbour's connection with
no time limit, so a peer that never starts (or exits first) would block it
forever (and ``mx.distributed.init`` holds the GIL while it waits, freezing
every thread). The wait happens in the shim, without the GIL; when the time
is up, ``init`` raises ``DistributedError``. MLX's attempt cannot be
interrupted and stays parked on a thread of its own (it does not hold up
interpreter exit), and every later ``init`` that would start a backend
raises the same error at once.

Mismatched collectives. MLX's ring backend does not check that the ranks
agree: ``all_sum`` of 4 elements on one rank and 100,000 on another, or
float32 against int8, or a ``recv`` of another shape than was sent, gives
one rank an error and the other wrong values, and leaves the next matched
collective wrong too. So each collective here first exchanges a small
header (the collective's kind, dtype and shape: 136 bytes, within the same
job, so no extra loop round trip): the all-reduce and gather collectives
compare every rank's header, a ``recv`` compares the sender's with what it
asked for. A mismatch raises ``DistributedError`` naming both sides and
breaks the group. What stays unchecked: the sender of a mismatched
``send`` learns nothing (it completes, or times out if the receiver does
not drain it); a ``send``/``recv`` against a group collective (``all_sum``,
...) is not named as a mismatch, since the ring backend carries them on
different connections and the headers never meet: the group collective
waits for its peer and breaks the group at its timeout (or at once if the
peer exits); and collectives MLX runs inside ``group.run`` (a sharded
model's own) are the caller's to match.

Cancellation: a cancelled awaiter is released at once, but its collective
keeps its place in the group's queue and runs (the other ranks issue it too;
dropped on one rank alone, every later collective would pair with the wrong
one); its result is discarded. Its timeout still holds: if it has not
completed by then (a peer that never issues it), the group breaks as if it
had been awaited, and its failure, if it fails, breaks the group too.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import sys
import threading
import weakref
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import mlx.core as mx
import mlx.nn.layers.distributed as _nn_distributed

from . import _backend
from . import replay as _replay
from ._dtypes import DTYPE_CODES, DTYPES, INT_RANGES, MAX_DIM
from ._errors import (DistributedError, InvalidArgument, InvalidArgumentType, MLXOverflowError, MLXValueError,
                      QueueClosed, RuntimeClosed)
from ._native import last_error, lib
from ._queue import CommandQueue
from ._runtime import Runtime, get_runtime

_BACKENDS = ("any", "ring", "mpi", "jaccl", "nccl")


class _PeerFailure(Exception):
    """A collective failed while it ran: the ranks are out of step now."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


class _Mismatch(Exception):
    """The ranks' headers disagree: they issued different collectives."""


class Group:
    """A group of ranks, MLX's ``mx.distributed.Group`` with a queue and a failure state.

    ``mlx_group`` is MLX's group (pass it to mlx-lm's ``model.shard``).
    ``timeout`` is the default, in seconds, for its collectives (None: wait
    as long as it takes). ``broken`` is the ``DistributedError`` that broke
    it, or None.
    """

    def __init__(self, mlx_group: mx.distributed.Group, *, backend: str, timeout: float | None,
                 device: mx.DeviceType):
        self.mlx_group = mlx_group
        self.backend = backend
        self.timeout = _check_timeout(timeout)
        self.device = device
        self.broken: DistributedError | None = None
        # The group's queue on each runtime (a dedicated one, not pooled).
        self._queues: weakref.WeakKeyDictionary[Runtime, dict] = weakref.WeakKeyDictionary()

    def rank(self) -> int:
        return self.mlx_group.rank()

    def size(self) -> int:
        return self.mlx_group.size()

    def __repr__(self) -> str:
        state = f" broken: {self.broken}" if self.broken else ""
        return f"<ea.distributed.Group {self.backend} rank {self.rank()} of {self.size()}{state}>"

    def queue(self, runtime: Runtime | None = None) -> CommandQueue:
        """The queue this group's collectives run on, in order (made on first use)."""
        self.check()
        runtime = runtime or get_runtime()
        registry = self._queues.setdefault(runtime, {})
        return runtime._dedicated_queue(registry, self.device, "distributed")

    def check(self) -> None:
        """Raise the group's ``DistributedError`` if it is broken."""
        if self.broken is not None:
            raise DistributedError(str(self.broken)) from self.broken

    def declare_broken(self, error: DistributedError) -> None:
        """Declare the group broken: its queues are abandoned and their tasks get `error`."""
        if self.broken is None:
            self.broken = error
        for registry in list(self._queues.values()):
            for queue in list(registry.values()):
                queue.abandon(error)
            registry.clear()

    def limit(self, timeout: float | None) -> float | None:
        """The seconds a call given `timeout` waits (None: the group's default; inf: no bound).

        None in the result means no bound; a bad `timeout` raises InvalidArgument.
        """
        return self.timeout if timeout is None else _check_timeout(timeout)

    async def run(self, fn: Callable[..., Any], /, *args: Any, timeout: float | None = None,
                  what: str | None = None, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` on the group's queue, in collective order.

        For code that issues collectives itself (a sharded model's forward
        pass): it keeps its place among the group's collectives. Any
        exception from `fn` breaks the group, since its collectives may have
        run on some ranks and not others; so does the timeout.

        ``timeout`` and ``what`` (the name errors give it) are this call's own:
        pass a function that takes arguments of those names through
        ``functools.partial`` or a lambda.

        Example:
            >>> logits = await group.run(lambda t: model(t), tokens, timeout=30)
        """
        return await self.issue(fn, *args, timeout=timeout, what=what, **kwargs)

    def issue(self, fn: Callable[..., Any], /, *args: Any, timeout: float | None = None,
              what: str | None = None, **kwargs: Any) -> Issued:
        """``run``'s job queued now: an ``Issued`` to await later (or ``leave()``). A cancelled
        awaiter leaves it queued, as ``run``'s; awaiting it again waits for the same job."""
        if not callable(fn):  # refused before it is queued: a misuse must not break the group
            raise InvalidArgumentType(f"group.run() needs a callable, got {type(fn).__name__}")

        def job(*a: Any, **k: Any) -> Any:
            try:
                return fn(*a, **k)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the loop as a break
                raise _PeerFailure(exc) from exc

        queue = self.queue()
        return self._issue(queue, lambda: queue.run(job, *args, **kwargs), timeout,
                           what or getattr(fn, "__name__", "run"))

    async def _await(self, queue: CommandQueue, submit: Callable[[], Any], timeout: float | None, what: str,
                     *, native: bool = False) -> Any:
        """Await the job `submit()` puts on `queue`, under the group's rules (its timeout, its
        breaks). `native`: a native job, any of whose failures is a failure while it ran."""
        return await self._issue(queue, submit, timeout, what, native=native)

    def _issue(self, queue: CommandQueue, submit: Callable[[], Any], timeout: float | None, what: str,
               *, native: bool = False) -> Issued:
        """The job `submit()` puts on `queue` now, to be awaited (or left) later: how a caller
        queues several in a fixed order without awaiting each."""
        limit = self.limit(timeout)
        deadline = None if limit is None else anyio.current_time() + limit
        return Issued(self, queue, submit(), deadline, limit, what, native)

    async def trace(self, fn: Callable[..., Any], *examples: mx.array, shapeless: bool = False,
                    save: str | os.PathLike | None = None) -> CollectiveFunction:
        """``ea.trace`` for a function that calls ``mx.distributed.all_sum`` over this group (a
        sharded model's forward pass): replayed natively, its collectives included.

        MLX cannot export a collective, so while `fn` is traced each ``all_sum``
        is recorded as a marker, which every call's graph turns into MLX's
        all_sum over this group, on the group's queue (and mlx.nn's sharded
        layers' ``sum_gradients``, a gradient rule, is left out, in the modules
        that imported it by name too, as a few of mlx-lm's MoE families do:
        trace forward passes, not gradients through those layers). Other
        collectives are refused (``InvalidArgument``), and so is
        ``shapeless=True``. Every rank traces its own shard and calls it in
        the same order, as with any collective.

        Example:
            >>> forward = await group.trace(lambda t: model(t), tokens)
            >>> logits = await forward(tokens)
        """
        if not callable(fn):
            raise InvalidArgumentType(f"[trace] fn must be callable, got {type(fn).__name__}")
        if shapeless is not False:  # MLX cannot infer a marker's shapes in a shapeless replay
            raise InvalidArgument("[trace] a group traces with fixed shapes only (shapeless=False)")
        self.check()

        def marked(*arrays: mx.array) -> Any:
            _tracing.group = self
            try:
                return fn(*arrays)
            finally:
                _tracing.group = None

        with _collectives_as_markers():
            traced = await _replay.trace(marked, *examples, shapeless=shapeless, save=save)
        return CollectiveFunction(self, traced)

    def load_traced(self, path: str | os.PathLike, *, verify: bool = False) -> CollectiveFunction:
        """A file ``trace(save=...)`` wrote, as a function over this group (``ea.load_traced``'s checks).

        Load such a file here only: ``ea.load_traced`` would run it with each
        all_sum as its input."""
        traced = _replay.load_traced(path, verify=verify)
        if traced.shapeless:
            traced.release()
            raise InvalidArgument("[load_traced] a group replays fixed-shape traces only; this file is shapeless")
        return CollectiveFunction(self, traced)

    def _past_deadline(self, queue: CommandQueue, what: str, limit: float | None) -> DistributedError:
        """A collective not done within its limit: the group's break (this one, or the timeout
        that broke it first), with its queue abandoned."""
        if self.broken is None or isinstance(self.broken.__cause__, TimeoutError):
            error = DistributedError(f"[{what}] rank {self.rank()} of {self.size()}: the group did not complete "
                                     f"it within {limit} s (a peer stalled or died); the group is broken")
            error.__cause__ = TimeoutError()
            self.declare_broken(error)
        else:
            error = DistributedError(str(self.broken))
            error.__cause__ = self.broken
        if not queue.closed:  # a caller's queue= holds the stuck worker: abandoned as the group's are
            queue.abandon(error)
        return error

    async def _watch_left(self, queue: CommandQueue, settled: anyio.Event, deadline: float, what: str,
                          limit: float | None) -> None:
        """A cancelled awaiter's collective, still queued or running: past its deadline it breaks
        the group as its awaiter would have (a peer that never issues it would hold the queue for good)."""
        with anyio.CancelScope(deadline=deadline):
            await settled.wait()
        if not settled.is_set():  # the group's break (this one, or the one before) abandons its queue too
            self._past_deadline(queue, what, limit)

    def _breaking(self, exc: Exception, what: str) -> DistributedError:
        """The DistributedError that a mismatch or a failure on a rank breaks the group with."""
        if isinstance(exc, _Mismatch):
            return DistributedError(f"[{what}] rank {self.rank()} of {self.size()}: {exc}; the group is broken")
        assert isinstance(exc, _PeerFailure)
        reason = str(exc.cause) or type(exc.cause).__name__  # AssertionError() says nothing itself
        error = DistributedError(f"[{what}] rank {self.rank()} of {self.size()} failed while it ran "
                                 f"({reason}); the ranks may be out of step, so the group is broken")
        error.__cause__ = exc.cause
        return error

    def _after_awaiter(self, future: Any, what: str, native: bool = False) -> None:
        """A job whose awaiter was cancelled has ended: its mismatch or failure still breaks the
        group (the ranks are out of step), though nobody is there to raise it to."""
        if future.cancelled():
            return
        exc = future.exception()
        if native and _failed_while_running(future):
            exc = _PeerFailure(exc)
        if isinstance(exc, (_Mismatch, _PeerFailure)) and self.broken is None:
            self.declare_broken(self._breaking(exc, what))


def _failed_while_running(future: Any) -> bool:
    """A native job's failure that may have left the ranks out of step (a collective failed,
    or the graph did): not the shim's refusal of its inputs (MLXValueError) before it ran,
    nor a queue or runtime that closed, nor the group's own break."""
    if future.cancelled() or future.exception() is None:
        return False
    return not isinstance(future.exception(), (MLXValueError, DistributedError, QueueClosed, RuntimeClosed))


class Issued:
    """A job on a group's queue, settled under the group's rules when awaited (its timeout,
    its breaks). One never awaited must be ``leave()``-d: its failure still breaks the group
    and its deadline is still watched, since the other ranks issue it whatever happens here.
    Awaiting it does not take it off the queue."""

    __slots__ = ("group", "queue", "future", "settled", "left", "deadline", "limit", "what", "native")

    def __init__(self, group: Group, queue: CommandQueue, future: Any, deadline: float | None,
                 limit: float | None, what: str, native: bool):
        self.group, self.queue, self.future, self.what, self.native = group, queue, future, what, native
        self.deadline, self.limit = deadline, limit
        # Through an event: a cancelled awaiter must not take the job out of the queue, since
        # the other ranks still issue it and every later collective would pair wrong.
        self.settled = anyio.Event()
        self.left = False  # once set, the job's failure is reported by its callback
        future.add_done_callback(self._done)

    def _done(self, future: Any) -> None:
        self.settled.set()
        if self.left:
            self.group._after_awaiter(future, self.what, self.native)
        else:
            _retrieve(future)

    def __await__(self) -> Any:
        return self._settle().__await__()

    async def _settle(self) -> Any:
        group, future = self.group, self.future
        try:
            with anyio.CancelScope(deadline=math.inf if self.deadline is None else self.deadline):
                await self.settled.wait()
            if not self.settled.is_set():  # past the deadline
                error = group._past_deadline(self.queue, self.what, self.limit)
                raise error from error.__cause__
            if self.native and _failed_while_running(future):
                raise _PeerFailure(future.exception())
            return future.result()
        except (_Mismatch, _PeerFailure) as exc:
            error = group._breaking(exc, self.what)
            group.declare_broken(error)
            raise error from error.__cause__
        except DistributedError:
            raise  # released by a break on another collective of the group
        finally:
            if not future.done():
                self.leave()

    def within(self, seconds: float | None) -> None:
        """Its deadline at most `seconds` from now (None: as it is): for a job queued ahead of
        others (a chain's k-th step), whose own time counts once the one before it is done."""
        if seconds is not None:
            now = anyio.current_time() + seconds
            self.deadline = now if self.deadline is None else min(self.deadline, now)
            self.limit = seconds

    def leave(self) -> None:
        """Nobody will await it: its failure breaks the group, past its deadline too."""
        if self.left:
            return
        self.left = True
        if self.future.done():
            self.group._after_awaiter(self.future, self.what, self.native)
        elif self.deadline is not None:  # the job still runs: its time limit still holds
            with contextlib.suppress(RuntimeError):  # the run is ending: nothing left to watch for
                _backend.current().spawn(lambda: self.group._watch_left(self.queue, self.settled, self.deadline,
                                                                         self.what, self.limit))


class CollectiveFunction:
    """A traced function whose ``all_sum`` calls run over its group (``Group.trace``).

    ``await f(*arrays)`` replays it on the group's queue, in order with the
    group's other collectives, under the group's timeout (``timeout=`` per
    call): the outputs, one array or a tuple. Inputs must fit a trace
    (``InvalidArgument`` otherwise, before anything runs; the shim's own
    refusals are ``MLXValueError``s and leave the group whole); a failure
    while it runs breaks the group, as a collective's does. ``bind`` and
    ``chain`` are ``TracedFunction``'s. Unlike the collectives, a call does
    not first check that every rank called the same function on the same
    shapes: that is the caller's, as inside ``group.run``.
    """

    def __init__(self, group: Group, traced: _replay.TracedFunction):
        self.group = group
        # Its own: a fresh function (trace, load, bind or chain made it) that only this
        # object calls, on the group's queue; the shim's entry learns the group here.
        self._traced = traced
        _check_native(lib.emlx_replay_set_group(traced.function_id, group.backend.encode()))

    async def __call__(self, *arrays: mx.array, timeout: float | None = None, donate: dict[int, int] | None = None,
                       fed: bool = False) -> Any:
        return await self.submit(*arrays, timeout=timeout, donate=donate, fed=fed)

    def submit(self, *arrays: mx.array, timeout: float | None = None, donate: dict[int, int] | None = None,
               fed: bool = False) -> Issued:
        """The call queued now (calls keep the order they were submitted in, as a chain
        needs); await the result to get the outputs, or ``leave()`` it."""
        group = self.group
        group.check()
        if not fed:  # a fed call's chained inputs only stand in: the worker checks what it feeds
            _check_fits(self._traced, arrays)
        queue = group.queue()
        return group._issue(queue, lambda: self._traced(*arrays, queue=queue, donate=donate, fed=fed),
                            timeout, "traced", native=True)

    def bind(self, *arrays: mx.array) -> CollectiveFunction:
        return CollectiveFunction(self.group, self._traced.bind(*arrays))

    def chain(self, inputs: dict[int, int], returned: Sequence[int] = (0,)) -> CollectiveFunction:
        return CollectiveFunction(self.group, self._traced.chain(inputs, returned))

    def release(self) -> None:
        self._traced.release()

    def __repr__(self) -> str:
        return f"<CollectiveFunction over {self.group!r}: {self._traced!r}>"


def _check_native(status: int) -> None:
    if status != 0:
        raise MLXValueError(last_error())


def _check_fits(traced: _replay.TracedFunction, arrays: Sequence[Any]) -> None:
    """Refuse inputs that fit none of `traced`'s traces: the native job would fail on every
    rank but break the group on this one."""
    for k, x in enumerate(arrays):
        if not isinstance(x, mx.array):
            raise InvalidArgumentType(f"[traced] input {k} must be an mx.array, got {type(x).__name__}")
    for specs, _ in traced.traces:
        if len(specs) == len(arrays) and all(
                x.dtype == dtype and (x.ndim == len(shape) if traced.shapeless else tuple(x.shape) == tuple(shape))
                for x, (shape, dtype) in zip(arrays, specs)):
            return
    def spec(shape: Sequence[int], dtype: mx.Dtype) -> str:
        return f"{tuple(shape)} {str(dtype).removeprefix('mlx.core.')}"

    given = ", ".join(spec(x.shape, x.dtype) for x in arrays) or "no inputs"
    wanted = " or ".join("(" + ", ".join(spec(*s) for s in specs) + ")" for specs, _ in traced.traces)
    raise InvalidArgument(f"[traced] the inputs ({given}) fit no trace of the function: it takes {wanted}")


# While a group traces a function, on the tracing thread only: all_sum is a marker
# (mx.depends([x], [x]); the shim puts MLX's all_sum in its place at each call),
# mlx.nn's sum_gradients (a gradient rule MLX cannot export) is left out, and the
# other collectives are refused. Other threads see MLX's functions.
_tracing = threading.local()
_MLX_ALL_SUM = mx.distributed.all_sum
_MLX_SUM_GRADIENTS = _nn_distributed.sum_gradients
_UNTRACEABLE = ("all_gather", "all_max", "all_min", "sum_scatter", "send", "recv", "recv_like")
_MLX_UNTRACEABLE = {name: getattr(mx.distributed, name) for name in _UNTRACEABLE}
_markers_lock = threading.Lock()
_markers_users = 0
_sum_gradients_importers: list[Any] = []  # modules whose own sum_gradients is marked while tracing


def _marked_all_sum(x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
    group = getattr(_tracing, "group", None)
    if group is None:
        return _MLX_ALL_SUM(x, *args, **kwargs)
    theirs = kwargs.get("group")
    if theirs is not None and (theirs.rank(), theirs.size()) != (group.rank(), group.size()):
        raise InvalidArgument(f"[trace] the function calls all_sum over another group (rank {theirs.rank()} of "
                              f"{theirs.size()}) than the one tracing it (rank {group.rank()} of {group.size()})")
    return mx.depends([x], [x])[0]  # one rank too: the file may be loaded over more


_marked_all_sum.__name__ = _marked_all_sum.__qualname__ = "all_sum"  # as MLX's, in messages naming it


def _marked_sum_gradients(group: Any) -> Callable[[mx.array], mx.array]:
    if getattr(_tracing, "group", None) is None:
        return _MLX_SUM_GRADIENTS(group)
    return lambda x: x


def _untraceable(name: str) -> Callable[..., Any]:
    def collective(*args: Any, **kwargs: Any) -> Any:
        if getattr(_tracing, "group", None) is None:
            return _MLX_UNTRACEABLE[name](*args, **kwargs)
        raise InvalidArgument(f"[trace] a group traces all_sum only; the function calls mx.distributed.{name}, "
                              "which MLX cannot export")
    return collective


def _importers_of(function: Any) -> list[Any]:
    """Modules holding `function` under its own name: those that imported it by name (a few
    of mlx-lm's MoE families import ``sum_gradients`` so). Read from their dicts: a module's
    ``__getattr__`` may import things."""
    name = function.__name__
    return [module for module in list(sys.modules.values())
            if (getattr(module, "__dict__", None) or {}).get(name) is function]


@contextlib.contextmanager
def _collectives_as_markers():
    global _markers_users, _sum_gradients_importers
    with _markers_lock:
        _markers_users += 1
        mx.distributed.all_sum = _marked_all_sum
        _nn_distributed.sum_gradients = _marked_sum_gradients
        _sum_gradients_importers = _sum_gradients_importers or _importers_of(_MLX_SUM_GRADIENTS)
        for module in _sum_gradients_importers:
            module.sum_gradients = _marked_sum_gradients
        for name in _UNTRACEABLE:
            setattr(mx.distributed, name, _untraceable(name))
    try:
        yield
    finally:
        with _markers_lock:
            _markers_users -= 1
            if not _markers_users:
                mx.distributed.all_sum = _MLX_ALL_SUM
                _nn_distributed.sum_gradients = _MLX_SUM_GRADIENTS
                for module in _sum_gradients_importers:
                    module.sum_gradients = _MLX_SUM_GRADIENTS
                _sum_gradients_importers = []
                for name, original in _MLX_UNTRACEABLE.items():
                    setattr(mx.distributed, name, original)


_groups: dict[str, Group] = {}  # by backend asked for; MLX caches its groups the same way
_failed: DistributedError | None = None  # a start-up that timed out (MLX's attempt is still parked)
_world: Group | None = None

DEFAULT_INIT_TIMEOUT = 60.0


def init(strict: bool = False, backend: str = "any", *, timeout: float | None = None,
         device: Any = None, init_timeout: float | None = DEFAULT_INIT_TIMEOUT) -> Group:
    """Initialise MLX's communication backend; the group of every rank.

    ``strict`` and ``backend`` are MLX's (``"any"``, ``"ring"``, ``"mpi"``,
    ``"jaccl"``, ``"nccl"``); without a launcher and with ``strict=False``
    the group is this process alone (size 1, collectives return their
    input). ``timeout`` is the group's default for its collectives, in
    seconds. ``device`` is where its collectives run (default: the GPU for
    NCCL, else the CPU, where the ring, MPI and JACCL backends work).
    ``init_timeout`` bounds the wait for the other ranks to connect (None:
    no bound); past it, ``DistributedError``. Calling it again with the same
    backend, or with ``"any"`` once a backend is started, returns the same
    group (a different ``device`` is an error).

    Example:
        >>> group = ea.distributed.init(backend="ring", timeout=30)
        >>> total = await ea.distributed.all_sum(mx.array([group.rank()]))
    """
    global _world
    if not isinstance(strict, bool):  # as MLX's init, which takes a bool only
        raise InvalidArgumentType(f"[init] strict must be a bool, got {type(strict).__name__}")
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise InvalidArgument(f"[init] backend must be one of {_BACKENDS}, got {backend!r}")
    timeout = _check_timeout(timeout)
    init_timeout = _check_timeout(init_timeout, "init_timeout")
    kind = None
    if device is not None:
        kind = device.type if isinstance(device, mx.Device) else device
        if not isinstance(kind, mx.DeviceType):
            raise InvalidArgumentType(f"[init] device must be an mx.Device or mx.DeviceType, got {device!r}")
    group = _groups.get(backend)
    if group is None and backend == "any" and _world is not None:
        # MLX's "any" hands back the backend already started: the same communicator, so the
        # same Group (a second one would put collectives on the wire from a second thread).
        group = _groups[backend] = _world
    if group is None:
        if _failed is not None:  # a second attempt would wait behind the first, with the GIL held
            raise DistributedError(str(_failed)) from _failed
        raw = _start(strict, backend, init_timeout)
        if kind is None:
            kind = mx.gpu if backend == "nccl" else mx.cpu
        group = _groups[backend] = Group(raw, backend=backend, timeout=timeout, device=kind)
    else:
        if kind is not None and kind != group.device:
            raise InvalidArgument(f"[init] the {backend!r} group runs its collectives on {group.device} already; "
                             f"it cannot move to {kind}")
        if timeout is not None:
            group.timeout = timeout
    _world = group
    return group


def _start(strict: bool, backend: str, limit: float | None) -> mx.distributed.Group:
    """MLX's init, given up after `limit` seconds (it cannot be interrupted).

    The wait happens in the shim without the GIL: mx.distributed.init holds
    it while MLX waits for the peers, which would freeze every thread.
    """
    global _failed
    status = lib.emlx_distributed_start(int(bool(strict)), backend.encode(), -1.0 if limit is None else limit)
    if status == lib.EMLX_DIST_TIMED_OUT:
        _failed = DistributedError(
            f"[init] the {backend!r} backend did not connect to the other ranks within {limit} s (a peer did not "
            "start, or exited before init); MLX cannot stop waiting, so this process cannot start a backend again")
        raise _failed
    if status == lib.EMLX_DIST_BAD_VALUE:
        raise MLXValueError(last_error())
    if status != lib.EMLX_DIST_STARTED:  # no launcher, no MPI library, ...: MLX's reason, as an EMLXError
        raise DistributedError(f"[init] the {backend!r} backend did not start: {last_error()}")
    return mx.distributed.init(strict=bool(strict), backend=backend)  # MLX's cached group now: at once


def world() -> Group:
    """The group of the last ``init()`` (initialising the default one if none)."""
    return _world if _world is not None else init()


def _check_timeout(timeout: Any, name: str = "timeout") -> float | None:
    if timeout is None:
        return None
    try:
        seconds = float(timeout) if isinstance(timeout, numbers.Real) and not isinstance(timeout, bool) else None
    except OverflowError:  # an int past float range
        seconds = None
    if seconds is None or not seconds > 0:  # NaN too
        raise InvalidArgument(f"{name} must be a positive number of seconds or None, got {timeout!r}")
    return None if seconds == math.inf else seconds


def _retrieve(future: Any) -> None:
    """Mark a discarded job's failure as seen (no "never retrieved" report)."""
    if not future.cancelled():
        future.exception()


def _group_of(group: Group | None) -> Group:
    if group is None:
        return world()
    if not isinstance(group, Group):
        raise InvalidArgumentType(f"group must be an ea.distributed.Group (from ea.distributed.init()), "
                        f"got {type(group).__name__}")
    return group


def _check_array(name: str, x: Any) -> None:
    if not isinstance(x, mx.array):
        raise InvalidArgumentType(f"[{name}] x must be an mx.array, got {type(x).__name__}")


def _check_peer(name: str, what: str, peer: Any, group: Group) -> int:
    if isinstance(peer, bool) or not isinstance(peer, numbers.Integral):
        raise InvalidArgumentType(f"[{name}] {what} must be an int rank, got {peer!r}")
    if not 0 <= peer < group.size() or peer == group.rank():
        raise InvalidArgument(f"[{name}] {what}={peer} must be another rank of the group "
                         f"(this is rank {group.rank()} of {group.size()})")
    if group.backend == "ring" and (peer - group.rank()) % group.size() not in (1, group.size() - 1):
        raise InvalidArgument(f"[{name}] the ring backend only talks to its neighbours: rank {group.rank()} "
                         f"cannot reach rank {peer}")
    return int(peer)


# The header each collective exchanges first: kind, dtype, ndim, element
# count, the first dims (0-padded), then a checksum of the dims past them
# (0 if none). int64, so 136 bytes on the wire.
_HEADER_DIMS = 12
_KINDS = ("all_sum", "all_max", "all_min", "all_gather", "sum_scatter", "send")
_DTYPE_NAMES = {code: str(dtype).removeprefix("mlx.core.") for code, dtype in enumerate(DTYPES)}


def _header(kind: str, shape: Sequence[int], dtype: mx.Dtype) -> list[int]:
    dims = [int(d) for d in shape]
    rest = zlib.crc32(b"".join(d.to_bytes(8, "little") for d in dims[_HEADER_DIMS:])) if len(dims) > _HEADER_DIMS else 0
    return [_KINDS.index(kind), DTYPE_CODES.get(dtype, -1), len(dims), math.prod(dims)] + dims[:_HEADER_DIMS] + \
        [0] * (_HEADER_DIMS - len(dims[:_HEADER_DIMS])) + [rest]


def _describe(header: list[int]) -> str:
    kind, dtype, ndim, size = header[:4]
    name = _KINDS[kind] if 0 <= kind < len(_KINDS) else f"an unknown collective ({kind})"
    dims = header[4:4 + min(ndim, _HEADER_DIMS)] + (["..."] if ndim > _HEADER_DIMS else [])
    shape = "(" + ", ".join(map(str, dims)) + ("," if ndim == 1 else "") + ")"
    return f"{name} of {shape} {_DTYPE_NAMES.get(dtype, f'dtype {dtype}')} ({size} elements)"


def _exchange(name: str, header: list[int], peer: int | None, kwargs: dict) -> None:
    """On the group's worker, before a collective: every rank's header must match this one.

    A send's header goes to its `peer` first and a recv's comes from it; the
    others gather every rank's.
    """
    group = kwargs["group"]
    if group.size() == 1:
        return
    mine = mx.array(header, dtype=mx.int64)
    if name == "recv":
        headers = {peer: mx.distributed.recv_like(mine, peer, **kwargs)}
    elif name == "send":
        mx.eval(mx.distributed.send(mine, peer, **kwargs))
        return
    else:
        gathered = mx.distributed.all_gather(mine[None], **kwargs)
        headers = dict(enumerate(gathered))
    mx.eval(list(headers.values()))
    for rank, theirs_array in headers.items():
        got: list[int] = theirs_array.tolist()  # type: ignore[assignment]  # an int64 row
        if got != header:
            past = "" if _describe(got) != _describe(header) else \
                f" (their shapes differ past the first {_HEADER_DIMS} dimensions)"
            raise _Mismatch(f"the ranks issued different collectives: rank {group.rank()} has {_describe(header)}, "
                            f"rank {rank} has {_describe(got)}{past}")


def _collective_job(op: Callable, args: tuple, kwargs: dict, header: tuple | None = None) -> mx.array:
    """On the group's worker: build the collective, then evaluate it."""
    stream = kwargs.get("stream")
    if isinstance(stream, mx.Stream) and stream != mx.default_stream(stream.device):
        # MLX streams are per thread: evaluating on another thread's fails mid-collective, a break.
        raise InvalidArgument(f"[{op.__name__}] stream={stream} is another thread's (MLX streams belong to the thread "
                         "that made them); pass a device such as mx.cpu to run on the group's worker")
    out = op(*args, **kwargs)  # argument errors raise here and leave the group intact
    try:
        if header is not None:
            _exchange(*header, kwargs)
        mx.eval(out)
    except _Mismatch:
        raise
    except Exception as exc:  # noqa: BLE001 - the ranks are out of step: a break
        raise _PeerFailure(exc) from exc
    return out


async def _collective(name: str, op: Callable, args: tuple, group: Group | None, stream: Any,
                      queue: CommandQueue | None, timeout: float | None, *, header: tuple | None = None,
                      ) -> mx.array:
    g = _group_of(group)
    g.check()
    if queue is not None and not isinstance(queue, CommandQueue):
        raise InvalidArgumentType(f"[{name}] queue must be an ea CommandQueue or None, got {type(queue).__name__}")
    kwargs: dict[str, Any] = {"group": g.mlx_group}
    if stream is not None:
        kwargs["stream"] = stream
    if header is None and isinstance(args[0], mx.array):  # every rank issues the same one
        header = (name, _header(name, args[0].shape, args[0].dtype), None)
    target = queue if queue is not None else g.queue()
    return await g._await(target, lambda: target.run(_collective_job, op, args, kwargs, header), timeout, name)


async def all_sum(x: mx.array, /, *, group: Group | None = None, stream: Any = None,
                  queue: CommandQueue | None = None, timeout: float | None = None) -> mx.array:
    """All-reduce sum: every rank gets the sum of every rank's `x`.

    Example:
        >>> total = await ea.distributed.all_sum(mx.array([1.0]))  # == group.size()
    """
    _check_array("all_sum", x)
    return await _collective("all_sum", mx.distributed.all_sum, (x,), group, stream, queue, timeout)


async def all_max(x: mx.array, /, *, group: Group | None = None, stream: Any = None,
                  queue: CommandQueue | None = None, timeout: float | None = None) -> mx.array:
    """All-reduce max: the element-wise maximum over the ranks."""
    _check_array("all_max", x)
    return await _collective("all_max", mx.distributed.all_max, (x,), group, stream, queue, timeout)


async def all_min(x: mx.array, /, *, group: Group | None = None, stream: Any = None,
                  queue: CommandQueue | None = None, timeout: float | None = None) -> mx.array:
    """All-reduce min: the element-wise minimum over the ranks."""
    _check_array("all_min", x)
    return await _collective("all_min", mx.distributed.all_min, (x,), group, stream, queue, timeout)


async def all_gather(x: mx.array, /, *, group: Group | None = None, stream: Any = None,
                     queue: CommandQueue | None = None, timeout: float | None = None) -> mx.array:
    """Every rank's `x` concatenated along the first axis, in rank order."""
    _check_array("all_gather", x)
    return await _collective("all_gather", mx.distributed.all_gather, (x,), group, stream, queue, timeout)


async def sum_scatter(x: mx.array, /, *, group: Group | None = None, stream: Any = None,
                      queue: CommandQueue | None = None, timeout: float | None = None) -> mx.array:
    """The sum over the ranks, split along the first axis: rank r gets the r-th part."""
    _check_array("sum_scatter", x)
    g = _group_of(group)
    if g.backend in ("ring", "jaccl") and g.size() > 1:  # MLX fails it mid-run, which would break the group
        raise InvalidArgument(f"[sum_scatter] the {g.backend} backend has no sum_scatter (NCCL and MPI have it); "
                         "use all_sum and slice")
    if x.ndim == 0 or x.shape[0] % g.size():
        raise InvalidArgument(f"[sum_scatter] the first axis ({x.shape[0] if x.ndim else 'a scalar'}) must divide "
                         f"evenly among {g.size()} ranks")
    return await _collective("sum_scatter", mx.distributed.sum_scatter, (x,), g, stream, queue, timeout)


async def send(x: mx.array, dst: int, /, *, group: Group | None = None, stream: Any = None,
               queue: CommandQueue | None = None, timeout: float | None = None) -> mx.array:
    """Send `x` to rank `dst`; completes when it is sent (the ring backend: neighbours only)."""
    _check_array("send", x)
    g = _group_of(group)
    dst = _check_peer("send", "dst", dst, g)
    return await _collective("send", mx.distributed.send, (x, dst), g, stream, queue, timeout,
                             header=("send", _header("send", x.shape, x.dtype), dst))


async def recv(shape: Sequence[int], dtype: mx.Dtype, src: int, /, *, group: Group | None = None,
               stream: Any = None, queue: CommandQueue | None = None,
               timeout: float | None = None) -> mx.array:
    """Receive an array of `shape` and `dtype` from rank `src`."""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or any(
            isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 0 for d in shape):
        raise InvalidArgument(f"[recv] shape must be a sequence of non-negative ints, got {shape!r}")
    if not isinstance(dtype, mx.Dtype):
        raise InvalidArgumentType(f"[recv] dtype must be an mx.Dtype, got {dtype!r}")
    shape = [int(d) for d in shape]
    # Past these MLX fails inside the job (a bare OverflowError, or std::bad_cast that broke the group).
    if any(d > MAX_DIM for d in shape) or math.prod(shape) > INT_RANGES[mx.int64][1]:
        raise MLXOverflowError(f"[recv] shape {tuple(shape)} does not fit MLX: each dimension at most {MAX_DIM}, "
                               f"and at most {INT_RANGES[mx.int64][1]} elements")
    g = _group_of(group)
    src = _check_peer("recv", "src", src, g)
    return await _collective("recv", mx.distributed.recv, (shape, dtype, src), g, stream, queue, timeout,
                             header=("recv", _header("send", shape, dtype), src))


async def recv_like(x: mx.array, src: int, /, *, group: Group | None = None, stream: Any = None,
                    queue: CommandQueue | None = None, timeout: float | None = None) -> mx.array:
    """Receive an array shaped and typed like `x` from rank `src`."""
    _check_array("recv_like", x)
    g = _group_of(group)
    src = _check_peer("recv_like", "src", src, g)
    return await _collective("recv_like", mx.distributed.recv_like, (x, src), g, stream, queue, timeout,
                             header=("recv", _header("send", x.shape, x.dtype), src))


__all__ = ["CollectiveFunction", "DistributedError", "Group", "Issued", "all_gather", "all_max", "all_min", "all_sum", "init", "recv",
           "recv_like", "send", "sum_scatter", "world"]
