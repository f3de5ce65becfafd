"""The job's lock (JobLock): a session-level advisory lock a driver holds, on a connection of its own, for its run.

A second driver of the job waits for it up to a limit, then refuses (JobAlreadyRunning) and
writes nothing. The connection holds no transaction open: the lock belongs to its session.
"""

from __future__ import annotations

import logging
import time

import sqlalchemy as sa

from embedjob import db

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.logs import log_event

log = logging.getLogger("embedjob_worker.sink.job_lock")
_POLL_S = 1.0


class JobLock:
    """The job's advisory lock, held by the session of its connection until `release`."""

    def __init__(self, connection: sa.Connection):
        self._connection = connection

    @classmethod
    def take(cls, engine: sa.Engine, job_key: str, wait_s: float) -> JobLock:
        """The lock of job `job_key`: a second driver of the job waits up to `wait_s` for the first to finish,
        then refuses (JobAlreadyRunning)."""
        conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")  # no transaction held open
        try_lock = db.advisory_lock_sql("pg_try_advisory_lock", db.JOB_LOCK)
        deadline, next_log = time.monotonic() + wait_s, 0.0
        while not conn.execute(try_lock, {"name": job_key}).scalar_one():
            if time.monotonic() >= deadline:
                holder = conn.execute(sa.select(db.runs.c.run_id, db.runs.c.heartbeat_at)
                                      .where(db.runs.c.job_key == job_key, db.runs.c.state == "running")
                                      .order_by(db.runs.c.started_at.desc()).limit(1)).first()
                conn.close()
                raise JobFailed("JobAlreadyRunning", f"another driver of job {job_key} holds its lock"
                                + (f" (run {holder.run_id}, heartbeat at {holder.heartbeat_at:%Y-%m-%dT%H:%M:%SZ})"
                                   if holder else "") + f"; waited {wait_s:.0f}s. This driver writes nothing")
            if time.monotonic() >= next_log:
                log_event(log, "waiting_for_job_lock", job=job_key, wait_s=round(deadline - time.monotonic()))
                next_log = time.monotonic() + 30.0
            time.sleep(_POLL_S)
        return cls(conn)

    def release(self) -> None:
        self._connection.invalidate()  # really closes the session, and with it the lock (no pool reuse)
        self._connection.close()
