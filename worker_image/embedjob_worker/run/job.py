"""Runs one embedding job: its start (start.py), its batches through feed, dispatch and writers, its end (end.py).

The steps (docs/driver.md, "What a run does"): migrate, take the job's lock, resolve the
model's revision and fingerprint the input, load the tokenizer a token budget or
spec.chunking needs, start or resume the run row, upgrade a vectors table from before
chunking (vectors_table), then stream the batches, each without the records whose vector
is up to date (embedjob_worker.sink.incremental), cut into chunks with spec.chunking; once
the first batch needs the model, lease the shared pool if the job runs on one, start the
actors and wait for their model, and run the batches through the Dispatcher into the
SinkWriter. Finally delete the vectors of ids gone from the source if sync.deleteMissing
says so, build the vector index the spec asks for, and record how the run ended.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import psycopg

from embedjob.api import RunCounters

from embedjob_worker.core.config import JobConfig
from embedjob_worker.core.errors import JobFailed, Unreachable, retry_database, too_many_failed_batches
from embedjob_worker.core.logs import log_event
from embedjob_worker.core.metrics import DriverMetrics
from embedjob_worker.core.outcome import BatchWriter
from embedjob_worker.core.tally import RunSummary, RunTally
from embedjob_worker.core.worker_reports import WorkerInfo
from embedjob_worker.encode.dispatch import Dispatcher
from embedjob_worker.encode.lease import PoolLease
from embedjob_worker.encode.model import ResolvedModel, check_dimensions, check_model, described_prompt
from embedjob_worker.encode.pools import pool_name, shared_cluster
from embedjob_worker.encode.precision import checked_precision
from embedjob_worker.encode.workers import ActorSet
from embedjob_worker.plan.batching import Batch
from embedjob_worker.plan.checks import IdRegistry, SortedIds
from embedjob_worker.plan.feed import FeedPlan, FeedSkips, batches_to_embed
from embedjob_worker.run.end import build_index, delete_gone, drop_previous, finish_run, refused
from embedjob_worker.run.start import StartedRun, migrate, start_run
from embedjob_worker.sink.incremental import (
    IncrementalFeed, StoredHashes, forget_seen_ids, run_batch_ids,
)
from embedjob_worker.sink.job_lock import JobLock
from embedjob_worker.sink.postgres import PostgresSink, open_engine
from embedjob_worker.sink.runs import JobRuns, RunSession, shards_read
from embedjob_worker.sink.seen_ids import SeenIds
from embedjob_worker.sink.target import SinkTarget
from embedjob_worker.sink.vector_index import check_indexable
from embedjob_worker.sink.vectors_table import add_metadata_columns, ensure_vectors_table, upgrade_vectors_table
from embedjob_worker.sink.writer import SinkWriter
from embedjob_worker.sink.writer_pool import WriterPool
from embedjob_worker.source.table import equal_ids_adjacent, table_uri

log = logging.getLogger("embedjob_worker.run.job")


@dataclass
class DriverOptions:
    new_run: bool = False
    metrics: DriverMetrics | None = None
    # Called from the driver loop with the run's counters (the CLI draws its progress bar).
    on_progress: Callable[[RunCounters], None] | None = None
    fault_injection: dict | None = None
    workers_ready_timeout_s: float = 900.0
    # A batch attempt without a result after max(this, 20 × the median batch latency) is hung.
    hung_batch_floor_s: float = 60.0
    # A second driver of a job waits this long for the first one's lock, then refuses (JobAlreadyRunning).
    job_lock_wait_s: float = 600.0
    # Where a table source is read (spec.source.databaseSecretRef); None: the sink's database.
    source_database_url: str | None = None


class JobRun:
    """One run of the job: the database's engine, the job's target and runs, and the counts shared by its steps."""

    def __init__(self, config: JobConfig, database_url: str, options: DriverOptions):
        self.config, self.spec, self.options = config, config.spec, options
        self.database_url = database_url
        self.source_database_url = options.source_database_url or database_url
        self.metrics = options.metrics or DriverMetrics()
        self.tally = RunTally()
        self.started = time.monotonic()
        self.summary = RunSummary(run_id=None, state="running", batching=str(config.spec.chosen_batching))
        self.engine = open_engine(database_url)
        self.target = SinkTarget.of_job(config)  # its schema once the database answers (run)

    def run(self) -> RunSummary:
        with ExitStack() as cleanup:  # on the way out: the job's lock is released, then the engine goes
            cleanup.callback(self.engine.dispose)
            try:
                migrate(self.database_url)
                self.target = retry_database(lambda: self.target.in_schema_of(self.engine), "vectors_schema")
                self.runs = JobRuns(self.engine, self.target, self.config.name, self.config.namespace)
                self.sink = PostgresSink(self.engine, self.target)
                self.lock = JobLock.take(self.engine, self.config.job_key, self.options.job_lock_wait_s)
                cleanup.callback(self.lock.release)
                started = start_run(self.config, self.runs, self.options.new_run)
            except JobFailed as failure:
                return refused(self.summary, failure)
            run, resolved = started.start.run, started.resolved
            self.summary.run_id, self.summary.prompt = run.run_id, described_prompt(resolved)
            self.summary.change_window = started.window  # finish_run records it, with the watermark its read took
            log_event(log, "run_started", job=self.config.job_key, run=run.run_id, resumed=started.start.resumed,
                      model=resolved.name, revision=resolved.revision, source=started.uri,
                      batching=self.summary.batching, prompt=self.summary.prompt, dimensions=resolved.dimensions)
            failure = self._load(started)
            finish_run(self.runs, run, failure, self.tally, self.summary, time.monotonic() - self.started)
            if failure is None:
                drop_previous(self.runs, self.spec.sink.retain_previous)
            self._report()
            return self.summary

    def _load(self, started: StartedRun) -> JobFailed | None:
        """The vectors table brought up to date, every batch still to do embedded and written, the vectors of ids
        gone deleted (sync.deleteMissing) and the index built; why the run failed, or None."""
        run = started.start.run
        try:
            # Before the table is read (stored hashes) or written: never chunks into a table keyed without them.
            retry_database(lambda: upgrade_vectors_table(self.engine, self.target.vectors), "vectors_table")
            if self.target.metadata:
                retry_database(lambda: add_metadata_columns(self.engine, self.target.vectors), "metadata_columns")
            failure = self._embed(started) or self.lock.failure()  # a driver that lost its lock deletes nothing
            if failure is None and self.spec.sync.delete_missing:
                delete_gone(self.engine, self.spec, self.target.vectors, run, started.window,
                            self.source_database_url, self.tally)
            return failure or build_index(self.engine, self.spec, self.target.vectors, self.summary)
        except Unreachable:
            raise
        except JobFailed as exc:  # raised while the actors are being set up (e.g. the model's export)
            return exc
        except Exception as exc:  # noqa: BLE001 - unforeseen: the run still ends failed, with the reason
            log.exception("unforeseen error in run %s", run.run_id)
            return JobFailed("InternalError", f"{type(exc).__name__}: {exc}"[:4000])

    def _embed(self, started: StartedRun) -> JobFailed | None:
        """Embed and write every batch still to do; why the run failed, or None."""
        spec, start, resolved = self.spec, started.start, started.resolved
        run = start.run
        run_batches = run_batch_ids(self.engine, self.config.job_key, run.run_id) if start.resumed else set()
        if start.resumed:
            self.tally.resumed(start.records_new, start.records_changed, start.chunks_embedded)
            if spec.source.table:
                forget_seen_ids(self.engine, run)
        # Batches are skipped by id only within the run (a new run's vectors may have been deleted
        # since), and never for a table: its batch ids name rows, and rows change between sessions.
        done_before = {} if spec.source.table else {
            batch_id: done for batch_id, done in self.runs.succeeded_batches().items() if batch_id in run_batches}
        failure: JobFailed | None = None
        with ExitStack() as cleanup:
            writer = SinkWriter(self.sink, run, self.tally, self.lock.failure)
            cleanup.callback(writer.close)  # drains what is queued
            try:
                stored = StoredHashes(self.engine, self.target.vectors, spec.sink.collection, resolved.name,
                                      resolved.revision, self.target.salt, self.target.metadata)
                batches = batches_to_embed(
                    FeedPlan(spec, started.uri, started.key, self.source_database_url, started.budget,
                             started.chunker, started.files, started.window),
                    FeedSkips(self._id_registry(run), done_before,
                              IncrementalFeed(stored, run_batches, self.tally, run).to_embed,
                              shards_read(self.engine, run.run_id) if start.resumed and started.files else {}),
                    self.tally, self.metrics, writer.put_bad_records, writer.put_shard_read)
                # No actor starts (nor model loads) before a batch needs one: an unchanged re-run starts none.
                first = next(batches, None)
                failure = (self._outcome_failure(0) if first is None else
                           self._dispatch(resolved, itertools.chain([first], batches), writer, len(done_before),
                                          run))
            except JobFailed as exc:
                failure = exc
        return writer.failure() or failure

    def _id_registry(self, run: RunSession) -> IdRegistry:
        """How duplicate ids are found: in PostgreSQL (seen_ids, which sync.deleteMissing needs: every id
        read), or, for a table read in an order that puts equal ids together, by comparing neighbours."""
        table = self.spec.source.table
        if table is not None and not self.spec.sync.delete_missing:
            try:
                if equal_ids_adjacent(self.source_database_url, table):
                    return SortedIds()
            except psycopg.Error as exc:  # as reading the table would fail
                raise JobFailed("SourceUnreadable",
                                f"reading {table_uri(table)}: {type(exc).__name__}: {exc}") from None
        return SeenIds(self.engine, run)

    def _dispatch(self, resolved: ResolvedModel, batches: Iterator[Batch], writer: SinkWriter,
                  skipping: int, run: RunSession) -> JobFailed | None:
        """Start the actors (on a leased shared pool if the job has one) and run every batch through them,
        written by `writer` or, with spec.sink.writers, by writer actors."""
        spec = self.spec
        cluster = shared_cluster(self.config)
        shared_pool = pool_name(resolved, spec.workers.cpus_per_actor, spec.workers.gpus_per_actor) if cluster else None
        with ExitStack() as cleanup:  # on the way out: the actors go, then the lease is released
            lease = None
            if shared_pool:
                # Leased before any actor is touched, so the operator never removes the pool under us.
                lease = PoolLease.acquire(self.engine, shared_pool, cluster, self.config, spec.workers.replicas)
                cleanup.callback(lease.release)
            actors = ActorSet(self.config, resolved, self.options.fault_injection, lease)
            cleanup.callback(actors.shutdown)
            results: BatchWriter = writer
            if spec.sink.writers:  # started while the actors load the model
                results = writers = WriterPool(spec.sink.writers, self.database_url, self.target, run, self.tally,
                                               writer, spec.retry.attempts_per_batch)
                cleanup.callback(writers.close)  # drained before the actors and the lease go
            dispatcher = self._dispatcher(actors, resolved, skipping)
            batches = checked_precision(actors.actors[0], resolved.precision, spec.model.min_cosine, batches,
                                        self.tally, self.options.workers_ready_timeout_s)
            dispatcher.run(batches, results, self._report)
            cleanup.close()  # every group written (or writing failed): only then is the outcome known
            if spec.sink.writers:
                self.summary.writers = writers.committed_by
            return dispatcher.failure or results.failure() or self._outcome_failure(dispatcher.failed_batches)

    def _outcome_failure(self, failed_batches: int) -> JobFailed | None:
        """Once every batch has been tried: too many failed batches for a percentage tolerance,
        or an input with records of which none was embedded (never reported as success)."""
        counters = self.tally.counters()
        too_many = too_many_failed_batches(self.spec.retry, failed_batches, counters.batches_total,
                                           "the percentage is of all the input's batches")
        if too_many is not None:
            return too_many
        if counters.records_total and not counters.records_embedded:
            return JobFailed("NothingEmbedded", f"none of the input's {counters.records_total} records was embedded; "
                                                "their reasons are in embedjob_record_errors")
        return None

    def _dispatcher(self, actors: ActorSet, resolved: ResolvedModel, skipping: int) -> Dispatcher:
        """Once every actor has loaded the job's model: the vectors table, and the dispatcher."""
        infos = self._ready_workers(actors, resolved)
        self._prepare_vectors_table(infos[0].dimension)
        self._start_embedding(infos, skipping)
        return Dispatcher(self.spec, actors, resolved, infos[0].max_tokens, self.metrics, self.summary,
                          self.options.hung_batch_floor_s)

    def _ready_workers(self, actors: ActorSet, resolved: ResolvedModel) -> list[WorkerInfo]:
        """Each actor's info once it has loaded the model, which must be the job's (ModelMismatch)."""
        infos = actors.wait_ready(self.options.workers_ready_timeout_s)
        self.summary.workers = infos
        for info in infos:
            check_model(info, resolved)
        check_dimensions(resolved, infos[0].model_dimension)
        return infos

    def _prepare_vectors_table(self, dimension: int) -> None:
        """The vectors table for the model's vectors, created unless it is there; refused when the index
        spec.sink.index asks for cannot take them."""
        sink = self.spec.sink
        ensure_vectors_table(self.engine, self.target.vectors, dimension, sink.vector_type)
        check_indexable(sink.hnsw, sink.vector_type, dimension)

    def _start_embedding(self, infos: list[WorkerInfo], skipping: int) -> None:
        """The model's load time into the summary and metrics; texts per second count from here."""
        self.summary.model_load_seconds = max(i.load_seconds for i in infos)
        self.metrics.model_load_seconds.set(self.summary.model_load_seconds)
        log_event(log, "workers_ready", replicas=len(infos), load_seconds=round(self.summary.model_load_seconds, 2),
                  actors=",".join(i.actor_id for i in infos), dimension=infos[0].dimension, skipping=skipping)
        self.tally.start_embedding()

    def _report(self) -> None:
        counters = self.tally.counters()
        self.metrics.texts_per_second.set(counters.texts_per_second)
        if self.options.on_progress:
            self.options.on_progress(counters)


def run_job(config: JobConfig, database_url: str, options: DriverOptions | None = None) -> RunSummary:
    """Run (or resume) the job on the Ray cluster this process is connected to."""
    return JobRun(config, database_url, options or DriverOptions()).run()
