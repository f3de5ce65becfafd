"""The batch writes of a run: a group of finished batches' rows, attempts, record errors, vectors (COPY) and counts.

A group of finished batches is written in one transaction: their batch rows (the
`succeeded` marks), their vectors by binary COPY into a temp staging table and one merge
into the vectors table (or straight into it when all their records are new), attempt rows,
record errors and what they add to the run's counters. A crash therefore loses whole
batches, never half of one, and a re-run rewrites nothing that is unchanged (the merge
skips rows whose content hash is the same).

Several writers may commit groups of one run at once (spec.sink.writers), so a group adds
its counts to the run row (`n = n + k`) instead of setting them, and commits only while
the run row still names the driver session that wrote the group (runs.update_run): a
dead driver's writer cannot commit into the session that resumed the run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from embedjob import db

from embedjob_worker.core.logs import log_event
from embedjob_worker.core.outcome import BatchOutcome, CounterUpdate, group_counts, now
from embedjob_worker.core.records import BadRecord
from embedjob_worker.core.shards import ShardRead
from embedjob_worker.sink.copy_data import copy_columns, copy_payload
from embedjob_worker.sink.runs import RunSession, counter_values, shard_row, update_run
from embedjob_worker.sink.target import SinkTarget

# One staging table per vector type (embedjob.vector_types.VECTOR_TYPES), so the COPY carries the column's own binary format.
_STAGING_DDL = (
    "CREATE TEMP TABLE IF NOT EXISTS embedjob_staging_{vector_type} (record_id text, chunk int4, char_start int4,"
    " char_end int4, content_hash text, embedding {vector_type}, text text, batch_id text, metadata jsonb,"
    " metadata_hash text) ON COMMIT DELETE ROWS"
)
_COPY_SQL = "COPY embedjob_staging_{vector_type} ({columns}) FROM STDIN (FORMAT BINARY)"
# New records' vectors straight into the vectors table: copy_columns, then the values the sink sets.
_DIRECT_COPY_SQL = "COPY {table} ({columns}, collection, model, revision, job_key) FROM STDIN (FORMAT BINARY)"
# {metadata} and its kin: the metadata columns when the job keeps metadata (_METADATA_MERGE), else nothing (its
# rows' metadata stays as an earlier job wrote it).
_MERGE_SQL = """
INSERT INTO {table} AS t (collection, record_id, chunk, model, revision, content_hash, embedding, text, char_start,
                            char_end, job_key, batch_id{metadata})
SELECT %(collection)s, s.record_id, s.chunk, %(model)s, %(revision)s, s.content_hash, s.embedding, s.text,
       s.char_start, s.char_end, %(job_key)s, s.batch_id{staged_metadata}
FROM embedjob_staging_{vector_type} s
ON CONFLICT (collection, record_id, chunk, model, revision) DO UPDATE
SET content_hash = excluded.content_hash, embedding = excluded.embedding, text = excluded.text,
    char_start = excluded.char_start, char_end = excluded.char_end, job_key = excluded.job_key,
    batch_id = excluded.batch_id, updated_at = now(){set_metadata}
WHERE t.content_hash IS DISTINCT FROM excluded.content_hash{metadata_changed}
"""
_METADATA_MERGE = {
    "metadata": ", metadata, metadata_hash", "staged_metadata": ", s.metadata, s.metadata_hash",
    "set_metadata": ", metadata = excluded.metadata, metadata_hash = excluded.metadata_hash",
    "metadata_changed": " OR t.metadata_hash IS DISTINCT FROM excluded.metadata_hash",
}
# In the merge's transaction: a written record keeps exactly its new chunks (one that got shorter loses the rest).
_DROP_STALE_CHUNKS_SQL = """
DELETE FROM {table} AS t USING (SELECT record_id, max(chunk) AS last FROM embedjob_staging_{vector_type}
                                  GROUP BY record_id) s
WHERE t.collection = %(collection)s AND t.record_id = s.record_id AND t.model = %(model)s
  AND t.revision = %(revision)s AND t.chunk > s.last
"""
log = logging.getLogger("embedjob_worker.sink.postgres")


def open_engine(url: str) -> sa.Engine:
    """The engine of a job's database that a driver (its runs, lock and queries too) or a writer actor writes with."""
    return db.create_engine(url, pool_pre_ping=True, pool_size=2)


class PostgresSink:
    """Writes groups of finished batches of a run into `target` on `engine` (its owner disposes of it)."""

    def __init__(self, engine: sa.Engine, target: SinkTarget):
        self.engine, self.target = engine, target
        names = {"table": target.vectors.sql, "vector_type": target.vector_type,
                 "columns": ", ".join(copy_columns(target.metadata)),
                 **{key: text if target.metadata else "" for key, text in _METADATA_MERGE.items()}}
        self.staging_ddl, self.copy_sql, self.direct_copy_sql, self.merge_sql, self.drop_stale_chunks_sql = (
            sql.format(**names) for sql in (_STAGING_DDL, _COPY_SQL, _DIRECT_COPY_SQL, _MERGE_SQL,
                                            _DROP_STALE_CHUNKS_SQL))

    def write(self, run: RunSession, outcomes: list[BatchOutcome], bad_records: list[BadRecord],
              update: CounterUpdate | None = None, shards: Sequence[ShardRead] = ()) -> list[BatchOutcome]:
        """One transaction: batch marks, vectors of the succeeded batches, attempts, errors, the dataset's shards
        read through (after their bad records, which come in the same or an earlier group), counters; the
        outcomes committed. An outcome whose batch row holds it already (a group sent again after its writer
        was lost, or retried after its commit reply was lost) is written no more, its vectors, attempts and
        counts are in, and it is among those returned: committed all the same. JobFailed (DriverSuperseded),
        and nothing written, once another driver session owns the run."""
        update = update or CounterUpdate()
        job_key = self.target.job_key
        with self.engine.begin() as conn:
            written, found = self._write_batches(conn, run.run_id, outcomes) if outcomes else ([], [])
            succeeded = [o for o in written if o.state == "succeeded"]
            if succeeded:
                with conn.connection.driver_connection.cursor() as cur:
                    self._write_vectors(cur, run, succeeded)
            errors = bad_records + [bad for o in succeeded for bad in o.truncated]
            if errors:
                conn.execute(pg_insert(db.record_errors).on_conflict_do_nothing(), [
                    {"run_id": run.run_id, "position": e.position, "job_key": job_key, "record_id": e.record_id,
                     "batch_id": e.batch_id, "reason": e.reason.value, "detail": e.detail} for e in errors])
            if shards:
                stmt = pg_insert(db.run_shards)
                # A shard read again (some of its batches were not written) replaces what its last reading recorded.
                conn.execute(stmt.on_conflict_do_update(
                    index_elements=[db.run_shards.c.run_id, db.run_shards.c.first_file],
                    set_={c: stmt.excluded[c] for c in ("files", "records", "batches", "counts", "batch_ids")}),
                    [shard_row(run.run_id, shard) for shard in shards])
            update_run(conn, run, {**counter_values(group_counts(written), update.driver), **update.set})
        return written + found

    def _write_vectors(self, cur: psycopg.Cursor, run: RunSession, succeeded: list[BatchOutcome]) -> None:
        """The vectors of `succeeded`, by binary COPY: into the vectors table itself when all their records are new,
        else into the staging table and merged from there."""
        target = self.target
        scope = {"collection": target.collection, "model": run.model, "revision": run.revision}
        # Records the planner found nowhere in the table (incremental.StoredHashes) are copied straight in: no
        # staging table, no speculative inserts, no chunks to drop. One that is there after all (another job
        # wrote it since) fails the COPY on the primary key, undone to the savepoint: the merge decides.
        if all(o.records_new == len(o.records) for o in succeeded):
            cur.execute("SAVEPOINT embedjob_new_records")
            try:
                # in _DIRECT_COPY_SQL's order of the columns after copy_columns
                self._copy(cur, self.direct_copy_sql, succeeded,
                           (target.collection, run.model, run.revision, target.job_key))
                cur.execute("RELEASE SAVEPOINT embedjob_new_records")
                return
            except psycopg.errors.UniqueViolation as error:
                cur.execute("ROLLBACK TO SAVEPOINT embedjob_new_records")
                log_event(log, "new_records_already_written", table=str(target.vectors),
                          batches=len(succeeded), detail=str(error.diag.message_detail))
        cur.execute(self.staging_ddl)
        self._copy(cur, self.copy_sql, succeeded)
        cur.execute(self.merge_sql, {**scope, "job_key": target.job_key})
        cur.execute(self.drop_stale_chunks_sql, scope)

    def _copy(self, cur: psycopg.Cursor, sql: str, outcomes: list[BatchOutcome],
              same_on_every_row: tuple[str, ...] = ()) -> None:
        with cur.copy(sql) as copy:
            for piece in copy_payload(outcomes, self.target.salt, self.target.vector_type, same_on_every_row,
                                      self.target.metadata):
                copy.write(piece)

    def _write_batches(self, conn: sa.Connection, run_id: str,
                       outcomes: list[BatchOutcome]) -> tuple[list[BatchOutcome], list[BatchOutcome]]:
        """The batch rows and attempts of `outcomes`: the ones written, and the ones their batch row held already."""
        job_key = self.target.job_key
        rows = [{
            "job_key": job_key, "batch_id": o.batch_id, "run_id": run_id, "state": o.state,
            "attempts": max(a.attempt for a in o.attempts), "records": len(o.records),
            "failed_records": len(o.records) if o.state == "failed" else 0, "error": o.error,
            "worker": o.worker, "started_at": o.started_at, "finished_at": now(), "duration_s": o.duration_s,
        } for o in outcomes]
        batches, stmt = db.batches, pg_insert(db.batches)
        # An outcome is known by its run, its first dispatch and its state: the same one written twice (a
        # failed batch too) is written once.
        same_outcome = sa.and_(batches.c.state == stmt.excluded.state, batches.c.run_id == stmt.excluded.run_id,
                               batches.c.started_at == stmt.excluded.started_at)
        written_ids = set(conn.execute(stmt.on_conflict_do_update(
            index_elements=[batches.c.job_key, batches.c.batch_id],
            set_={c: stmt.excluded[c] for c in ("run_id", "state", "attempts", "records", "failed_records",
                                                 "error", "worker", "started_at", "finished_at", "duration_s")},
            where=sa.not_(same_outcome),
        ).returning(batches.c.batch_id), rows).scalars())
        written = [o for o in outcomes if o.batch_id in written_ids]
        if written:
            conn.execute(db.batch_attempts.insert(), [{
                "job_key": job_key, "batch_id": o.batch_id, "run_id": run_id, "attempt": a.attempt,
                "worker": a.worker, "outcome": a.outcome, "reason": a.reason, "started_at": a.started_at,
                "finished_at": a.finished_at,
            } for o in written for a in o.attempts])
        return written, [o for o in outcomes if o.batch_id not in written_ids]
