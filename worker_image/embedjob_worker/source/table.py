"""The table source: a PostgreSQL table or view read in id order (ties by text), a page at a time.

The query is composed with psycopg.sql: every identifier is checked against
SOURCE_IDENTIFIER again here (the driver trusts no config it did not parse itself) and
quoted with sql.Identifier; filter values are bound parameters, and the operators come
from a fixed table.

Rows are read in keyset pages of PAGE_ROWS, each page a short read-only transaction of its
own: no transaction stays open while the driver embeds, so a server's
`idle_in_transaction_session_timeout` never ends a read, and the read never holds back
VACUUM for the hours a large job runs. A page resumes after the last id it read whole
(`id >= :last AND (id, id::text) > (:last, :last)`, so an index on the id column serves
every page), and a page ends on a whole group of equal ids, so equal ids stay together and
the first of them is the same however the pages fall. A connection lost between or during
pages (a failover, a restart, `idle_session_timeout`) is opened again and the page read
again, for up to RECONNECT_WAITS_S. Each page is its own snapshot: a row changed while the
job reads is read as it was or as it is, and the next run catches up (docs/table-source.md).
Rows whose id is NULL come last, as in ORDER BY id; they are counted, not read, since such
a row is refused by its id alone.

The source session bounds each statement (`statement_timeout`) and each lock wait
(`lock_timeout`, a table locked by a migration) as the driver's other sessions do: a wait
past them ends the run `SourceUnreadable` saying so (SourceWaitExceeded), never a read that
waits for ever while the writer's heartbeat keeps the run looking healthy.

Read in id order, a table whose id column is an integer, a uuid or a text under a
deterministic collation brings equal ids next to each other, so its duplicate ids are
found by comparing each id with the one before (records.SortedIds) instead of claiming
every id in PostgreSQL (equal_ids_adjacent). Other types (numeric, whose 1.0 and 1.00
sort together but read differently; text under a nondeterministic collation, which sorts
'a' and 'A' as one) and domains are claimed as before; the order's second key, the id's
text in byte order, keeps even those ids' equal texts together.

A table's input fingerprint (snapshot.InputSnapshot) names the table, not its content:
schema, name, id and text columns and the filter. Its rows change between runs by
design, and a re-run embeds only what changed (embedjob_worker.sink.incremental); what a
changed fingerprint means is that another table or filter is being read, which is
refused like a changed file unless a new run is asked for (docs/table-source.md).
"""
from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from embedjob.api import NULL_OPS, SOURCE_IDENTIFIER, SourceTable, TableFilter
from embedjob.text_template import TextTemplate
from embedjob.db import LOCK_TIMEOUT_S, STATEMENT_TIMEOUT_S, engine_url

from embedjob_worker.core.logs import log_event, mask_secrets
from embedjob_worker.core.records import RawRecord
from embedjob_worker.source.record_fields import RecordFields
from embedjob_worker.source.snapshot import InputSnapshot

PAGE_ROWS = 2000
# A row's id and text among its metadata columns' values: keys no column name (an identifier) can be.
_ID, _TEXT = "\x00id", "\x00text"
# How long to wait before each new connection after one was lost mid-read: a minute in all, a failover's time.
RECONNECT_WAITS_S = (1, 2, 4, 8, 15, 30)
_OPERATORS = {"eq": "=", "ne": "<>", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
              "isNull": "IS NULL", "isNotNull": "IS NOT NULL"}
# The id column's type and whether its collation is deterministic (no collation: True).
_ID_COLUMN_SQL = """
SELECT format_type(a.atttypid, NULL), coalesce(co.collisdeterministic, true)
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_collation co ON co.oid = a.attcollation
WHERE n.nspname = %s AND c.relname = %s AND a.attname = %s AND a.attnum > 0 AND NOT a.attisdropped
"""
_EXACT_ORDER_TYPES = frozenset({"smallint", "integer", "bigint", "uuid", "text", "character varying"})
log = logging.getLogger("embedjob_worker.source.table")


class UnsafeTableSpec(ValueError):
    """An identifier or operator the driver will not put into SQL; names the field."""


class SourceWaitExceeded(ValueError):
    """A read of the table that waited past the source session's lock or statement timeout; says which."""


def session_bounds() -> dict[str, str]:
    """The source session's bounds (module docstring); set after connecting, since poolers drop startup options.
    Read when a session starts, from the same names its messages quote."""
    return {"statement_timeout": f"{STATEMENT_TIMEOUT_S}s", "lock_timeout": f"{LOCK_TIMEOUT_S}s"}


def _identifier(value: str, field: str) -> sql.Identifier:
    if not isinstance(value, str) or re.fullmatch(SOURCE_IDENTIFIER, value) is None:
        raise UnsafeTableSpec(f"spec.source.table.{field}: {value!r} is not an identifier the driver accepts "
                              f"(pattern {SOURCE_IDENTIFIER})")
    return sql.Identifier(value)


def _condition(index: int, condition: TableFilter) -> tuple[sql.Composable, list[str]]:
    column = _identifier(condition.column, f"filter[{index}].column")
    if condition.op == "in":
        values = list(condition.values or [])
        placeholders = sql.SQL(", ").join(sql.Placeholder() * len(values))
        return sql.SQL("{} IN ({})").format(column, placeholders), values
    operator = _OPERATORS.get(condition.op)
    if operator is None:
        raise UnsafeTableSpec(f"spec.source.table.filter[{index}].op: {condition.op!r} is not an operator")
    if condition.op in NULL_OPS:
        return sql.SQL("{} " + operator).format(column), []
    return sql.SQL("{} " + operator + " {}").format(column, sql.Placeholder()), [condition.value]


class TableQueries(NamedTuple):
    """The statements that read a table source (module docstring), each taking the filter's parameters first."""
    first_page: sql.Composed  # then the page's row limit
    next_page: sql.Composed  # then the last id read whole, three times, and the row limit
    null_ids: sql.Composed  # how many rows have no id
    params: list[str]


def table_queries(table: SourceTable, template: TextTemplate | None = None, metadata: Sequence[str] = ()) -> TableQueries:
    """How the table is read: SELECT id::text, text FROM schema.name WHERE [filter AND] id IS NOT NULL, in
    pages ORDER BY id, id::text COLLATE "C", text::text COLLATE "C"; then the count of rows without an id.
    The text breaks ties between equal ids, so which of them is read first (and wins) is the same on every
    read, whatever the rows' physical order: the smallest text in byte order, NULL last (a view has no
    ctid; rows of equal id and text are the same record). With a `template` (spec.source.textTemplate) its
    columns stand for the text column, in the order the template names them; `metadata`'s columns follow."""
    # Columns named through the table's alias: in ORDER BY a bare "id" would name the output column id::text,
    # and the rows would come in the order of the ids' texts (1, 10, 100, 2), which no index on id serves.
    id_column = sql.SQL("source.{}").format(_identifier(table.id_column, "idColumn"))
    text_columns = [sql.SQL("source.{}").format(_identifier(name, "textColumn" if template is None else
                                                              f"textTemplate field {name!r}"))
                    for name in (template.fields if template is not None else [table.text_column])]
    source = sql.SQL("FROM {}.{} AS source").format(_identifier(table.table_schema, "schema"),
                                                    _identifier(table.name, "name"))
    params: list[str] = []
    conditions: list[sql.Composable] = []
    for index, condition in enumerate(table.filter or []):
        clause, values = _condition(index, condition)
        conditions.append(clause)
        params += values
    id_text = sql.SQL('{}::text COLLATE "C"').format(id_column)

    def where(*more: sql.Composable) -> sql.Composable:
        return sql.SQL(" WHERE ") + sql.SQL(" AND ").join([*conditions, *more])

    kept = [sql.SQL(", source.{}").format(_identifier(name, f"metadataFields[{n}]")) for n, name in enumerate(metadata)]
    select = sql.SQL("SELECT {}::text, {}{} ").format(id_column, sql.SQL(", ").join(text_columns),
                                                      sql.Composed(kept)) + source
    ties = sql.SQL(", ").join(sql.SQL('{}::text COLLATE "C"').format(column) for column in text_columns)
    order = sql.SQL(" ORDER BY {}, {}, {} LIMIT %s").format(id_column, id_text, ties)
    has_id = sql.SQL("{} IS NOT NULL").format(id_column)
    # `id >= last` besides the row comparison lets an index on the id column find the page's start.
    after = sql.SQL("{} >= %s AND ({}, {}) > (%s, %s)").format(id_column, id_column, id_text)
    return TableQueries(first_page=select + where(has_id) + order, next_page=select + where(has_id, after) + order,
                        null_ids=sql.SQL("SELECT count(*) ") + source + where(sql.SQL("{} IS NULL").format(id_column)),
                        params=params)


def check_table(table: SourceTable, template: TextTemplate | None = None) -> None:
    """Raise UnsafeTableSpec unless the whole table spec (and the template's columns) is safe to compose into SQL."""
    table_queries(table, template)


def table_snapshot(table: SourceTable, template: TextTemplate | None = None) -> InputSnapshot:
    """The table's identity as an input snapshot: what it reads, not what the rows hold (module docstring)."""
    check_table(table, template)
    identity = {"schema": table.table_schema, "name": table.name, "idColumn": table.id_column,
                "textColumn": table.text_column, "filter": [f.model_dump(by_alias=True, exclude_none=True)
                                                            for f in table.filter]}
    return InputSnapshot(uri=table_uri(table), size=None, modified=None,
                         content="table:" + json.dumps(identity, sort_keys=True, separators=(",", ":")))


def table_uri(table: SourceTable) -> str:
    """How logs and messages name the table: `table:schema.name`."""
    return f"table:{table.table_schema}.{table.name}"


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL (postgresql+psycopg://...) as libpq takes it, credentials kept."""
    return engine_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def read_table_records(url: str, table: SourceTable, template: TextTemplate | None = None,
                       metadata: Sequence[str] = ()) -> Iterator[RawRecord]:
    """The table's rows as RawRecords (id as text, the text column as stored or the `template` rendered from its
    columns, the `metadata` columns' values as JSON), in id order, then one without id or text per row whose id is
    NULL; SourceWaitExceeded when a statement or lock wait outlasts its bound."""
    queries = table_queries(table, template, metadata)
    names = list(template.fields) if template is not None else [_TEXT]
    made_of = RecordFields(_ID, template or _TEXT, tuple(metadata))
    position = 0
    with _SourceSession(url, table_uri(table)) as session:
        for record_id, *values in _pages(session, queries):
            yield (made_of.record(position, {_ID: record_id, **dict(zip([*names, *metadata], values))})
                   if template is not None or metadata else RawRecord(position, record_id, values[0]))
            position += 1
        for _ in range(session.rows(queries.null_ids, queries.params)[0][0]):
            yield RawRecord(position, None, None)
            position += 1


def _pages(session: _SourceSession, queries: TableQueries) -> Iterator[tuple[str, Any]]:
    """The rows with an id, page by page, each page ending on a whole group of equal ids (module docstring)."""
    after, limit = None, PAGE_ROWS
    while True:
        if after is None:
            rows = session.rows(queries.first_page, [*queries.params, limit])
        else:
            rows = session.rows(queries.next_page, [*queries.params, after, after, after, limit])
        if len(rows) < limit:
            yield from rows
            return
        whole = last_group_start(rows)
        if whole == 0:  # one id fills the page: read it again with room for all of it
            limit *= 2
            continue
        yield from rows[:whole]
        after, limit = rows[whole - 1][0], PAGE_ROWS


def last_group_start(rows: list[tuple]) -> int:
    """Where the rows' last run of equal ids (their first field) starts: a page may hold only part of it."""
    start = len(rows) - 1
    while start > 0 and rows[start - 1][0] == rows[-1][0]:
        start -= 1
    return start


class _SourceSession:
    """The source's bounded, read-only connection, opened again when lost once it has read (module docstring)."""

    def __init__(self, url: str, uri: str):
        self._url, self._uri = url, uri
        self._conn: psycopg.Connection | None = None
        self._has_read = False  # before the first read, a refused connection is the job's error, not a failover

    def __enter__(self) -> _SourceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()

    def rows(self, query: sql.Composed, params: list) -> list[tuple]:
        """The query's rows, read in a short read-only transaction of its own."""
        waits = iter(RECONNECT_WAITS_S)
        while True:
            try:
                rows = self._read(query, params)
                self._has_read = True
                return rows
            except psycopg.errors.LockNotAvailable:
                raise SourceWaitExceeded(f"waited {LOCK_TIMEOUT_S} s (lock_timeout) for a lock on {self._uri} that "
                                         "another session holds (a migration, a VACUUM FULL?); run the job again "
                                         "once it is released") from None
            except psycopg.errors.QueryCanceled as exc:  # statement_timeout
                raise SourceWaitExceeded(f"a read of {self._uri} ran past {STATEMENT_TIMEOUT_S} s "
                                         f"(statement_timeout): {exc}") from None
            except psycopg.OperationalError as exc:
                lost = self._conn is None or self._conn.broken
                wait = next(waits, None) if lost and self._has_read else None
                if wait is None:
                    raise
                log_event(log, "source_reconnecting", logging.WARNING, source=self._uri, wait_s=wait,
                          error=mask_secrets(str(exc).strip()))
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                time.sleep(wait)

    def _read(self, query: sql.Composed, params: list) -> list[tuple]:
        if self._conn is None:
            conn = psycopg.connect(libpq_url(self._url), connect_timeout=10, application_name="embedjob-source")
            conn.read_only = True
            for name, value in session_bounds().items():
                conn.execute("SELECT set_config(%s, %s, false)", (name, value))
            conn.commit()  # a session setting made in a transaction lasts only once that commits
            self._conn = conn
        rows = self._conn.execute(query, params).fetchall()
        self._conn.commit()  # the page's transaction ends here: none stays open while the driver embeds
        return rows


def equal_ids_adjacent(url: str, table: SourceTable) -> bool:
    """Whether reading the table in id order brings equal ids (as text) next to each other (module docstring)."""
    with psycopg.connect(libpq_url(url), connect_timeout=10, application_name="embedjob-source") as conn:
        row = conn.execute(_ID_COLUMN_SQL, (table.table_schema, table.name, table.id_column)).fetchone()
    return row is not None and sorts_equal_ids_together(*row)


def sorts_equal_ids_together(type_name: str, deterministic_collation: bool) -> bool:
    """Whether ORDER BY a column of this type (format_type's name) and collation puts values whose text
    is equal next to each other: only where equal text means equal value and the reverse."""
    return type_name in _EXACT_ORDER_TYPES and deterministic_collation
