"""A driver superseded after its job lock was lost, and a write whose commit reply was lost, on a real PostgreSQL."""

import numpy as np
import pytest
import sqlalchemy as sa

from embedjob import db
from support.polling import wait_until
from support.sink import OpenJob, open_job
from support.sql import query
from embedjob_worker.core.errors import JobFailed, retry_database
from embedjob_worker.core.outcome import AttemptRow, BatchOutcome, now
from embedjob_worker.core.records import Record
from embedjob_worker.core.tally import RunTally
from embedjob_worker.sink.copy_data import content_salt
from embedjob_worker.sink.incremental import delete_missing, forget_seen_ids
from embedjob_worker.sink.job_lock import SERVER_KEEPALIVES, JobLock
from embedjob_worker.sink.runs import RunRequest
from embedjob_worker.sink.seen_ids import SeenIds
from embedjob_worker.sink.target import SinkTarget
from embedjob_worker.sink.writer import SinkWriter

DIM = 4
JOB = "local/default/locktest"
TARGET = SinkTarget(JOB, "c1", "vectors", content_salt(True, None))
RUN = RunRequest("m", "r1", "in", "cfg")


def open_driver(url: str) -> OpenJob:
    """One driver's engine, runs and sink (each driver of the job has its own)."""
    return open_job(url, TARGET, "locktest", "default", dim=DIM)


def outcome(batch_id: str, ids: list[str]) -> BatchOutcome:
    records = tuple(Record(i, rid, f"text of {rid}") for i, rid in enumerate(ids))
    vectors = np.random.default_rng(0).standard_normal((len(records), DIM)).astype(np.float32)
    return BatchOutcome(batch_id, "succeeded", records, [AttemptRow(1, "w", "succeeded", None, now())], now(),
                        vectors=vectors, worker="w", duration_s=0.1)


def lock_holders(url: str) -> list[int]:
    return [pid for pid, in query(url, "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted")]


def terminate_lock_backend(url: str) -> int:
    """What a failover, idle_session_timeout or a NAT dropping the idle connection does to the lock's session."""
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        pids = conn.execute(sa.text("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted")).scalars().all()
        assert len(pids) == 1
        conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pids[0]})
    engine.dispose()
    return pids[0]


def test_a_driver_superseded_after_its_lock_was_lost_deletes_nothing_and_stops(database_url):
    """The issue's reproduction: 3 vectors written, the lock's backend terminated, a second driver resumes the run
    (clearing its seen ids), then the first reaches delete_missing."""
    first = open_driver(database_url)
    first_lock = JobLock.take(first.engine, JOB, 5.0, check_every_s=3600)  # checked below, when the test says
    run = first.runs.start(RUN, new_run=False).run
    first.sink.write(run, [outcome("b1", ["x", "y", "z"])], [])
    SeenIds(first.engine, run).first_occurrences([("x", 0), ("y", 1), ("z", 2)])
    assert first_lock.check() is None

    terminate_lock_backend(database_url)
    second = open_driver(database_url)
    second_lock = JobLock.take(second.engine, JOB, 5.0)  # free now: the first driver has not checked yet
    lost = first_lock.check()
    assert lost is first_lock.failure() and lost.reason == "JobLockLost" and JOB in str(lost)
    writer = SinkWriter(first.sink, run, RunTally(), first_lock.failure)  # the driver's writer stops on it
    writer.put_outcome(outcome("b2", ["v"]))
    writer.close()
    assert writer.failure() is lost
    assert query(database_url, "SELECT count(*) FROM vectors WHERE record_id = 'v'") == [(0,)]
    resumed = second.runs.start(RUN, new_run=False)
    assert resumed.resumed and resumed.run.run_id == run.run_id
    forget_seen_ids(second.engine, resumed.run)

    # Whatever the first driver still does (it raced its lock check) is fenced: nothing deleted, nothing claimed.
    for superseded_write in (lambda: delete_missing(first.engine, first.target.vectors, "c1", run),
                             lambda: SeenIds(first.engine, run).first_occurrences([("w", 3)]),
                             lambda: forget_seen_ids(first.engine, run)):
        with pytest.raises(JobFailed) as superseded:
            superseded_write()
        assert superseded.value.reason == "DriverSuperseded"
    assert query(database_url, "SELECT record_id FROM vectors ORDER BY 1") == [("x",), ("y",), ("z",)]
    assert query(database_url, "SELECT count(*) FROM embedjob_seen_ids") == [(0,)]

    # The second driver's own sync deletes what its source no longer has, and only that.
    SeenIds(second.engine, resumed.run).first_occurrences([("x", 0), ("z", 1)])
    assert delete_missing(second.engine, second.target.vectors, "c1", resumed.run) == 1
    assert query(database_url, "SELECT record_id FROM vectors ORDER BY 1") == [("x",), ("z",)]
    assert second_lock.check() is None
    second_lock.release()
    first_lock.release()
    first.close()
    second.close()


def test_a_lock_whose_session_ended_is_taken_again_when_no_other_driver_holds_it(database_url):
    """A PostgreSQL restart or failover ends the lock's session with nobody else waiting: the driver goes on."""
    driver = open_driver(database_url)
    lock = JobLock.take(driver.engine, JOB, 5.0, check_every_s=0.2)
    ended = terminate_lock_backend(database_url)

    def taken_again() -> list[int]:
        holders = lock_holders(database_url)
        return holders if holders and ended not in holders else []

    assert len(wait_until("the lock taken again by a new session", taken_again, timeout=30)) == 1
    assert lock.failure() is None
    lock.release()
    driver.close()


def lose_commit_replies(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch, commits: int) -> None:
    """The next `commits` commits on `engine` land in PostgreSQL, then the connection breaks before their reply
    reaches the driver (as a failover or a dropped connection right after COMMIT does)."""
    dialect, lost = engine.dialect, iter(range(commits))
    real_commit = dialect.do_commit

    def commit(dbapi_connection):
        real_commit(dbapi_connection)
        if next(lost, None) is not None:  # the session ends right after its commit: the driver sees an error
            dbapi_connection.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    monkeypatch.setattr(dialect, "do_commit", commit)


def test_a_write_retried_after_its_commit_reply_was_lost_counts_everything_once(database_url, monkeypatch):
    """One batch of 2 records and 2 records rejected before embedding: the group's commit lands, its reply is lost,
    the writer retries; then the run's end loses its reply too."""
    job = open_driver(database_url)
    run = job.runs.start(RUN, new_run=False).run
    tally = RunTally()
    tally.rejected(2)
    lose_commit_replies(job.engine, monkeypatch, 1)
    writer = SinkWriter(job.sink, run, tally)
    writer.put_outcome(outcome("b1", ["x", "y"]))
    writer.close()
    assert writer.error is None
    # the commit that landed holds the batch; the retry found it written and wrote nothing of it again
    assert query(database_url, "SELECT outcome FROM embedjob_batch_attempts") == [("succeeded",)]

    assert query(database_url, "SELECT batches_succeeded, records_embedded, records_failed FROM embedjob_runs") == [
        (1, 2, 2)]
    counted = tally.counters()  # what the driver judges the run by (NothingEmbedded) and reports
    assert (counted.batches_succeeded, counted.records_embedded, counted.records_failed) == (1, 2, 2)
    lose_commit_replies(job.engine, monkeypatch, 1)
    row = retry_database(lambda: job.runs.finish(run, "succeeded", None, None, tally.driver_update()), "finish")
    assert (row["batches_succeeded"], row["records_embedded"], row["records_failed"]) == (1, 2, 2)
    assert query(database_url, "SELECT record_id FROM vectors ORDER BY 1") == [("x",), ("y",)]
    job.close()


def test_a_sync_delete_whose_commit_reply_was_lost_or_whose_driver_crashed_still_counts_its_records(
        database_url, monkeypatch):
    """deleteMissing's commit lands and its reply is lost: the retry finds nothing left to delete and still reports
    the 2 records deleted; so does a session that resumes the run after a crash, through its progress writes."""
    job = open_driver(database_url)
    run = job.runs.start(RUN, new_run=False).run
    job.sink.write(run, [outcome("b1", ["x", "y", "z"])], [])
    SeenIds(job.engine, run).first_occurrences([("x", 0)])  # this run read only x
    lose_commit_replies(job.engine, monkeypatch, 1)
    assert retry_database(lambda: delete_missing(job.engine, job.target.vectors, "c1", run), "delete_missing") == 2
    assert query(database_url, "SELECT record_id FROM vectors") == [("x",)]
    assert query(database_url, "SELECT records_deleted FROM embedjob_runs") == [(2,)]
    job.close()

    resuming = open_driver(database_url)  # the first driver crashed before the run's end
    resumed = resuming.runs.start(RUN, new_run=False)
    assert resumed.resumed
    tally = RunTally()
    writer = SinkWriter(resuming.sink, resumed.run, tally)  # its progress writes carry the driver's counts
    writer.put_outcome(outcome("b2", ["x"]))
    writer.close()
    assert writer.error is None
    tally.deleted(delete_missing(resuming.engine, resuming.target.vectors, "c1", resumed.run))
    row = resuming.runs.finish(resumed.run, "succeeded", None, None, tally.driver_update())
    assert row["records_deleted"] == 2 and tally.counters().records_deleted == 2
    resuming.close()


def test_the_lock_session_asks_the_server_for_keepalives_so_a_vanished_driver_frees_the_lock(database_url):
    """A driver whose pod vanished sends no FIN: the server's own keepalives end its session, and the lock, in about
    a minute. (On this test's Unix socket the server ignores them and shows 0: the source shows they were asked.)"""
    engine = db.create_engine(database_url)
    lock = JobLock.take(engine, "local/default/keepalives", wait_s=1)
    try:
        asked = lock._connection.execute(sa.text(
            "SELECT name, source FROM pg_settings WHERE name LIKE 'tcp_keepalives_%' ORDER BY name")).all()
        assert [tuple(row) for row in asked] == [(name, "client") for name in sorted(SERVER_KEEPALIVES)]
    finally:
        lock.release()
        engine.dispose()
