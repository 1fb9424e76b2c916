"""Every exception emlx_async raises to its users, and only here.

Each is an ``EMLXError`` and also inherits the builtin a user would catch
(``except ValueError`` keeps working). The modules that raise them re-export
them where users import them from (``emlx_async``, ``emlx_async.ipc``,
``emlx_async.llm``). Exceptions that never leave the package (control flow
inside one module, such as ``distributed._PeerFailure``) stay private where
they are used; tests/core/test_errors.py keeps it so.
"""

from __future__ import annotations


class EMLXError(Exception):
    """Base class of every error raised by emlx_async."""


class MLXRuntimeError(EMLXError, RuntimeError):
    """MLX raised a runtime error on a worker; the message is MLX's own."""


class MLXValueError(EMLXError, ValueError):
    """MLX rejected an argument (``std::invalid_argument``); MLX's message."""


class MLXIndexError(EMLXError, IndexError):
    """MLX raised ``std::out_of_range``; MLX's message."""


class MLXOverflowError(EMLXError, OverflowError):
    """A value does not fit the C++ type MLX stores it in (``std::overflow_error``)."""


class InvalidArgument(EMLXError, ValueError):
    """An argument emlx_async itself refuses before doing any work; the message names it.

    MLX's own refusals are ``MLXValueError``; this is for the package's checks
    outside MLX (an engine option, a collective's peer, a shared-memory name).
    """


class InvalidArgumentType(EMLXError, TypeError):
    """An argument of a type emlx_async itself refuses; the message names it and the type."""


class InvalidState(EMLXError, RuntimeError):
    """A call its object cannot take now: it is closed, busy, not started, or the wrong rank for it."""


class QueueFull(EMLXError):
    """A queue is at ``max_pending`` and the caller asked not to wait."""


class QueueClosed(EMLXError, RuntimeError):
    """The queue was closed; it takes no new jobs."""


class RuntimeClosed(EMLXError, RuntimeError):
    """The runtime was closed, or belongs to another event loop."""

    def __init__(self, message: str = "the emlx_async runtime is closed") -> None:
        super().__init__(message)


class QueueReleaseError(EMLXError, RuntimeError):
    """A queue was given back to a pool that did not lend it, or given back twice."""


class CancelledJob(EMLXError):
    """Under trio: the job awaited was cancelled (``cancel()``, or another task awaiting it was).

    A cancelled awaiter cancels the job for every awaiter, as under asyncio,
    where the others get ``asyncio.CancelledError``; trio has no such error
    for a task that was not cancelled itself, so they get this one.
    """


class HostCallDeadlock(EMLXError, RuntimeError):
    """A host callback awaited the very queue whose worker is waiting for it."""


class DeviceUnavailable(EMLXError, ValueError):
    """The requested device has no backend in this MLX build."""


class ForkedProcessError(EMLXError, RuntimeError):
    """MLX or a runtime was used in a child process after ``fork``.

    Threads do not survive ``fork``: a runtime made in the parent is unusable
    in the child, and once the parent has evaluated anything with MLX, the
    child cannot use MLX at all (its stream threads are the parent's, gone).
    Start such children with the ``spawn`` or ``forkserver`` method.
    """


class HostCallError(EMLXError, RuntimeError):
    """A host call failed (raised, timed out, was cancelled or returned bad outputs)."""


class ForeignLazyArrayError(EMLXError, ValueError):
    """A lazy array whose graph belongs to a thread that no queue owns.

    MLX streams are thread-local: such an array can only be evaluated on the
    thread that built it. Evaluate it there (``mx.eval``) before passing it in.
    """


class DistributedError(EMLXError, RuntimeError):
    """A distributed group is broken: a collective timed out or a peer failed.

    Every later collective on the group raises it at once; the group cannot
    be repaired (the ranks no longer agree on which collective comes next).
    Start the ranks again.
    """


class OptionTypeError(EMLXError, TypeError):
    """An option of a type mlx's binding would refuse; the generated functions ask mlx for its message."""


class InvalidInputType(OptionTypeError, MLXValueError):
    """mlx's ValueError for a value no array is made of (a list, an object ndarray).

    An OptionTypeError too: where mlx's parameter is a plain ``array`` its
    binding refuses the value with a TypeError, which the generated functions ask mlx for.
    """


class SharedMemoryError(EMLXError, OSError):
    """A shared-memory object could not be created, opened, read or removed."""


# ---- the LLM layer's (emlx_async.llm) ------------------------------------------

class EngineBusy(QueueFull):
    """Every request slot is taken and the caller asked not to wait."""


class BatchDriverError(EMLXError, RuntimeError):
    """The batch driver failed; each request it carried gets one, chained to the cause."""


class BatchingRefused(EMLXError, ValueError):
    """Batch mode refused for a model whose batch gives its rows other logits than
    each row alone (mlx-lm's gemma2 as mlx-lm has it; ``llm.model_fixes.fix_batch_masks`` fixes
    it): parallel mode serves it right."""


class GrammarError(EMLXError, ValueError):
    """A grammar that cannot be used: invalid, unsupported, or unsatisfiable. The message names why."""


class GrammarStateError(EMLXError, RuntimeError):
    """A request's grammar failed while decoding (a token it rejects, a parser limit).

    Only that request is affected: its matcher stays in the error state and
    other requests, and their matchers, go on.
    """


class InvalidOption(InvalidArgument):
    """A bad sampling option; ``option`` names it (the service answers a 400 naming the field)."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


class SpecialTokenText(EMLXError, ValueError):
    """Special-token text where the template renders it as it is (a tool, a call's arguments,
    a template option): `field` says where, as (``"tools"``, index), (``"template_kwargs"``,
    name) or (``"messages"``, index, key)."""

    def __init__(self, message: str, field: tuple):
        super().__init__(message)
        self.field = field


class NotTraceable(EMLXError, ValueError):
    """What cannot be traced, the message says which: a model's caches (or its use of them)
    that have no fixed-buffer form, or a function ``ea.trace`` traces that reads an array's
    value (``.item()``, ``.tolist()``, ``np.array``; MLX's refusal is the cause)."""


# error_kind values (EMLX_ERR_*) from cffi_src/common.h, in order: a
# completion record carries one, and so does every failed native call
# (emlx_last_error_kind).
_NATIVE_ERROR_CLASSES = (MLXRuntimeError, MLXValueError, MLXIndexError, MLXRuntimeError, MLXOverflowError,
                         RuntimeClosed)


def native_error(kind: int, message: str) -> EMLXError:
    """The exception for a native error kind: MLX's message, kept verbatim."""
    cls = _NATIVE_ERROR_CLASSES[kind] if 0 <= kind < len(_NATIVE_ERROR_CLASSES) else MLXRuntimeError
    return cls(message)


_MLX_BUILTINS = ((OverflowError, MLXOverflowError), (IndexError, MLXIndexError), (ValueError, MLXValueError),
                 (RuntimeError, MLXRuntimeError))


def mlx_error(exc: Exception) -> Exception:
    """An exception mlx.core raised (its builtin class) as this package's class for that
    builtin, message kept; an EMLXError or any other exception is returned as it is."""
    if isinstance(exc, EMLXError):
        return exc
    for builtin, ours in _MLX_BUILTINS:
        if isinstance(exc, builtin):
            return ours(*exc.args)
    return exc
