"""The PostgreSQL sink: vectors (pgvector), batches, attempts, record errors, runs.

A group of finished batches is written in one transaction: their batch rows (the
`succeeded` marks), their vectors by binary COPY into a temp staging table and one merge
into the vectors table (or straight into it when all their records are new), attempt rows,
record errors and what they add to the run's counters. A crash therefore loses whole
batches, never half of one, and a re-run rewrites nothing that is unchanged (the merge
skips rows whose content hash is the same).

Several writers may commit groups of one run at once (spec.sink.writers), so a group adds
its counts to the run row (`n = n + k`) instead of setting them, and commits only while
the run row still names the driver session that wrote the group (`driver_session`): a
dead driver's writer cannot commit into the session that resumed the run.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from embedjob import db

from embedjob_worker.core.config import identity_changes
from embedjob_worker.sink.copy_data import COPY_COLUMNS, copy_payload
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.logs import log_event
from embedjob_worker.core.outcome import (ADDED_COUNTERS, KEPT_ON_RESUME, BatchOutcome, CounterUpdate, DoneBatch,
                                          group_counts, now)
from embedjob_worker.core.records import BadRecord
from embedjob_worker.source.snapshot import describe_input
from embedjob_worker.sink.vectors_table import ensure_vectors_table

# One staging table per vector type (db.VECTOR_TYPES), so the COPY carries the column's own binary format.
_STAGING_DDL = (
    "CREATE TEMP TABLE IF NOT EXISTS embedjob_staging_{vector_type} (record_id text, chunk int4, char_start int4,"
    " char_end int4, content_hash text, embedding {vector_type}, text text, batch_id text) ON COMMIT DELETE ROWS"
)
_COPY_SQL = f"COPY embedjob_staging_{{vector_type}} ({', '.join(COPY_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
# New records' vectors straight into the vectors table: COPY_COLUMNS, then the values the sink sets.
_DIRECT_COPY_SQL = (f'COPY "{{table}}" ({", ".join(COPY_COLUMNS)}, collection, model, revision, job_key)'
                    " FROM STDIN (FORMAT BINARY)")
_MERGE_SQL = """
INSERT INTO "{table}" AS t (collection, record_id, chunk, model, revision, content_hash, embedding, text, char_start,
                            char_end, job_key, batch_id)
SELECT %(collection)s, s.record_id, s.chunk, %(model)s, %(revision)s, s.content_hash, s.embedding, s.text,
       s.char_start, s.char_end, %(job_key)s, s.batch_id
FROM embedjob_staging_{vector_type} s
ON CONFLICT (collection, record_id, chunk, model, revision) DO UPDATE
SET content_hash = excluded.content_hash, embedding = excluded.embedding, text = excluded.text,
    char_start = excluded.char_start, char_end = excluded.char_end, job_key = excluded.job_key,
    batch_id = excluded.batch_id, updated_at = now()
WHERE t.content_hash IS DISTINCT FROM excluded.content_hash
"""
# In the merge's transaction: a written record keeps exactly its new chunks (one that got shorter loses the rest).
_DROP_STALE_CHUNKS_SQL = """
DELETE FROM "{table}" AS t USING (SELECT record_id, max(chunk) AS last FROM embedjob_staging_{vector_type}
                                  GROUP BY record_id) s
WHERE t.collection = %(collection)s AND t.record_id = s.record_id AND t.model = %(model)s
  AND t.revision = %(revision)s AND t.chunk > s.last
"""
log = logging.getLogger("embedjob_worker.sink.postgres")
_JOB_LOCK_POLL_S = 1.0


# Runs that ended before embedding anything; a later start compares against the run before them.
REFUSED_START_REASONS = ("InputChanged", "ModelUnavailable", "SourceUnavailable", "ChunkingUnsupported")


@dataclass(frozen=True)
class RunStart:
    run_id: str
    resumed: bool
    session: str = ""  # this driver session (db.runs.c.driver_session)
    # A resumed run's new and changed records and chunks embedded, as its earlier sessions committed them.
    records_new: int = 0
    records_changed: int = 0
    chunks_embedded: int = 0


# A resumed run's row counts afresh from here: the session recounts the batches done before as skipped.
_SESSION_START_COUNTERS = {**{name: 0 for name in ADDED_COUNTERS if name not in KEPT_ON_RESUME},
                           "records_unchanged": 0, "records_deleted": 0, "texts_per_second": 0.0,
                           "batches_total": None, "records_total": None}


class PostgresSink:
    def __init__(self, url: str, job_key: str, collection: str, table: str, salt: bytes, vector_type: str = "vector"):
        self.url = url
        self.engine = db.create_engine(url, pool_pre_ping=True, pool_size=2)
        self.job_key, self.collection, self.table, self.salt = job_key, collection, table, salt
        if vector_type not in db.VECTOR_TYPES:
            raise ValueError(f"vector type {vector_type!r} is not one of {', '.join(db.VECTOR_TYPES)}")
        self.vector_type = vector_type
        self.staging_ddl, self.copy_sql = (sql.format(vector_type=vector_type) for sql in (_STAGING_DDL, _COPY_SQL))
        self.direct_copy_sql, self.merge_sql, self.drop_stale_chunks_sql = (
            sql.format(table=table, vector_type=vector_type)
            for sql in (_DIRECT_COPY_SQL, _MERGE_SQL, _DROP_STALE_CHUNKS_SQL))
        self.model = self.revision = None  # set by start_run
        self.session: str | None = None  # the driver session that owns the run (start_run); its writes only
        self._job_lock: sa.Connection | None = None  # holds the job's session-level advisory lock

    def lock_job(self, wait_s: float) -> None:
        """Take the job's advisory lock for this sink's life (released by close()): a second driver of
        the job waits up to `wait_s` for the first to finish, then refuses (JobAlreadyRunning)."""
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")  # no transaction held open
        try_lock = db.advisory_lock_sql("pg_try_advisory_lock", db.JOB_LOCK)
        deadline, next_log = time.monotonic() + wait_s, 0.0
        while not conn.execute(try_lock, {"name": self.job_key}).scalar_one():
            if time.monotonic() >= deadline:
                holder = conn.execute(sa.select(db.runs.c.run_id, db.runs.c.heartbeat_at)
                                      .where(db.runs.c.job_key == self.job_key, db.runs.c.state == "running")
                                      .order_by(db.runs.c.started_at.desc()).limit(1)).first()
                conn.close()
                raise JobFailed("JobAlreadyRunning", f"another driver of job {self.job_key} holds its lock"
                                + (f" (run {holder.run_id}, heartbeat at {holder.heartbeat_at:%Y-%m-%dT%H:%M:%SZ})"
                                   if holder else "") + f"; waited {wait_s:.0f}s. This driver writes nothing")
            if time.monotonic() >= next_log:
                log_event(log, "waiting_for_job_lock", job=self.job_key, wait_s=round(deadline - time.monotonic()))
                next_log = time.monotonic() + 30.0
            time.sleep(_JOB_LOCK_POLL_S)
        self._job_lock = conn

    def migrate(self) -> None:
        db.migrate(self.url)

    def ensure_vectors_table(self, dim: int) -> None:
        ensure_vectors_table(self.engine, self.table, dim, self.vector_type)

    def start_run(self, job_name: str, namespace: str, model: str, revision: str, input_fp: str, config_fp: str,
                  new_run: bool, identity: dict | None = None, input_record: dict | None = None,
                  how_to_start_anew: str = "Pass --new-run to start a new run") -> RunStart:
        """Resume the job's run over the same input (`input_record`, fingerprinted as `input_fp`) and config
        (`identity`, hashed as `config_fp`), or start one; refuse a changed input or config, naming what
        changed and ending with `how_to_start_anew`."""
        runs = db.runs
        self.model, self.revision = model, revision
        self.session = str(uuid.uuid4())
        refused = None
        with self.engine.begin() as conn:  # the driver holds the job's lock (lock_job) around this
            latest = conn.execute(
                sa.select(runs.c.run_id, runs.c.input_fingerprint, runs.c.config_fingerprint, runs.c.identity,
                          runs.c.input)
                .where(runs.c.job_key == self.job_key)
                .where(sa.or_(runs.c.reason.is_(None), runs.c.reason.not_in(REFUSED_START_REASONS)))
                .order_by(runs.c.started_at.desc()).limit(1)
            ).first()
            if latest is not None and not new_run:
                if (latest.input_fingerprint, latest.config_fingerprint) == (input_fp, config_fp):
                    # Takes the run from any earlier session at once: a writer of a dead driver that
                    # commits after this finds another session in the row and rolls back.
                    resumed = conn.execute(runs.update().where(runs.c.run_id == latest.run_id).values(
                        state="running", reason=None, error=None, finished_at=None, heartbeat_at=sa.func.now(),
                        driver_session=self.session, **_SESSION_START_COUNTERS,
                    ).returning(*(runs.c[name] for name in KEPT_ON_RESUME))).one()
                    return RunStart(latest.run_id, True, self.session, **resumed._asdict())
                refused = self._refusal(latest, input_fp, config_fp, identity, input_record, how_to_start_anew)
            run_id = self._insert_run(conn, job_name, namespace, input_fp, config_fp, refused and "InputChanged",
                                      refused, identity, input_record)
        if refused:
            raise JobFailed("InputChanged", refused)
        return RunStart(run_id, resumed=False, session=self.session)

    @staticmethod
    def _refusal(latest: sa.Row, input_fp: str, config_fp: str, identity: dict | None, input_record: dict | None,
                 how_to_start_anew: str) -> str:
        """Why a re-run may not resume run `latest`: the input's content changed, or the named config fields did."""
        changes = []
        if latest.input_fingerprint != input_fp:
            changes.append(f"the input changed from {describe_input(latest.input)} to {describe_input(input_record)}")
        if latest.config_fingerprint != config_fp:
            changes += (identity_changes(latest.identity, identity) if latest.identity and identity else
                        ["the batching/model/sink config changed (the fields are not recorded for that run)"])
        return (f"{'; '.join(changes)} since run {latest.run_id}; its vectors and batches belong to the old "
                f"input and settings, so nothing is skipped or mixed. {how_to_start_anew}")

    def record_refused_start(self, job_name: str, namespace: str, model: str, reason: str, error: str) -> None:
        """A run that could not start (no model, no input): a failed run row that says why."""
        self.model, self.revision = model, ""
        with self.engine.begin() as conn:
            self._insert_run(conn, job_name, namespace, "", "", reason, error, None, None)

    def _insert_run(self, conn: sa.Connection, job_name: str, namespace: str, input_fp: str, config_fp: str,
                    reason: str | None, error: str | None, identity: dict | None, input_record: dict | None) -> str:
        run_id = str(uuid.uuid4())
        conn.execute(db.runs.insert().values(
            run_id=run_id, job_key=self.job_key, job_name=job_name, namespace=namespace,
            collection=self.collection, vectors_table=self.table, model=self.model, revision=self.revision,
            input_fingerprint=input_fp, config_fingerprint=config_fp, identity=identity, input=input_record,
            state="failed" if reason else "running", driver_session=self.session,
            reason=reason, error=error, finished_at=sa.func.now() if reason else None))
        return run_id

    def succeeded_batches(self) -> dict[str, DoneBatch]:
        """The job's succeeded batches (ids carry the input and config fingerprints) by id."""
        batches, errors = db.batches, db.record_errors
        truncated = (sa.select(errors.c.batch_id, sa.func.count(sa.distinct(errors.c.position)).label("records"))
                     .where(errors.c.job_key == self.job_key, errors.c.reason == "truncated")
                     .group_by(errors.c.batch_id).subquery())
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(batches.c.batch_id, batches.c.records - batches.c.failed_records,
                                          sa.func.coalesce(truncated.c.records, 0))
                                .outerjoin(truncated, truncated.c.batch_id == batches.c.batch_id)
                                .where(batches.c.job_key == self.job_key, batches.c.state == "succeeded"))
            return {batch_id: DoneBatch(embedded, truncated) for batch_id, embedded, truncated in rows}

    def write(self, run_id: str, outcomes: list[BatchOutcome], bad_records: list[BadRecord],
              update: CounterUpdate | None = None) -> list[BatchOutcome]:
        """One transaction: batch marks, vectors of the succeeded batches, attempts, errors, counters; the
        outcomes written. An outcome whose batch row holds it already (a group sent again after its writer
        was lost) is left out: its vectors, attempts and counts are in. JobFailed (DriverSuperseded), and
        nothing written, once another driver session owns the run."""
        update = update or CounterUpdate()
        with self.engine.begin() as conn:
            written = self._write_batches(conn, run_id, outcomes) if outcomes else []
            succeeded = [o for o in written if o.state == "succeeded"]
            if succeeded:
                with conn.connection.driver_connection.cursor() as cur:
                    self._write_vectors(cur, succeeded)
            errors = bad_records + [bad for o in succeeded for bad in o.truncated]
            if errors:
                conn.execute(pg_insert(db.record_errors).on_conflict_do_nothing(), [
                    {"run_id": run_id, "position": e.position, "job_key": self.job_key, "record_id": e.record_id,
                     "batch_id": e.batch_id, "reason": e.reason.value, "detail": e.detail} for e in errors])
            added = group_counts(written)
            for name, count in update.add.items():
                added[name] += count
            self._update_run(conn, run_id, {**{name: db.runs.c[name] + count for name, count in added.items()
                                               if count}, **update.set})
        return written

    def _write_vectors(self, cur: psycopg.Cursor, succeeded: list[BatchOutcome]) -> None:
        """The vectors of `succeeded`, by binary COPY: into the vectors table itself when all their records are new,
        else into the staging table and merged from there."""
        scope = {"collection": self.collection, "model": self.model, "revision": self.revision}
        # Records the planner found nowhere in the table (incremental.StoredHashes) are copied straight in: no
        # staging table, no speculative inserts, no chunks to drop. One that is there after all (another job
        # wrote it since) fails the COPY on the primary key, undone to the savepoint: the merge decides.
        if all(o.records_new == len(o.records) for o in succeeded):
            cur.execute("SAVEPOINT embedjob_new_records")
            try:
                # in _DIRECT_COPY_SQL's order of the columns after COPY_COLUMNS
                self._copy(cur, self.direct_copy_sql, succeeded,
                           (self.collection, self.model, self.revision, self.job_key))
                cur.execute("RELEASE SAVEPOINT embedjob_new_records")
                return
            except psycopg.errors.UniqueViolation as error:
                cur.execute("ROLLBACK TO SAVEPOINT embedjob_new_records")
                log_event(log, "new_records_already_written", table=self.table,
                          batches=len(succeeded), detail=str(error.diag.message_detail))
        cur.execute(self.staging_ddl)
        self._copy(cur, self.copy_sql, succeeded)
        cur.execute(self.merge_sql, {**scope, "job_key": self.job_key})
        cur.execute(self.drop_stale_chunks_sql, scope)

    def _copy(self, cur: psycopg.Cursor, sql: str, outcomes: list[BatchOutcome],
              same_on_every_row: tuple[str, ...] = ()) -> None:
        with cur.copy(sql) as copy:
            for piece in copy_payload(outcomes, self.salt, self.vector_type, same_on_every_row):
                copy.write(piece)

    def _update_run(self, conn: sa.Connection, run_id: str, values: dict) -> sa.Row:
        """The run row, updated (last in a transaction: its row lock is held only until the commit)."""
        runs = db.runs
        row = conn.execute(runs.update().where(runs.c.run_id == run_id, runs.c.driver_session == self.session)
                           .values(heartbeat_at=sa.func.now(), **values).returning(*runs.c)).first()
        if row is None:
            raise JobFailed("DriverSuperseded", f"run {run_id} is owned by another driver session now (a driver that "
                                                "resumed it): this session writes nothing more")
        return row

    def _write_batches(self, conn: sa.Connection, run_id: str, outcomes: list[BatchOutcome]) -> list[BatchOutcome]:
        rows = [{
            "job_key": self.job_key, "batch_id": o.batch_id, "run_id": run_id, "state": o.state,
            "attempts": max(a.attempt for a in o.attempts), "records": len(o.records),
            "failed_records": len(o.records) if o.state == "failed" else 0, "error": o.error,
            "worker": o.worker, "started_at": o.started_at, "finished_at": now(), "duration_s": o.duration_s,
        } for o in outcomes]
        batches, stmt = db.batches, pg_insert(db.batches)
        # An outcome is known by its run and its first dispatch: the same one written twice is written once.
        same_outcome = sa.and_(batches.c.state == "succeeded", batches.c.run_id == stmt.excluded.run_id,
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
                "job_key": self.job_key, "batch_id": o.batch_id, "run_id": run_id, "attempt": a.attempt,
                "worker": a.worker, "outcome": a.outcome, "reason": a.reason, "started_at": a.started_at,
                "finished_at": a.finished_at,
            } for o in written for a in o.attempts])
        return written

    def finish_run(self, run_id: str, state: str, reason: str | None, error: str | None,
                   update: CounterUpdate | None = None) -> dict:
        """The run's end (its seen ids, seen_ids.SeenIds, go: a resumed run rebuilds them); the run row's counters."""
        update = update or CounterUpdate()
        with self.engine.begin() as conn:
            conn.execute(db.seen_ids.delete().where(db.seen_ids.c.run_id == run_id))
            row = self._update_run(conn, run_id, {
                **{name: db.runs.c[name] + count for name, count in update.add.items() if count}, **update.set,
                "state": state, "reason": reason, "error": error, "finished_at": sa.func.now()})
        return dict(row._mapping)

    def close(self) -> None:
        if self._job_lock is not None:
            self._job_lock.invalidate()  # really closes the session, and with it the lock (no pool reuse)
            self._job_lock.close()
            self._job_lock = None
        self.engine.dispose()

