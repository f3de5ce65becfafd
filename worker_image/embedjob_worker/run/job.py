"""Runs one embedding job: starts or resumes its run and wires lease, actors, feed, dispatch and writer.

The steps (docs/driver.md, "What a run does"): migrate, resolve the model's revision
and fingerprint the input, load the tokenizer a token budget or spec.chunking needs, start
or resume the run row, upgrade a vectors table from before chunking (vectors_table), then
stream the batches, each without the records whose vector is up to date
(embedjob_worker.sink.incremental), cut into chunks with spec.chunking; once the
first batch needs the model, lease the shared pool if the job runs on one, start the
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
import sqlalchemy as sa

from embedjob import db
from embedjob.api import RunCounters

from embedjob_worker.plan.batching import Batch, TokenBudget, batch_key
from embedjob_worker.plan.chunking import Chunker
from embedjob_worker.core.config import JobConfig, config_fingerprint, run_identity
from embedjob_worker.encode.dispatch import Dispatcher
from embedjob_worker.core.errors import DB_ERRORS, JobFailed, Unreachable, retry_database, too_many_failed_batches
from embedjob_worker.plan.feed import FeedPlan, FeedSkips, batches_to_embed
from embedjob_worker.sink.incremental import (
    IncrementalFeed, StoredHashes, delete_missing, forget_seen_ids, latest_run_succeeded, run_batch_ids,
)
from embedjob_worker.encode.lease import PoolLease
from embedjob_worker.core.logs import log_event
from embedjob_worker.core.metrics import DriverMetrics
from embedjob_worker.encode.model import ResolvedModel, resolve_model
from embedjob_worker.encode.pools import pool_name, shared_cluster
from embedjob_worker.plan.checks import IdRegistry, SortedIds
from embedjob_worker.sink.seen_ids import SeenIds
from embedjob_worker.sink.job_lock import JobLock
from embedjob_worker.sink.postgres import PostgresSink, open_engine
from embedjob_worker.sink.runs import JobRuns, RunRequest, RunSession, RunStart
from embedjob_worker.sink.target import SinkTarget
from embedjob_worker.source.snapshot import InputSnapshot, input_snapshot
from embedjob_worker.source.files import resolve_uri
from embedjob_worker.source.table import equal_ids_adjacent, table_snapshot, table_uri
from embedjob_worker.core.tally import RunSummary, RunTally
from embedjob_worker.encode.tokens import chunker_for, load_tokenizer, model_token_limit, token_budget
from embedjob_worker.sink.vector_index import check_indexable, ensure_index, metric_for
from embedjob_worker.sink.vectors_table import ensure_vectors_table, upgrade_vectors_table
from embedjob_worker.encode.workers import ActorSet, check_model
from embedjob_worker.core.outcome import BatchWriter
from embedjob_worker.sink.writer import SinkWriter
from embedjob_worker.sink.writer_pool import WriterPool

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
    def __init__(self, config: JobConfig, database_url: str, options: DriverOptions):
        self.config, self.spec, self.options = config, config.spec, options
        self.database_url = database_url
        self.source_database_url = options.source_database_url or database_url
        self.metrics = options.metrics or DriverMetrics()
        self.tally = RunTally()
        self.started = time.monotonic()
        self.summary = RunSummary(run_id=None, state="running")
        self.engine = open_engine(database_url)
        self.target = SinkTarget.of_job(config)
        self.sink = PostgresSink(self.engine, self.target)
        self.runs = JobRuns(self.engine, self.target, config.name, config.namespace)
        self.job_lock: JobLock | None = None

    def run(self) -> RunSummary:
        try:
            return self._run()
        finally:
            if self.job_lock is not None:
                self.job_lock.release()
            self.engine.dispose()

    def _run(self) -> RunSummary:
        try:
            db.migrate(self.database_url)
        except sa.exc.OperationalError as exc:
            raise Unreachable(f"cannot reach the database: {str(exc.orig).splitlines()[0]}") from None
        except db.SchemaBehind as exc:  # a namespace role may not migrate: an admin must (docs/install.md)
            return self._refused(JobFailed("SchemaBehind", str(exc)))
        try:
            self.job_lock = JobLock.take(self.engine, self.config.job_key, self.options.job_lock_wait_s)
            resolved, uri, snapshot = self._resolve_inputs()
            budget, chunker = self._token_plan(resolved)
            identity = run_identity(self.spec, resolved.revision)
            config_fp = config_fingerprint(identity)
            # A table's rows change by design: each sync after a finished one is a run of its own (docs/table-source.md).
            new_run = self.options.new_run or (self.spec.source.table is not None
                                               and latest_run_succeeded(self.engine, self.config.job_key))
            start = self.runs.start(RunRequest(resolved.name, resolved.revision, snapshot.fingerprint, config_fp,
                                               identity, snapshot.record()), new_run, self.config.how_to_start_anew)
        except JobFailed as failure:
            return self._refused(failure)
        run = start.run
        self.summary.run_id = run.run_id
        log_event(log, "run_started", job=self.config.job_key, run=run.run_id, resumed=start.resumed,
                  model=resolved.name, revision=resolved.revision, source=uri)
        try:
            # Before the table is read (stored hashes) or written: never chunks into a table keyed without them.
            retry_database(lambda: upgrade_vectors_table(self.engine, self.spec.sink.table), "vectors_table")
            failure = self._embed(resolved, uri, batch_key(snapshot.fingerprint, config_fp), start, budget, chunker)
            if failure is None and self.spec.sync.delete_missing:
                self.tally.deleted(retry_database(lambda: delete_missing(
                    self.engine, self.spec.sink.table, self.spec.sink.collection, resolved.name,
                    resolved.revision, run.run_id), "delete_missing"))
            failure = failure or self._build_index()
        except Unreachable:
            raise
        except JobFailed as exc:  # raised while the actors are being set up (e.g. the model's export)
            failure = exc
        except Exception as exc:  # noqa: BLE001 - unforeseen: the run still ends failed, with the reason
            log.exception("unforeseen error in run %s", run.run_id)
            failure = JobFailed("InternalError", f"{type(exc).__name__}: {exc}"[:4000])
        self._finish(run, failure)
        return self.summary

    def _refused(self, failure: JobFailed) -> RunSummary:
        """The job cannot start a run: no run row is written, the summary says why."""
        log_event(log, "job_refused", logging.ERROR, reason=failure.reason, error=str(failure))
        self.summary.state, self.summary.reason, self.summary.error = "failed", failure.reason, str(failure)
        return self.summary

    def _resolve_inputs(self) -> tuple[ResolvedModel, str, InputSnapshot]:
        """Model revision and input fingerprint; failing either is recorded as a refused run."""
        table = self.spec.source.table
        uri = table_uri(table) if table else resolve_uri(self.spec.source.uri, self.config.base_dir)
        try:
            resolved = resolve_model(self.spec.model)
        except (OSError, ValueError) as exc:
            failure = JobFailed("ModelUnavailable", f"spec.model: {exc}")
        else:
            try:
                return resolved, uri, table_snapshot(table) if table else input_snapshot(uri)
            except (OSError, ValueError) as exc:
                failure = JobFailed("SourceUnavailable", f"spec.source {uri}: {type(exc).__name__}: {exc}")
        self.runs.refuse_start(self.spec.model.name, failure)
        raise failure

    def _token_plan(self, resolved: ResolvedModel) -> tuple[TokenBudget | None, Chunker | None]:
        """The token budget and the chunker the spec asks for (one tokenizer for both); a refused start
        when the model cannot take them."""
        spec, limit = self.spec, model_token_limit(resolved)
        try:
            tokenizer = (load_tokenizer(resolved) if spec.batching.max_tokens is not None and spec.chunking is not None
                         else None)
            return (token_budget(spec.batching.max_tokens, resolved, limit, tokenizer),
                    chunker_for(spec.chunking, resolved, limit, tokenizer))
        except (OSError, ValueError) as exc:
            failure = JobFailed("ModelUnavailable", f"spec.model: the tokenizer: {type(exc).__name__}: {exc}")
        except JobFailed as exc:
            failure = exc
        self.runs.refuse_start(self.spec.model.name, failure)
        raise failure

    def _embed(self, resolved: ResolvedModel, uri: str, key: str, start: RunStart, budget: TokenBudget | None,
               chunker: Chunker | None) -> JobFailed | None:
        """Embed and write every batch still to do; why the run failed, or None."""
        spec, run = self.spec, start.run
        run_batches = run_batch_ids(self.engine, self.config.job_key, run.run_id) if start.resumed else set()
        if start.resumed:
            self.tally.resumed(start.records_new, start.records_changed, start.chunks_embedded)
            if spec.source.table:
                forget_seen_ids(self.engine, run.run_id)
        # Batches are skipped by id only within the run (a new run's vectors may have been deleted
        # since), and never for a table: its batch ids name rows, and rows change between sessions.
        done_before = {} if spec.source.table else {
            batch_id: done for batch_id, done in self.runs.succeeded_batches().items() if batch_id in run_batches}
        failure: JobFailed | None = None
        with ExitStack() as cleanup:
            writer = SinkWriter(self.sink, run, self.tally)
            cleanup.callback(writer.close)  # drains what is queued
            try:
                stored = StoredHashes(self.engine, spec.sink.table, spec.sink.collection, resolved.name,
                                      resolved.revision, self.target.salt)
                batches = batches_to_embed(
                    FeedPlan(spec, uri, key, self.source_database_url, budget, chunker),
                    FeedSkips(self._id_registry(run.run_id), done_before,
                              IncrementalFeed(stored, run_batches, self.tally).to_embed),
                    self.tally, self.metrics, writer.put_bad_records)
                # No actor starts (nor model loads) before a batch needs one: an unchanged re-run starts none.
                first = next(batches, None)
                failure = (self._outcome_failure(0) if first is None else
                           self._dispatch(resolved, itertools.chain([first], batches), writer, len(done_before),
                                          run))
            except JobFailed as exc:
                failure = exc
        return writer.failure() or failure

    def _id_registry(self, run_id: str) -> IdRegistry:
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
        return SeenIds(self.engine, run_id)

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
            dispatcher.run(batches, results, self._report)
            cleanup.close()  # every group written (or writing failed): only then is the outcome known
            if spec.sink.writers:
                self.summary.writers = writers.committed_by
            return dispatcher.failure or results.failure() or self._outcome_failure(dispatcher.failed_batches)

    def _build_index(self) -> JobFailed | None:
        """After a successful load: the HNSW index spec.sink.index asks for, unless the table has it already."""
        index, sink = self.spec.sink.hnsw, self.spec.sink
        if index is None:
            return None
        try:  # not retried: a build that failed (memory, timeout) is retried by re-running the job
            self.summary.index = ensure_index(self.engine, sink.table, sink.vector_type,
                                              metric_for(self.spec.model.normalize), index)
        except sa.exc.DBAPIError as exc:
            return JobFailed("IndexBuildFailed", f"spec.sink.index: building the HNSW index on table {sink.table} "
                                                 f"failed: {str(exc.orig).strip()}; the vectors are written, a re-run "
                                                 "builds only the index")
        if self.summary.index.note:  # kept with other parameters, or built past its memory
            log_event(log, "index_built_slowly" if self.summary.index.built else "index_kept", logging.WARNING,
                      note=self.summary.index.note)
        return None

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
        infos = actors.wait_ready(self.options.workers_ready_timeout_s)
        self.summary.workers = infos
        for info in infos:
            check_model(info, resolved)
        ensure_vectors_table(self.engine, self.spec.sink.table, infos[0]["dimension"], self.spec.sink.vector_type)
        check_indexable(self.spec.sink.hnsw, self.spec.sink.vector_type, infos[0]["dimension"])
        self.summary.model_load_seconds = max(i["load_seconds"] for i in infos)
        self.metrics.model_load_seconds.set(self.summary.model_load_seconds)
        log_event(log, "workers_ready", replicas=len(infos), load_seconds=round(self.summary.model_load_seconds, 2),
                  actors=",".join(i["actor_id"] for i in infos), dimension=infos[0]["dimension"], skipping=skipping)
        self.tally.start_embedding()
        return Dispatcher(self.spec, actors, resolved, infos[0]["max_tokens"], self.metrics, self.summary,
                          self.options.hung_batch_floor_s)

    def _report(self) -> None:
        counters = self.tally.counters()
        self.metrics.texts_per_second.set(counters.texts_per_second)
        if self.options.on_progress:
            self.options.on_progress(counters)

    def _finish(self, run: RunSession, failure: JobFailed | None) -> None:
        built = self.summary.index
        update = self.tally.driver_update()
        update.set["index_build_seconds"] = round(built.seconds, 3) if built and built.built else None
        state = "failed" if failure else "succeeded"
        self.summary.state = state
        self.summary.batches_skipped = self.tally.batches_skipped
        self.summary.records_truncated += self.tally.truncated_skipped  # the run's, not only this session's
        self.summary.reason = failure.reason if failure else None
        self.summary.error = str(failure) if failure else None
        self.summary.elapsed_seconds = time.monotonic() - self.started
        try:
            row = retry_database(lambda: self.runs.finish(run, state, self.summary.reason, self.summary.error, update),
                                 "finish_run")
        except DB_ERRORS as exc:
            raise Unreachable(f"cannot record the run's end in the database: {exc}") from None
        except JobFailed as superseded:  # another driver resumed the run: the row is its now
            log_event(log, "run_superseded", logging.ERROR, run=run.run_id, error=str(superseded))
            row = self.tally.counters().model_dump() | update.set
        # The row's counters, which every writer's commits added to.
        self.summary.counters = counters = RunCounters(**{name: row[name] for name in RunCounters.model_fields})
        log_event(log, "run_finished", logging.ERROR if failure else logging.INFO, run=run.run_id, state=state,
                  reason=self.summary.reason, error=self.summary.error, **counters.model_dump())
        self._report()


def run_job(config: JobConfig, database_url: str, options: DriverOptions | None = None) -> RunSummary:
    """Run (or resume) the job on the Ray cluster this process is connected to."""
    return JobRun(config, database_url, options or DriverOptions()).run()
