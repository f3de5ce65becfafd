"""The driver's database sessions are bounded: connect, statement and lock (advisory locks included) timeouts."""

import pytest
import sqlalchemy as sa

from embedjob import db


def test_engine_sessions_carry_statement_and_lock_timeouts(database_url):
    engine = db.create_engine(database_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SHOW statement_timeout")).scalar_one() == f"{db.STATEMENT_TIMEOUT_S // 60}min"
        assert conn.execute(sa.text("SHOW lock_timeout")).scalar_one() == f"{db.LOCK_TIMEOUT_S // 60}min"
    engine.dispose()


def test_an_advisory_lock_held_elsewhere_is_waited_for_only_until_the_lock_timeout(database_url):
    holder, waiter = db.create_engine(database_url), db.create_engine(database_url)
    lock = db.advisory_lock_sql("pg_advisory_xact_lock", db.JOB_LOCK)
    with holder.begin() as held:
        held.execute(lock, {"name": "some-job"})
        with waiter.begin() as conn, pytest.raises(sa.exc.OperationalError, match="lock timeout"):
            conn.execute(sa.text("SET LOCAL lock_timeout = '300ms'"))
            conn.execute(lock, {"name": "some-job"})
    holder.dispose()
    waiter.dispose()
