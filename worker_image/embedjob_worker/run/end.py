"""The end of a job's run: the vectors of ids gone deleted, the vector index built, the run row finished, the summary
filled in, the retired revisions past spec.sink.retainPrevious dropped; a refused start."""

from __future__ import annotations

import logging
import time

import psycopg
import sqlalchemy as sa

from embedjob.api import EmbeddingJobSpec, RunCounters

from embedjob_worker.core.change_window import ChangeWindow
from embedjob_worker.core.errors import DB_ERRORS, JobFailed, Unreachable, retry_database
from embedjob_worker.core.logs import log_event, mask_secrets
from embedjob_worker.core.tally import RunSummary, RunTally
from embedjob_worker.sink.incremental import delete_missing
from embedjob_worker.sink.revisions import drop_retired
from embedjob_worker.sink.runs import JobRuns, RunSession
from embedjob_worker.sink.seen_ids import SeenIds
from embedjob_worker.sink.target import VectorsTable
from embedjob_worker.sink.vector_index import ensure_index, ensure_metadata_index, metric_for
from embedjob_worker.source.table import read_table_ids, table_uri

log = logging.getLogger("embedjob_worker.run.end")


def refused(summary: RunSummary, failure: JobFailed) -> RunSummary:
    """The job cannot start a run: no run row is written, the summary says why."""
    summary.state, summary.reason, summary.error = "failed", failure.reason, mask_secrets(str(failure))
    log_event(log, "job_refused", logging.ERROR, reason=failure.reason, error=summary.error)
    return summary


def delete_gone(engine: sa.Engine, spec: EmbeddingJobSpec, vectors: VectorsTable, run: RunSession,
                window: ChangeWindow | None, source_url: str | None, tally: RunTally) -> None:
    """sync.deleteMissing after a successful load: the vectors of ids the run did not read deleted, once it has read
    every id (a full read; or a change window's read, and then its id scan, read here); a window read without an
    id scan deletes nothing. JobFailed (SourceUnreadable) when the id scan cannot read the table."""
    if window is not None and window.read_from is not None:
        if window.id_scan is None:
            log_event(log, "delete_missing_not_this_run", window_runs=window.window_runs,
                      full_scan_every=spec.sync.full_scan_every or 1)
            return
        _scan_ids(source_url, spec, SeenIds(engine, run))
    tally.deleted(retry_database(lambda: delete_missing(engine, vectors, spec.sink.collection, run),
                                 "delete_missing"))


def _scan_ids(source_url: str | None, spec: EmbeddingJobSpec, seen: SeenIds) -> None:
    """Every id of the table recorded as read (the run's own records claimed theirs as they were read)."""
    table, started, ids = spec.source.table, time.monotonic(), 0
    assert table is not None  # a change window is a table's
    try:
        for page in read_table_ids(source_url, table):
            seen.read_ids(page)
            ids += len(page)
    except (ValueError, psycopg.Error) as exc:  # SourceWaitExceeded is a ValueError
        raise JobFailed("SourceUnreadable", f"reading the ids of {table_uri(table)} (sync.deleteMissing): "
                                            f"{type(exc).__name__}: {exc}") from None
    log_event(log, "ids_scanned", table=table_uri(table), ids=ids, seconds=round(time.monotonic() - started, 3))


def build_index(engine: sa.Engine, spec: EmbeddingJobSpec, table: VectorsTable, summary: RunSummary
                ) -> JobFailed | None:
    """After a successful load: the indexes spec.sink.index asks for on `table` (the metadata's GIN index, the HNSW
    index; into `summary`), unless the table has them already."""
    index, sink = spec.sink.hnsw, spec.sink
    try:  # not retried: a build that failed (memory, timeout) is retried by re-running the job
        if sink.index is not None and sink.index.metadata:
            summary.metadata_index = ensure_metadata_index(engine, table)
        if index is None:
            return None
        summary.index = ensure_index(engine, table, sink.vector_type, metric_for(spec.model.normalize), index)
    except sa.exc.DBAPIError as exc:
        return JobFailed("IndexBuildFailed", f"spec.sink.index: building an index on table {table} "
                                             f"failed: {str(exc.orig).strip()}; the vectors are written, a re-run "
                                             "builds only the index")
    if summary.index.note:  # kept with other parameters, or built past its memory
        log_event(log, "index_built_slowly" if summary.index.built else "index_kept", logging.WARNING,
                  note=summary.index.note)
    return None


def finish_run(runs: JobRuns, run: RunSession, failure: JobFailed | None, tally: RunTally, summary: RunSummary,
               elapsed_s: float) -> None:
    """The run row's end (failed with `failure`, else succeeded) and the summary of the run, with the row's
    counters; Unreachable when the database cannot record it."""
    built = summary.index
    update = tally.driver_update()
    update.set["index_build_seconds"] = round(built.seconds, 3) if built and built.built else None
    if summary.change_window is not None:  # with the watermark its read took: the next run may read from it
        update.set["change_window"] = summary.change_window.record()
    state = "failed" if failure else "succeeded"
    summary.state = state
    summary.batches_skipped = tally.batches_skipped
    summary.records_truncated += tally.truncated_skipped  # the run's, not only this session's
    summary.metadata_updated = tally.records_metadata_updated
    summary.reason = failure.reason if failure else None
    summary.error = mask_secrets(str(failure)) if failure else None  # printed by `embedjob run`, stored
    summary.elapsed_seconds = elapsed_s
    try:
        row = retry_database(lambda: runs.finish(run, state, summary.reason, summary.error, update), "finish_run")
    except DB_ERRORS as exc:
        raise Unreachable(f"cannot record the run's end in the database: {exc}") from None
    except JobFailed as superseded:  # another driver resumed the run: the row is its now
        log_event(log, "run_superseded", logging.ERROR, run=run.run_id, error=str(superseded))
        row = tally.counters().model_dump() | update.set
    # The row's counters, which every writer's commits added to.
    summary.counters = counters = RunCounters(**{name: row[name] for name in RunCounters.model_fields})
    log_event(log, "run_finished", logging.ERROR if failure else logging.INFO, run=run.run_id, state=state,
              reason=summary.reason, error=summary.error, **counters.model_dump())


def drop_previous(runs: JobRuns, retain: int) -> None:
    """After a successful run: the collection's retired revisions past the `retain` latest dropped with their vectors
    (revisions.drop_retired). The run is recorded already; a drop the database cut short is logged and taken up
    again after the next switch."""
    try:
        drop_retired(runs.engine, runs.target.vectors, runs.target.collection, retain)
    except (sa.exc.DBAPIError, *DB_ERRORS) as exc:
        log_event(log, "revision_drop_failed", logging.WARNING, error=mask_secrets(str(exc)))
