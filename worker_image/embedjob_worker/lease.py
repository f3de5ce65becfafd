"""A job's lease on a shared actor pool: acquired, heart-beaten on its own thread, released.

Detached pool actors outlive the job that uses them, so each job records its use in
`embedjob_pool_leases`; the operator removes a pool only when no lease is live (see
docs/pools.md). The lease is acquired before any actor is touched, under the pool's
advisory lock (`embedjob.db.POOL_LOCK`, which the removal takes too), so a job that
starts during a removal waits and then creates new actors. While the job runs, a
thread refreshes the lease's heartbeat every HEARTBEAT_S, whether or not batches are
being written; a driver killed without releasing stops beating and its lease expires.
"""

from __future__ import annotations

import logging
import threading
import uuid

import sqlalchemy as sa

from embedjob import db

from .config import JobConfig
from .errors import DB_ERRORS
from .logs import log_event
from .sink import HEARTBEAT_S

log = logging.getLogger("embedjob_worker.lease")


class PoolLease:
    def __init__(self, engine: sa.Engine, lease_id: str, interval_s: float = HEARTBEAT_S):
        self.engine, self.lease_id, self.interval_s = engine, lease_id, interval_s
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="embedjob-lease", daemon=True)
        self._thread.start()

    @classmethod
    def acquire(cls, engine: sa.Engine, pool: str, cluster: str, config: JobConfig, actors: int) -> PoolLease:
        """Record that this job uses the pool (waits while the operator is removing it); heartbeat from now on."""
        lease_id = str(uuid.uuid4())
        with engine.begin() as conn:
            conn.execute(db.advisory_lock_sql("pg_advisory_xact_lock", db.POOL_LOCK),
                         {"name": db.pool_lock_name(cluster, pool)})
            conn.execute(db.pool_leases.insert().values(
                lease_id=lease_id, pool=pool, cluster=cluster, job_key=config.job_key, job_name=config.name,
                namespace=config.namespace, actors=actors))
        log_event(log, "pool_leased", pool=pool, cluster=cluster, lease=lease_id)
        return cls(engine, lease_id)

    def _beat(self) -> None:
        while not self._released.wait(self.interval_s):
            try:
                self._update(heartbeat_at=sa.func.now())
            except DB_ERRORS as exc:  # the next beat tries again; the lease expires if none gets through
                log_event(log, "pool_heartbeat_failed", logging.WARNING, lease=self.lease_id, error=str(exc)[:300])

    def release(self) -> None:
        """Stop beating and mark the lease released; if that fails, the lease expires with its heartbeat."""
        self._released.set()
        self._thread.join()
        try:
            self._update(released_at=sa.func.now(), heartbeat_at=sa.func.now())
        except DB_ERRORS as exc:
            log_event(log, "pool_release_failed", logging.WARNING, lease=self.lease_id, error=str(exc)[:300])

    def _update(self, **values) -> None:
        leases = db.pool_leases
        with self.engine.begin() as conn:
            conn.execute(leases.update().where(leases.c.lease_id == self.lease_id).values(**values))
