"""A job's lease on a shared actor pool: acquired, heart-beaten on its own thread, checked, released.

Detached pool actors outlive the job that uses them, so each job records its use in
`embedjob_pool_leases`; the operator removes a pool only when no lease is live (see
docs/pools.md). The lease is acquired before any actor is touched, under the pool's
advisory lock (`embedjob.db.POOL_LOCK`, which the removal takes too), so a job that
starts during a removal waits and then creates new actors. While the job runs, a
thread renews the lease every HEARTBEAT_S, whether or not batches are being written;
a driver killed without releasing stops beating and its lease expires.

A lease is lost when its row says so (released, its pool removed, the row gone) or when
no renewal got through for POOL_LEASE_EXPIRY_SECONDS (after that the operator may have
removed the pool without the driver being able to see it). A job whose lease is lost
stops with `LeaseLost` rather than re-acquiring: its actors may be dead or about to be
killed, and a driver that could not reach the database for a lease's lifetime could not
write either. Its committed batches stay; running the job again resumes the run under a
new lease and a new pool. Renewals, and the check before any pool actor is created,
run under the pool's lock, so they never interleave with a removal: once a lease is
lost, the job creates no actor that no lease covers (nothing would ever remove it).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import sqlalchemy as sa

from embedjob import db
from embedjob.contract import POOL_LEASE_EXPIRY_SECONDS

from embedjob_worker.core.config import JobConfig
from embedjob_worker.core.errors import DB_ERRORS, JobFailed
from embedjob_worker.core.logs import log_event
from embedjob.contract import HEARTBEAT_S

log = logging.getLogger("embedjob_worker.encode.lease")

LEASE_LOST = "LeaseLost"
# Between renewals that failed on a database error, in confirm().
_CONFIRM_RETRY_S = 1.0


def row_lost_reason(row: sa.Row | None) -> str:
    """Why a lease that could not be renewed is lost, from its row (None: the row is gone)."""
    if row is None:
        return "its row was deleted"
    if row.pool_removed_at is not None:
        return f"the operator removed the pool at {row.pool_removed_at.isoformat()}"
    return f"it was released at {row.released_at.isoformat()}"


class PoolLease:
    def __init__(self, engine: sa.Engine, lease_id: str, cluster: str, pool: str, interval_s: float = HEARTBEAT_S,
                 lifetime_s: float = POOL_LEASE_EXPIRY_SECONDS):
        self.engine, self.lease_id, self.cluster, self.pool = engine, lease_id, cluster, pool
        self.interval_s, self.lifetime_s = interval_s, lifetime_s
        self._confirmed_at = time.monotonic()
        self._lost: str | None = None
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="embedjob-lease", daemon=True)
        self._thread.start()

    @classmethod
    def acquire(cls, engine: sa.Engine, pool: str, cluster: str, config: JobConfig, actors: int,
                **timing: float) -> PoolLease:
        """Record that this job uses the pool (waits while the operator is removing it); heartbeat from now on."""
        lease_id = str(uuid.uuid4())
        with engine.begin() as conn:
            conn.execute(db.advisory_lock_sql("pg_advisory_xact_lock", db.POOL_LOCK),
                         {"name": db.pool_lock_name(cluster, pool)})
            conn.execute(db.pool_leases.insert().values(
                lease_id=lease_id, pool=pool, cluster=cluster, job_key=config.job_key, job_name=config.name,
                namespace=config.namespace, actors=actors))
        log_event(log, "pool_leased", pool=pool, cluster=cluster, lease=lease_id)
        return cls(engine, lease_id, cluster, pool, **timing)

    def check(self) -> None:
        """Raise LeaseLost once the lease is lost (as last seen; confirm() looks now)."""
        reason, unconfirmed_s = self._lost, time.monotonic() - self._confirmed_at
        if reason is None and unconfirmed_s > self.lifetime_s:
            reason = f"no heartbeat got through for {unconfirmed_s:.0f}s, longer than its {self.lifetime_s:.0f}s lifetime"
        if reason is not None:
            raise JobFailed(LEASE_LOST, f"the job's lease on pool {self.pool} of {self.cluster} was lost: {reason}")

    def confirm(self) -> None:
        """Renew now, before an actor of the pool is created; LeaseLost if the lease is lost.

        A database error is retried until the lease's lifetime since the last renewal runs out."""
        while self._lost is None:
            try:
                self._renew()
                break
            except DB_ERRORS as exc:
                if time.monotonic() - self._confirmed_at > self.lifetime_s:
                    break
                log_event(log, "pool_lease_confirm_retry", logging.WARNING, lease=self.lease_id,
                          error=str(exc)[:300])
                time.sleep(_CONFIRM_RETRY_S)
        self.check()

    def _beat(self) -> None:
        while self._lost is None and not self._released.wait(self.interval_s):
            try:
                self._renew()
            except DB_ERRORS as exc:  # the next beat tries again; the lease is lost if none gets through
                log_event(log, "pool_heartbeat_failed", logging.WARNING, lease=self.lease_id, error=str(exc)[:300])

    def _renew(self) -> None:
        """Refresh the heartbeat, under the pool's lock, unless the lease was released or its pool removed."""
        leases = db.pool_leases
        with self.engine.begin() as conn:
            conn.execute(db.advisory_lock_sql("pg_advisory_xact_lock", db.POOL_LOCK),
                         {"name": db.pool_lock_name(self.cluster, self.pool)})
            renewed = conn.execute(leases.update().where(
                leases.c.lease_id == self.lease_id, leases.c.released_at.is_(None),
                leases.c.pool_removed_at.is_(None)).values(heartbeat_at=sa.func.now())
                .returning(leases.c.lease_id)).first()
            if renewed is None:
                row = conn.execute(sa.select(leases.c.released_at, leases.c.pool_removed_at)
                                   .where(leases.c.lease_id == self.lease_id)).first()
        if renewed is not None:
            self._confirmed_at = time.monotonic()
        elif self._lost is None:
            self._lost = row_lost_reason(row)
            log_event(log, "pool_lease_lost", logging.ERROR, lease=self.lease_id, pool=self.pool, reason=self._lost)

    def release(self) -> None:
        """Stop beating and mark the lease released; if that fails, the lease expires with its heartbeat."""
        self._released.set()
        self._thread.join()
        leases = db.pool_leases
        try:
            with self.engine.begin() as conn:
                conn.execute(leases.update().where(leases.c.lease_id == self.lease_id)
                             .values(released_at=sa.func.now(), heartbeat_at=sa.func.now()))
        except DB_ERRORS as exc:
            log_event(log, "pool_release_failed", logging.WARNING, lease=self.lease_id, error=str(exc)[:300])
