"""Dispatch: batches to the EmbeddingWorker actors, at most maxInFlight at a time, retried with backoff.

One object, the Dispatcher, owns the attempts in flight (matched back by the batch id
their result carries, in completion order), the retry heap and the retry policy; the
actors themselves are an ActorSet (`workers.py`). Finished batches, succeeded or failed
for good, go to the writer; until it has committed them they count against
maxInFlight, so a crash loses at most maxInFlight batches. With writer actors
(spec.sink.writers) an actor returns a batch's vectors as an object of their own: the
driver reads the rest of the result and hands the writer the ObjectRef of the vectors.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

import ray
from ray.exceptions import RayActorError, RayTaskError

from embedjob.api import EmbeddingJobSpec

from embedjob_worker.plan.batching import Batch
from embedjob_worker.core.errors import JobFailed, backoff_seconds, too_many_failed_batches
from embedjob_worker.encode.inflight import InFlightBatches
from embedjob_worker.core.logs import log_event
from embedjob_worker.core.metrics import DriverMetrics
from embedjob_worker.encode.model import ResolvedModel, check_model
from embedjob_worker.core.outcome import AttemptRow, BatchOutcome, now
from embedjob_worker.core.records import BadReason, BadRecord, chunk_owners
from embedjob.contract import HEARTBEAT_S
from embedjob_worker.core.tally import RunSummary
from embedjob_worker.core.vector_range import out_of_range, why_out_of_range
from embedjob_worker.core.worker_reports import EmbedResult
from embedjob_worker.encode.workers import ActorSet
from embedjob_worker.core.outcome import BatchWriter

log = logging.getLogger("embedjob_worker.encode.dispatch")

# An attempt without a result after max(floor, this × the median of the recent batch
# latencies) counts as hung: its actor is killed and replaced and the batch retried.
HUNG_LATENCY_FACTOR = 20
_RECENT_LATENCIES = 101
# An actor that has not answered yet (a replacement) first loads the model: its attempts get
# this many times the model's load time, plus the margin, on top.
_LOAD_GRACE_FACTOR, _LOAD_GRACE_MARGIN_S = 3, 30.0


@dataclass
class Attempt:
    batch: Batch
    number: int
    history: list[AttemptRow]
    first_started_at: datetime
    slot: int = -1
    actor: object = None
    worker: str | None = None  # the actor's name, for the attempt row when it died
    started_at: datetime | None = None
    submitted: float = 0.0
    vectors: ray.ObjectRef | None = None  # the result's vectors, returned apart (spec.sink.writers)


class Dispatcher:
    """Runs every batch on the actors until it succeeded or failed for good.

    A lost actor is replaced in its slot; a failed attempt is retried after a backoff
    up to spec.retry.attemptsPerBatch attempts. More batches failed for good than
    spec.retry.failedBatchesTolerated set `failure`: no new batch starts, the ones in
    flight finish. An attempt older than `hung_after_s()` is treated like a lost actor.
    """

    def __init__(self, spec: EmbeddingJobSpec, actors: ActorSet, resolved: ResolvedModel, max_tokens: int,
                 metrics: DriverMetrics, summary: RunSummary, hung_floor_s: float):
        self.spec, self.actors, self.resolved, self.max_tokens = spec, actors, resolved, max_tokens
        self.metrics, self.summary, self.hung_floor_s = metrics, summary, hung_floor_s
        self._recent_latencies: deque[float] = deque(maxlen=_RECENT_LATENCIES)
        self._answered = {actors.actor_name(slot) for slot in range(len(actors.actors))}  # model loaded
        self.failure: JobFailed | None = None
        self.failed_batches = 0  # for good, in this session
        self._in_flight = InFlightBatches()
        self._refs: dict[ray.ObjectRef, str] = {}
        self._retries: list[tuple[float, int, Attempt]] = []  # heap of (not before, tie-breaker, attempt)
        self._tie = itertools.count()
        self._vectors_apart = spec.sink.writers > 0

    def run(self, batches: Iterator[Batch], writer: BatchWriter, report: Callable[[], None]) -> None:
        """Embed every batch (and hand it to `writer`); `report` after each result or wait."""
        max_in_flight = self.spec.batching.max_in_flight
        source_done = False
        while True:
            if (write_failure := writer.failure()) is not None:
                raise write_failure
            self.actors.check_lease()  # a lost pool lease stops the job (LeaseLost; embedjob_worker.encode.lease)
            # A batch waiting to be retried is still in flight: a crash then loses it too, so it counts against
            # maxInFlight (an actor lost as its pod goes must not free room for new batches), and it is sent
            # again when due whatever the room, which it holds already.
            while self.failure is None:
                if self._retries and self._retries[0][0] <= time.monotonic():
                    self._submit(heapq.heappop(self._retries)[2])
                elif source_done or len(self._in_flight) + len(self._retries) + writer.uncommitted >= max_in_flight:
                    break
                elif (batch := next(batches, None)) is None:
                    source_done = True
                else:
                    self._submit(Attempt(batch, 1, [], now()))
            if not self._refs:
                if self.failure is not None or (source_done and not self._retries and not writer.uncommitted):
                    return
                if self._retries and not writer.uncommitted:
                    time.sleep(max(0.0, self._retries[0][0] - time.monotonic()))
                else:
                    writer.wait_for_commit(timeout=1.0)
                report()
                continue
            ready, _ = ray.wait(list(self._refs), num_returns=1, timeout=HEARTBEAT_S)
            for ref in ready:
                if (outcome := self._handle(ref, self._refs.pop(ref))) is not None:
                    writer.put_outcome(outcome)
            for outcome in self._give_up_on_hung():
                writer.put_outcome(outcome)
            report()

    def hung_after_s(self) -> float:
        """How long an attempt may go without a result: max(floor, HUNG_LATENCY_FACTOR × recent median)."""
        if not self._recent_latencies:
            return self.hung_floor_s
        return max(self.hung_floor_s, HUNG_LATENCY_FACTOR * statistics.median(self._recent_latencies))

    def _give_up_on_hung(self) -> list[BatchOutcome]:
        """Attempts past hung_after_s(): their actor is killed and replaced, the batch retried (or failed)."""
        limit, outcomes = self.hung_after_s(), []
        loading = _LOAD_GRACE_FACTOR * self.summary.model_load_seconds + _LOAD_GRACE_MARGIN_S
        for ref, batch_id in list(self._refs.items()):
            attempt = self._in_flight.attempt(batch_id)
            grace = 0.0 if attempt.worker in self._answered else loading
            if time.monotonic() - attempt.submitted <= limit * self._passes(attempt.batch) + grace:
                continue
            del self._refs[ref]
            attempt = self._complete(batch_id)
            # The actor's other attempts then fail with RayActorError and are retried as lost.
            ray.kill(attempt.actor, no_restart=True)
            self.actors.replace(attempt.slot, attempt.actor)
            waited = limit * self._passes(attempt.batch) + grace
            outcome = self._failed_attempt(attempt, "BatchTimeout", f"no result after {waited:.0f}s: the "
                                           "actor was killed and replaced", retryable=True)
            if outcome is not None:
                outcomes.append(outcome)
        return outcomes

    def _passes(self, batch: Batch) -> int:
        """Forward passes of batchSize chunks the batch takes: more than one only for a record of more chunks."""
        return max(1, -(-len(chunk_owners(batch.records)) // self.spec.chosen_batching.batch_size))

    def _submit(self, attempt: Attempt) -> None:
        actors = self.actors
        attempt.slot = actors.least_loaded()
        attempt.actor = actors.actors[attempt.slot]
        attempt.worker = actors.actor_name(attempt.slot)
        attempt.started_at, attempt.submitted = now(), time.monotonic()
        actors.outstanding[attempt.slot] += 1
        chosen, batch = self.spec.chosen_batching, attempt.batch
        args = (batch.batch_id, batch.texts, batch.encode_batch_size(chosen.batch_size, chosen.max_tokens))
        if self._vectors_apart:
            ref, attempt.vectors = attempt.actor.embed_apart.options(num_returns=2).remote(*args)
        else:
            ref = attempt.actor.embed.remote(*args)
        self._in_flight.add(attempt.batch.batch_id, attempt)
        self._refs[ref] = attempt.batch.batch_id
        log_event(log, "batch_dispatched", batch=attempt.batch.batch_id, attempt=attempt.number,
                  records=len(attempt.batch.records), slot=attempt.slot)

    def _complete(self, batch_id: str) -> Attempt:
        attempt = self._in_flight.complete(batch_id)
        self.actors.outstanding[attempt.slot] -= 1
        return attempt

    def _handle(self, ref: ray.ObjectRef, batch_id: str) -> BatchOutcome | None:
        """The batch's outcome once it succeeded or failed for good; None while it will be retried."""
        try:
            result = ray.get(ref)
        except RayActorError as exc:
            attempt = self._complete(batch_id)
            self.actors.replace(attempt.slot, attempt.actor)
            return self._failed_attempt(attempt, "ActorDied", str(exc).splitlines()[0], retryable=True)
        except RayTaskError as exc:
            attempt = self._complete(batch_id)
            cause = exc.cause if exc.cause is not None else exc
            return self._failed_attempt(attempt, type(cause).__name__,
                                        str(cause).splitlines()[0] if str(cause) else "", retryable=True)
        # Matched by the id the result carries, not by the order of submission.
        attempt = self._complete(result.batch_id)
        latency = time.monotonic() - attempt.submitted
        self._answered.add(attempt.worker)
        self.summary.batch_latencies.append(latency)
        self._recent_latencies.append(latency)
        self.metrics.batch_latency.observe(latency)
        try:
            check_model(result, self.resolved)
        except JobFailed as mismatch:
            return self._failed_attempt(attempt, mismatch.reason, str(mismatch), retryable=False)
        unstorable = out_of_range(result.largest, self.spec.sink.vector_type)
        if unstorable:  # the model gives the same vectors again: failed at once, the batch's records only
            return self._failed_attempt(attempt, "VectorOutOfRange",
                                        self._unstorable(attempt.batch, result, unstorable), retryable=False)
        return self._succeeded(attempt, result)

    def _unstorable(self, batch: Batch, result: EmbedResult, rows: list[int]) -> str:
        """The records (and chunks) of the vectors at `rows` and what is wrong with each, the first few."""
        owners, vector_type = chunk_owners(batch.records), self.spec.sink.vector_type
        named = [f"record {owners[i].id!r} (chunk {owners[:i].count(owners[i])}): "
                 f"{why_out_of_range(result.largest[i], vector_type)}" for i in rows[:3]]
        more = f"; and {len(rows) - 3} more vectors" if len(rows) > 3 else ""
        return "; ".join(named) + more

    def _succeeded(self, attempt: Attempt, result: EmbedResult) -> BatchOutcome:
        batch, worker, history = attempt.batch, result.worker, attempt.history
        if result.oom_splits:
            self.summary.oom_splits += result.oom_splits
            self.metrics.oom_splits.inc(result.oom_splits)
            history.append(AttemptRow(attempt.number, worker, "split", f"OutOfMemory: batch of {len(batch.records)}"
                                      f" split in halves {result.oom_splits} time(s)", attempt.started_at))
        history.append(AttemptRow(attempt.number, worker, "succeeded", None, attempt.started_at))
        owners = chunk_owners(batch.records)
        truncated = [BadRecord(record.position, record.id, BadReason.truncated,
                               f"longer than {self.max_tokens} tokens: embedded truncated", batch.batch_id)
                     for record in dict.fromkeys(owners[i] for i in result.truncated)]
        self.summary.records_truncated += len(truncated)
        self.metrics.records.labels("embedded").inc(len(batch.records))
        self.metrics.records.labels("truncated").inc(len(truncated))
        self.metrics.batches.labels("succeeded").inc()
        vectors = attempt.vectors if self._vectors_apart else result.vectors
        return BatchOutcome(batch.batch_id, "succeeded", batch.records, history, attempt.first_started_at,
                            vectors=vectors, worker=worker, truncated=truncated,
                            duration_s=(now() - attempt.first_started_at).total_seconds())

    def _failed_attempt(self, attempt: Attempt, reason: str, message: str, retryable: bool) -> BatchOutcome | None:
        will_retry = retryable and attempt.number < self.spec.retry.attempts_per_batch
        attempt.history.append(AttemptRow(attempt.number, attempt.worker, "retry" if will_retry else "failed",
                                          f"{reason}: {message}"[:2000], attempt.started_at))
        log_event(log, "batch_attempt_failed", logging.WARNING, batch=attempt.batch.batch_id, attempt=attempt.number,
                  reason=reason, error=message[:300], retry=will_retry)
        if will_retry:
            self.summary.retries += 1
            self.metrics.retries.labels(reason).inc()
            retry = Attempt(attempt.batch, attempt.number + 1, attempt.history, attempt.first_started_at)
            heapq.heappush(self._retries, (time.monotonic() + backoff_seconds(attempt.number), next(self._tie), retry))
            return None
        self.metrics.batches.labels("failed").inc()
        self.failed_batches += 1
        retry = self.spec.retry
        # A percentage is of all batches, known once the input is read through: the run decides
        # it at its end (too_many_failed_batches); a plain count can stop the job at once.
        if retry.failed_batches_tolerated_percent is None and self.failure is None:
            self.failure = too_many_failed_batches(retry, self.failed_batches, None, f"last: {reason}: {message}")
        return BatchOutcome(attempt.batch.batch_id, "failed", attempt.batch.records, attempt.history,
                            attempt.first_started_at, error=f"{reason}: {message}"[:4000],
                            duration_s=(now() - attempt.first_started_at).total_seconds())
