"""The writer actors of spec.sink.writers: the driver hands them groups of finished batches and counts what they commit.

Each GroupWriter (writer_actor.py) writes a group in one transaction on its own
connection; the driver keeps the batches' metadata and the ObjectRefs of their vectors
(it owns them: they outlive the EmbeddingWorker that computed them) until the group is
committed, so batches here still count against maxInFlight. A writer that dies is
replaced and its group goes, as it was, to the next free writer, with a `retry` attempt
row (WriterLost) per batch; a group its dead writer had committed already is written
once (PostgresSink.write leaves an outcome its batch row holds). After
spec.retry.attemptsPerBatch lost writers for one batch the run fails (WriterLost).
"""

from __future__ import annotations

import logging
import threading
from collections import deque

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from embedjob_worker.core.actor_names import worker_actor_name
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.logs import log_event
from embedjob_worker.core.outcome import BatchOutcome
from embedjob_worker.core.tally import RunTally
from embedjob_worker.sink.runs import RunSession
from embedjob_worker.sink.target import SinkTarget
from embedjob_worker.sink.writer import MAX_GROUP_BATCHES, SinkWriter, UncommittedBatches, note_write_retry, write_failure
from embedjob_worker.sink.writer_actor import GroupWriter

log = logging.getLogger("embedjob_worker.sink.writer_pool")

_OPEN_TIMEOUT_S = 120.0
_POLL_S = 0.5


class WriterPool(UncommittedBatches):
    """`count` GroupWriter actors fed from one queue: a free writer takes what has queued (up to
    MAX_GROUP_BATCHES batches) as its next group, and writes it on its own connection to `url` as
    the driver would. `thread` (the driver's SinkWriter) still writes the bad records and the
    driver's own counts, and its failures are this pool's too."""

    def __init__(self, count: int, url: str, target: SinkTarget, run: RunSession, tally: RunTally,
                 thread: SinkWriter, attempts_per_batch: int):
        super().__init__()
        self.url, self.target, self.run, self.tally, self.thread = url, target, run, tally, thread
        self.attempts_per_batch = attempts_per_batch
        self.error: BaseException | None = None
        self._actor_class = ray.remote(GroupWriter)
        self._queue: deque[BatchOutcome] = deque()
        self._calls: dict[ray.ObjectRef, tuple[int, list[BatchOutcome]]] = {}
        self._lost: dict[str, int] = {}  # batch id: writers lost while writing it
        self._closing = False
        self.generations = [0] * count
        self.actors = [self._start(slot) for slot in range(count)]
        self.names = self._open(self.actors)  # each writer's host/pid
        self.committed_by: dict[str, int] = {}  # batches each writer committed
        self._idle = deque(range(count))  # taken in turn: every writer gets groups
        self._thread = threading.Thread(target=self._run, name="embedjob-writers", daemon=True)
        self._thread.start()

    def _start(self, slot: int):
        # No CPU asked: they wait on PostgreSQL mostly, and must not take an EmbeddingWorker's place.
        return self._actor_class.options(name=worker_actor_name(self.target.job_key, slot, self.generations[slot],
                                                                "writer"),
                                         num_cpus=0, max_restarts=0, max_task_retries=0).remote()

    def _open(self, actors: list) -> list[str]:
        calls = [actor.open.remote(self.url, self.target, self.run) for actor in actors]
        try:
            return ray.get(calls, timeout=_OPEN_TIMEOUT_S)
        except GetTimeoutError:
            raise JobFailed("WorkersUnavailable", f"writer actors not ready after {_OPEN_TIMEOUT_S:.0f}s") from None
        except RayTaskError as exc:
            raise write_failure(exc.cause if exc.cause is not None else exc) from None
        except RayActorError as exc:
            raise JobFailed("WorkersUnavailable", f"a writer actor failed to start: {exc}") from None

    def put_outcome(self, outcome: BatchOutcome) -> None:
        with self._changed:
            self._uncommitted += 1
            self._queue.append(self.tally.label(outcome))
            self._send()

    def failure(self) -> JobFailed | None:
        """Why writing failed for good (here or in the driver's writer thread)."""
        with self._changed:
            error = self.error
        return write_failure(error) if error is not None else self.thread.failure()

    def close(self) -> None:
        """Write everything queued (unless writing failed), then end the writers."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join()
        for actor in self.actors:
            ray.kill(actor)

    def _send(self) -> None:
        """Give free writers what has queued (self._changed held)."""
        while self._idle and self._queue and self.error is None:
            slot = self._idle.popleft()
            group = [self._queue.popleft() for _ in range(min(MAX_GROUP_BATCHES, len(self._queue)))]
            self._calls[self.actors[slot].write.remote(group)] = (slot, group)

    def _run(self) -> None:
        while True:
            with self._changed:
                if self._closing and not self._calls and (self.error is not None or not self._queue):
                    return
                calls = list(self._calls)
                if not calls:
                    self._changed.wait(_POLL_S)
                    continue
            ready, _ = ray.wait(calls, num_returns=1, timeout=_POLL_S)
            for ref in ready:
                self._finished(ref)

    def _finished(self, ref: ray.ObjectRef) -> None:
        with self._changed:
            slot, group = self._calls.pop(ref)
        committed = 0
        try:
            written = set(ray.get(ref))
        except RayActorError as exc:
            self._writer_lost(slot, group, str(exc).splitlines()[0])
        except RayTaskError as exc:
            with self._changed:
                self.error = exc.cause if exc.cause is not None else exc
        except Exception as exc:  # noqa: BLE001 - e.g. an error Ray could not carry back: the run fails with it
            with self._changed:
                self.error = exc
        else:
            self.tally.commit([o for o in group if o.batch_id in written])
            committed = len(group)
            self.committed_by[self.names[slot]] = self.committed_by.get(self.names[slot], 0) + len(written)
        with self._changed:
            self._uncommitted -= committed
            self._idle.append(slot)
            self._send()
            self._changed.notify_all()

    def _writer_lost(self, slot: int, group: list[BatchOutcome], message: str) -> None:
        """A fresh writer in the slot; the group queued again first, or the run fails once a batch lost too many."""
        log_event(log, "writer_lost", logging.WARNING, slot=slot, batches=len(group), error=message[:300])
        for outcome in group:
            self._lost[outcome.batch_id] = self._lost.get(outcome.batch_id, 0) + 1
        worst = max(group, key=lambda o: self._lost[o.batch_id])
        if self._lost[worst.batch_id] >= self.attempts_per_batch:
            with self._changed:
                self.error = JobFailed("WriterLost", f"{self._lost[worst.batch_id]} writer actors were lost while "
                                                     f"writing batch {worst.batch_id} (spec.retry.attemptsPerBatch="
                                                     f"{self.attempts_per_batch}); last: {message}"[:4000])
            return
        note_write_retry(group, f"WriterLost: {message}")
        self.generations[slot] += 1
        replacement = self._start(slot)
        try:
            name, = self._open([replacement])
        except JobFailed as failure:
            with self._changed:
                self.error = failure
            return
        with self._changed:
            self.actors[slot], self.names[slot] = replacement, name
            self._queue.extendleft(reversed(group))
