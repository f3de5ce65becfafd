"""The shared schema's migrations against a real PostgreSQL with pgvector."""

import typing

import sqlalchemy as sa

from embedjob import api, db, schema
from embedjob.vectors_schema import vectors_table


def test_migrations_create_the_bookkeeping_tables_idempotently(database_url):
    schema.migrate(database_url)
    schema.migrate(database_url)  # a second driver starting later changes nothing
    engine = sa.create_engine(database_url)
    tables = set(sa.inspect(engine).get_table_names())
    assert {t.name for t in db.metadata.sorted_tables} <= tables
    # The migration and the SQLAlchemy model agree column for column.
    for table in db.metadata.sorted_tables:
        live = {c["name"] for c in sa.inspect(engine).get_columns(table.name)}
        assert live == {c.name for c in table.columns}, table.name
    with engine.begin() as conn:
        vectors = vectors_table("embeddings", 3)
        vectors.create(conn, checkfirst=True)
        conn.execute(sa.text(
            "INSERT INTO embeddings (collection, record_id, chunk, model, revision, content_hash, embedding, text,"
            " char_start, char_end, job_key, batch_id) VALUES ('c', 'r', 0, 'm', 'v', 'h', '[1,0,0]', 't', 0, 1, 'j',"
            " 'b')"))
        nearest = conn.execute(sa.text("SELECT record_id FROM embeddings ORDER BY embedding <=> '[1,0,0]' LIMIT 1"))
        assert nearest.scalar_one() == "r"
    engine.dispose()


def test_the_run_counters_are_the_numeric_columns_of_embedjob_runs():
    """`api.RunCounters` is the one definition of a run's counters: the run row's columns follow it."""
    numeric = {c.name: c for c in db.runs.columns if isinstance(c.type, (sa.Integer, sa.Float))}
    assert set(numeric) == set(api.RunCounters.model_fields)
    for name, field in api.RunCounters.model_fields.items():
        python_types = {t for t in typing.get_args(field.annotation) or (field.annotation,) if t is not type(None)}
        assert python_types == {numeric[name].type.python_type}, name
        assert numeric[name].nullable == (field.default is None), name
