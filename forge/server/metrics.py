"""Prometheus metrics of one server (a registry per app, so several apps can share a process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """Counters and histograms updated by the handlers; gauges read from the scheduler."""

    def __init__(self, stats: Callable[[], dict[str, float]]):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("forge_requests", "HTTP requests to the generation endpoints",
                                ["endpoint", "status"], registry=r)  # fmt: skip
        self.prompt_tokens = Counter("forge_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generated_tokens = Counter("forge_generated_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("forge_time_to_first_token_seconds",
                              "Time from request to its first generated token",
                              buckets=_LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.tpot = Histogram("forge_time_per_output_token_seconds",
                              "Time between consecutive generated tokens of a request",
                              buckets=_LATENCY_BUCKETS, registry=r)  # fmt: skip
        self._stats = stats
        for key, name, doc in (
            ("waiting", "forge_queue_depth", "Requests waiting to be scheduled"),
            ("running", "forge_running_sequences", "Sequences in the running batch"),
            ("kv_usage", "forge_kv_cache_usage_ratio", "Fraction of KV cache blocks in use"),
            ("cancelled", "forge_cancelled_sequences", "Sequences cancelled so far (disconnects)"),
            ("preemptions", "forge_preemptions", "Sequences preempted for KV space so far"),
            ("steps", "forge_steps", "Forward passes run so far"),
            ("prompt_steps", "forge_prompt_steps", "Forward passes so far that held prompt tokens"),
        ):
            Gauge(name, doc, registry=r).set_function(lambda key=key: self._stat(key))

    def _stat(self, key: str) -> float:
        return float(self._stats().get(key, 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
