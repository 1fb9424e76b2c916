"""emlx_async: an asyncio actor runtime for MLX.

Native worker threads own MLX streams; every op is an awaitable; command
queues are actors you bind to tasks. See the README for the tour.
"""

# First: its fork check (see _native) counts this process's threads before
# numpy loads, whose BLAS threads, started in a fork child, would hide the fork.
from . import _native as _native
from ._api import eval as eval  # noqa: A004 - MLX's name
from ._api import item as item
from ._api import run as run
from ._api import synchronize as synchronize
from ._api import to_numpy as to_numpy
from ._context import bind as bind
from ._api import current_queue as current_queue
from ._routing import bound_queue as bound_queue
from ._errors import BatchDriverError as BatchDriverError
from ._errors import BatchingRefused as BatchingRefused
from ._errors import CancelledJob as CancelledJob
from ._errors import DeviceUnavailable as DeviceUnavailable
from ._errors import DistributedError as DistributedError
from ._errors import EMLXError as EMLXError
from ._errors import EngineBusy as EngineBusy
from ._errors import ForeignLazyArrayError as ForeignLazyArrayError
from ._errors import ForkedProcessError as ForkedProcessError
from ._errors import GrammarError as GrammarError
from ._errors import InvalidInputType as InvalidInputType
from ._errors import GrammarStateError as GrammarStateError
from ._errors import HostCallDeadlock as HostCallDeadlock
from ._errors import MLXIndexError as MLXIndexError
from ._errors import MLXOverflowError as MLXOverflowError
from ._errors import MLXRuntimeError as MLXRuntimeError
from ._errors import MLXValueError as MLXValueError
from ._errors import InvalidArgument as InvalidArgument
from ._errors import InvalidArgumentType as InvalidArgumentType
from ._errors import InvalidOption as InvalidOption
from ._errors import InvalidState as InvalidState
from ._errors import NotTraceable as NotTraceable
from ._errors import OptionTypeError as OptionTypeError
from ._errors import QueueClosed as QueueClosed
from ._errors import QueueFull as QueueFull
from ._errors import QueueReleaseError as QueueReleaseError
from ._errors import RuntimeClosed as RuntimeClosed
from ._errors import HostCallError as HostCallError
from ._errors import SharedMemoryError as SharedMemoryError
from ._errors import SpecialTokenText as SpecialTokenText
from ._host_call import host_call as host_call
from ._queue import CommandQueue as CommandQueue
from ._queue import QueueStats as QueueStats
from ._backend import JobFuture as JobFuture
from ._backend import TrioJobFuture as TrioJobFuture
from ._queue import cancelled as cancelled
from ._runtime import Runtime as Runtime
from ._runtime import RuntimeStats as RuntimeStats
from ._runtime import get_runtime as get_runtime
from ._version import __version__ as __version__
from . import attention as attention  # noqa: E402 - after the core names they use
from . import fast as fast  # noqa: E402
from . import distributed as distributed  # noqa: E402
from . import fft as fft  # noqa: E402
from . import ipc as ipc  # noqa: E402
from . import linalg as linalg  # noqa: E402
from . import memory as memory  # noqa: E402
from . import ops as ops  # noqa: E402
from . import random as random  # noqa: E402
from . import replay as replay  # noqa: E402
from .replay import CompiledFunction as CompiledFunction  # noqa: E402
from .replay import TracedFunction as TracedFunction  # noqa: E402
from .replay import compile as compile  # noqa: E402, A004 - MLX's name
from .replay import load_traced as load_traced  # noqa: E402
from .replay import trace as trace  # noqa: E402

__all__ = [
    "CommandQueue", "CompiledFunction", "TracedFunction", "compile", "load_traced", "trace",
    "BatchDriverError", "BatchingRefused", "CancelledJob", "DeviceUnavailable", "DistributedError", "EMLXError", "EngineBusy",
    "ForeignLazyArrayError", "ForkedProcessError", "GrammarError", "GrammarStateError", "InvalidInputType",
    "HostCallDeadlock", "HostCallError", "InvalidArgument", "InvalidArgumentType", "InvalidOption", "InvalidState", "JobFuture", "TrioJobFuture", "MLXIndexError", "MLXOverflowError", "MLXRuntimeError",
    "MLXValueError", "NotTraceable", "OptionTypeError", "QueueClosed", "QueueFull", "QueueReleaseError", "QueueStats", "Runtime",
    "RuntimeClosed", "RuntimeStats", "SharedMemoryError", "SpecialTokenText",
    "__version__", "attention", "bind", "bound_queue", "cancelled", "current_queue", "distributed", "eval", "fast", "fft",
    "get_runtime", "host_call", "ipc", "item", "linalg", "memory", "ops", "random", "replay", "run", "synchronize",
    "to_numpy",
]
