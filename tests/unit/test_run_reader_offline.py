"""Progress reads without a database: an outage is reported without credentials, and
every spelling of a PostgreSQL URL gets the psycopg 3 driver."""

from __future__ import annotations

import pytest

from controller.run_reader import RunReader, RunUnavailable
from embedjob.db import engine_url
from support.net import free_port


def test_database_outage_is_reported_without_credentials():
    reader = RunReader(f"postgresql://reader:s3cret-pw@127.0.0.1:{free_port()}/embed")  # nobody listens there
    try:
        with pytest.raises(RunUnavailable) as info:
            reader.latest("uid-1", "team-a", "pep")
    finally:
        reader.close()
    assert "OperationalError" in str(info.value) and "s3cret-pw" not in str(info.value)


def test_plain_postgresql_urls_use_psycopg3():
    assert engine_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert engine_url("postgresql+psycopg://u@h/db").drivername == "postgresql+psycopg"
    assert engine_url("postgres://u@h/db").drivername == "postgresql+psycopg"
