"""The user's vectors table (spec.sink.table): its columns, created once the model's dimension is known."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from embedjob.vector_types import VECTOR_TYPES


def metadata_columns() -> list[sa.Column]:
    """The record's metadata (spec.source.metadataFields; a JSON object) on each of its chunks, and its hash
    (copy_data.metadata_hash): a re-run rewrites the metadata alone when only it changed. NULL without."""
    return [sa.Column("metadata", postgresql.JSONB), sa.Column("metadata_hash", sa.String(64))]


def vectors_table(name: str, dim: int, meta: sa.MetaData | None = None, vector_type: str = "vector",
                  schema: str | None = None) -> sa.Table:
    """The user's vectors table: one row per (collection, record id, chunk, model, revision); `embedding` is
    `vector_type(dim)` (a key of VECTOR_TYPES). `text` is the chunk's text, `char_start`/`char_end` its
    character offsets into the record's text; `content_hash` is the whole record's, on each of its chunks.
    A record without spec.chunking is one chunk, 0, over its whole text; metadata_columns hold its metadata.
    `schema` None: the search path's."""
    return sa.Table(
        name,
        meta if meta is not None else sa.MetaData(),
        sa.Column("collection", sa.String(128), primary_key=True),
        sa.Column("record_id", sa.Text, primary_key=True),
        sa.Column("chunk", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("model", sa.String(256), primary_key=True),
        sa.Column("revision", sa.String(128), primary_key=True),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("embedding", VECTOR_TYPES[vector_type](dim), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("char_start", sa.Integer, nullable=False),
        sa.Column("char_end", sa.Integer, nullable=False),
        sa.Column("job_key", sa.String(300), nullable=False),
        sa.Column("batch_id", sa.String(64), nullable=False),
        *metadata_columns(),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=schema,
    )
