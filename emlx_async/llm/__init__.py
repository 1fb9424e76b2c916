"""Concurrent LLM decode streams on emlx_async queues (needs mlx-lm and tokenizers)."""

from .engine import Engine as Engine
from .prompt_cache import PrefixCache as PrefixCache
from .types import BatchDriverError as BatchDriverError
from .types import Delta as Delta
from .types import EngineBusy as EngineBusy
from .types import RequestStats as RequestStats

__all__ = ["BatchDriverError", "Delta", "Engine", "EngineBusy", "PrefixCache", "RequestStats"]
