"""The watermark a table read leaves for the next run (core.change_window), taken before its first page.

Two statements, in this order, before any page is read: the database's clock (T), then which transactions are
open in the database (pg_stat_activity, a snapshot taken after T) and when the oldest began (X). The watermark
is min(T, X) less changeSkewSeconds. A transaction that commits a row after the pages' snapshots either was
open at the second statement (so began at or after X) or began after it (so after T): its now() and
clock_timestamp() are at or past the watermark. The change column must be a timestamp with time zone: a
timestamp without one holds each writer's local time, which no watermark compares safely.

The proof needs every open transaction to be seen: a role without pg_read_all_stats sees other roles' sessions
without their transaction's start, and a standby does not see its primary's transactions. Then the watermark
is held where this read started (ChangeWindow.hold), and the log says how to let it advance.

An xid8 column, each row stamped with its writing transaction's pg_current_xact_id() (a default and a
trigger), is the one integer change column with a proof, and needs no clock and no pg_read_all_stats: the
watermark is pg_snapshot_xmin of a snapshot taken before the pages, the oldest transaction id then running. A
transaction that commits a row after the pages' snapshots was running at that snapshot (its id, or the one it
is given at its first write, is at or past that xmin) or began after it (past its xmax): its stamp is at or
past the watermark. An integer that the application takes from a sequence has no such bound (a value taken
early by a transaction that commits late), and is refused.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from psycopg import sql

from embedjob.api import SourceTable

from embedjob_worker.core.change_window import ChangeWindow
from embedjob_worker.core.logs import log_event
from embedjob_worker.source.table_session import SourceSession

WATERMARK_TYPE = "timestamp with time zone"
XID_TYPE = "xid8"
# Whether the table or view exists, and its change column's type (NULL: no such column).
_COLUMN_TYPE_SQL = sql.SQL("""
SELECT c.oid IS NOT NULL, format_type(a.atttypid, NULL)
FROM (SELECT 1) one
LEFT JOIN pg_namespace n ON n.nspname = %s
LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = %s
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = %s AND a.attnum > 0 AND NOT a.attisdropped
""")
_CLOCK_SQL = sql.SQL("SELECT clock_timestamp(), pg_is_in_recovery()")
_XMIN_SQL = sql.SQL("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::numeric, pg_is_in_recovery()")
_STANDBY = ("the source is a standby, which does not see its primary's open transactions: read the primary "
            "(spec.source.databaseSecretRef) so that the watermark can advance")
# Sessions of other roles that this role may not look into show nothing but their database and role: no
# transaction start and not even their backend type (which every session shows to a role that may see it).
_OPEN_TRANSACTIONS_SQL = sql.SQL("""
SELECT min(xact_start),
       (array_agg(pid ORDER BY xact_start) FILTER (WHERE xact_start IS NOT NULL))[1],
       count(*) FILTER (WHERE backend_type IS NULL)
FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
""")
log = logging.getLogger("embedjob_worker.source.change_watermark")


class ChangeColumnRefused(ValueError):
    """A change column the watermark cannot be kept on; names the field and the column."""


def take_watermark(session: SourceSession, table: SourceTable, window: ChangeWindow) -> None:
    """Check the change column and set `window`'s watermark (or hold it) before the read's first page."""
    column = window.column
    (table_found, column_type), = session.rows(_COLUMN_TYPE_SQL, [table.table_schema, table.name, column])
    if not table_found:
        raise ValueError(f"spec.source.table: there is no table or view {table.table_schema}.{table.name}")
    if column_type is None:
        raise ChangeColumnRefused(f"spec.source.table.changeColumn: {table.table_schema}.{table.name} has no "
                                  f"column {column!r}")
    if column_type not in (WATERMARK_TYPE, XID_TYPE):
        raise ChangeColumnRefused(
            f"spec.source.table.changeColumn: {column} is {column_type}, not {WATERMARK_TYPE} or {XID_TYPE}: a "
            "change column must hold the moment each row was written, comparable across sessions (a timestamp "
            "without time zone holds each writer's local time; a number from a sequence can be taken by a "
            "transaction that commits after a later one): ALTER TABLE ... ALTER COLUMN "
            f"{column} TYPE timestamptz, or a {XID_TYPE} column set to pg_current_xact_id() on every write")
    if window.read_from is not None and isinstance(window.read_from, int) != (column_type == XID_TYPE):
        raise ChangeColumnRefused(f"spec.source.table.changeColumn: {column} is {column_type} now, and the "
                                  "previous run's watermark is not one of its values: this run stops before its "
                                  "first page, and the next one reads every row")
    if column_type == XID_TYPE:
        _take_transaction_watermark(session, window)
        return
    (clock, standby), = session.rows(_CLOCK_SQL, [])
    (oldest, oldest_pid, hidden), = session.rows(_OPEN_TRANSACTIONS_SQL, [])
    if standby:
        window.hold(_STANDBY)
    elif hidden:
        window.hold(f"the source role cannot see the transactions of {hidden} other sessions (pg_stat_activity): "
                    "GRANT pg_read_all_stats TO it so that the watermark can advance")
    else:
        window.watermark = min(clock, oldest or clock) - timedelta(seconds=window.skew_s)
    log_event(log, "change_window", logging.WARNING if window.held else logging.INFO, column=column,
              read_from=window.read_from and window.read_from.isoformat(), why_full=window.why_full,
              watermark=window.watermark and window.watermark.isoformat(), held=window.held,
              oldest_transaction_pid=oldest_pid if oldest is not None and oldest < clock else None)


def _take_transaction_watermark(session: SourceSession, window: ChangeWindow) -> None:
    """An xid8 column's watermark: the oldest transaction id running before the pages (module docstring)."""
    (xmin, standby), = session.rows(_XMIN_SQL, [])
    if standby:
        window.hold(_STANDBY)
    else:
        window.watermark = int(xmin)
    log_event(log, "change_window", logging.WARNING if window.held else logging.INFO, column=window.column,
              read_from=window.read_from, why_full=window.why_full, watermark=window.watermark, held=window.held)
