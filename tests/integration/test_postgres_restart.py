"""Fault matrix: PostgreSQL restarted while the driver writes (real Ray, the real model, and a
PostgreSQL server of this module's own, so restarting it disturbs no other test)."""

import logging
import tempfile
import threading
import time

import pytest
import sqlalchemy as sa

from embedjob_worker.core.config import JobConfig
from embedjob_worker.sink.copy_data import content_salt
from embedjob_worker.core.records import Record
from embedjob_worker.plan.checks import classify_records
from embedjob_worker.run.job import run_job
from embedjob_worker.sink.seen_ids import SeenIds
from embedjob_worker.sink.runs import RunRequest
from embedjob_worker.sink.target import SinkTarget
from embedjob_worker.source.files import read_records
from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.polling import wait_until
from support.sink import open_job
from support.sql import query

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def own_postgres():
    """A server of this module's own, its data outside pytest's temp root: pytest sessions that
    start meanwhile make that root private again, and pg_ctl runs as pgserver's own user."""
    import pgserver

    server = pgserver.get_server(tempfile.mkdtemp(prefix="ejpg-restart-", dir="/tmp"), cleanup_mode="delete")
    yield server
    server.cleanup()


def pg_ctl(server, *args: str) -> None:
    from pgserver._commands import pg_ctl as run_pg_ctl

    run_pg_ctl(["-w", *args], pgdata=server.pgdata, user=server.system_user, timeout=60)


def restart(server, down_s: float) -> None:
    """`pg_ctl stop -m fast` (every session is terminated), down for `down_s`, started again as before."""
    pg_ctl(server, "-m", "fast", "stop")
    time.sleep(down_s)
    pg_ctl(server, "restart")  # `restart` of a stopped server starts it with its last options


def committed(url: str) -> int:
    try:
        return query(url, "SELECT count(*) FROM embedjob_batches WHERE state = 'succeeded'")[0][0]
    except (sa.exc.ProgrammingError, sa.exc.OperationalError):  # not migrated yet, or restarting
        return 0


def test_postgres_restarted_mid_write_loses_and_duplicates_nothing(ray_address, own_postgres, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="embedjob_worker")
    url = own_postgres.get_uri().replace("postgresql://", "postgresql+psycopg://", 1)
    max_in_flight, records = 4, 640
    source = write_input(tmp_path / "restart.jsonl", corpus_lines(5000, records))
    expected = {r.id for r in classify_records(read_records(str(source), "jsonl", "id", "text"))
                if isinstance(r, Record)}
    job = JobConfig.from_manifest(manifest(source, "pgrestart", batch_size=16, max_in_flight=max_in_flight))
    outcome = {}
    driver = threading.Thread(target=lambda: outcome.update(summary=run_job(job, url)))
    driver.start()
    try:
        wait_until("5 committed batches", lambda: not driver.is_alive() or committed(url) >= 5, timeout=300)
        assert driver.is_alive(), outcome
        before = committed(url)
        restart(own_postgres, down_s=8.0)
    finally:
        driver.join(timeout=600)
    summary = outcome["summary"]
    assert summary.state == "succeeded", (summary.reason, summary.error)
    assert before < 40, "the restart came too late to be mid-run"
    batches = len({r.fields["batch"] for r in caplog.records if r.getMessage() == "batch_dispatched"})
    dispatches = sum(1 for r in caplog.records if r.getMessage() == "batch_dispatched")
    assert batches == 40 and dispatches - batches <= max_in_flight  # batches embedded again
    stored = query(url, "SELECT count(*), count(DISTINCT record_id) FROM embeddings")[0]
    assert tuple(stored) == (len(expected), len(expected))  # 0 lost, 0 duplicated
    assert {r.record_id for r in query(url, "SELECT record_id FROM embeddings")} == expected
    per_batch = query(url, "SELECT batch_id, count(*) FROM embedjob_batch_attempts WHERE outcome = 'succeeded' "
                           "GROUP BY 1")
    assert len(per_batch) == 40 and all(count == 1 for _, count in per_batch)
    # The writes the restart cut off were retried, and the retries recorded with their batches.
    retried = query(url, "SELECT reason FROM embedjob_batch_attempts WHERE outcome = 'retry'")
    assert query(url, "SELECT state, batches_succeeded, records_embedded FROM embedjob_runs") == [
        ("succeeded", 40, len(expected))]
    assert retried and all(r.reason.startswith("DatabaseWriteFailed") for r in retried), retried


def test_duplicate_id_claims_wait_for_a_restarting_postgres(own_postgres):
    url = own_postgres.get_uri().replace("postgresql://", "postgresql+psycopg://", 1)
    job = open_job(url, SinkTarget("local/tests/claims", "claims", "vectors", content_salt(True, None)), "claims",
                   "tests")
    run = job.runs.start(RunRequest("m", "r1", "in", "cfg"), new_run=False).run
    ids = SeenIds(job.engine, run)
    assert ids.first_occurrences([("a", 0), ("b", 1), ("a", 2)]) & {0, 1, 2} == {0, 1}
    pg_ctl(own_postgres, "-m", "fast", "stop")
    answer = {}
    claiming = threading.Thread(target=lambda: answer.update(firsts=ids.first_occurrences([("b", 3), ("c", 4)])))
    claiming.start()
    time.sleep(4)  # the claim meets a stopped server, and waits
    assert claiming.is_alive()
    pg_ctl(own_postgres, "restart")
    claiming.join(timeout=120)
    assert answer["firsts"] & {3, 4} == {4}  # "b" was first seen at 1
    job.close()
