"""The operator's side of `embedjob_pool_leases`: the leases of every pool, a pool's lock, the removal marks.

The operator removes a pool while it holds the pool's advisory lock, the lock a driver
takes to lease it, so no driver can lease the pool between the check and the removal.
Every call is bounded (`controller.database`): a silent database or a lock held for long
fails this sweep's call, and the next sweep tries again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import sqlalchemy as sa

from embedjob import db

from .database import bounded_engine
from .pool_policy import Lease


def _lease(row: sa.Row) -> Lease:
    return Lease(row.lease_id, row.job_key, row.job_name, row.namespace, row.heartbeat_at, row.released_at)


class LeaseStore:
    """The operator's reads of `embedjob_pool_leases`, the pool lock, and the removal marks."""

    def __init__(self, url: str):
        self._engine = bounded_engine(url, pool_size=1, read_only=False)

    def close(self) -> None:
        self._engine.dispose()

    def pools(self) -> tuple[dt.datetime, dict[tuple[str, str], list[Lease]]]:
        """The database's clock and the leases of every pool not yet removed, by (cluster, pool)."""
        leases = db.pool_leases
        try:
            with self._engine.connect() as conn:
                now = conn.execute(sa.select(sa.func.now())).scalar_one()
                rows = conn.execute(sa.select(leases).where(leases.c.pool_removed_at.is_(None))).all()
        except sa.exc.ProgrammingError:  # no driver has migrated the database yet: no pools
            return dt.datetime.now(dt.UTC), {}
        grouped: dict[tuple[str, str], list[Lease]] = {}
        for row in rows:
            grouped.setdefault((row.cluster, row.pool), []).append(_lease(row))
        return now, grouped

    @contextmanager
    def locked(self, cluster: str, pool: str) -> Iterator["LockedPool"]:
        """Hold the pool's advisory lock: no driver acquires a lease on it meanwhile."""
        with self._engine.connect() as conn:
            params = {"name": db.pool_lock_name(cluster, pool)}
            conn.execute(db.advisory_lock_sql("pg_advisory_lock", db.POOL_LOCK), params)
            conn.commit()
            try:
                yield LockedPool(conn, cluster, pool)
            finally:
                conn.execute(db.advisory_lock_sql("pg_advisory_unlock", db.POOL_LOCK), params)
                conn.commit()


@dataclass
class LockedPool:
    conn: sa.Connection
    cluster: str
    pool: str

    def leases(self) -> tuple[dt.datetime, list[Lease]]:
        t = db.pool_leases
        now = self.conn.execute(sa.select(sa.func.now())).scalar_one()
        rows = self.conn.execute(sa.select(t).where(t.c.cluster == self.cluster, t.c.pool == self.pool,
                                                    t.c.pool_removed_at.is_(None))).all()
        self.conn.commit()
        return now, [_lease(row) for row in rows]

    def mark_removed(self, leases: list[Lease]) -> None:
        t = db.pool_leases
        self.conn.execute(t.update().where(t.c.lease_id.in_([lease.lease_id for lease in leases]))
                          .values(pool_removed_at=sa.func.now()))
        self.conn.commit()
