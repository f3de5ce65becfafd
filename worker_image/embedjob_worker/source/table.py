"""The table source: a PostgreSQL table or view read in id order (ties by text), a page at a time.

The query is composed with psycopg.sql: every identifier is checked against
SOURCE_IDENTIFIER again here (the driver trusts no config it did not parse itself) and
quoted with sql.Identifier; filter values are bound parameters, and the operators come
from a fixed table.

Rows are read in keyset pages of PAGE_ROWS, each page a short read-only transaction of the
source session (table_session: bounded, opened again when lost). A page resumes after the last
id it read whole (`id >= :last AND (id, id::text) > (:last, :last)`, so an index on the id
column serves every page), and a page ends on a whole group of equal ids, so equal ids stay
together and the first of them is the same however the pages fall. Each page is its own
snapshot: a row changed while the job reads is read as it was or as it is, and the next run
catches up (docs/table-source.md). Rows whose id is NULL come last, as in ORDER BY id; they are
counted, not read, since such a row is refused by its id alone. A run with a change window
(core.change_window) reads only the rows whose change column is at or past its start, or NULL;
one that also scans ids reads every row's id alone afterwards (read_table_ids).

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
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from embedjob.api import NULL_OPS, SOURCE_IDENTIFIER, SourceTable, TableFilter
from embedjob.text_template import TextTemplate

from embedjob_worker.core.change_window import ChangeWindow, Watermark
from embedjob_worker.core.records import RawRecord
from embedjob_worker.source.change_watermark import take_watermark
from embedjob_worker.source.record_fields import RecordFields
from embedjob_worker.source.record_metadata import MetadataFields
from embedjob_worker.source.snapshot import InputSnapshot
from embedjob_worker.source.table_session import SourceSession, libpq_url

PAGE_ROWS = 2000
ID_PAGE_ROWS = 20_000  # an id scan's page: ids alone are small
# A row's id and text among its metadata columns' values: keys no column name (an identifier) can be.
_ID, _TEXT = "\x00id", "\x00text"
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


class UnsafeTableSpec(ValueError):
    """An identifier or operator the driver will not put into SQL; names the field."""


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
    first_ids: sql.Composed  # the ids alone (an id scan, read_table_ids): then the page's row limit
    next_ids: sql.Composed  # then the last id read, three times, and the row limit
    params: list[Any]


def table_queries(table: SourceTable, template: TextTemplate | None = None, metadata: MetadataFields = (),
                  changed_since: Watermark | None = None) -> TableQueries:
    """How the table is read: SELECT id::text, text FROM schema.name WHERE [filter AND] id IS NOT NULL, in
    pages ORDER BY id, id::text COLLATE "C", text::text COLLATE "C"; then the count of rows without an id.
    The text breaks ties between equal ids, so which of them is read first (and wins) is the same on every
    read, whatever the rows' physical order: the smallest text in byte order, NULL last (a view has no
    ctid; rows of equal id and text are the same record). With a `template` (spec.source.textTemplate) its
    columns stand for the text column, in the order the template names them; `metadata`'s columns follow.
    `changed_since` (a change window's start) keeps only rows whose change column is at or past it, or NULL."""
    # Columns named through the table's alias: in ORDER BY a bare "id" would name the output column id::text,
    # and the rows would come in the order of the ids' texts (1, 10, 100, 2), which no index on id serves.
    id_column = sql.SQL("source.{}").format(_identifier(table.id_column, "idColumn"))
    text_columns = [sql.SQL("source.{}").format(_identifier(name, "textColumn" if template is None else
                                                              f"textTemplate field {name!r}"))
                    for name in (template.fields if template is not None else [table.text_column])]
    source = sql.SQL("FROM {}.{} AS source").format(_identifier(table.table_schema, "schema"),
                                                    _identifier(table.name, "name"))
    params: list[Any] = []
    conditions: list[sql.Composable] = []
    for index, condition in enumerate(table.filter or []):
        clause, values = _condition(index, condition)
        conditions.append(clause)
        params += values
    if changed_since is not None:
        change = _identifier(table.change_column or "", "changeColumn")
        since = sql.SQL("CAST(%s AS xid8)" if isinstance(changed_since, int) else "%s")  # a transaction id's text
        conditions.append(sql.SQL("(source.{} >= {} OR source.{} IS NULL)").format(change, since, change))
        params.append(str(changed_since) if isinstance(changed_since, int) else changed_since)
    id_text = sql.SQL('{}::text COLLATE "C"').format(id_column)

    def where(*more: sql.Composable) -> sql.Composable:
        return sql.SQL(" WHERE ") + sql.SQL(" AND ").join([*conditions, *more])

    kept = [sql.SQL(", source.{}").format(_identifier(field, f"metadataFields field {field!r}")) for _, field in metadata]
    select = sql.SQL("SELECT {}::text, {}{} ").format(id_column, sql.SQL(", ").join(text_columns),
                                                      sql.Composed(kept)) + source
    ties = sql.SQL(", ").join(sql.SQL('{}::text COLLATE "C"').format(column) for column in text_columns)
    order = sql.SQL(" ORDER BY {}, {}, {} LIMIT %s").format(id_column, id_text, ties)
    has_id = sql.SQL("{} IS NOT NULL").format(id_column)
    # `id >= last` besides the row comparison lets an index on the id column find the page's start.
    after = sql.SQL("{} >= %s AND ({}, {}) > (%s, %s)").format(id_column, id_column, id_text)
    select_ids = sql.SQL("SELECT {}::text ").format(id_column) + source
    order_ids = sql.SQL(" ORDER BY {}, {} LIMIT %s").format(id_column, id_text)
    return TableQueries(first_page=select + where(has_id) + order, next_page=select + where(has_id, after) + order,
                        null_ids=sql.SQL("SELECT count(*) ") + source + where(sql.SQL("{} IS NULL").format(id_column)),
                        first_ids=select_ids + where(has_id) + order_ids,
                        next_ids=select_ids + where(has_id, after) + order_ids, params=params)


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


def read_table_records(url: str, table: SourceTable, template: TextTemplate | None = None,
                       metadata: MetadataFields = (), window: ChangeWindow | None = None) -> Iterator[RawRecord]:
    """The table's rows as RawRecords (id as text, the text column as stored or the `template` rendered from its
    columns, the `metadata` columns' values as JSON), in id order, then one without id or text per row whose id is
    NULL; with a change `window`, only its rows, its watermark taken before the first page (change_watermark).
    SourceWaitExceeded when a statement or lock wait outlasts its bound."""
    queries = table_queries(table, template, metadata, window.read_from if window is not None else None)
    names = list(template.fields) if template is not None else [_TEXT]
    made_of = RecordFields(_ID, template or _TEXT, metadata)
    position = 0
    with SourceSession(url, table_uri(table)) as session:
        if window is not None:
            take_watermark(session, table, window)
        for record_id, *values in _pages(session, queries):
            yield (made_of.record(position, {_ID: record_id, **dict(zip([*names, *(field for _, field in metadata)], values))})
                   if template is not None or metadata else RawRecord(position, record_id, values[0]))
            position += 1
        for _ in range(session.rows(queries.null_ids, queries.params)[0][0]):
            yield RawRecord(position, None, None)
            position += 1


def read_table_ids(url: str, table: SourceTable) -> Iterator[list[str]]:
    """The ids (as text) of every row the filter keeps, a page at a time in id order, no text read: an id scan
    (core.change_window), all that sync.deleteMissing needs of the rows outside a change window. Equal ids may
    come once only; a page is its own snapshot, as for read_table_records."""
    queries = table_queries(table)
    with SourceSession(url, table_uri(table)) as session:
        page = session.rows(queries.first_ids, [*queries.params, ID_PAGE_ROWS])
        while page:
            yield [record_id for record_id, in page]
            if len(page) < ID_PAGE_ROWS:
                return
            last = page[-1][0]
            page = session.rows(queries.next_ids, [*queries.params, last, last, last, ID_PAGE_ROWS])


def _pages(session: SourceSession, queries: TableQueries) -> Iterator[tuple[str, Any]]:
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


def equal_ids_adjacent(url: str, table: SourceTable) -> bool:
    """Whether reading the table in id order brings equal ids (as text) next to each other (module docstring)."""
    with psycopg.connect(libpq_url(url), connect_timeout=10, application_name="embedjob-source") as conn:
        row = conn.execute(_ID_COLUMN_SQL, (table.table_schema, table.name, table.id_column)).fetchone()
    return row is not None and sorts_equal_ids_together(*row)


def sorts_equal_ids_together(type_name: str, deterministic_collation: bool) -> bool:
    """Whether ORDER BY a column of this type (format_type's name) and collation puts values whose text
    is equal next to each other: only where equal text means equal value and the reverse."""
    return type_name in _EXACT_ORDER_TYPES and deterministic_collation
