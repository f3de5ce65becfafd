"""Per-job Prometheus samples computed from a job's stored status: a pure function, no client library.

Each EmbeddingJob has its own series, labelled `namespace` and `embeddingjob` (not `job`,
which Prometheus gives every scraped series), so a dashboard or an alert can name the job.
A sync of a collection is a job that wrote it; `embedjob_job_last_success_timestamp_seconds`
also carries the vectors table and collection, so that the sync lag of a collection is
`time() - max by (namespace, vectors_table, collection) (...)` whichever job wrote it last.
"""

from __future__ import annotations

from typing import Any, Mapping

from embedjob.api_status import JobState

from .times import parse_time

#: metric name -> (help, label names). The operator declares these gauges from this table.
JOB_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "embedjob_job_state": ("1 for the job's current state (status.state), one series per job.",
                           ("namespace", "embeddingjob", "state")),
    "embedjob_job_last_success_timestamp_seconds": (
        "When the job completed (status.completionTime, Unix seconds); a scheduled job: when its latest "
        "completed run did (status.schedule.lastSuccessfulTime); a job that has not completed has none.",
        ("namespace", "embeddingjob", "vectors_table", "collection")),
    "embedjob_job_records": ("The newest run's record counters (status.progress), by outcome.",
                             ("namespace", "embeddingjob", "outcome")),
    "embedjob_job_texts_per_second": ("The newest run's texts per second (status.progress.textsPerSecond).",
                                      ("namespace", "embeddingjob")),
}

#: status.progress field -> the `outcome` label of embedjob_job_records
RECORD_OUTCOMES = {"recordsEmbedded": "embedded", "recordsFailed": "failed", "recordsNew": "new",
                   "recordsChanged": "changed", "recordsUnchanged": "unchanged", "recordsDeleted": "deleted"}

Samples = dict[tuple[str, tuple[str, ...]], float]


def job_samples(meta: Mapping[str, Any], spec: Mapping[str, Any], status: Mapping[str, Any]) -> Samples:
    """(metric, label values) -> value for one job, from its stored status (wire form)."""
    job = (meta.get("namespace", ""), meta.get("name", ""))
    samples: Samples = {}
    state = status.get("state")
    if state:
        samples["embedjob_job_state", (*job, state)] = 1.0
    schedule = status.get("schedule")
    if state == JobState.complete.value:
        completed = _unix_seconds(status.get("completionTime"))
    else:  # a scheduled job: its latest completed run's, kept after the history limit deletes that run
        completed = _unix_seconds(schedule.get("lastSuccessfulTime")) if isinstance(schedule, Mapping) else None
    if completed is not None:
        sink = spec.get("sink") or {}
        samples["embedjob_job_last_success_timestamp_seconds",
                (*job, str(sink.get("table") or ""), str(sink.get("collection") or ""))] = completed
    progress = status.get("progress")
    progress = progress if isinstance(progress, Mapping) else {}
    for field, outcome in RECORD_OUTCOMES.items():
        if _number(progress.get(field)) and isinstance(progress[field], int):
            samples["embedjob_job_records", (*job, outcome)] = float(progress[field])
    if _number(progress.get("textsPerSecond")):
        samples["embedjob_job_texts_per_second", job] = float(progress["textsPerSecond"])
    return samples


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _unix_seconds(timestamp: Any) -> float | None:
    moment = parse_time(timestamp)
    return moment.timestamp() if moment is not None else None
