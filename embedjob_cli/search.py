"""Nearest neighbours of a query vector in a job's collection, ordered by the job's metric so an HNSW index serves them.

A hit is one chunk (spec.chunking; a record embedded whole is chunk 0): its record id,
chunk number and character offsets into the record's text, so it points into the document.

The ORDER BY is the bare distance operator of the index's operator class
(vector_index.metric_for) against a query cast to the column's own type (vector or
halfvec): the form PostgreSQL's planner answers with an index scan. The distance shown
is always the cosine distance. `hnsw.ef_search` (pgvector's candidate list) is at least
k, and iterative scans keep a filtered search (collection, model, revision) from
returning fewer than k rows when other collections share the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa

from embedjob.db import VECTOR_TYPES

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


def nearest(conn: sa.Connection, table: VectorsTable, collection: str, model: str, revision: str, query: np.ndarray, k: int,
            metric: Metric, ef_search: int | None = None) -> list[Hit] | None:
    """The k rows of (collection, model, revision) nearest to `query`; None when the table does not exist.
    Runs in the connection's transaction (the search settings are local to it)."""
    columns = column_types(conn, table)
    vector_type = columns.get("embedding")
    if not columns:
        return None
    if vector_type not in VECTOR_TYPES:
        raise ValueError(f"table {table}'s embedding column is of type {vector_type}, not {' or '.join(VECTOR_TYPES)}")
    if "chunk" not in columns:
        raise ValueError(f"table {table} was created before chunking (no chunk column): a run of the job upgrades it "
                         "in place (docs/chunking.md)")
    conn.execute(sa.text("SELECT set_config('hnsw.ef_search', :ef, true),"
                         " set_config('hnsw.iterative_scan', 'strict_order', true)"),
                 {"ef": str(min(MAX_EF_SEARCH, max(ef_search or DEFAULT_EF_SEARCH, k)))})
    cast_query = f"CAST(:q AS {vector_type})"
    distance = metric.cosine_distance.format(column="embedding", query=cast_query)
    rows = conn.execute(sa.text(
        f"SELECT record_id, {distance} AS distance, text, chunk, char_start, char_end FROM {table.sql}"
        " WHERE collection = :c AND model = :m AND revision = :r"
        f" ORDER BY embedding {metric.operator} {cast_query} LIMIT :k"),
        {"q": vector_literal(query), "c": collection, "m": model, "r": revision, "k": k}).all()
    return [Hit(row.record_id, float(row.distance), row.text, row.chunk, row.char_start, row.char_end) for row in rows]
