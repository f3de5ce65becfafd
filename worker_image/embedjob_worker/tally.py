"""The run's counts: the run row's counters (as embedjob.api.RunCounters) and the end-of-run summary."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from embedjob.api import RunCounters

from .logs import log_event
from .records import chunk_owners
from .sink import BatchOutcome, DoneBatch
from .vector_index import IndexBuild

log = logging.getLogger("embedjob_worker.tally")


class RunTally:
    """The run's counters, kept by the driver loop and the writer thread; read as RunCounters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.batches_total: int | None = None  # known once the input has been read through
        self.records_total: int | None = None
        # done by an earlier session of this job (and its records truncated then)
        self.batches_skipped = self.records_skipped = self.truncated_skipped = 0
        self.batches_succeeded = self.batches_failed = 0  # committed in this session
        self.records_embedded = self.records_failed = 0
        # Incremental runs (embedjob_worker.incremental): new and changed records of committed batches
        # (from the run row when the run is resumed), those of batches not yet committed by batch id,
        # records whose vector was up to date, and vectors deleted at the end.
        self.records_new = self.records_changed = self.records_unchanged = self.records_deleted = 0
        self.chunks_embedded = 0  # of committed batches (from the run row when the run is resumed)
        self._classified: dict[str, tuple[int, int]] = {}
        self._embedding_started: float | None = None

    def start_embedding(self) -> None:
        """Texts per second count from here (the actors are ready)."""
        with self._lock:
            self._embedding_started = time.monotonic()

    def input_read(self, batches: int, records: int) -> None:
        with self._lock:
            self.batches_total, self.records_total = batches, records

    def skipped(self, done: DoneBatch) -> None:
        """A batch an earlier session of the job already wrote."""
        with self._lock:
            self.batches_skipped += 1
            self.records_skipped += done.records_embedded
            self.truncated_skipped += done.records_truncated

    def resumed(self, new: int, changed: int, chunks: int) -> None:
        """A resumed run's new and changed records and chunks embedded, as its earlier sessions committed them."""
        with self._lock:
            self.records_new, self.records_changed, self.chunks_embedded = new, changed, chunks

    def classified(self, batch_id: str, new: int, changed: int) -> None:
        """A batch about to be embedded holds this many new and changed records."""
        with self._lock:
            self._classified[batch_id] = (new, changed)

    def up_to_date(self, unchanged: int, already_written: int, whole_batch: bool) -> None:
        """Records not sent to the model: unchanged since an earlier run, or written earlier in this one;
        `whole_batch`: none of the batch's records was left to embed."""
        with self._lock:
            self.records_unchanged += unchanged
            self.records_skipped += already_written
            self.batches_skipped += whole_batch

    def deleted(self, vectors: int) -> None:
        with self._lock:
            self.records_deleted += vectors

    def rejected(self, records: int) -> None:
        """Bad records, failed before embedding."""
        with self._lock:
            self.records_failed += records

    def counters(self, pending: Iterable[BatchOutcome] = ()) -> RunCounters:
        """The run row's counters, as if `pending` were already committed."""
        pending = list(pending)
        succeeded = [o for o in pending if o.state == "succeeded"]
        failed = [o for o in pending if o.state == "failed"]
        with self._lock:
            embedded = self.records_embedded + sum(len(o.records) for o in succeeded)
            elapsed = time.monotonic() - self._embedding_started if self._embedding_started else 0.0
            pending_new = [self._classified.get(o.batch_id, (0, 0)) for o in succeeded]
            return RunCounters(
                batches_total=self.batches_total,
                batches_succeeded=self.batches_skipped + self.batches_succeeded + len(succeeded),
                batches_failed=self.batches_failed + len(failed),
                records_total=self.records_total,
                records_embedded=self.records_skipped + self.records_unchanged + embedded,
                records_failed=self.records_failed + sum(len(o.records) for o in failed),
                texts_per_second=round(embedded / elapsed, 2) if elapsed > 0 else 0.0,
                records_new=self.records_new + sum(new for new, _ in pending_new),
                records_changed=self.records_changed + sum(changed for _, changed in pending_new),
                records_unchanged=self.records_unchanged,
                records_deleted=self.records_deleted,
                chunks_embedded=self.chunks_embedded + sum(_chunks(o) for o in succeeded),
            )

    def commit(self, outcomes: Iterable[BatchOutcome]) -> None:
        """Count the batches the writer committed; each is a `batch_written` line (`embedjob run -v`)."""
        outcomes = list(outcomes)
        with self._lock:
            for o in outcomes:
                new, changed = self._classified.pop(o.batch_id, (0, 0))
                if o.state == "succeeded":
                    self.batches_succeeded += 1
                    self.records_embedded += len(o.records)
                    self.chunks_embedded += _chunks(o)
                    self.records_new += new
                    self.records_changed += changed
                else:
                    self.batches_failed += 1
                    self.records_failed += len(o.records)
        for o in outcomes:
            log_event(log, "batch_written", batch=o.batch_id, state=o.state, records=len(o.records), chunks=_chunks(o),
                      truncated=len(o.truncated), worker=o.worker, attempt=o.attempts[-1].attempt,
                      latency_s=round(o.duration_s or 0.0, 3))


def _chunks(outcome: BatchOutcome) -> int:
    return len(chunk_owners(outcome.records))


@dataclass
class RunSummary:
    """What a run did, for the caller (`embedjob run` prints it)."""

    run_id: str | None
    state: str  # succeeded | failed
    reason: str | None = None
    error: str | None = None
    counters: RunCounters | None = None  # the run row's counters; None when the run was refused
    batches_skipped: int = 0
    records_truncated: int = 0
    retries: int = 0
    oom_splits: int = 0
    batch_latencies: list[float] = field(default_factory=list)
    model_load_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    workers: list[dict] = field(default_factory=list)  # each actor's info(): actor id, when it loaded the model
    index: IndexBuild | None = None  # the vector index after the load (spec.sink.index), built or found

    def latency_percentile(self, q: float) -> float:
        if not self.batch_latencies:
            return 0.0
        ordered = sorted(self.batch_latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
