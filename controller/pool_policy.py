"""Which idle actor pools on shared Ray clusters may be removed, and why (pure functions; docs/pools.md).

A pool's leases (`embedjob_pool_leases`) say which jobs use it. A lease is live while it
is not released, its heartbeat is fresh and its EmbeddingJob is not known to be gone; a
pool may go once no lease of it is live and it has been unused long enough.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Lease:
    lease_id: str
    job_key: str  # the EmbeddingJob's uid
    job_name: str
    namespace: str
    heartbeat_at: dt.datetime
    released_at: dt.datetime | None


# Why a pool was removed (the `reason` label of embedjob_pool_removals_total).
IDLE, HEARTBEAT_EXPIRED, JOB_DELETED = "Idle", "HeartbeatExpired", "JobDeleted"


def removal_reason(leases: list[Lease], now: dt.datetime, idle_s: float, expiry_s: float,
                   job_exists: Callable[[Lease], bool | None]) -> str | None:
    """Why the pool may go now, or None while it must stay.

    A lease is live while it is not released, its heartbeat is younger than `expiry_s`
    and its EmbeddingJob is not known to be gone (`job_exists` False; None: unknown, e.g.
    a namespace this operator does not watch). A pool goes when no lease is live and
    its last use (release or heartbeat) is at least `idle_s` old.
    """
    expiry, idle = dt.timedelta(seconds=expiry_s), dt.timedelta(seconds=idle_s)
    unreleased = [lease for lease in leases if lease.released_at is None]
    if any(now - lease.heartbeat_at < expiry and job_exists(lease) is not False for lease in unreleased):
        return None
    if now - max(lease.released_at or lease.heartbeat_at for lease in leases) < idle:
        return None
    if not unreleased:
        return IDLE
    return JOB_DELETED if any(job_exists(lease) is False for lease in unreleased) else HEARTBEAT_EXPIRED
