"""Every database call of the operator gives up within seconds (issue 26, item 5): the pool sweep's
reads and its pool lock against a database that accepts connections and never answers, and against
a pool lock another session holds; the run reader alike. A call that waited for ever would stop
pool removal for good."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as WaitTimeout

import pytest
import sqlalchemy as sa

from controller import database
from controller.pool_leases import LeaseStore
from controller.run_reader import RunReader, RunUnavailable
from embedjob import db, schema

#: what a bounded call may take here: its timeout and room for a loaded machine
BOUND_S = database.CONNECT_TIMEOUT_SECONDS + 10


@pytest.fixture
def silent_database():
    """A loopback TCP server that accepts connections and never says a word; yields its URL."""
    server = socket.create_server(("127.0.0.1", 0))
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"postgresql://operator:secret@127.0.0.1:{server.getsockname()[1]}/embed"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def finishes_within(call, seconds: float):
    """(what `call` raised or returned, seconds it took); fails when it is still waiting after `seconds`."""
    pool = ThreadPoolExecutor(1)
    started = time.monotonic()
    future = pool.submit(call)
    try:
        try:
            outcome = future.result(timeout=seconds)
        except WaitTimeout:
            pytest.fail(f"still waiting after {seconds:.0f}s: the call is not bounded")
        except Exception as exc:  # noqa: BLE001 - the error is the outcome
            outcome = exc
        return outcome, time.monotonic() - started
    finally:
        pool.shutdown(wait=False)


def test_the_pool_sweeps_reads_give_up_on_a_database_that_never_answers(silent_database):
    store = LeaseStore(silent_database)
    outcome, took = finishes_within(store.pools, BOUND_S)
    assert isinstance(outcome, sa.exc.OperationalError), outcome
    print(f"\npool leases read against a silent database: gave up after {took:.1f}s")


def test_the_run_reader_gives_up_on_a_database_that_never_answers(silent_database):
    reader = RunReader(silent_database)
    outcome, _ = finishes_within(lambda: reader.latest("uid", "ns", "job"), BOUND_S)
    assert isinstance(outcome, RunUnavailable) and "secret" not in str(outcome), outcome


def test_the_pool_lock_held_elsewhere_fails_the_sweeps_call_instead_of_waiting(database_url):
    schema.migrate(database_url)
    holder = sa.create_engine(db.engine_url(database_url))
    params = {"name": db.pool_lock_name("team/ray", "pool-a")}
    with holder.connect() as conn:
        conn.execute(db.advisory_lock_sql("pg_advisory_lock", db.POOL_LOCK), params)  # a driver leasing it

        def lock_and_read():
            with LeaseStore(database_url).locked("team/ray", "pool-a") as pool:
                return pool.leases()

        outcome, took = finishes_within(lock_and_read, BOUND_S)
        assert isinstance(outcome, sa.exc.OperationalError) and "statement timeout" in str(outcome), outcome
        assert took >= database.STATEMENT_TIMEOUT_MS / 1000 - 0.5
        conn.execute(db.advisory_lock_sql("pg_advisory_unlock", db.POOL_LOCK), params)
    holder.dispose()
    # free again: the same call goes through
    with LeaseStore(database_url).locked("team/ray", "pool-a") as pool:
        assert pool.leases()[1] == []
