"""The run's counts: the run row's counters (as embedjob.api.RunCounters) and the end-of-run summary."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from embedjob.api import RunCounters

from embedjob_worker.core.change_window import ChangeWindow
from embedjob_worker.core.logs import log_event
from embedjob_worker.core.worker_reports import PrecisionCheck, WorkerInfo
from embedjob_worker.core.outcome import (ADDED_COUNTERS, KEPT_ON_RESUME, BatchOutcome, CounterUpdate, DoneBatch, chunks,
                                          group_counts)

log = logging.getLogger("embedjob_worker.core.tally")


@dataclass(frozen=True)
class DriverCounts:
    """What only the driver counts (RunTally.driver_counts), or what reading a part of the input added to it."""

    batches_skipped: int = 0
    records_skipped: int = 0
    truncated_skipped: int = 0
    records_rejected: int = 0
    records_unchanged: int = 0

    def __sub__(self, other: DriverCounts) -> DriverCounts:
        return DriverCounts(**{name: value - getattr(other, name) for name, value in asdict(self).items()})


class RunTally:
    """The run's counters, kept by the driver loop and the writer thread; read as RunCounters.

    Two kinds of counts add up to the run row's: what committed groups add (group_counts, in
    the transaction that commits them, whichever writer it is) and what only the driver
    knows (batches done before, records up to date, bad records), which the driver's own
    writes carry as totals (`driver_update`); the row adds what they are beyond the totals it
    holds, so a write retried after its commit reply was lost adds nothing twice.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.batches_total: int | None = None  # known once the input has been read through
        self.records_total: int | None = None
        # done by an earlier session of this job (and its records truncated then)
        self.batches_skipped = self.records_skipped = self.truncated_skipped = 0
        self.records_rejected = 0  # bad records, failed before embedding
        # Incremental runs (embedjob_worker.sink.incremental): new and changed records (and, with them, the
        # chunks embedded) committed by the run's earlier sessions, of batches not yet committed by batch
        # id, records whose vector was up to date, and vectors deleted at the end.
        self._resumed = dict.fromkeys(KEPT_ON_RESUME, 0)
        self.records_unchanged = self.records_deleted = 0
        self.records_metadata_updated = 0  # of the unchanged, those whose metadata alone this session rewrote
        self._committed = dict.fromkeys(ADDED_COUNTERS, 0)  # this session's commits, as group_counts adds them
        self._classified: dict[str, tuple[int, int]] = {}
        self._embedding_started: float | None = None
        self.precision: PrecisionCheck | None = None  # a reduced precision's check, as this session measured it

    def start_embedding(self) -> None:
        """Texts per second count from here (the actors are ready)."""
        with self._lock:
            self._embedding_started = time.monotonic()

    def precision_checked(self, check: PrecisionCheck) -> None:
        with self._lock:
            self.precision = check

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
            self._resumed.update(records_new=new, records_changed=changed, chunks_embedded=chunks)

    def classified(self, batch_id: str, new: int, changed: int) -> None:
        """A batch about to be embedded holds this many new and changed records."""
        with self._lock:
            self._classified[batch_id] = (new, changed)

    def label(self, outcome: BatchOutcome) -> BatchOutcome:
        """`outcome` with its new and changed records (from `classified`), as the write counts them."""
        with self._lock:
            outcome.records_new, outcome.records_changed = self._classified.pop(outcome.batch_id, (0, 0))
        return outcome

    def up_to_date(self, unchanged: int, already_written: int, whole_batch: bool) -> None:
        """Records not sent to the model: unchanged since an earlier run, or written earlier in this one;
        `whole_batch`: none of the batch's records was left to embed."""
        with self._lock:
            self.records_unchanged += unchanged
            self.records_skipped += already_written
            self.batches_skipped += whole_batch

    def metadata_updated(self, records: int) -> None:
        """Records up to date but for their metadata, whose metadata was written without embedding them."""
        with self._lock:
            self.records_metadata_updated += records

    def deleted(self, records: int) -> None:
        """The records the run's sync.deleteMissing deleted, as the run row counts them (delete_missing)."""
        with self._lock:
            self.records_deleted = records

    def rejected(self, records: int) -> None:
        """Bad records, failed before embedding."""
        with self._lock:
            self.records_rejected += records

    def driver_counts(self) -> DriverCounts:
        """What only the driver has counted so far (a shard's reading adds the difference, shards.ShardRead)."""
        with self._lock:
            return DriverCounts(self.batches_skipped, self.records_skipped, self.truncated_skipped,
                                self.records_rejected, self.records_unchanged)

    def add_driver_counts(self, counts: DriverCounts) -> None:
        """What reading a shard added (an earlier session read it; this one skips it), added once more."""
        with self._lock:
            self.batches_skipped += counts.batches_skipped
            self.records_skipped += counts.records_skipped
            self.truncated_skipped += counts.truncated_skipped
            self.records_rejected += counts.records_rejected
            self.records_unchanged += counts.records_unchanged

    def counters(self, pending: Iterable[BatchOutcome] = ()) -> RunCounters:
        """The run row's counters, as if `pending` were already committed."""
        pending_counts = group_counts(list(pending))
        with self._lock:
            committed = {name: count + pending_counts[name] for name, count in self._committed.items()}
            driver = self._driver_counts()
            elapsed = time.monotonic() - self._embedding_started if self._embedding_started else 0.0
            embedded = committed["records_embedded"]
            return RunCounters(
                batches_total=self.batches_total,
                batches_succeeded=driver["batches_succeeded"] + committed["batches_succeeded"],
                batches_failed=committed["batches_failed"],
                records_total=self.records_total,
                records_embedded=driver["records_embedded"] + embedded,
                records_failed=driver["records_failed"] + committed["records_failed"],
                texts_per_second=round(embedded / elapsed, 2) if elapsed > 0 else 0.0,
                records_unchanged=self.records_unchanged,
                records_deleted=self.records_deleted,
                **self._precision_figures(),
                **{name: count + committed[name] for name, count in self._resumed.items()},
            )

    def _precision_figures(self) -> dict[str, float | None]:
        """The run row's precision columns (self._lock held)."""
        check = self.precision
        return {"precision_cosine_mean": check and check.mean, "precision_cosine_min": check and check.minimum}

    def _driver_counts(self) -> dict[str, int]:
        """What only the driver knows, by the run row counter it adds to (self._lock held)."""
        return {"batches_succeeded": self.batches_skipped,
                "records_embedded": self.records_skipped + self.records_unchanged,
                "records_failed": self.records_rejected}

    def driver_update(self, pending: Iterable[BatchOutcome] = ()) -> CounterUpdate:
        """The driver's part of its next run row write: its counts so far, and the figures only it knows
        (texts/s as if `pending` were committed)."""
        texts_per_second = self.counters(pending).texts_per_second
        with self._lock:
            return CounterUpdate(
                driver=self._driver_counts(),
                set={"batches_total": self.batches_total, "records_total": self.records_total,
                     "records_unchanged": self.records_unchanged,
                     "texts_per_second": texts_per_second, **self._precision_figures()})

    def commit(self, outcomes: Iterable[BatchOutcome]) -> None:
        """Count the batches a writer committed (or found committed: a commit whose reply was lost, a writer
        lost after its commit); each is a `batch_written` line (`embedjob run -v`)."""
        outcomes = list(outcomes)
        with self._lock:
            for name, count in group_counts(outcomes).items():
                self._committed[name] += count
        for o in outcomes:
            log_event(log, "batch_written", batch=o.batch_id, state=o.state, records=len(o.records), chunks=chunks(o),
                      truncated=len(o.truncated), worker=o.worker, attempt=o.attempts[-1].attempt,
                      latency_s=round(o.duration_s or 0.0, 3))


@dataclass(frozen=True)
class IndexBuild:
    """What ensure_index did: built `name` in `seconds`, or found an index there (`built` False)."""

    name: str
    built: bool
    seconds: float = 0.0
    # An existing index with other parameters than the spec's, or a build whose graph outgrew its memory.
    note: str | None = None


@dataclass
class RunSummary:
    """What a run did, for the caller (`embedjob run` prints it)."""

    run_id: str | None
    state: str  # succeeded | failed
    reason: str | None = None
    error: str | None = None
    counters: RunCounters | None = None  # the run row's counters; None when the run was refused
    batching: str = ""  # the batch size and token budget the job ran with (str(spec.chosen_batching))
    prompt: str = ""  # the document prompt the texts were embedded with, and why (model_card.document_prompt)
    batches_skipped: int = 0
    records_truncated: int = 0
    metadata_updated: int = 0  # records whose metadata alone changed, rewritten without embedding (this session)
    retries: int = 0
    oom_splits: int = 0
    batch_latencies: list[float] = field(default_factory=list)
    model_load_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    workers: list[WorkerInfo] = field(default_factory=list)  # each actor's, once it had loaded the model
    writers: dict[str, int] = field(default_factory=dict)  # batches each writer actor (host/pid) committed
    index: IndexBuild | None = None  # the vector index after the load (spec.sink.index), built or found
    metadata_index: IndexBuild | None = None  # the metadata's GIN index (spec.sink.index.metadata), built or found
    change_window: ChangeWindow | None = None  # a table read by its change column: which rows, the watermark left

    def latency_percentile(self, q: float) -> float:
        if not self.batch_latencies:
            return 0.0
        ordered = sorted(self.batch_latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
