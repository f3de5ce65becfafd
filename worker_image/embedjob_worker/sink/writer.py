"""The writer thread: finished batches, bad records and shards read go to PostgreSQL in groups, off the driver loop.

Keeps PostgreSQL round trips off the driver loop; batches queued here count against
maxInFlight, so a crash still loses at most maxInFlight batches. With nothing to write
it still writes the run's counters every HEARTBEAT_S, which is the run's heartbeat. A
write that fails on a lost connection is retried (errors.retry_database), so a database
restart or failover shorter than DATABASE_OUTAGE_S costs the job nothing. `write_group`
is that write, also what each writer actor does (spec.sink.writers, writer_pool.py); then
this thread writes only bad records, shards read and the driver's own counts.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from embedjob_worker.core.errors import DB_ERRORS, JobFailed, retry_database
from embedjob_worker.core.outcome import AttemptRow, BatchOutcome, CounterUpdate, now
from embedjob_worker.core.records import BadRecord
from embedjob_worker.core.shards import ShardRead
from embedjob.contract import HEARTBEAT_S
from embedjob_worker.sink.postgres import PostgresSink
from embedjob_worker.sink.runs import RunSession
from embedjob_worker.core.tally import RunTally

# Finished batches written per transaction at most; more waiting means the sink is behind.
MAX_GROUP_BATCHES = 64
# Groups of bad records queued at most: the feed waits when the writer is this far behind.
_MAX_QUEUED_BAD_GROUPS = 8


def note_write_retry(outcomes: list[BatchOutcome], reason: str) -> None:
    """A `retry` attempt row before each outcome's final one: its write is tried again (recorded with it)."""
    for outcome in outcomes:
        final = outcome.attempts[-1]
        outcome.attempts.insert(-1, AttemptRow(final.attempt, None, "retry", reason[:2000], now()))


def write_group(sink: PostgresSink, run: RunSession, outcomes: list[BatchOutcome], bad_records: list[BadRecord],
                update: CounterUpdate | None = None, shards: Sequence[ShardRead] = ()) -> list[BatchOutcome]:
    """One group in one transaction (sink.write), retried while the database is lost; the outcomes committed."""
    return retry_database(lambda: sink.write(run, outcomes, bad_records, update, shards), "sink_write",
                          lambda exc: note_write_retry(outcomes, f"DatabaseWriteFailed: {exc}"))


def write_failure(error: BaseException) -> JobFailed:
    """Why writing failed for good, as the run's reason."""
    if isinstance(error, JobFailed):  # a reason of its own (e.g. VectorOutOfRange), passed on as it is
        return error
    if isinstance(error, DB_ERRORS):
        return JobFailed("DatabaseUnavailable", f"writing to the database failed: {error}")
    return JobFailed("InternalError", f"writing to the database failed: {type(error).__name__}: {error}"[:4000])


class UncommittedBatches:
    """Batches handed to a writer and not committed yet (they count against maxInFlight); a wait for a commit."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._uncommitted = 0

    @property
    def uncommitted(self) -> int:
        with self._changed:
            return self._uncommitted

    def wait_for_commit(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)


# What the writer's queue holds, besides the BatchOutcomes themselves.
@dataclass(frozen=True)
class _BadRecords:
    records: tuple[BadRecord, ...]


@dataclass(frozen=True)
class _ShardRead:
    shard: ShardRead


@dataclass(frozen=True)
class _Stop:
    """Write what is queued before this, then end the thread."""


class SinkWriter(UncommittedBatches):
    """The writer thread of `run`; it stops, failing the run, once `lock_lost` says why (job_lock.JobLock.failure)."""

    def __init__(self, sink: PostgresSink, run: RunSession, tally: RunTally,
                 lock_lost: Callable[[], JobFailed | None] = lambda: None):
        super().__init__()
        self.sink, self.run, self.tally, self.lock_lost = sink, run, tally, lock_lost
        self.error: BaseException | None = None
        self._queue: queue.Queue[BatchOutcome | _BadRecords | _ShardRead | _Stop] = queue.Queue()
        self._bad_group_slots = threading.Semaphore(_MAX_QUEUED_BAD_GROUPS)
        self._thread = threading.Thread(target=self._run, name="embedjob-sink", daemon=True)
        self._thread.start()

    def put_outcome(self, outcome: BatchOutcome) -> None:
        with self._changed:
            self._uncommitted += 1
        self._queue.put(self.tally.label(outcome))

    def put_bad_records(self, bad_records: list[BadRecord]) -> None:
        """Queue bad records for writing; waits while _MAX_QUEUED_BAD_GROUPS groups are still unwritten."""
        if not bad_records:
            return
        while not self._bad_group_slots.acquire(timeout=1.0):
            if (write_failure := self.failure()) is not None:
                raise write_failure
        self._queue.put(_BadRecords(tuple(bad_records)))

    def put_shard_read(self, shard: ShardRead) -> None:
        """Queue a dataset's shard read through: written after the bad records queued before it."""
        self._queue.put(_ShardRead(shard))

    def failure(self) -> JobFailed | None:
        """Why writing failed for good: the database was lost, or a write the driver did not foresee failed."""
        return None if self.error is None else write_failure(self.error)

    def close(self) -> None:
        """Write everything queued, then stop."""
        self._queue.put(_Stop())
        self._thread.join()

    def _run(self) -> None:
        stopping = False
        while not stopping and self.error is None:
            outcomes: list[BatchOutcome] = []
            bad_records: list[BadRecord] = []
            shards: list[ShardRead] = []
            bad_groups = 0
            for item in self._next_group():
                match item:
                    case BatchOutcome():
                        outcomes.append(item)
                    case _BadRecords(records):
                        bad_records.extend(records)
                        bad_groups += 1
                    case _ShardRead(shard):
                        shards.append(shard)
                    case _Stop():
                        stopping = True
            try:
                self._write(outcomes, bad_records, shards)
            except BaseException as exc:  # noqa: BLE001 - handed to the driver loop, which fails the job
                self.error = exc
            for _ in range(bad_groups):
                self._bad_group_slots.release()
            with self._changed:
                if self.error is None:
                    self._uncommitted -= len(outcomes)
                self._changed.notify_all()

    def _next_group(self) -> list[BatchOutcome | _BadRecords | _ShardRead | _Stop]:
        """What has queued up, waiting at most HEARTBEAT_S for the first item (none: a heartbeat write)."""
        try:
            items = [self._queue.get(timeout=HEARTBEAT_S)]
        except queue.Empty:
            return []
        while len(items) < MAX_GROUP_BATCHES:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _write(self, outcomes: list[BatchOutcome], bad_records: list[BadRecord], shards: list[ShardRead]) -> None:
        if (lost := self.lock_lost()) is not None:  # checked at least every HEARTBEAT_S
            raise lost
        update = self.tally.driver_update(outcomes)
        self.tally.commit(write_group(self.sink, self.run, outcomes, bad_records, update, shards))
