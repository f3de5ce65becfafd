"""Finished batches: one ready to be written (BatchOutcome, its AttemptRows), what it adds to the run's counters,
the writer that takes it (BatchWriter), and one an earlier session wrote (DoneBatch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Protocol

import numpy as np

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.records import BadRecord, Record, chunk_owners


def now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class AttemptRow:
    attempt: int
    worker: str | None
    outcome: str  # succeeded | retry | split | failed
    reason: str | None
    started_at: datetime | None
    finished_at: datetime = field(default_factory=now)


@dataclass
class BatchOutcome:
    """A batch's final result in this run, ready to be written."""

    batch_id: str
    state: str  # succeeded | failed
    records: tuple[Record, ...]
    attempts: list[AttemptRow]
    started_at: datetime
    vectors: np.ndarray | None = None  # on its way to a writer actor: the ray.ObjectRef of them
    worker: str | None = None
    error: str | None = None
    truncated: list[BadRecord] = field(default_factory=list)
    duration_s: float | None = None
    # Of a succeeded batch's records, those with no stored vector and those whose text changed (incremental.py).
    records_new: int = 0
    records_changed: int = 0


# The run row's counters a committed group adds to (group_counts); the others are the driver's alone.
ADDED_COUNTERS = ("batches_succeeded", "batches_failed", "records_embedded", "records_failed", "records_new",
                  "records_changed", "chunks_embedded")
# Of those, the ones a resumed run keeps from its earlier sessions (the others it recounts: skipped batches).
KEPT_ON_RESUME = ("records_new", "records_changed", "chunks_embedded")


def group_counts(outcomes: list[BatchOutcome]) -> dict[str, int]:
    """What committing `outcomes` adds to the run row's counters."""
    succeeded = [o for o in outcomes if o.state == "succeeded"]
    failed = [o for o in outcomes if o.state != "succeeded"]
    return {"batches_succeeded": len(succeeded), "batches_failed": len(failed),
            "records_embedded": sum(len(o.records) for o in succeeded),
            "records_failed": sum(len(o.records) for o in failed),
            "records_new": sum(o.records_new for o in succeeded),
            "records_changed": sum(o.records_changed for o in succeeded),
            "chunks_embedded": sum(chunks(o) for o in succeeded)}


def chunks(outcome: BatchOutcome) -> int:
    """The batch's chunks (spec.chunking; without it one per record): its vectors."""
    return len(chunk_owners(outcome.records))


@dataclass(frozen=True)
class CounterUpdate:
    """The driver's part of a run row update: its own counts so far this session, by the counter (of
    ADDED_COUNTERS) they add to (the row adds what they are beyond the ones it holds: runs.counter_values),
    and figures only it sets."""

    driver: dict[str, int] = field(default_factory=dict)
    set: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class DoneBatch:
    """A batch an earlier session of the job wrote: what it embedded and, of that, truncated."""

    records_embedded: int
    records_truncated: int


class BatchWriter(Protocol):
    """Where the dispatcher hands finished batches: this thread, or the writer actors (sink.writer_pool.WriterPool)."""

    @property
    def uncommitted(self) -> int: ...  # handed over, not yet committed: they count against maxInFlight

    def put_outcome(self, outcome: BatchOutcome) -> None: ...

    def failure(self) -> JobFailed | None: ...

    def wait_for_commit(self, timeout: float) -> None: ...
