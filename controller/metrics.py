"""Prometheus metrics of the operator (served on EMBEDJOB_METRICS_PORT, path /metrics)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from embedjob.api_status import JobState

from .job_metrics import JOB_GAUGES, Samples, job_samples

RECONCILES = Counter("embedjob_reconciles_total", "Handler runs, by handler.", ["handler"])
ERRORS = Counter("embedjob_reconcile_errors_total", "Handler runs that raised, by handler and error.",
                 ["handler", "error"])
LATENCY = Histogram("embedjob_reconcile_duration_seconds", "Handler run time, by handler.", ["handler"],
                    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
POOL_REMOVALS = Counter("embedjob_pool_removals_total",
                        "Detached actor pools removed from shared Ray clusters, by reason.", ["reason"])
POOL_LEASES_UNCONFIRMED = Gauge("embedjob_pool_leases_unconfirmed",
                                "Pool lease rows Kubernetes does not confirm (the pool sweep ignores them), by reason.",
                                ["reason"])
JOBS = Gauge("embedjob_jobs", "EmbeddingJobs this operator tracks, by state.", ["state"])
PER_JOB = {name: Gauge(name, help_text, list(labels)) for name, (help_text, labels) in JOB_GAUGES.items()}
SCHEDULE_PENDING_TICKS = Gauge(
    "embedjob_schedule_pending_ticks",
    "A scheduled job's ticks that are due and not started because a run is active (concurrencyPolicy Forbid); "
    "at most one of them will start, the latest due when that run ends. 0 when none waits or while suspended; "
    "101: more than 100.", ["namespace", "embeddingjob"])


@contextmanager
def reconcile(handler: str) -> Iterator[None]:
    RECONCILES.labels(handler).inc()
    started = time.perf_counter()
    try:
        yield
    except Exception as exc:
        ERRORS.labels(handler, type(exc).__name__).inc()
        raise
    finally:
        LATENCY.labels(handler).observe(time.perf_counter() - started)


class JobStates:
    """The state of every tracked job, kept in the `embedjob_jobs` gauge, and each job's own series
    (`job_metrics`), removed when the job is forgotten."""

    def __init__(self) -> None:
        self._states: dict[str, str] = {}
        self._samples: dict[str, Samples] = {}
        for state in JobState:
            JOBS.labels(state.value).set(0)

    def observe(self, uid: str, job: dict, stored: dict) -> None:
        """The job's status as the keeper stored it."""
        if stored.get("state"):
            self._set_state(uid, stored["state"])
        samples = job_samples(job["metadata"], job.get("spec") or {}, stored)
        self._replace_samples(uid, samples)

    def _set_state(self, uid: str, state: str) -> None:
        old = self._states.get(uid)
        if old == state:
            return
        if old is not None:
            JOBS.labels(old).dec()
        self._states[uid] = state
        JOBS.labels(state).inc()

    def _replace_samples(self, uid: str, samples: Samples) -> None:
        for name, labels in self._samples.get(uid, {}).keys() - samples.keys():
            PER_JOB[name].remove(*labels)
        for (name, labels), value in samples.items():
            PER_JOB[name].labels(*labels).set(value)
        if samples:
            self._samples[uid] = samples
        else:
            self._samples.pop(uid, None)

    def forget(self, uid: str) -> None:
        old = self._states.pop(uid, None)
        if old is not None:
            JOBS.labels(old).dec()
        self._replace_samples(uid, {})


def serve(port: int) -> None:
    """Serve /metrics in a background thread (port 0: no metrics endpoint)."""
    if port:
        start_http_server(port)
