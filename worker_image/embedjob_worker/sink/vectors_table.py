"""The vectors table's shape: created for the model's type and dimension, or brought up to today's columns in place.

A table created before chunking keys its rows by (collection, record id, model, revision)
and has no `chunk`, `char_start` or `char_end`. Writing chunks into it would be wrong, so
before a run reads or writes it the driver upgrades it in place when its role owns the
table (each old row is chunk 0 over its whole text, which is what it holds), and refuses
the run naming the table and the fix otherwise. docs/chunking.md has the statements. A table
from before the metadata columns gets them when a job with spec.source.metadataFields writes it.
"""

from __future__ import annotations

import logging
import time

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from embedjob import db
from embedjob.vectors_schema import metadata_columns, vectors_table

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.logs import log_event
from embedjob_worker.sink.revisions import ensure_current_view
from embedjob_worker.sink.target import VectorsTable
from embedjob_worker.sink.vector_index import BUILD_TIMEOUT_S

log = logging.getLogger("embedjob_worker.sink.vectors_table")

_COLUMNS_SQL = sa.text("SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attnum > 0"
                       " AND NOT attisdropped")
_OWNED_SQL = sa.text("SELECT pg_has_role(relowner, 'USAGE'), current_user FROM pg_class WHERE oid = to_regclass(:t)")
_PRIMARY_KEY_SQL = sa.text("SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(:t) AND contype = 'p'")
CHUNK_COLUMNS = ("chunk", "char_start", "char_end")
# The constraint's name is whatever the table's owner gave it: quoted as an identifier, `"` doubled.
_quote_identifier = postgresql.dialect().identifier_preparer.quote_identifier


def upgrade_statements(table: VectorsTable, primary_key: str) -> list[str]:
    """What makes a vectors table from before chunking one of today's: every old row is chunk 0 of its text."""
    return [
        f'ALTER TABLE {table.sql} ADD COLUMN chunk integer NOT NULL DEFAULT 0,'
        " ADD COLUMN char_start integer NOT NULL DEFAULT 0, ADD COLUMN char_end integer",
        f'UPDATE {table.sql} SET char_end = char_length(text)',
        f'ALTER TABLE {table.sql} ALTER COLUMN chunk DROP DEFAULT, ALTER COLUMN char_start DROP DEFAULT,'
        f" ALTER COLUMN char_end SET NOT NULL, DROP CONSTRAINT {_quote_identifier(primary_key)},"
        " ADD PRIMARY KEY (collection, record_id, chunk, model, revision)",
    ]


def upgrade_vectors_table(engine: sa.Engine, table: VectorsTable) -> bool:
    """Add the chunk columns to an existing vectors table that lacks them; whether it did.
    JobFailed (VectorsTableOutdated) when this role does not own the table."""
    quoted = table.sql
    with engine.begin() as conn:
        # Serialised with the table's creation and other drivers' upgrades of it.
        conn.execute(db.advisory_lock_sql("pg_advisory_xact_lock", db.TABLE_LOCK), {"name": str(table)})
        columns = set(conn.execute(_COLUMNS_SQL, {"t": quoted}).scalars())
        if not columns or "chunk" in columns:
            return False  # not there yet (the run creates it), or already of today's shape
        owned, role = conn.execute(_OWNED_SQL, {"t": quoted}).one()
        primary_key = conn.execute(_PRIMARY_KEY_SQL, {"t": quoted}).scalar_one_or_none()
        if not owned or primary_key is None or columns & set(CHUNK_COLUMNS):
            why = (f"role {role} does not own it, so the driver may not add them" if not owned else
                   "its primary key or columns are not the ones embedjob created")
            raise JobFailed("VectorsTableOutdated",
                            f"spec.sink.table: table {table} was created before chunking: it has no chunk column in "
                            f"its primary key, and {why}. Its owner runs one job on it (the driver adds the chunk "
                            "columns in place) or the statements in docs/chunking.md; or set spec.sink.table to "
                            "another table")
        timeout_ms = str(BUILD_TIMEOUT_S * 1000)  # rewrites every row: as long as an index build may take
        conn.execute(sa.text("SELECT set_config('statement_timeout', :t, true), set_config('lock_timeout', :t, true)"),
                     {"t": timeout_ms})
        started = time.monotonic()
        for statement in upgrade_statements(table, primary_key):
            conn.execute(sa.text(statement))
    log_event(log, "vectors_table_upgraded", logging.WARNING, table=table, columns=",".join(CHUNK_COLUMNS),
              seconds=round(time.monotonic() - started, 2))
    return True


def add_metadata_columns(engine: sa.Engine, table: VectorsTable) -> bool:
    """Add the metadata columns (vectors_schema.metadata_columns) to an existing vectors table that lacks them (one created
    before they existed), for a job with spec.source.metadataFields or metadataFieldMap; whether it did. JobFailed
    (VectorsTableOutdated) naming the statement when this role does not own the table."""
    quoted = table.sql
    with engine.begin() as conn:
        conn.execute(db.advisory_lock_sql("pg_advisory_xact_lock", db.TABLE_LOCK), {"name": str(table)})
        columns = set(conn.execute(_COLUMNS_SQL, {"t": quoted}).scalars())
        missing = [c for c in metadata_columns() if c.name not in columns]
        if not columns or not missing:
            return False  # not there yet (the run creates it with them), or they are there
        statement = f"ALTER TABLE {quoted} " + ", ".join(
            f"ADD COLUMN IF NOT EXISTS {c.name} {c.type.compile(dialect=postgresql.dialect())}" for c in missing)
        owned, role = conn.execute(_OWNED_SQL, {"t": quoted}).one()
        if not owned:
            raise JobFailed("VectorsTableOutdated",
                            f"spec.source.metadataFields/metadataFieldMap: table {table} has no metadata columns "
                            f"and role {role} does not own it, so the driver may not add them: its owner runs `{statement}` (instant: "
                            "no row is rewritten), or set spec.sink.table to another table")
        conn.execute(sa.text(statement))
    log_event(log, "vectors_table_upgraded", logging.WARNING, table=table, columns=",".join(c.name for c in missing))
    return True


def _ensure_view(conn: sa.Connection, table: VectorsTable) -> None:
    """The table's `_current` view (revisions.current_view); a role that may not make it (no CREATE on the schema,
    not the view's owner) is told so in the log and the run goes on: only readers of the view miss it."""
    try:
        with conn.begin_nested():
            ensure_current_view(conn, table)
    except sa.exc.ProgrammingError as exc:
        log_event(log, "current_view_not_made", logging.WARNING, table=str(table), error=str(exc.orig).strip())


def ensure_vectors_table(engine: sa.Engine, table: VectorsTable, dim: int, vector_type: str) -> None:
    """Create the vectors table unless it exists, with its `_current` view; refuse one of another vector type or
    dimension."""
    with engine.begin() as conn:
        # Drivers of two jobs sharing a table may start together; CREATE TABLE's
        # check-then-create is not atomic (a duplicate pg_type row otherwise).
        conn.execute(db.advisory_lock_sql("pg_advisory_xact_lock", db.TABLE_LOCK), {"name": str(table)})
        vectors_table(table.name, dim, vector_type=vector_type, schema=table.schema).create(conn, checkfirst=True)
        _ensure_view(conn, table)
        existing_type, existing_dim = conn.execute(sa.text(
            "SELECT atttypid::regtype::text, atttypmod FROM pg_attribute"
            " WHERE attrelid = CAST(:t AS regclass) AND attname = 'embedding'"
        ), {"t": table.sql}).one()
    if existing_type != vector_type:  # never mixed: each write and search casts to one type
        raise JobFailed("VectorTypeMismatch",
                        f"table {table} holds {existing_type}({existing_dim}) vectors but spec.sink.vectorType "
                        f"is {vector_type}: set vectorType {existing_type}, or write to another table")
    if existing_dim != dim:
        raise JobFailed("VectorDimensionMismatch", f"table {table} holds {existing_type}({existing_dim}) but "
                                                   f"the model gives {dim} dimensions")
