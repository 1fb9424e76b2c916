"""Prometheus metrics for the service, on a registry of the app's own
(two apps in one process do not collide). What belongs to one model (its
tokens, latencies, slots, prompt cache, loads) carries a ``model`` label."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import anyio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

# Latency buckets from a fast GPU (ms) to a busy 2-core CPU (tens of seconds).
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class QueueCollector:
    """The runtime's per-queue counters (``rt.stats()``), read at scrape time.

    Labelled by queue ("cpu:3") and role ("default", "pool"); a queue's
    counters start from zero when a pool replaces it, which Prometheus
    treats as a counter reset.
    """

    def __init__(self, runtime_stats: Callable[[], Any]):
        self._runtime_stats = runtime_stats

    def describe(self) -> list[Metric]:
        return []  # families are only known at scrape time (queues come and go)

    def collect(self) -> Iterator[Metric]:
        stats = self._runtime_stats()
        labels = ["queue", "role"]
        busy = CounterMetricFamily("emlx_queue_busy_seconds", "Time the queue's worker spent running jobs",
                                   labels=labels)
        wait = CounterMetricFamily("emlx_queue_wait_seconds", "Summed time jobs waited from submission to start",
                                   labels=labels)
        jobs = CounterMetricFamily("emlx_queue_jobs", "Jobs by outcome (submitted, started, completed, failed, "
                                   "cancelled)", labels=[*labels, "outcome"])
        fraction = GaugeMetricFamily("emlx_queue_busy_fraction", "Busy time over the queue's lifetime",
                                     labels=labels)
        if stats is not None:
            for queue in stats.queues.values():
                key = [queue.name, queue.role]
                busy.add_metric(key, queue.run_time)
                wait.add_metric(key, queue.wait_time)
                fraction.add_metric(key, queue.busy_fraction)
                for outcome in ("submitted", "started", "completed", "failed", "cancelled"):
                    jobs.add_metric([*key, outcome], getattr(queue, outcome))
        yield from (busy, wait, jobs, fraction)


class ModelCollector:
    """Each served model's state, read at scrape time, labelled by model: its
    slots, its prompt cache and its constrained requests' mask time (since it was
    last loaded), whether it is loaded, and how often it was loaded and unloaded
    (serve/models.py's ServedModel)."""

    def __init__(self, models: Callable[[], Iterable[Any]]):
        self._models = models

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, documentation: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, labels=["model"])

        active = gauge("emlx_requests_active", "Requests holding an engine slot")
        waiting = gauge("emlx_requests_waiting", "Admitted requests waiting for an engine slot")
        hits = gauge("emlx_prompt_cache_hits", "Prompts that started from a cached prefix")
        reused = gauge("emlx_prompt_cache_reused_tokens", "Prompt tokens not prefilled thanks to the prompt cache")
        nbytes = gauge("emlx_prompt_cache_bytes", "Bytes of keys and values the prompt cache keeps")
        loaded = gauge("emlx_model_loaded", "1 while the model's engine is loaded")
        loads = CounterMetricFamily("emlx_model_loads", "Times the model was loaded (at start and after an unload)",
                                    labels=["model"])
        unloads = CounterMetricFamily("emlx_model_unloads", "Times the model was unloaded for being idle",
                                      labels=["model"])
        # Since the model was loaded. Mean mask time per step: mask_seconds / mask_computations.
        masks = CounterMetricFamily("emlx_grammar_masks", "Token masks computed for constrained requests",
                                    labels=["model"])
        computations = CounterMetricFamily("emlx_grammar_mask_computations",
                                           "Mask computations: one row's mask, or a batch round's rows at once",
                                           labels=["model"])
        mask_seconds = CounterMetricFamily("emlx_grammar_mask_seconds", "Wall time spent computing token masks "
                                           "(off the model's worker; a batch round's rows count once)",
                                           labels=["model"])
        for served in self._models():
            key = [served.name]
            cache = served.prefix_cache
            active.add_metric(key, served.active())
            waiting.add_metric(key, served.waiting())
            hits.add_metric(key, cache.hits if cache else 0)
            reused.add_metric(key, cache.reused_tokens if cache else 0)
            nbytes.add_metric(key, cache.nbytes if cache else 0)
            loaded.add_metric(key, 1 if served.engine is not None else 0)
            loads.add_metric(key, served.loads)
            unloads.add_metric(key, served.unloads)
            mask_time = getattr(served.engine, "mask_time", None)  # no engine while unloaded
            masks.add_metric(key, mask_time.masks if mask_time else 0)
            computations.add_metric(key, mask_time.computations if mask_time else 0)
            mask_seconds.add_metric(key, mask_time.seconds if mask_time else 0.0)
        yield from (active, waiting, hits, reused, nbytes, loaded, loads, unloads, masks, computations, mask_seconds)


class Metrics:
    """The service's metrics. `models` returns the served models (ModelCollector reads
    them); `runtime_stats` returns ``rt.stats()`` (None before the runtime exists).
    The per-model counters and histograms are used as ``metrics.ttft.labels(name)``."""

    def __init__(self, models: Callable[[], Iterable[Any]] = lambda: (),
                 runtime_stats: Callable[[], Any] = lambda: None):
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(QueueCollector(runtime_stats))
        r.register(ModelCollector(models))
        model = ["model"]
        self.requests = Counter("emlx_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("emlx_prompt_tokens", "Prompt tokens of admitted requests", model, registry=r)
        self.generated_tokens = Counter("emlx_generated_tokens", "Tokens generated", model, registry=r)
        self.ttft = Histogram("emlx_time_to_first_token_seconds", "From admission to the first generated token",
                              model, buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("emlx_inter_token_latency_seconds", "Time between consecutive generated tokens",
                             model, buckets=_LATENCY_BUCKETS, registry=r)
        self.duration = Histogram("emlx_request_duration_seconds", "Generation requests from admission to end",
                                  model, buckets=_LATENCY_BUCKETS, registry=r)
        self.loop_lag = Histogram("emlx_event_loop_lag_seconds",
                                  "How late the event loop wakes a periodic ticker", buckets=_LAG_BUCKETS, registry=r)
        self.cancelled = Counter("emlx_requests_cancelled", "Generations cancelled (client gone or shutdown)",
                                 model, registry=r)

    def add_model(self, name: str) -> None:
        """Start the model's series at zero (a labelled series exists only once it is used)."""
        for family in (self.prompt_tokens, self.generated_tokens, self.ttft, self.itl, self.duration,
                       self.cancelled):
            family.labels(name)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def watch_loop_lag(self, interval: float = 0.1) -> None:
        """Runs until cancelled: a ticker whose lateness is the loop's lag."""
        while True:
            start = time.perf_counter()
            await anyio.sleep(interval)
            self.loop_lag.observe(max(0.0, time.perf_counter() - start - interval))
