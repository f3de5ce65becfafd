"""Prometheus metrics of the driver, served on --metrics-port (or $EMBEDJOB_DRIVER_METRICS_PORT) when one is given."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from embedjob_worker.core.logs import log_event

log = logging.getLogger("embedjob_worker.metrics")


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

    def serve(self, port: int | None) -> None:
        """Serve /metrics on `port` (None or 0: nowhere). A port in use costs the metrics, not the run."""
        if not port:
            return
        try:
            start_http_server(port, registry=self.registry)
        except OSError as exc:
            log_event(log, "metrics_port_unavailable", logging.WARNING, port=port, error=str(exc))


def metrics_port_from_env(value: str | None) -> int | None:
    """The port $EMBEDJOB_DRIVER_METRICS_PORT names; None for unset, empty or not a port (logged)."""
    if not value:
        return None
    if value.isascii() and value.isdigit() and int(value) <= 65535:
        return int(value)
    log_event(log, "metrics_port_invalid", logging.WARNING, value=value[:64])
    return None
