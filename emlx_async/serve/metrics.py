"""Prometheus metrics for the service, on a registry of the app's own
(two apps in one process do not collide)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
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


class Metrics:
    """The service's metrics; `runtime_stats` returns ``rt.stats()`` (None before the runtime exists)."""

    def __init__(self, active: Callable[[], float], waiting: Callable[[], float],
                 prefix_hits: Callable[[], float], prefix_tokens: Callable[[], float],
                 runtime_stats: Callable[[], Any] = lambda: None, prefix_bytes: Callable[[], float] = lambda: 0):
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(QueueCollector(runtime_stats))
        self.requests = Counter("emlx_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("emlx_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generated_tokens = Counter("emlx_generated_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("emlx_time_to_first_token_seconds",
                              "From admission to the first generated token", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("emlx_inter_token_latency_seconds", "Time between consecutive generated tokens",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.duration = Histogram("emlx_request_duration_seconds", "Generation requests from admission to end",
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.active = Gauge("emlx_requests_active", "Requests holding an engine slot", registry=r)
        self.active.set_function(active)
        self.waiting = Gauge("emlx_requests_waiting", "Admitted requests waiting for an engine slot", registry=r)
        self.waiting.set_function(waiting)
        self.loop_lag = Histogram("emlx_event_loop_lag_seconds",
                                  "How late the event loop wakes a periodic ticker", buckets=_LAG_BUCKETS, registry=r)
        self.prefix_hits = Gauge("emlx_prompt_cache_hits", "Prompts that started from a cached prefix", registry=r)
        self.prefix_hits.set_function(prefix_hits)
        self.prefix_tokens = Gauge("emlx_prompt_cache_reused_tokens", "Prompt tokens not prefilled thanks to the "
                                   "prompt cache", registry=r)
        self.prefix_tokens.set_function(prefix_tokens)
        self.prefix_bytes = Gauge("emlx_prompt_cache_bytes", "Bytes of keys and values the prompt cache keeps",
                                  registry=r)
        self.prefix_bytes.set_function(prefix_bytes)
        self.cancelled = Counter("emlx_requests_cancelled", "Generations cancelled (client gone or shutdown)",
                                 registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def watch_loop_lag(self, interval: float = 0.1) -> None:
        """Runs until cancelled: a ticker whose lateness is the loop's lag."""
        while True:
            start = time.perf_counter()
            await anyio.sleep(interval)
            self.loop_lag.observe(max(0.0, time.perf_counter() - start - interval))
