"""Concurrent LLM decode streams on emlx_async queues (needs mlx-lm and tokenizers)."""

from .engine import BatchDriverError as BatchDriverError
from .engine import Delta as Delta
from .engine import Engine as Engine
from .engine import EngineBusy as EngineBusy
from .engine import RequestStats as RequestStats
from .prompt_cache import PrefixCache as PrefixCache

__all__ = ["BatchDriverError", "Delta", "Engine", "EngineBusy", "PrefixCache", "RequestStats"]
