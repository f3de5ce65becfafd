"""The writer thread: finished batches and bad records go to PostgreSQL in groups, off the driver loop.

Keeps PostgreSQL round trips off the driver loop; batches queued here count against
maxInFlight, so a crash still loses at most maxInFlight batches. With nothing to write
it still writes the run's counters every HEARTBEAT_S, which is the run's heartbeat. A
write that fails on a lost connection is retried (errors.retry_database), so a database
restart or failover shorter than DATABASE_OUTAGE_S costs the job nothing.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

from .errors import DB_ERRORS, JobFailed, retry_database
from .records import BadRecord
from .sink import HEARTBEAT_S, AttemptRow, BatchOutcome, PostgresSink, now
from .tally import RunTally

# Finished batches written per transaction at most; more waiting means the sink is behind.
_MAX_GROUP_BATCHES = 64
# Groups of bad records queued at most: the feed waits when the writer is this far behind.
_MAX_QUEUED_BAD_GROUPS = 8


# What the writer's queue holds, besides the BatchOutcomes themselves.
@dataclass(frozen=True)
class _BadRecords:
    records: tuple[BadRecord, ...]


@dataclass(frozen=True)
class _Stop:
    """Write what is queued before this, then end the thread."""


class SinkWriter:
    def __init__(self, sink: PostgresSink, run_id: str, tally: RunTally):
        self.sink, self.run_id, self.tally = sink, run_id, tally
        self.error: BaseException | None = None
        self._queue: queue.Queue[BatchOutcome | _BadRecords | _Stop] = queue.Queue()
        self._uncommitted = 0
        self._changed = threading.Condition()
        self._bad_group_slots = threading.Semaphore(_MAX_QUEUED_BAD_GROUPS)
        self._thread = threading.Thread(target=self._run, name="embedjob-sink", daemon=True)
        self._thread.start()

    @property
    def uncommitted(self) -> int:
        with self._changed:
            return self._uncommitted

    def put_outcome(self, outcome: BatchOutcome) -> None:
        with self._changed:
            self._uncommitted += 1
        self._queue.put(outcome)

    def put_bad_records(self, bad_records: list[BadRecord]) -> None:
        """Queue bad records for writing; waits while _MAX_QUEUED_BAD_GROUPS groups are still unwritten."""
        if not bad_records:
            return
        while not self._bad_group_slots.acquire(timeout=1.0):
            if (write_failure := self.failure()) is not None:
                raise write_failure
        self._queue.put(_BadRecords(tuple(bad_records)))

    def failure(self) -> JobFailed | None:
        """Why writing failed for good: the database was lost, or a write the driver did not foresee failed."""
        if self.error is None:
            return None
        if isinstance(self.error, JobFailed):  # a reason of its own (e.g. VectorOutOfRange), passed on as it is
            return self.error
        if isinstance(self.error, DB_ERRORS):
            return JobFailed("DatabaseUnavailable", f"writing to the database failed: {self.error}")
        return JobFailed("InternalError", f"writing to the database failed: {type(self.error).__name__}: "
                                          f"{self.error}"[:4000])

    def wait_for_commit(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)

    def close(self) -> None:
        """Write everything queued, then stop."""
        self._queue.put(_Stop())
        self._thread.join()

    def _run(self) -> None:
        stopping = False
        while not stopping and self.error is None:
            outcomes: list[BatchOutcome] = []
            bad_records: list[BadRecord] = []
            bad_groups = 0
            for item in self._next_group():
                match item:
                    case BatchOutcome():
                        outcomes.append(item)
                    case _BadRecords(records):
                        bad_records.extend(records)
                        bad_groups += 1
                    case _Stop():
                        stopping = True
            try:
                self._write(outcomes, bad_records)
            except BaseException as exc:  # noqa: BLE001 - handed to the driver loop, which fails the job
                self.error = exc
            for _ in range(bad_groups):
                self._bad_group_slots.release()
            with self._changed:
                if self.error is None:
                    self._uncommitted -= len(outcomes)
                self._changed.notify_all()

    def _next_group(self) -> list[BatchOutcome | _BadRecords | _Stop]:
        """What has queued up, waiting at most HEARTBEAT_S for the first item (none: a heartbeat write)."""
        try:
            items = [self._queue.get(timeout=HEARTBEAT_S)]
        except queue.Empty:
            return []
        while len(items) < _MAX_GROUP_BATCHES:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _write(self, outcomes: list[BatchOutcome], bad_records: list[BadRecord]) -> None:
        def note_retry(exc: Exception) -> None:  # recorded with the batch once the write gets through
            for outcome in outcomes:
                final = outcome.attempts[-1]
                outcome.attempts.insert(-1, AttemptRow(final.attempt, None, "retry", f"DatabaseWriteFailed: {exc}"[:2000],
                                                       now()))

        retry_database(lambda: self.sink.write(self.run_id, outcomes, bad_records,
                                               self.tally.counters(outcomes).model_dump()), "sink_write", note_retry)
        self.tally.commit(outcomes)
