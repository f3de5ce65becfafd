"""Reading rows from a test database."""

import sqlalchemy as sa


def query(url: str, sql: str, **params) -> list:
    """Rows of one SQL statement on a test database."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text(sql), params).all()
    engine.dispose()
    return rows
