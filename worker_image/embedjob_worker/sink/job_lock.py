"""The job's lock (JobLock): a session-level advisory lock a driver holds, on a connection of its own, for its run.

A second driver of the job waits for it up to a limit, then refuses (JobAlreadyRunning) and
writes nothing. The connection holds no transaction open: the lock belongs to its session.
A session can end without the driver noticing (a failover, idle_session_timeout, a NAT
dropping the idle connection), and with it the lock: the connection has TCP keepalives and
a thread checks every `check_every_s` that its session still holds the lock; once it does
not, the lock is taken again on a new connection (a PostgreSQL restart is ridden out), unless
another driver holds it now: then `failure` says so (JobLockLost) and the driver stops. Its
writes are fenced by its driver session anyway (runs.update_run), so one that races the
check writes nothing.
"""

from __future__ import annotations

import logging
import threading
import time

import sqlalchemy as sa

from embedjob import db

from embedjob_worker.core.errors import DATABASE_OUTAGE_S, JobFailed
from embedjob_worker.core.logs import log_event

log = logging.getLogger("embedjob_worker.sink.job_lock")
_POLL_S = 1.0
# How often the lock's session is asked whether it still holds the lock.
CHECK_EVERY_S = 10.0
# A dead peer of the idle lock connection is found within about 30 + 3 × 10 seconds: by the driver (libpq's
# keepalives) and by the server (its own, for this session). A driver whose pod or node vanished sends no FIN;
# without the server's keepalives its session, and the job's lock, would outlive it by the OS default (2 hours),
# and the job's retry would wait job_lock_wait_s for it and then refuse (JobAlreadyRunning).
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
SERVER_KEEPALIVES = {f"tcp_{name}": value for name, value in _KEEPALIVES.items() if name != "keepalives"}
# Whether this session holds the job's lock (pg_locks shows a two-key advisory lock as classid, objid, objsubid 2).
_HELD_SQL = sa.text("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
                    f" AND granted AND objsubid = 2 AND classid = {db.JOB_LOCK}::oid"
                    " AND objid = hashtext(:name)::oid)")


class JobLock:
    """The job's advisory lock, held by the session of its connection until `release`, checked while held."""

    def __init__(self, engine: sa.Engine, connection: sa.Connection, job_key: str, check_every_s: float):
        self._engine, self._connection, self.job_key = engine, connection, job_key
        self._lost: JobFailed | None = None
        self._stop = threading.Event()
        self._checker = threading.Thread(target=self._check, args=(check_every_s,), name="embedjob-job-lock",
                                         daemon=True)
        self._checker.start()

    @classmethod
    def take(cls, engine: sa.Engine, job_key: str, wait_s: float, check_every_s: float = CHECK_EVERY_S) -> JobLock:
        """The lock of job `job_key` (on a connection of its own to `engine`'s database): a second driver of the
        job waits up to `wait_s` for the first to finish, then refuses (JobAlreadyRunning)."""
        lock_engine = db.create_engine(engine.url, SERVER_KEEPALIVES, poolclass=sa.pool.NullPool,
                                       connect_args=_KEEPALIVES)
        conn = lock_engine.connect().execution_options(isolation_level="AUTOCOMMIT")  # no transaction held open
        try_lock = db.advisory_lock_sql("pg_try_advisory_lock", db.JOB_LOCK)
        deadline, next_log = time.monotonic() + wait_s, 0.0
        while not conn.execute(try_lock, {"name": job_key}).scalar_one():
            if time.monotonic() >= deadline:
                holder = conn.execute(sa.select(db.runs.c.run_id, db.runs.c.heartbeat_at)
                                      .where(db.runs.c.job_key == job_key, db.runs.c.state == "running")
                                      .order_by(db.runs.c.started_at.desc()).limit(1)).first()
                conn.close()
                lock_engine.dispose()
                raise JobFailed("JobAlreadyRunning", f"another driver of job {job_key} holds its lock"
                                + (f" (run {holder.run_id}, heartbeat at {holder.heartbeat_at:%Y-%m-%dT%H:%M:%SZ})"
                                   if holder else "") + f"; waited {wait_s:.0f}s. This driver writes nothing")
            if time.monotonic() >= next_log:
                log_event(log, "waiting_for_job_lock", job=job_key, wait_s=round(deadline - time.monotonic()))
                next_log = time.monotonic() + 30.0
            time.sleep(_POLL_S)
        return cls(lock_engine, conn, job_key, check_every_s)

    def failure(self) -> JobFailed | None:
        """JobLockLost once a check found the lock gone to another driver (which may resume the run), else None."""
        return self._lost

    def check(self) -> JobFailed | None:
        """Whether the lock's session still holds it; if its session ended (a restart, a failover), the lock is
        taken again on a new connection unless another driver holds it now (JobLockLost, and `failure` says so)."""
        try:
            if self._connection.execute(_HELD_SQL, {"name": self.job_key}).scalar_one():
                return None
            why = "its session no longer holds it"
        except sa.exc.SQLAlchemyError as exc:  # the session is gone, and the lock with it
            why = f"its connection failed: {str(exc).strip().splitlines()[0]}"
        log_event(log, "job_lock_session_lost", logging.WARNING, job=self.job_key, error=why)
        if self._retake():
            log_event(log, "job_lock_retaken", job=self.job_key)
            return None
        self._lost = JobFailed("JobLockLost", f"the lock of job {self.job_key} was lost ({why}) and another driver "
                                              "holds it: it may resume the run, so this driver writes nothing more")
        log_event(log, "job_lock_lost", logging.ERROR, job=self.job_key, error=why)
        return self._lost

    def _retake(self) -> bool:
        """The lock again on a new connection, retried while the database is away (as long as a write is); False
        once another session holds it. Writes in the gap are fenced by the driver session all the same."""
        deadline = time.monotonic() + DATABASE_OUTAGE_S
        while not self._stop.is_set():
            try:
                conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                if not conn.execute(db.advisory_lock_sql("pg_try_advisory_lock", db.JOB_LOCK),
                                    {"name": self.job_key}).scalar_one():
                    conn.close()
                    return False
            except sa.exc.SQLAlchemyError:
                if time.monotonic() >= deadline:
                    return False
                self._stop.wait(_POLL_S)
                continue
            self._connection.invalidate()
            self._connection = conn
            return True
        return False

    def _check(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            if self.check() is not None:
                return

    def release(self) -> None:
        self._stop.set()
        self._checker.join()
        self._connection.invalidate()  # really closes the session, and with it the lock (no pool reuse)
        self._connection.close()
        self._engine.dispose()
