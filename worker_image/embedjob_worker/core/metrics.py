"""Prometheus metrics of the driver, served on --metrics-port when one is given."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class DriverMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.batches = Counter("embedjob_batches", "Batches by final state (succeeded, failed, skipped).",
                               ["state"], registry=self.registry)
        self.records = Counter("embedjob_records", "Records by outcome (embedded, failed, truncated).",
                               ["outcome"], registry=self.registry)
        self.texts_per_second = Gauge("embedjob_texts_per_second", "Texts embedded per second in this run.",
                                      registry=self.registry)
        self.batch_latency = Histogram(
            "embedjob_batch_latency_seconds", "Submit-to-result time of a batch attempt.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128), registry=self.registry)
        self.retries = Counter("embedjob_batch_retries", "Batch attempts retried, by reason.", ["reason"],
                               registry=self.registry)
        self.oom_splits = Counter("embedjob_oom_splits", "Batches split in halves after out-of-memory.",
                                  registry=self.registry)
        self.model_load_seconds = Gauge("embedjob_model_load_seconds", "Model load time of the slowest actor.",
                                        registry=self.registry)

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
