"""The service's Prometheus metrics (prometheus-client, one registry per app so that several apps in one process
do not share counters)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class ServiceMetrics:
    """Requests by endpoint and status, request latency, time queued before a forward, and the size of each
    forward in requests, texts and real tokens."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("bertology_requests", "HTTP requests by endpoint and status code",
                                ("endpoint", "method", "status"), registry=self.registry)
        self.latency = Histogram("bertology_request_duration_seconds", "HTTP request latency, first byte received "
                                 "to response sent", ("endpoint",), buckets=LATENCY_BUCKETS, registry=self.registry)
        self.in_flight = Gauge("bertology_requests_in_flight", "HTTP requests being served",
                               registry=self.registry)
        self.queue = Histogram("bertology_queue_seconds", "time an embedding request waited before its forward "
                               "started", buckets=QUEUE_BUCKETS, registry=self.registry)
        self.batch_requests = Histogram("bertology_batch_requests", "requests packed into one batch",
                                        buckets=COUNT_BUCKETS, registry=self.registry)
        self.batch_texts = Histogram("bertology_batch_texts", "texts in one batch", buckets=COUNT_BUCKETS,
                                     registry=self.registry)
        self.batch_tokens = Histogram("bertology_batch_tokens", "real tokens (specials included) in one batch",
                                      buckets=TOKEN_BUCKETS, registry=self.registry)
        self.forward = Histogram("bertology_batch_duration_seconds", "time to embed one batch on the worker thread",
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.decode_rows = Histogram("bertology_decode_rows", "rows of the running generation batch at one decoding "
                                     "step", buckets=COUNT_BUCKETS, registry=self.registry)
        self.generated = Counter("bertology_generated_tokens", "tokens chosen by the running generation batch",
                                 registry=self.registry)

    def decode_step(self, *, rows: int, tokens: int) -> None:
        """Record one decoding step of the running batch (called by `bertology.serve.decoding.Decoder`)."""
        self.decode_rows.observe(rows)
        self.generated.inc(tokens)

    def batch(self, *, requests: int, texts: int, tokens: int, seconds: float, waits: Sequence[float]) -> None:
        """Record one batch (called by the batcher)."""
        self.batch_requests.observe(requests)
        self.batch_texts.observe(texts)
        self.batch_tokens.observe(tokens)
        self.forward.observe(seconds)
        for wait in waits:
            self.queue.observe(wait)

    def request(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, method, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """The metrics in the Prometheus text format, and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def metric_value(text: str, name: str, labels: dict[str, Any] | None = None) -> float | None:
    """The value of one sample in an exposition (for tests and the benchmark), parsed with prometheus-client."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {k: str(v) for k, v in (labels or {}).items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in wanted.items()):
                return sample.value
    return None
