"""Incremental runs: which records of a batch still need the model, and deleting the vectors of ids gone.

Before batches are dispatched, one query reads the stored content hashes of their record
ids (this collection, model and revision; the vectors table's primary key serves it), for
a group of consecutive batches at a time (feed.LOOKUP_RECORDS records): one round trip per
group, not per batch.
A record is `new` without a stored vector, `changed` when the hash differs, and
`unchanged` when it matches: that record is neither sent to the model nor written. A
match written by a batch of this same run (a resumed run) was counted when it was
written, so it is `already written`, not unchanged. The new and changed records of a
batch that holds others too form a batch whose id derives from its parent's id and their
ids: as stable across sessions as the parent's, and never the id of a batch with other
records (a batch row's record count stays true). With spec.source.metadataFields a record
up to date but for its metadata (its metadata hash differs) is not sent to the model either:
its metadata is written onto its stored chunks before the group's batches go on.

With sync.deleteMissing, the end of a successful run deletes the vectors whose id the
run did not read: the run's embedjob_seen_ids rows are every id it read (valid or not).
The delete commits only while the run row still names the driver session (runs.update_run,
in its transaction): a driver superseded by one that resumed the run, and cleared its seen
ids, deletes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Container
from dataclasses import dataclass

import sqlalchemy as sa

from embedjob import db

from embedjob_worker.plan.batching import Batch, batch_id
from embedjob_worker.core.records import Record
from embedjob_worker.sink.copy_data import content_hash, metadata_hash
from embedjob_worker.core.errors import retry_database
from embedjob_worker.core.logs import log_event
from embedjob_worker.sink.runs import RunSession, latest_started_run, update_run
from embedjob_worker.sink.target import VectorsTable
from embedjob_worker.core.tally import RunTally

log = logging.getLogger("embedjob_worker.sink.incremental")

# Chunk 0 stands for its record: all of a record's chunks are written together, with the record's hashes.
_STORED_SQL = ("SELECT record_id, content_hash, batch_id{metadata_hash} FROM {table} WHERE collection = :collection"
               " AND model = :model AND revision = :revision AND record_id = ANY(:ids) AND chunk = 0")
# A record whose text is up to date and whose metadata is not: its metadata on each of its chunks, no embedding.
_UPDATE_METADATA_SQL = """
UPDATE {table} AS t SET metadata = CAST(v.metadata AS jsonb), metadata_hash = v.metadata_hash, updated_at = now()
FROM unnest(CAST(:ids AS text[]), CAST(:metadata AS text[]), CAST(:hashes AS text[])) AS v(record_id, metadata,
                                                                                              metadata_hash)
WHERE t.collection = :collection AND t.model = :model AND t.revision = :revision AND t.record_id = v.record_id
"""
_EXISTS_SQL = sa.text("SELECT to_regclass(:table) IS NOT NULL")
# Every chunk of a record gone; the count is of records.
_DELETE_MISSING_SQL = """
WITH gone AS (
  DELETE FROM {table} AS v
  WHERE v.collection = :collection AND v.model = :model AND v.revision = :revision
    AND NOT EXISTS (SELECT 1 FROM embedjob_seen_ids s WHERE s.run_id = :run_id AND s.record_id = v.record_id)
  RETURNING v.record_id)
SELECT count(DISTINCT record_id) FROM gone
"""


@dataclass(frozen=True)
class BatchChanges:
    """A batch split by what its records' stored vectors say."""

    to_embed: Batch | None  # the new and changed records (module docstring); None when there are none
    new: int
    changed: int
    unchanged: int
    already_written: int  # by this run, before it was resumed
    metadata_only: tuple[Record, ...] = ()  # up to date but for their metadata (spec.source.metadataFields)


class StoredHashes:
    """The content hashes in the vectors table for one collection, model and revision."""

    def __init__(self, engine: sa.Engine, table: VectorsTable, collection: str, model: str, revision: str, salt: bytes,
                 metadata: bool = False):
        self.engine, self.salt, self.metadata = engine, salt, metadata
        self.scope = {"collection": collection, "model": model, "revision": revision}
        self.stored_sql = sa.text(_STORED_SQL.format(table=table.sql, metadata_hash=", metadata_hash" * metadata))
        self.update_metadata_sql = sa.text(_UPDATE_METADATA_SQL.format(table=table.sql))
        self.quoted_table, self.table_exists = table.sql, False

    def _stored(self, ids: list[str]) -> dict[str, sa.Row]:
        with self.engine.connect() as conn:
            if not self.table_exists:  # the first run's first batches come before the table does
                self.table_exists = conn.execute(_EXISTS_SQL, {"table": self.quoted_table}).scalar_one()
                if not self.table_exists:
                    return {}
            # .all(): one fetch of every row, not a Python call per row
            return {row.record_id: row for row in conn.execute(self.stored_sql, {**self.scope, "ids": ids}).all()}

    def changes(self, batches: list[Batch], run_batches: Container[str]) -> list[BatchChanges]:
        """Split each of `batches` (one query for all); `run_batches` holds the ids of the batches this run
        has written."""
        stored = self._stored([r.id for batch in batches for r in batch.records]) if batches else {}
        return [self._split(batch, stored, run_batches) for batch in batches]

    def update_metadata(self, records: list[Record], run: RunSession) -> None:
        """Write `records`' metadata (and its hash) onto their stored chunks, fenced by `run` (runs.update_run)."""
        params = {**self.scope, "ids": [r.id for r in records], "metadata": [r.metadata for r in records],
                  "hashes": [metadata_hash(r.metadata) for r in records]}
        with self.engine.begin() as conn:
            conn.execute(self.update_metadata_sql, params)
            update_run(conn, run, {})

    def _split(self, batch: Batch, stored: dict[str, sa.Row], run_batches: Container[str]) -> BatchChanges:
        to_embed, metadata_only, new = [], [], 0
        unchanged = already_written = 0
        for record in batch.records:
            row = stored.get(record.id)
            if row is None:
                new += 1
                to_embed.append(record)
                continue
            if row.content_hash != content_hash(self.salt, record.text.encode()):
                to_embed.append(record)
                continue
            if self.metadata and record.metadata is not None and row.metadata_hash != metadata_hash(record.metadata):
                metadata_only.append(record)
            if row.batch_id in run_batches:
                already_written += 1
            else:
                unchanged += 1
        if not to_embed or len(to_embed) == len(batch.records):
            kept = batch if to_embed else None
        else:  # a part of the batch is a batch of its own, with an id as stable as its parent's
            kept = Batch(batch_id(batch.batch_id, (r.id for r in to_embed)), tuple(to_embed))
        return BatchChanges(kept, new, len(to_embed) - new, unchanged, already_written, tuple(metadata_only))


class IncrementalFeed:
    """What the feed asks before each group of batches: the part of each the model still has to embed (counted
    in the tally)."""

    def __init__(self, stored: StoredHashes, run_batches: Container[str], tally: RunTally, run: RunSession):
        self.stored, self.run_batches, self.tally, self.run = stored, run_batches, tally, run

    def to_embed(self, batches: list[Batch]) -> list[Batch | None]:
        """Each batch's part still to embed, None for a batch with nothing left; the metadata of records up to
        date but for it written (one statement for the group)."""
        kept, metadata_only = [], []
        for found in retry_database(lambda: self.stored.changes(batches, self.run_batches), "stored_hashes"):
            self.tally.up_to_date(found.unchanged, found.already_written, whole_batch=found.to_embed is None)
            if found.to_embed is not None:
                self.tally.classified(found.to_embed.batch_id, found.new, found.changed)
            kept.append(found.to_embed)
            metadata_only += found.metadata_only
        if metadata_only:
            retry_database(lambda: self.stored.update_metadata(metadata_only, self.run), "update_metadata")
            self.tally.metadata_updated(len(metadata_only))
        return kept


def delete_missing(engine: sa.Engine, table: VectorsTable, collection: str, run: RunSession) -> int:
    """Delete the vectors (of this collection, the run's model and revision; every chunk) whose id `run` did
    not read; how many records the run has deleted so far. The run row counts them in the delete's own
    transaction, so a retry after a commit whose reply was lost, or a resumed session after a crash, reports
    the records deleted before, not the none left to delete. Fenced like a batch write: JobFailed
    (DriverSuperseded), and nothing deleted, once another driver session owns the run (its seen ids are being
    claimed afresh)."""
    with engine.begin() as conn:
        if not conn.execute(_EXISTS_SQL, {"table": table.sql}).scalar_one():
            return 0  # nothing was ever embedded into it
        deleted = conn.execute(sa.text(_DELETE_MISSING_SQL.format(table=table.sql)),
                               {"collection": collection, "model": run.model, "revision": run.revision,
                                "run_id": run.run_id}).scalar_one()
        row = update_run(conn, run, {"records_deleted": db.runs.c.records_deleted + deleted})
    log_event(log, "vectors_deleted", run=run.run_id, collection=collection, deleted=deleted,
              run_total=row.records_deleted)
    return row.records_deleted


def latest_run_succeeded(engine: sa.Engine, job_key: str) -> bool:
    """Whether the job's latest run that got to start (the one runs.JobRuns.start resumes) succeeded."""
    with engine.connect() as conn:
        state = conn.execute(latest_started_run(job_key, db.runs.c.state)).scalar()
    return state == "succeeded"


def forget_seen_ids(engine: sa.Engine, run: RunSession) -> None:
    """A resumed table run claims its ids afresh: rows inserted or deleted since its last session
    moved the positions, and an id's old, lower position would make its row a duplicate. Fenced by `run`."""
    with engine.begin() as conn:
        conn.execute(db.seen_ids.delete().where(db.seen_ids.c.run_id == run.run_id))
        update_run(conn, run, {})


def run_batch_ids(engine: sa.Engine, job_key: str, run_id: str) -> set[str]:
    """The batches run `run_id` of the job has written (a resumed run's earlier sessions)."""
    batches = db.batches
    with engine.connect() as conn:
        return set(conn.execute(sa.select(batches.c.batch_id).where(
            batches.c.job_key == job_key, batches.c.run_id == run_id, batches.c.state == "succeeded")).scalars())
