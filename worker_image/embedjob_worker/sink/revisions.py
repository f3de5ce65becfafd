"""The revisions of a collection's vectors (embedjob_revisions): embedding, then ready (what searches read), then retired.

A run marks its (vectors table, collection, model, revision) `embedding` as it starts, unless it
is the ready one already (an incremental re-run keeps serving it). A run that succeeds with every
batch written makes it `ready` in the transaction that records the run's end, retiring the one
that was ready: a reader sees the old revision up to that commit and the new one from it on,
never both and never neither. Readers go through the table's `_current` view (current_view),
which keeps a row only where its revision is the ready one of its collection; one statement reads
one snapshot, so a search is never half switched.

Retired revisions beyond spec.sink.retainPrevious are dropped after the switch (drop_retired):
first the batch rows of their runs, so a later run of one re-embeds every record instead of
skipping batches whose vectors are going; then their vectors, a chunk per transaction (no long
lock on a table being searched), each chunk only while the revision is still retired and only rows
written before the drop began (a run of it started since writes rows that stay); the revision's
row last. A revision with a live run (a recent heartbeat) is not dropped, and a run that finds its
revision retired or dropped by the time it succeeds does not make it ready. A drop cut short (a
crash) is taken up again by the next switch.
"""

from __future__ import annotations

import hashlib
import logging

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from embedjob import db
from embedjob.contract import HEARTBEAT_S

from embedjob_worker.core.logs import log_event
from embedjob_worker.sink.target import VectorsTable, quote_identifier

log = logging.getLogger("embedjob_worker.sink.revisions")

VIEW_SUFFIX = "_current"
_MAX_IDENTIFIER = 63  # PostgreSQL's NAMEDATALEN - 1 (bytes)
# Rows of a retired revision deleted per transaction.
DROP_CHUNK_ROWS = 10_000
# A run of a retired revision whose heartbeat is this recent may still write it: the drop waits for a later switch.
LIVE_RUN_S = 10 * HEARTBEAT_S


def current_view(table: VectorsTable) -> VectorsTable:
    """The view of `table` that keeps the rows of each collection's ready revision: `<table>_current`, or for a
    name too long for that, its first characters, a hash of the whole name and the suffix (63 bytes)."""
    name = table.name + VIEW_SUFFIX
    if len(name.encode()) > _MAX_IDENTIFIER:
        digest = hashlib.sha256(table.name.encode()).hexdigest()[:8]
        name = f"{table.name.encode()[:_MAX_IDENTIFIER - len(VIEW_SUFFIX) - 9].decode(errors='ignore')}_{digest}"
        name += VIEW_SUFFIX
    return VectorsTable(table.schema, name)


def _of_collection(table: VectorsTable, collection: str):
    r = db.revisions.c
    return sa.and_(r.vectors_table == str(table), r.collection == collection)


def _key(table: VectorsTable, collection: str, model: str, revision: str):
    r = db.revisions.c
    return sa.and_(_of_collection(table, collection), r.model == model, r.revision == revision)


def mark_embedding(conn: sa.Connection, table: VectorsTable, collection: str, model: str, revision: str,
                   namespace: str, run_id: str) -> str | None:
    """A run of the revision starts: `embedding`, unless it is the ready one (it stays what searches read); the
    state it had before (None: no row)."""
    before = conn.execute(sa.select(db.revisions.c.state).where(_key(table, collection, model, revision))
                          .with_for_update()).scalar()
    insert = postgresql.insert(db.revisions).values(
        vectors_table=str(table), collection=collection, model=model, revision=revision, state="embedding",
        namespace=namespace, run_id=run_id)
    conn.execute(insert.on_conflict_do_update(
        index_elements=[c.name for c in db.revisions.primary_key],
        set_={"state": "embedding", "namespace": namespace, "run_id": run_id, "changed_at": sa.func.now()},
        where=db.revisions.c.state == "retired"))
    return before


def make_ready(conn: sa.Connection, table: VectorsTable, collection: str, model: str, revision: str,
               namespace: str, run_id: str) -> None:
    """In the caller's transaction: the revision becomes the collection's ready one and the one ready before is
    retired. The collection's rows are locked first: two switches at once (two jobs writing one collection) take
    turns. A revision that another run's switch retired (or a drop removed) while this run wrote it stays so: a
    newer revision took over, and a dropped one's vectors may be partly gone."""
    r = db.revisions.c
    states = {(m, rev): state for m, rev, state in conn.execute(
        sa.select(r.model, r.revision, r.state).where(_of_collection(table, collection)).with_for_update())}
    state = states.get((model, revision))  # the run's start made the row (mark_embedding)
    if state not in ("embedding", "ready"):
        log_event(log, "revision_not_made_ready", logging.WARNING, table=str(table), collection=collection,
                  model=model, revision=revision, state=state or "dropped")
        return
    retired = conn.execute(db.revisions.update().where(
        _of_collection(table, collection), r.state == "ready",
        sa.not_(sa.and_(r.model == model, r.revision == revision)),
    ).values(state="retired", run_id=run_id, changed_at=sa.func.now()).returning(r.model, r.revision)).all()
    conn.execute(db.revisions.update().where(_key(table, collection, model, revision)).values(
        state="ready", namespace=namespace, run_id=run_id, changed_at=sa.func.now()))
    log_event(log, "revision_ready", table=str(table), collection=collection, model=model, revision=revision,
              retired=",".join(f"{m}@{rev}" for m, rev in retired) or None)


def ready_revision(conn: sa.Connection, table: VectorsTable, collection: str) -> tuple[str, str] | None:
    """The collection's ready (model, revision), None when none is."""
    r = db.revisions.c
    row = conn.execute(sa.select(r.model, r.revision).where(_of_collection(table, collection),
                                                            r.state == "ready")).first()
    return tuple(row) if row else None


def revision_state(conn: sa.Connection, table: VectorsTable, collection: str, model: str, revision: str) -> str | None:
    """The revision's state; None when no run of it recorded one (vectors from before migration 0015, or none)."""
    return conn.execute(sa.select(db.revisions.c.state).where(_key(table, collection, model, revision))).scalar()


def ensure_current_view(conn: sa.Connection, table: VectorsTable) -> None:
    """The table's `_current` view (current_view), made or remade when it lacks a column of the table (one added
    since: metadata, chunks). Called with the table's creation lock held."""
    view = current_view(table)
    columns = conn.execute(sa.text(
        "SELECT (SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attnum > 0"
        " AND NOT attisdropped), (SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(:v) AND attnum > 0)"
    ), {"t": table.sql, "v": view.sql}).one()
    if columns[0] == columns[1]:
        return
    # Bound by OID when made: later search paths do not change which bookkeeping table it reads.
    conn.execute(sa.text(
        f"CREATE OR REPLACE VIEW {view.sql} AS SELECT v.* FROM {table.sql} v WHERE EXISTS (SELECT FROM "
        f"{quote_identifier(db.revisions.name)} r WHERE r.vectors_table = {_literal(str(table))}"
        " AND r.collection = v.collection AND r.model = v.model AND r.revision = v.revision AND r.state = 'ready')"))
    log_event(log, "current_view_made", view=str(view), table=str(table))


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def drop_retired(engine: sa.Engine, table: VectorsTable, collection: str, retain: int) -> list[tuple[str, str]]:
    """The collection's retired revisions past the `retain` most recently retired, dropped with their vectors (see
    the module's doc); the (model, revision) pairs dropped."""
    r = db.revisions.c
    with engine.connect() as conn:
        retired = conn.execute(sa.select(r.model, r.revision).where(
            _of_collection(table, collection), r.state == "retired",
        ).order_by(r.changed_at.desc(), r.model, r.revision).offset(retain)).all()
    dropped = [(model, revision) for model, revision in retired if _drop(engine, table, collection, model, revision)]
    for model, revision in dropped:
        log_event(log, "revision_dropped", table=str(table), collection=collection, model=model, revision=revision)
    return dropped


def _still_retired(conn: sa.Connection, key) -> bool:
    return conn.execute(sa.select(db.revisions.c.state).where(key).with_for_update()).scalar() == "retired"


def _drop(engine: sa.Engine, table: VectorsTable, collection: str, model: str, revision: str) -> bool:
    key = _key(table, collection, model, revision)
    runs = db.runs.c
    with engine.begin() as conn:
        if not _still_retired(conn, key) or conn.execute(sa.select(sa.exists().where(
                runs.vectors_table == table.name, runs.collection == collection, runs.model == model,
                runs.revision == revision, runs.state == "running",
                runs.heartbeat_at > sa.func.now() - sa.text(f"interval '{LIVE_RUN_S} seconds'")))).scalar():
            return False
        began = conn.execute(sa.select(sa.func.now())).scalar_one()
        conn.execute(db.batches.delete().where(db.batches.c.run_id.in_(sa.select(runs.run_id).where(
            runs.vectors_table == table.name, runs.collection == collection, runs.model == model,
            runs.revision == revision))))
    chunk = sa.text(
        f"DELETE FROM {table.sql} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table.sql} WHERE collection = :c"
        " AND model = :m AND revision = :r AND updated_at < :began LIMIT :n))")
    while True:
        with engine.begin() as conn:
            if not _still_retired(conn, key):
                return False
            deleted = conn.execute(chunk, {"c": collection, "m": model, "r": revision, "began": began,
                                           "n": DROP_CHUNK_ROWS}).rowcount
            if deleted == 0:
                conn.execute(db.revisions.delete().where(key, db.revisions.c.state == "retired"))
                return True
