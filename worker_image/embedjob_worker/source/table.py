"""The table source: a PostgreSQL table or view read in id order (ties by text) through a server-side cursor.

The query is composed with psycopg.sql: every identifier is checked against
SOURCE_IDENTIFIER again here (the driver trusts no config it did not parse itself) and
quoted with sql.Identifier; filter values are bound parameters, and the operators come
from a fixed table. Rows are fetched FETCH_ROWS at a time by a named (server-side)
cursor, so the table is never held in memory; one query, so one snapshot of the table.

The source session bounds each statement (`statement_timeout`) and each lock wait
(`lock_timeout`, a table locked by a migration) as the driver's other sessions do: a wait
past them ends the run `SourceUnreadable` saying so (SourceWaitExceeded), never a read that
waits for ever while the writer's heartbeat keeps the run looking healthy.

Read in id order, a table whose id column is an integer, a uuid or a text under a
deterministic collation brings equal ids next to each other, so its duplicate ids are
found by comparing each id with the one before (records.SortedIds) instead of claiming
every id in PostgreSQL (equal_ids_adjacent). Other types (numeric, whose 1.0 and 1.00
sort together but read differently; text under a nondeterministic collation, which sorts
'a' and 'A' as one) and domains are claimed as before.

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

import psycopg
from psycopg import sql

from embedjob.api import NULL_OPS, SOURCE_IDENTIFIER, SourceTable, TableFilter
from embedjob.db import LOCK_TIMEOUT_S, STATEMENT_TIMEOUT_S, engine_url

from embedjob_worker.core.records import RawRecord
from embedjob_worker.source.snapshot import InputSnapshot

FETCH_ROWS = 2000
_OPERATORS = {"eq": "=", "ne": "<>", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
              "isNull": "IS NULL", "isNotNull": "IS NOT NULL"}
_CURSOR_NAME = "embedjob_source"
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


class SourceWaitExceeded(ValueError):
    """A read of the table that waited past the source session's lock or statement timeout; says which."""


# The source session's bounds (module docstring); set after connecting, since poolers drop startup options.
SESSION_BOUNDS = {"statement_timeout": f"{STATEMENT_TIMEOUT_S}s", "lock_timeout": f"{LOCK_TIMEOUT_S}s"}


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


def table_query(table: SourceTable) -> tuple[sql.Composed, list[str]]:
    """SELECT id::text, text FROM schema.name [WHERE filter] ORDER BY id, text::text COLLATE "C", and its
    parameters. The text breaks ties between equal ids, so which of them is read first (and wins) is the same
    on every read, whatever the rows' physical order: the smallest text in byte order, NULL last (a view has
    no ctid; rows of equal id and text are the same record)."""
    id_column, text_column = _identifier(table.id_column, "idColumn"), _identifier(table.text_column, "textColumn")
    query = sql.SQL("SELECT {}::text, {} FROM {}.{}").format(
        id_column, text_column, _identifier(table.table_schema, "schema"), _identifier(table.name, "name"))
    params: list[str] = []
    if table.filter:
        conditions = []
        for index, condition in enumerate(table.filter):
            clause, values = _condition(index, condition)
            conditions.append(clause)
            params += values
        query += sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions)
    return query + sql.SQL(' ORDER BY {}, {}::text COLLATE "C"').format(id_column, text_column), params


def check_table(table: SourceTable) -> None:
    """Raise UnsafeTableSpec unless the whole table spec is safe to compose into SQL."""
    table_query(table)


def table_snapshot(table: SourceTable) -> InputSnapshot:
    """The table's identity as an input snapshot: what it reads, not what the rows hold (module docstring)."""
    check_table(table)
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


def read_table_records(url: str, table: SourceTable) -> Iterator[RawRecord]:
    """The table's rows as RawRecords (id as text, the text column as stored), in id order; SourceWaitExceeded
    when a statement or lock wait outlasts its bound."""
    query, params = table_query(table)
    with psycopg.connect(libpq_url(url), connect_timeout=10, application_name="embedjob-source") as conn:
        conn.read_only = True
        for name, value in SESSION_BOUNDS.items():
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        try:
            with conn.cursor(name=_CURSOR_NAME) as cur:
                cur.execute(query, params)
                position = 0
                while rows := cur.fetchmany(FETCH_ROWS):  # a fetch per FETCH_ROWS rows, not a call per row
                    for record_id, text in rows:
                        yield RawRecord(position, record_id, text)
                        position += 1
        except psycopg.errors.LockNotAvailable:
            raise SourceWaitExceeded(f"waited {LOCK_TIMEOUT_S} s (lock_timeout) for a lock on {table_uri(table)} that "
                                     "another session holds (a migration, a VACUUM FULL?); run the job again once it "
                                     "is released") from None
        except psycopg.errors.QueryCanceled as exc:  # statement_timeout
            raise SourceWaitExceeded(f"a read of {table_uri(table)} ran past {STATEMENT_TIMEOUT_S} s "
                                     f"(statement_timeout): {exc}") from None


def equal_ids_adjacent(url: str, table: SourceTable) -> bool:
    """Whether reading the table in id order brings equal ids (as text) next to each other (module docstring)."""
    with psycopg.connect(libpq_url(url), connect_timeout=10, application_name="embedjob-source") as conn:
        row = conn.execute(_ID_COLUMN_SQL, (table.table_schema, table.name, table.id_column)).fetchone()
    return row is not None and sorts_equal_ids_together(*row)


def sorts_equal_ids_together(type_name: str, deterministic_collation: bool) -> bool:
    """Whether ORDER BY a column of this type (format_type's name) and collation puts values whose text
    is equal next to each other: only where equal text means equal value and the reverse."""
    return type_name in _EXACT_ORDER_TYPES and deterministic_collation
