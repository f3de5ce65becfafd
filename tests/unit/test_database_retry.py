"""errors.retry_database: a lost connection is ridden out for a bounded time, then raised."""

import psycopg
import pytest
import sqlalchemy as sa

from embedjob_worker.core.errors import retry_database


def lost_connection() -> sa.exc.OperationalError:
    return sa.exc.OperationalError("INSERT", {}, psycopg.OperationalError("server closed the connection"))


def test_a_call_that_fails_on_lost_connections_is_retried_until_it_gets_through():
    failures, retried = iter([lost_connection(), lost_connection()]), []

    def call():
        if (failure := next(failures, None)) is not None:
            raise failure
        return "written"

    assert retry_database(call, "test", retried.append, outage_s=10) == "written"
    assert len(retried) == 2


def test_a_database_gone_longer_than_the_outage_allows_is_raised():
    def call():
        raise lost_connection()

    with pytest.raises(sa.exc.OperationalError):
        retry_database(call, "test", outage_s=0.2)


def test_a_bad_statement_is_not_retried():
    calls = []

    def call():
        calls.append(1)
        raise sa.exc.ProgrammingError("SELECT", {}, psycopg.errors.UndefinedTable("no table"))

    with pytest.raises(sa.exc.ProgrammingError):
        retry_database(call, "test", outage_s=10)
    assert calls == [1]
