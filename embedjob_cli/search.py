"""Nearest neighbours of a query vector in a job's collection, ordered by the job's metric so an HNSW index serves them.

A hit is one chunk (spec.chunking; a record embedded whole is chunk 0): its record id,
chunk number and character offsets into the record's text, so it points into the document.

The ORDER BY is the bare distance operator of the index's operator class
(vector_index.metric_for) against a query cast to the column's own type (vector or
halfvec): the form PostgreSQL's planner answers with an index scan. The distance shown
is always the cosine distance. `hnsw.ef_search` (pgvector's candidate list) is at least
k, and iterative scans keep a filtered search (collection, model, revision, and the
metadata `--where` names) from returning fewer than k rows when other rows share the table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa

from embedjob.vector_types import VECTOR_TYPES

from embedjob_worker.sink.revisions import ready_revision, revision_state
from embedjob_worker.sink.target import VectorsTable
from embedjob_worker.sink.vector_index import Metric

# pgvector's default and largest hnsw.ef_search.
DEFAULT_EF_SEARCH = 40
MAX_EF_SEARCH = 1000


@dataclass(frozen=True)
class Hit:
    record_id: str
    distance: float  # cosine distance: 0 the same direction, 2 the opposite
    text: str  # the chunk's
    chunk: int  # 0 for a record embedded whole
    char_start: int  # the chunk's character offsets into the record's text
    char_end: int


def vector_literal(vector: np.ndarray) -> str:
    """pgvector's text form of a vector, '[0.1,0.2,...]'."""
    return "[" + ",".join(f"{x:.7g}" for x in vector) + "]"


def column_types(conn: sa.Connection, table: VectorsTable) -> dict[str, str]:
    """The vectors table's columns and their types (embedding: vector or halfvec); empty when it does not exist."""
    return dict(conn.execute(sa.text(
        "SELECT attname, atttypid::regtype::text FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attnum > 0"
        " AND NOT attisdropped"), {"t": table.sql}).all())


def revision_refusal(conn: sa.Connection, table: VectorsTable, collection: str, model: str, revision: str) -> str | None:
    """Why search does not read the manifest's (model, revision): it reads the collection's ready one only (a run of
    it wrote every batch; docs/revisions.md). None when it is the ready one, or when the collection has no revision
    recorded (vectors written before embedjob_revisions existed: read as they are)."""
    if conn.execute(sa.text("SELECT to_regclass('embedjob_revisions')")).scalar() is None:
        return None
    ready = ready_revision(conn, table, collection)
    if ready == (model, revision):
        return None
    state = revision_state(conn, table, collection, model, revision)
    if ready is None and state is None:
        return None
    mine = f"{model}@{revision} ({state or 'no run of it yet'})"
    if ready is None:
        return (f"collection {collection!r} of table {table} has no ready revision yet: this manifest's is {mine}; "
                "search reads a revision once a run of it has written every batch (--incoming reads it as it stands)")
    return (f"the ready revision of collection {collection!r} in table {table} is {ready[0]}@{ready[1]}, not this "
            f"manifest's {mine}: search with the manifest of the ready one, or pass --incoming to read this one as "
            "it stands")


def where_condition(text: str) -> tuple[str, str]:
    """`--where key=value` as (key, value); ValueError saying the form."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise ValueError(f"{text!r} is not key=value (a metadata field's name, then the value it must have)")
    return key, value


def _metadata_filter(where: list[tuple[str, str]]) -> tuple[str, dict[str, str]]:
    """SQL conditions (and their parameters) keeping the rows whose metadata has each key with its value: as text, or
    as the JSON number, true, false or null it spells (a CSV's "2024" and a JSON line's 2024 both match), by
    containment (`@>`), which the metadata's GIN index (spec.sink.index.metadata) serves."""
    conditions, params = [], {}
    for n, (key, value) in enumerate(where):
        forms = [json.dumps({key: value})]
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        if parsed is None or isinstance(parsed, (bool, int, float)):
            forms.append(json.dumps({key: parsed}))
        conditions.append("(" + " OR ".join(f"metadata @> CAST(:w{n}_{i} AS jsonb)" for i in range(len(forms))) + ")")
        params.update({f"w{n}_{i}": form for i, form in enumerate(forms)})
    return "".join(f" AND {c}" for c in conditions), params


def searchable_vector_type(conn: sa.Connection, table: VectorsTable, where: list[tuple[str, str]] = ()) -> str | None:
    """The type of the vectors table's embedding column (vector or halfvec), None when the table does not exist;
    ValueError naming what keeps search from reading it (another type, no chunk column, no metadata to filter on)."""
    columns = column_types(conn, table)
    vector_type = columns.get("embedding")
    if not columns:
        return None
    if vector_type not in VECTOR_TYPES:
        raise ValueError(f"table {table}'s embedding column is of type {vector_type}, not {' or '.join(VECTOR_TYPES)}")
    if "chunk" not in columns:
        raise ValueError(f"table {table} was created before chunking (no chunk column): a run of the job upgrades it "
                         "in place (docs/chunking.md)")
    if where and "metadata" not in columns:
        raise ValueError(f"table {table} keeps no metadata: --where filters on what spec.source.metadataFields keeps")
    return vector_type


def nearest(conn: sa.Connection, table: VectorsTable, collection: str, model: str, revision: str, query: np.ndarray, k: int,
            metric: Metric, ef_search: int | None = None, where: list[tuple[str, str]] = ()) -> list[Hit] | None:
    """The k rows of (collection, model, revision) nearest to `query` whose metadata has each of `where`'s values;
    None when the table does not exist. Runs in the connection's transaction (the search settings are local to it)."""
    vector_type = searchable_vector_type(conn, table, where)
    if vector_type is None:
        return None
    conditions, where_params = _metadata_filter(list(where))
    conn.execute(sa.text("SELECT set_config('hnsw.ef_search', :ef, true),"
                         " set_config('hnsw.iterative_scan', 'strict_order', true)"),
                 {"ef": str(min(MAX_EF_SEARCH, max(ef_search or DEFAULT_EF_SEARCH, k)))})
    cast_query = f"CAST(:q AS {vector_type})"
    distance = metric.cosine_distance.format(column="embedding", query=cast_query)
    rows = conn.execute(sa.text(
        f"SELECT record_id, {distance} AS distance, text, chunk, char_start, char_end FROM {table.sql}"
        f" WHERE collection = :c AND model = :m AND revision = :r{conditions}"
        f" ORDER BY embedding {metric.operator} {cast_query} LIMIT :k"),
        {"q": vector_literal(query), "c": collection, "m": model, "r": revision, "k": k, **where_params}).all()
    return [Hit(row.record_id, float(row.distance), row.text, row.chunk, row.char_start, row.char_end) for row in rows]
