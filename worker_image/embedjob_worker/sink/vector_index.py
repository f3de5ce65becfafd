"""The vectors table's indexes: the HNSW one (its distance, operator class and build) and the metadata's GIN one.

A job with `model.normalize` stores unit vectors, for which the inner product orders
neighbours exactly as cosine does and costs less (no norms), so it gets pgvector's
inner-product operator class and `<#>`; without it the metric is cosine (`<=>`), as
`embedjob search` ranks. The index is built after the load (one bulk build is much
faster than maintaining the graph during the COPYs) and only when no HNSW index with
the job's operator class exists on the column: a re-run never rebuilds it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass

import sqlalchemy as sa

from embedjob import db
from embedjob.api import HNSW_DEFAULT_EF_CONSTRUCTION, HNSW_DEFAULT_M, VectorIndex

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.tally import IndexBuild
from embedjob_worker.core.logs import log_event
from embedjob_worker.sink.target import VectorsTable

log = logging.getLogger("embedjob_worker.sink.vector_index")

# pgvector indexes at most this many dimensions with HNSW (HNSW_MAX_DIM, and twice that for halfvec).
HNSW_MAX_DIMENSIONS = {"vector": 2000, "halfvec": 4000}
# A build of a large table outlasts the engine's statement timeout (db.STATEMENT_TIMEOUT_S); a
# second driver of the table waits on the first one's build instead of building too.
BUILD_TIMEOUT_S = 6 * 3600
_MAX_IDENTIFIER = 63


@dataclass(frozen=True)
class Metric:
    """A pgvector distance: its operator, its operator-class suffix, and the cosine distance in SQL."""

    name: str
    operator: str
    opclass_suffix: str
    cosine_distance: str  # SQL over {column} and {query}: 0 same direction, 2 opposite

    def opclass(self, vector_type: str) -> str:
        return f"{vector_type}_{self.opclass_suffix}"


INNER_PRODUCT = Metric("ip", "<#>", "ip_ops", "1 + ({column} <#> {query})")  # <#> is the negative inner product
COSINE = Metric("cosine", "<=>", "cosine_ops", "{column} <=> {query}")


def metric_for(normalize: bool) -> Metric:
    return INNER_PRODUCT if normalize else COSINE


def index_name(table: str, metric: Metric) -> str:
    """`<table>_hnsw_<metric>`; a table name too long for that is cut and told apart by a hash."""
    return _index_name(table, f"_hnsw_{metric.name}")


def ensure_metadata_index(engine: sa.Engine, table: VectorsTable) -> IndexBuild:
    """The GIN index on the metadata (spec.sink.index.metadata; jsonb_path_ops: containment, `@>`, which
    `embedjob search --where` asks), built unless the table has a GIN index on it with that operator class."""
    name = _index_name(table.name, "_metadata")
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT set_config('statement_timeout', :t, true), set_config('lock_timeout', :t, true)"),
                     {"t": str(BUILD_TIMEOUT_S * 1000)})
        conn.execute(db.advisory_lock_sql("pg_advisory_xact_lock", db.TABLE_LOCK), {"name": str(table)})
        for existing, definition in conn.execute(sa.text(
                "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE i.indrelid = CAST(:t AS regclass)"), {"t": table.sql}).all():
            if "USING gin (metadata jsonb_path_ops)" in definition:
                return IndexBuild(existing, built=False)
        started = time.perf_counter()
        conn.execute(sa.text(f'CREATE INDEX "{name}" ON {table.sql} USING gin (metadata jsonb_path_ops)'))
        seconds = time.perf_counter() - started
    log_event(log, "index_built", index=name, table=str(table), opclass="jsonb_path_ops", seconds=round(seconds, 2))
    return IndexBuild(name, built=True, seconds=seconds)


def _index_name(table: str, suffix: str) -> str:
    """`<table><suffix>` within PostgreSQL's identifier length: a longer table name is cut, told apart by a hash."""
    if len(table) + len(suffix) <= _MAX_IDENTIFIER:
        return table + suffix
    digest = hashlib.sha256(table.encode()).hexdigest()[:8]
    return f"{table[:_MAX_IDENTIFIER - len(suffix) - 9]}_{digest}{suffix}"


def check_indexable(index: VectorIndex | None, vector_type: str, dim: int) -> None:
    """Refuse, before anything is embedded, an index pgvector could not build on these vectors."""
    if index is None or dim <= HNSW_MAX_DIMENSIONS[vector_type]:
        return
    roomier = [t for t, most in HNSW_MAX_DIMENSIONS.items() if dim <= most]
    raise JobFailed("IndexUnsupported", f"spec.sink.index: pgvector's HNSW indexes {vector_type} of at most "
                                        f"{HNSW_MAX_DIMENSIONS[vector_type]} dimensions and the model gives {dim}; "
                    + (f"set spec.sink.vectorType {roomier[0]} or " if roomier else "") + "set index type none")


# pgvector's NOTICE when the graph outgrows maintenance_work_mem and the build goes on far more slowly.
_OUTGREW_MEMORY = "no longer fits into maintenance_work_mem"


def _outgrew_note(notices: list[str], index: VectorIndex) -> str | None:
    """The build's note when pgvector said the graph outgrew its memory, naming the setting that gives it more."""
    said = next((n for n in notices if _OUTGREW_MEMORY in n), None)
    if said is None:
        return None
    given = f"spec.sink.index.buildMemory {index.build_memory}" if index.build_memory else \
        "the database's maintenance_work_mem (spec.sink.index.buildMemory unset)"
    return f"pgvector: {said.rstrip('.')}; the build had {given}: a larger buildMemory builds it faster"


_PARAMETER = r"{}\s*=\s*'?(\d+)"


def _parameters(indexdef: str) -> dict[str, int]:
    found = {key: re.search(_PARAMETER.format(key), indexdef) for key in ("m", "ef_construction")}
    return {key: int(match.group(1)) for key, match in found.items() if match}


def ensure_index(engine: sa.Engine, table: VectorsTable, vector_type: str, metric: Metric, index: VectorIndex) -> IndexBuild:
    """Build the HNSW index on `table`'s embeddings unless one with the same operator class exists."""
    name, opclass = index_name(table.name, metric), metric.opclass(vector_type)
    m, ef_construction = int(index.hnsw_m), int(index.hnsw_ef_construction)
    notices: list[str] = []
    with engine.begin() as conn:
        timeout_ms = str(BUILD_TIMEOUT_S * 1000)
        conn.execute(sa.text("SELECT set_config('statement_timeout', :t, true), set_config('lock_timeout', :t, true)"),
                     {"t": timeout_ms})
        if index.build_memory_kb is not None:  # this transaction only: the pooled session keeps the server's
            conn.execute(sa.text("SELECT set_config('maintenance_work_mem', :m, true)"),
                         {"m": f"{index.build_memory_kb}kB"})
        conn.execute(db.advisory_lock_sql("pg_advisory_xact_lock", db.TABLE_LOCK), {"name": str(table)})
        definitions = conn.execute(sa.text(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = CAST(:t AS regclass)"), {"t": table.sql}).all()
        for existing, definition in definitions:
            if re.search(rf"USING hnsw \(embedding {opclass}\)", definition):
                return IndexBuild(existing, built=False, note=_differs(existing, definition, m, ef_construction))
        started = time.perf_counter()
        driver_connection = conn.connection.driver_connection
        keep = lambda diagnostic: notices.append(diagnostic.message_primary or "")  # noqa: E731
        driver_connection.add_notice_handler(keep)
        try:
            conn.execute(sa.text(f'CREATE INDEX IF NOT EXISTS "{name}" ON {table.sql} USING hnsw (embedding {opclass})'
                                 f" WITH (m = {m}, ef_construction = {ef_construction})"))
        finally:
            driver_connection.remove_notice_handler(keep)
        seconds = time.perf_counter() - started
        # Statistics of the freshly loaded table: without them the planner guesses that the search's filter
        # (collection, model, revision) keeps a few rows and sorts them from the primary key instead.
        conn.execute(sa.text(f"ANALYZE {table.sql}"))
    note = _outgrew_note(notices, index)
    log_event(log, "index_built", index=name, table=str(table), opclass=opclass, m=m, ef_construction=ef_construction,
              build_memory=index.build_memory, seconds=round(seconds, 2), **({"note": note} if note else {}))
    return IndexBuild(name, built=True, seconds=seconds, note=note)


def _differs(name: str, definition: str, m: int, ef_construction: int) -> str | None:
    """The note for an existing index built with other parameters: kept, since a rebuild locks the table's writes."""
    wanted = {"m": m, "ef_construction": ef_construction}
    found = _parameters(definition)  # pgvector's defaults where the index was built without WITH (...)
    have = {"m": found.get("m", HNSW_DEFAULT_M), "ef_construction": found.get("ef_construction",
                                                                              HNSW_DEFAULT_EF_CONSTRUCTION)}
    if have == wanted:
        return None
    return (f"index {name} exists with m={have['m']}, ef_construction={have['ef_construction']}, not the spec's "
            f"m={m}, efConstruction={ef_construction}; kept (DROP INDEX {name} to have the next run rebuild it)")
