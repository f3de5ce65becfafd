"""Crashing a driver mid-job: the RayJob entrypoint as a subprocess, SIGKILLed once some batches are written."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from embedjob.contract import encode_job_config
from support.polling import wait_until
from support.sql import query


def committed_batches(url: str, job_key: str | None = None) -> set[str]:
    """The ids of the batches marked `succeeded` (of one job, or of all), empty before the driver migrated."""
    try:
        rows = query(url, "SELECT batch_id FROM embedjob_batches WHERE state = 'succeeded'"
                     + (" AND job_key = :job" if job_key else ""), job=job_key)
    except sa.exc.ProgrammingError:  # the driver has not migrated the database yet
        return set()
    return {r[0] for r in rows}


def succeeded_batches(url: str) -> int:
    return len(committed_batches(url))


def succeeded_attempts(url: str) -> dict[str, int]:
    """Each batch's succeeded attempts, by id (a batch written once has one)."""
    return dict(query(url, "SELECT batch_id, count(*) FROM embedjob_batch_attempts WHERE outcome = 'succeeded'"
                           " GROUP BY 1"))


def assert_resumed_exactly(summary, committed: set[str], url: str, records: int, batches: int) -> None:
    """A run resumed after a killed one finished: it skipped every batch the killed run committed, each of the
    `batches` batches was written once, and each of the `records` records has one vector."""
    assert summary.state == "succeeded", summary.error
    assert summary.batches_skipped == len(committed)
    assert query(url, "SELECT count(*), count(DISTINCT record_id) FROM embeddings")[0] == (records, records)
    attempts = succeeded_attempts(url)
    assert len(attempts) == batches and set(attempts.values()) == {1}, attempts


def dispatched_batches(driver_log: str) -> set[str]:
    """The ids of the batches a driver dispatched, from its log (`event=batch_dispatched`)."""
    return set(re.findall(r"event=batch_dispatched batch=(\w+)", driver_log))


def other_sessions(url: str) -> int:
    """Client sessions on the test database other than this query's."""
    return query(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                      " AND backend_type = 'client backend' AND pid <> pg_backend_pid()")[0][0]


def kill_driver_after(spec: dict, database_url: str, ray_address: str, log_path: Path, batches: int,
                      timeout: float = 180) -> tuple[set[str], set[str]]:
    """Run `python -m embedjob_worker.driver` on `ray_address`, SIGKILL it once `batches` batches
    succeeded; the ids of the batches committed and of those it had dispatched (from its log), read once
    every session of the driver has left the database (its writer actors, spec.sink.writers, are
    killed by Ray after it: until then one may still commit a group)."""
    env = {**os.environ, "EMBEDJOB_DATABASE_URL": database_url, "HF_HUB_OFFLINE": "1"}
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "embedjob_worker.driver", "--config-b64", encode_job_config(spec),
             "--ray-address", ray_address], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(f"{batches} batches to succeed or the driver to end",
                       lambda: succeeded_batches(database_url) >= batches or process.poll() is not None,
                       timeout=timeout)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
    assert process.returncode == -signal.SIGKILL, log_path.read_text()[-2000:]
    # Ray kills a dead driver's actors once it notices the death: seconds idle, over a minute seen under load.
    wait_until("the killed driver's database sessions to end", lambda: other_sessions(database_url) == 0,
               timeout=240)
    return committed_batches(database_url), dispatched_batches(log_path.read_text())
