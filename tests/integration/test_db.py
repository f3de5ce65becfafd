"""The shared schema's migrations against a real PostgreSQL with pgvector."""

import sqlalchemy as sa

from embedjob import db


def test_migrations_create_the_bookkeeping_tables_idempotently(database_url):
    db.migrate(database_url)
    db.migrate(database_url)  # a second driver starting later changes nothing
    engine = sa.create_engine(database_url)
    tables = set(sa.inspect(engine).get_table_names())
    assert {t.name for t in db.metadata.sorted_tables} <= tables
    # The migration and the SQLAlchemy model agree column for column.
    for table in db.metadata.sorted_tables:
        live = {c["name"] for c in sa.inspect(engine).get_columns(table.name)}
        assert live == {c.name for c in table.columns}, table.name
    with engine.begin() as conn:
        vectors = db.vectors_table("embeddings", 3)
        vectors.create(conn, checkfirst=True)
        conn.execute(sa.text(
            "INSERT INTO embeddings (collection, record_id, model, revision, content_hash, embedding, text, job_key,"
            " batch_id) VALUES ('c', 'r', 'm', 'v', 'h', '[1,0,0]', 't', 'j', 'b')"))
        nearest = conn.execute(sa.text("SELECT record_id FROM embeddings ORDER BY embedding <=> '[1,0,0]' LIMIT 1"))
        assert nearest.scalar_one() == "r"
    engine.dispose()
