"""Reading rows from a test database."""

import numpy as np
import sqlalchemy as sa


def query(url: str, sql: str, **params) -> list:
    """Rows of one SQL statement on a test database."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(sql), params).all()
    finally:  # also when the statement fails: else the pooled session lingers until a garbage collection
        engine.dispose()


def vectors(url: str, collection: str = "default") -> list:
    """(record id, model, dimensions, norm to 3 places) of each vector of a collection in `embeddings`."""
    return query(url, "SELECT record_id, model, vector_dims(embedding), round(vector_norm(embedding)::numeric, 3)"
                      " FROM embeddings WHERE collection = :collection", collection=collection)


def stored_vectors(url: str, collection: str) -> tuple[list[str], np.ndarray, str]:
    """The ids (in order), float32 vectors and revision of a collection's rows in `embeddings`."""
    rows = query(url, "SELECT record_id, embedding::text AS e, revision FROM embeddings WHERE collection = :c"
                      " ORDER BY record_id", c=collection)
    vectors = np.array([[float(x) for x in r.e.strip("[]").split(",")] for r in rows], dtype=np.float32)
    return [r.record_id for r in rows], vectors, rows[0].revision
