"""Fault matrix: PostgreSQL restarted while the driver writes (real Ray, the real model, and a
PostgreSQL server of this module's own, so restarting it disturbs no other test)."""

import json
import logging
import tempfile
import threading
import time

import pytest
import sqlalchemy as sa

from embedjob_worker.core.config import JobConfig
from embedjob_worker.sink.copy_data import content_salt
from embedjob_worker.core.records import Record
from embedjob_worker.plan import checks, feed
from embedjob_worker.plan.checks import classify_records
from embedjob_worker.run.job import run_job
from embedjob_worker.sink.seen_ids import SeenIds
from embedjob_worker.sink.runs import RunRequest
from embedjob_worker.sink.target import SinkTarget
from embedjob_worker.source import table as table_source
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


def fresh_database(server, name: str) -> str:
    """A new database on the module's server, as a SQLAlchemy URL."""
    admin = sa.create_engine(server.get_uri(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return sa.engine.make_url(server.get_uri()).set(drivername="postgresql+psycopg", database=name).render_as_string(
        hide_password=False)


def fill_docs(url: str, texts: list[str]) -> None:
    """Table `docs`: integer ids 1..n, a text each."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE docs (id integer PRIMARY KEY, body text)"))
        conn.execute(sa.text("INSERT INTO docs VALUES (:id, :body)"),
                     [{"id": i + 1, "body": text} for i, text in enumerate(texts)])
    engine.dispose()


@pytest.mark.parametrize("source_kind", ["file", "table"])
def test_postgres_restarted_mid_write_loses_and_duplicates_nothing(ray_address, own_postgres, tmp_path, caplog,
                                                                   monkeypatch, source_kind):
    """A restart ends every session at once, as a failover does: the job's lock, the writes and, for a table
    source, the reader's (before issue 27 item 6, its named cursor died with it: SourceUnreadable)."""
    caplog.set_level(logging.INFO, logger="embedjob_worker")
    url = fresh_database(own_postgres, f"restart_{source_kind}")
    max_in_flight, records = 4, 320
    lines = corpus_lines(5000, records)
    spec = manifest(tmp_path / "restart.jsonl", f"pgrestart-{source_kind}", batch_size=16, max_in_flight=max_in_flight)
    if source_kind == "file":
        source = write_input(tmp_path / "restart.jsonl", lines)
        expected = {r.id for r in classify_records(read_records(str(source), "jsonl", "id", "text"))
                    if isinstance(r, Record)}
    else:
        texts = [json.loads(line)["text"] for line in lines]
        fill_docs(url, texts)
        expected = {str(i + 1) for i, text in enumerate(texts) if text.strip()}
        spec["spec"]["source"] = {"table": {"name": "docs", "idColumn": "id", "textColumn": "body"}}
        spec["spec"]["sync"] = {"deleteMissing": True}
        # the reader stays a few pages ahead of the writes, not done when the restart comes
        spec["spec"]["batching"]["sortWindow"] = 32
        monkeypatch.setattr(table_source, "PAGE_ROWS", 32)
        monkeypatch.setattr(checks, "CLAIM_CHUNK_RECORDS", 32)
        monkeypatch.setattr(feed, "LOOKUP_RECORDS", 32)
    job = JobConfig.from_manifest(spec)
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
    assert before < 20, "the restart came too late to be mid-run"
    batches = len({r.fields["batch"] for r in caplog.records if r.getMessage() == "batch_dispatched"})
    dispatches = sum(1 for r in caplog.records if r.getMessage() == "batch_dispatched")
    assert batches == 20 and dispatches - batches <= max_in_flight  # batches embedded again
    stored = query(url, "SELECT count(*), count(DISTINCT record_id) FROM embeddings")[0]
    assert tuple(stored) == (len(expected), len(expected))  # 0 lost, 0 duplicated
    assert {r.record_id for r in query(url, "SELECT record_id FROM embeddings")} == expected
    per_batch = query(url, "SELECT batch_id, count(*) FROM embedjob_batch_attempts WHERE outcome = 'succeeded' "
                           "GROUP BY 1")
    assert len(per_batch) == 20 and all(count == 1 for _, count in per_batch)
    # The writes the restart cut off were retried, and the retries recorded with their batches.
    retried = query(url, "SELECT reason FROM embedjob_batch_attempts WHERE outcome = 'retry'")
    assert query(url, "SELECT state, batches_succeeded, records_embedded FROM embedjob_runs") == [
        ("succeeded", 20, len(expected))]
    assert retried and all(r.reason.startswith("DatabaseWriteFailed") for r in retried), retried
    reconnects = [r for r in caplog.records if r.getMessage() == "source_reconnecting"]
    assert bool(reconnects) == (source_kind == "table")  # the reader's session was cut mid-read, and came back


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
