"""Where a job's vectors go (SinkTarget): its job key, collection, vectors table (schema-qualified), vector type,
content salt and whether metadata goes with them."""

from __future__ import annotations

from dataclasses import dataclass, replace

import sqlalchemy as sa

from embedjob.vector_types import VECTOR_TYPES

from embedjob_worker.core.config import JobConfig
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.sink.copy_data import content_salt


def quote_identifier(name: str) -> str:
    """A PostgreSQL identifier quoted as SQL text (an inner quote doubled)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class VectorsTable:
    """A vectors table named in its schema: every statement, lock key and catalogue lookup names it so, never
    through the search path (a same-named table in `public` is another table)."""

    schema: str
    name: str

    @property
    def sql(self) -> str:
        """`"schema"."name"`, for SQL text and regclass casts."""
        return f"{quote_identifier(self.schema)}.{quote_identifier(self.name)}"

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True)
class SinkTarget:
    """The same for every run of the job; a writer actor gets it as it is (it pickles)."""

    job_key: str
    collection: str
    table: str  # spec.sink.table, unqualified
    salt: bytes  # copy_data.content_salt: part of every content hash
    vector_type: str = "vector"  # one of VECTOR_TYPES
    schema: str | None = None  # where `table` is: resolved once per driver (in_schema_of), None until then
    metadata: bool = False  # spec.source.metadataFields set: its rows' metadata is written (and its hash)

    def __post_init__(self) -> None:
        if self.vector_type not in VECTOR_TYPES:
            raise ValueError(f"vector type {self.vector_type!r} is not one of {', '.join(VECTOR_TYPES)}")

    @classmethod
    def of_job(cls, config: JobConfig) -> SinkTarget:
        """The target spec.sink names, salted with the model settings a vector depends on beyond its text."""
        spec = config.spec
        return cls(config.job_key, spec.sink.collection, spec.sink.table,
                   content_salt(spec.model.normalize, spec.model.max_seq_length, spec.chunking),
                   spec.sink.vector_type, metadata=bool(spec.source.metadata))

    @property
    def vectors(self) -> VectorsTable:
        if self.schema is None:
            raise ValueError(f"vectors table {self.table}: its schema is not resolved (SinkTarget.in_schema_of)")
        return VectorsTable(self.schema, self.table)

    def in_schema_of(self, engine: sa.Engine) -> SinkTarget:
        """This target with its table in the schema the role creates tables in (the first schema of its search
        path that exists: a tenant role's own, else `public`), looked up once; JobFailed (VectorsSchemaMissing)
        when there is none."""
        if self.schema is not None:
            return self
        with engine.connect() as conn:
            schema = conn.execute(sa.text("SELECT current_schema()")).scalar_one()
        if schema is None:
            raise JobFailed("VectorsSchemaMissing",
                            f"spec.sink.table: no schema for table {self.table}: no schema on the database role's "
                            "search_path exists (docs/install.md, \"One database role per namespace\")")
        return replace(self, schema=schema)
