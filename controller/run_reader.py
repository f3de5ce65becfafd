"""Reads a job's newest run row from the driver's `embedjob_runs` table (read-only).

A small pool with connect and statement timeouts: a slow or absent database delays
a status update by seconds at most and is reported as "progress unavailable"; it never
fails a job by itself.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from pydantic import ConfigDict

from embedjob.api import RunCounters
from embedjob.change_window_record import described
from embedjob.db import engine_url, runs

from .database import bounded_engine

UNDEFINED_TABLE = "42P01"  # before the driver's first migration
INSUFFICIENT_PRIVILEGE = "42501"


class RunRow(RunCounters):
    """One driver run as the operator reads it: the run's counters, its state and why it failed."""

    model_config = ConfigDict(frozen=True)

    state: str  # running | succeeded | failed
    reason: str | None = None
    error: str | None = None
    heartbeat_at: dt.datetime | None = None
    prompt: str | None = None  # the document prompt the run embedded with (migration 0013)
    model: str = ""
    revision: str = ""
    collection: str = ""
    vectors_table: str = ""  # unqualified, as spec.sink.table
    # From embedjob_revisions (migration 0015), not the run row: the state of the run's revision in its collection,
    # and the collection's ready model@revision.
    revision_state: str | None = None
    ready_revision: str | None = None
    # A table run's change window (migration 0016), as change_window_record.described reads it.
    rows_read: str | None = None


_NOT_COLUMNS = ("revision_state", "ready_revision", "rows_read")
# The columns of a RunRow, by field name (a field without a column fails here, at import).
_RUN_COLUMNS = [runs.c[name] for name in RunRow.model_fields if name not in _NOT_COLUMNS]
_HAS_CHANGE_WINDOW = sa.text("SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'embedjob_runs'::regclass "
                             "AND attname = 'change_window' AND NOT attisdropped)")
# The run's revision and the collection's ready one. embedjob_revisions names the table with its schema, the run row
# without: of same-named tables in several schemas, the rows last changed by the job's namespace come first.
_REVISIONS = sa.text(
    "SELECT model, revision, state FROM embedjob_revisions WHERE collection = :collection"
    " AND right(vectors_table, :length) = :suffix AND (state = 'ready' OR (model = :model AND revision = :revision))"
    " ORDER BY namespace = :namespace DESC, changed_at DESC")


class RunUnavailable(Exception):
    """The database could not be read; the message is safe to show (no credentials)."""


class RunReader:
    def __init__(self, url: str, pool_size: int = 2):
        self._url = engine_url(url)
        self._engine = bounded_engine(url, pool_size, read_only=True)
        self._has_change_window = False  # asked again until a driver's migration 0016 adds the column

    def latest(self, uid: str, namespace: str, name: str) -> RunRow | None:
        """The newest run of the job, None before the driver started one. A row counts only where its
        job_key, namespace and job_name are the job's: a row written under another namespace's
        database role (docs/install.md) can never drive this job's status."""
        try:
            with self._engine.connect() as conn:
                self._has_change_window = self._has_change_window or conn.execute(_HAS_CHANGE_WINDOW).scalar_one()
                window = [runs.c.change_window] if self._has_change_window else []
                row = conn.execute(sa.select(*_RUN_COLUMNS, *window).where(
                    runs.c.job_key == uid, runs.c.namespace == namespace, runs.c.job_name == name,
                ).order_by(runs.c.started_at.desc()).limit(1)).mappings().first()
                if row is None:
                    return None
                values = dict(row)
                values["rows_read"] = described(values.pop("change_window", None))
                return RunRow.model_validate({**values, **self._revisions(conn, row, namespace)})
        except sa.exc.DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) == UNDEFINED_TABLE:
                return None
            raise RunUnavailable(self._describe(exc)) from None
        except sa.exc.SQLAlchemyError as exc:
            raise RunUnavailable(self._describe(exc)) from None

    @staticmethod
    def _revisions(conn: sa.Connection, run: sa.RowMapping, namespace: str) -> dict[str, str | None]:
        """The run's revision state and the collection's ready revision; none before migration 0015, for a run that
        recorded none, or for a role not granted embedjob_revisions."""
        try:
            rows = conn.execute(_REVISIONS, {
                "collection": run["collection"], "length": len(run["vectors_table"]) + 1,
                "suffix": f".{run['vectors_table']}", "model": run["model"], "revision": run["revision"],
                "namespace": namespace}).all()
        except sa.exc.ProgrammingError as exc:
            # Before migration 0015, or a role granted embedjob_runs only (docs/install.md before it): the counters
            # still show.
            if getattr(exc.orig, "sqlstate", None) not in (UNDEFINED_TABLE, INSUFFICIENT_PRIVILEGE):
                raise
            return {}
        own = next((r.state for r in rows if (r.model, r.revision) == (run["model"], run["revision"])), None)
        ready = next((f"{r.model}@{r.revision}" for r in rows if r.state == "ready"), None)
        return {"revision_state": own, "ready_revision": ready}

    def _describe(self, exc: Exception) -> str:
        cause = getattr(exc, "orig", None) or exc
        first_line = (str(cause).strip().splitlines() or [""])[0][:200]
        if self._url.password:
            first_line = first_line.replace(self._url.password, "***")
        return f"{type(cause).__name__}: {first_line}"

    def close(self) -> None:
        self._engine.dispose()
