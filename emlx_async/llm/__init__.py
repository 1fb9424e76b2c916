"""Concurrent LLM decode streams on emlx_async queues (needs mlx-lm and tokenizers).

The modules, bottom-up (each imports only those above it in this list):

* ``_gguf``: reading a GGUF file's weights, vocabulary and metadata.
* ``types``: what a generation streams (Delta, RequestStats) and its errors.
* ``prompt_cache``: keys and values of earlier prompts, reused by later ones.
* ``cache_options``: mlx-lm's KV-cache options (max_kv_size, kv_bits, kv_group_size).
* ``penalties``: penalties, logit bias and min-p: options, token history, the math both steps share.
* ``traced``: sampling inside a traced step, its options as inputs.
* ``replay_step``: any mlx-lm model's decode step over fixed cache buffers, traced and replayed.
* ``state``: what each decode path keeps on its worker, as dataclasses.
* ``sampling``: the Python sampler and the checking of sampling options.
* ``grammar``: grammar-constrained decoding (llguidance): token masks per request.
* ``text``: prompts to ids (chat safety), streaming detokenization, stop strings.
* ``model_fixes``: fixes of mlx-lm's model code so more families replay and batch (applied at load).
* ``loading``: a GGUF file or an mlx-lm folder, and the facts read off the model.
* ``decoding``: what every decode path reads, mlx-lm's chunked prefill, the Python step.
* ``traces``: the replayed step's traces, one per shape.
* ``parallel``: mode "parallel", a pooled queue per request (Python and replayed steps).
* ``batching``: mode "batch", the batch driver and mlx-lm's BatchGenerator as jobs.
* ``batch_replay``: mode "batch" with the replayed step.
* ``save``: a loaded model written as an mlx-lm folder.
* ``engine``: ``Engine``, the public face that ties them together.
* ``sharded``: ``ShardedEngine``, the batch jobs run on every rank of a group.
"""

from .engine import CHOICE_SEED_STEP as CHOICE_SEED_STEP
from .engine import Engine as Engine
from .grammar import Grammar as Grammar
from .grammar import GrammarError as GrammarError
from .grammar import GrammarStateError as GrammarStateError
from .penalties import InvalidOption as InvalidOption
from .prompt_cache import PrefixCache as PrefixCache
from .text import SpecialTokenText as SpecialTokenText
from .types import BatchDriverError as BatchDriverError
from .types import BatchingRefused as BatchingRefused
from .types import MAX_CHOICES as MAX_CHOICES
from .types import Delta as Delta
from .types import EngineBusy as EngineBusy
from .types import RequestStats as RequestStats

__all__ = ["BatchDriverError", "BatchingRefused", "CHOICE_SEED_STEP", "Delta", "Engine", "EngineBusy", "Grammar",
           "GrammarError", "GrammarStateError", "InvalidOption", "MAX_CHOICES", "PrefixCache", "RequestStats",
           "SpecialTokenText"]
