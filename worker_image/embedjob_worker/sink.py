"""The PostgreSQL sink: vectors (pgvector), batches, attempts, record errors, runs.

A group of finished batches is written in one transaction: their vectors by binary
COPY into a temp staging table and one merge into the vectors table, and their batch
rows (the `succeeded` marks), attempt rows, record errors and the run's counters. A
crash therefore loses whole batches, never half of one, and a re-run rewrites nothing
that is unchanged (the merge skips rows whose content hash is the same).
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from embedjob import db
from embedjob.api import Chunking

from .config import identity_changes
from .errors import JobFailed
from .logs import log_event
from .records import BadRecord, Record, chunk_owners
from .snapshot import describe_input
from .vectors_table import ensure_vectors_table

# One staging table per vector type (db.VECTOR_TYPES), so the COPY carries the column's own binary format.
_STAGING_DDL = (
    "CREATE TEMP TABLE IF NOT EXISTS embedjob_staging_{vector_type} (record_id text, chunk int4, char_start int4,"
    " char_end int4, content_hash text, embedding {vector_type}, text text, batch_id text) ON COMMIT DELETE ROWS"
)
_COPY_SQL = ("COPY embedjob_staging_{vector_type} (record_id, chunk, char_start, char_end, content_hash, embedding,"
             " text, batch_id) FROM STDIN (FORMAT BINARY)")
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
log = logging.getLogger("embedjob_worker.sink")
_JOB_LOCK_POLL_S = 1.0
# A live driver refreshes heartbeat_at (its run row, its pool lease) at least this often.
HEARTBEAT_S = 5.0

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
_HASH_FIELD = struct.pack(">i", 64)  # hex sha256
# pgvector's binary input of each type: int16 dimensions, int16 unused, then big-endian floats of this dtype.
_BINARY_DTYPES = {"vector": np.dtype(">f4"), "halfvec": np.dtype(">f2")}


def now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class AttemptRow:
    attempt: int
    worker: str | None
    outcome: str  # succeeded | retry | split | failed
    reason: str | None
    started_at: datetime | None
    finished_at: datetime = field(default_factory=now)


@dataclass
class BatchOutcome:
    """A batch's final result in this run, ready to be written."""

    batch_id: str
    state: str  # succeeded | failed
    records: tuple[Record, ...]
    attempts: list[AttemptRow]
    started_at: datetime
    vectors: np.ndarray | None = None
    worker: str | None = None
    error: str | None = None
    truncated: list[BadRecord] = field(default_factory=list)
    duration_s: float | None = None


# Runs that ended before embedding anything; a later start compares against the run before them.
REFUSED_START_REASONS = ("InputChanged", "ModelUnavailable", "SourceUnavailable", "ChunkingUnsupported")


@dataclass(frozen=True)
class DoneBatch:
    """A batch an earlier session of the job wrote: what it embedded and, of that, truncated."""

    records_embedded: int
    records_truncated: int


@dataclass(frozen=True)
class RunStart:
    run_id: str
    resumed: bool


def content_salt(normalize: bool, max_seq_length: int | None, chunking: Chunking | None = None) -> bytes:
    """Part of every content hash: settings that change a vector without changing its key (the chunking
    only when set, so the hashes of vectors written without it stay as they were)."""
    chunks = "" if chunking is None else f";chunking={chunking.max_tokens}/{chunking.overlap_tokens}"
    return f"normalize={normalize};max_seq_length={max_seq_length}{chunks}\x00".encode()


def content_hash(salt: bytes, text: bytes) -> str:
    """A vector row's content_hash: sha256 of the salt and the UTF-8 text, hex."""
    return hashlib.sha256(salt + text).hexdigest()


def copy_payload(outcomes: list[BatchOutcome], salt: bytes, vector_type: str = "vector") -> bytes:
    """PostgreSQL binary COPY data for the staging table (pgvector's binary `vector` or `halfvec` format)."""
    dtype = _BINARY_DTYPES[vector_type]
    parts = [_COPY_SIGNATURE]
    for outcome in outcomes:
        with np.errstate(over="ignore"):  # beyond float16's range: inf, refused below
            vectors = np.ascontiguousarray(outcome.vectors, dtype=dtype)
        if vector_type == "halfvec" and not np.isfinite(vectors).all():
            record = chunk_owners(outcome.records)[int(np.flatnonzero(~np.isfinite(vectors).all(axis=1))[0])]
            raise JobFailed("VectorOutOfRange", f"record {record.id!r} (batch {outcome.batch_id}): a component is "
                                                f"beyond halfvec's range (±65504); use vectorType vector")
        count, dim = vectors.shape
        vector_prefix = struct.pack(">ihh", 4 + dtype.itemsize * dim, dim, 0)
        batch_id = outcome.batch_id.encode()
        batch_field = struct.pack(">i", len(batch_id)) + batch_id
        rows = iter(vectors)
        for record in outcome.records:
            record_id = record.id.encode()
            id_field = struct.pack(">hi", 8, len(record_id)) + record_id
            hash_field = _HASH_FIELD + content_hash(salt, record.text.encode()).encode()  # the record's, on each chunk
            for number, (span, text) in enumerate(zip(record.chunks, record.chunk_texts())):
                text = text.encode()
                parts += (id_field, struct.pack(">iiiiii", 4, number, 4, span.start, 4, span.end), hash_field,
                          vector_prefix, next(rows).tobytes(), struct.pack(">i", len(text)), text, batch_field)
    parts.append(_COPY_TRAILER)
    return b"".join(parts)


class PostgresSink:
    def __init__(self, url: str, job_key: str, collection: str, table: str, salt: bytes, vector_type: str = "vector"):
        self.url = url
        self.engine = db.create_engine(url, pool_pre_ping=True, pool_size=2)
        self.job_key, self.collection, self.table, self.salt = job_key, collection, table, salt
        if vector_type not in db.VECTOR_TYPES:
            raise ValueError(f"vector type {vector_type!r} is not one of {', '.join(db.VECTOR_TYPES)}")
        self.vector_type = vector_type
        self.staging_ddl, self.copy_sql = (sql.format(vector_type=vector_type) for sql in (_STAGING_DDL, _COPY_SQL))
        self.merge_sql, self.drop_stale_chunks_sql = (sql.format(table=table, vector_type=vector_type)
                                                      for sql in (_MERGE_SQL, _DROP_STALE_CHUNKS_SQL))
        self.model = self.revision = None  # set by start_run
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
                    conn.execute(runs.update().where(runs.c.run_id == latest.run_id).values(
                        state="running", reason=None, error=None, finished_at=None, heartbeat_at=sa.func.now()))
                    return RunStart(latest.run_id, resumed=True)
                refused = self._refusal(latest, input_fp, config_fp, identity, input_record, how_to_start_anew)
            run_id = self._insert_run(conn, job_name, namespace, input_fp, config_fp, refused and "InputChanged",
                                      refused, identity, input_record)
        if refused:
            raise JobFailed("InputChanged", refused)
        return RunStart(run_id, resumed=False)

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
            state="failed" if reason else "running",
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
              counters: dict) -> None:
        """One transaction: vectors of the succeeded batches, batch marks, attempts, errors, counters."""
        succeeded = [o for o in outcomes if o.state == "succeeded"]
        with self.engine.begin() as conn:
            if succeeded:
                with conn.connection.driver_connection.cursor() as cur:
                    cur.execute(self.staging_ddl)
                    with cur.copy(self.copy_sql) as copy:
                        copy.write(copy_payload(succeeded, self.salt, self.vector_type))
                    scope = {"collection": self.collection, "model": self.model, "revision": self.revision}
                    cur.execute(self.merge_sql, {**scope, "job_key": self.job_key})
                    cur.execute(self.drop_stale_chunks_sql, scope)
            if outcomes:
                self._write_batches(conn, run_id, outcomes)
            errors = bad_records + [bad for o in succeeded for bad in o.truncated]
            if errors:
                conn.execute(pg_insert(db.record_errors).on_conflict_do_nothing(), [
                    {"run_id": run_id, "position": e.position, "job_key": self.job_key, "record_id": e.record_id,
                     "batch_id": e.batch_id, "reason": e.reason.value, "detail": e.detail} for e in errors])
            conn.execute(db.runs.update().where(db.runs.c.run_id == run_id)
                         .values(heartbeat_at=sa.func.now(), **counters))

    def _write_batches(self, conn: sa.Connection, run_id: str, outcomes: list[BatchOutcome]) -> None:
        rows = [{
            "job_key": self.job_key, "batch_id": o.batch_id, "run_id": run_id, "state": o.state,
            "attempts": max(a.attempt for a in o.attempts), "records": len(o.records),
            "failed_records": len(o.records) if o.state == "failed" else 0, "error": o.error,
            "worker": o.worker, "started_at": o.started_at, "finished_at": now(), "duration_s": o.duration_s,
        } for o in outcomes]
        stmt = pg_insert(db.batches)
        conn.execute(stmt.on_conflict_do_update(
            index_elements=[db.batches.c.job_key, db.batches.c.batch_id],
            set_={c: stmt.excluded[c] for c in ("run_id", "state", "attempts", "records", "failed_records",
                                                 "error", "worker", "started_at", "finished_at", "duration_s")},
        ), rows)
        conn.execute(db.batch_attempts.insert(), [{
            "job_key": self.job_key, "batch_id": o.batch_id, "run_id": run_id, "attempt": a.attempt,
            "worker": a.worker, "outcome": a.outcome, "reason": a.reason, "started_at": a.started_at,
            "finished_at": a.finished_at,
        } for o in outcomes for a in o.attempts])

    def finish_run(self, run_id: str, state: str, reason: str | None, error: str | None, counters: dict) -> None:
        """The run's end, and its seen ids (seen_ids.SeenIds) go: a resumed run rebuilds them."""
        with self.engine.begin() as conn:
            conn.execute(db.seen_ids.delete().where(db.seen_ids.c.run_id == run_id))
            conn.execute(db.runs.update().where(db.runs.c.run_id == run_id).values(
                state=state, reason=reason, error=error, finished_at=sa.func.now(), heartbeat_at=sa.func.now(),
                **counters))

    def close(self) -> None:
        if self._job_lock is not None:
            self._job_lock.invalidate()  # really closes the session, and with it the lock (no pool reuse)
            self._job_lock.close()
            self._job_lock = None
        self.engine.dispose()

