"""Removing idle detached actor pools from shared Ray clusters (see docs/pools.md).

Drivers on an existing RayCluster (`spec.clusterSelector`) keep their EmbeddingWorker
actors in detached pools and lease them in `embedjob_pool_leases`. `PoolSweeper`
removes a pool once no lease of it is live (released, heartbeat expired, or its
EmbeddingJob deleted) and it has been unused for EMBEDJOB_POOL_IDLE_SECONDS.

The operator does not import Ray: it runs `python -m embedjob_worker.pools remove` on
the cluster through the Ray Jobs REST API of the cluster's dashboard, with the
cluster's token (`Authorization: Bearer`), while it holds the pool's advisory lock, so
no driver can lease the pool between the check and the removal.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from embedjob import db
from embedjob.db import engine_url
from embedjob.contract import pool_removal_command

from . import metrics
from .kube import Cluster
from .settings import Settings

log = logging.getLogger("controller.pools")

# KubeRay's defaults: the head Service `<cluster>-head-svc`, the dashboard on 8265, and
# the token Secret named like the cluster with the key `auth_token`.
DASHBOARD_PORT = 8265
HEAD_SERVICE_SUFFIX = "-head-svc"
AUTH_TOKEN_KEY = "auth_token"
HTTP_TIMEOUT_SECONDS = 10
REMOVAL_TIMEOUT_SECONDS = 120
JOB_POLL_SECONDS = 0.5
FINISHED_JOB_STATES = ("SUCCEEDED", "FAILED", "STOPPED")


def dashboard_url(raycluster: dict[str, Any]) -> str:
    """The dashboard of a RayCluster as KubeRay reports it: the head Service's cluster IP
    (or its DNS name until the IP is known) and the `dashboard` endpoint's port."""
    meta, status = raycluster["metadata"], raycluster.get("status") or {}
    head = status.get("head") or {}
    port = (status.get("endpoints") or {}).get("dashboard") or DASHBOARD_PORT
    service = head.get("serviceName") or f"{meta['name']}{HEAD_SERVICE_SUFFIX}"
    host = head.get("serviceIP") or f"{service}.{meta['namespace']}.svc"
    return f"http://{host}:{port}"


def auth_secret_name(raycluster: dict[str, Any]) -> str | None:
    """The Secret holding the cluster's Ray token (key `auth_token`); None without token auth.
    KubeRay uses `authOptions.secretName`, else generates one named like the cluster."""
    auth = (raycluster.get("spec") or {}).get("authOptions") or {}
    if auth.get("mode") != "token":
        return None
    return auth.get("secretName") or raycluster["metadata"]["name"]


class DashboardError(Exception):
    """A call to a Ray dashboard failed; the message never holds the token."""


class RayJobsClient:
    """The Ray Jobs REST API of one cluster (POST /api/jobs/, GET /api/jobs/<id>)."""

    def __init__(self, url: str, token: str | None):
        self.url = url.rstrip("/")
        self._token = token

    def __repr__(self) -> str:  # never the token
        return f"RayJobsClient({self.url!r})"

    def _call(self, method: str, path: str, body: dict | None = None) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(self.url + path, method=method, headers=headers,
                                         data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECONDS) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read(300).decode(errors="replace").strip()
            raise DashboardError(f"{method} {self.url}{path}: HTTP {exc.code} {detail}") from None
        except (OSError, ValueError) as exc:
            raise DashboardError(f"{method} {self.url}{path}: {type(exc).__name__}: {exc}") from None

    def submit(self, entrypoint: str, submission_id: str) -> str:
        reply = self._call("POST", "/api/jobs/", {"entrypoint": entrypoint, "submission_id": submission_id})
        return reply.get("submission_id", submission_id)

    def job(self, submission_id: str) -> dict[str, Any]:
        return self._call("GET", f"/api/jobs/{submission_id}")

    def logs(self, submission_id: str) -> str:
        return self._call("GET", f"/api/jobs/{submission_id}/logs").get("logs", "")

    def run(self, entrypoint: str, submission_id: str, timeout_s: float) -> str:
        """Submit a job, wait for it to finish; its logs if it succeeded."""
        self.submit(entrypoint, submission_id)
        deadline = time.monotonic() + timeout_s
        while (status := self.job(submission_id).get("status")) not in FINISHED_JOB_STATES:
            if time.monotonic() > deadline:
                raise DashboardError(f"Ray job {submission_id} still {status} after {timeout_s:.0f}s")
            time.sleep(JOB_POLL_SECONDS)
        if status != "SUCCEEDED":
            raise DashboardError(f"Ray job {submission_id} {status}: {self.logs(submission_id)[-500:]}")
        return self.logs(submission_id)


def removal_entrypoint(pool: str) -> str:
    return pool_removal_command(pool)


@dataclass(frozen=True)
class Lease:
    lease_id: str
    job_key: str  # the EmbeddingJob's uid
    job_name: str
    namespace: str
    heartbeat_at: dt.datetime
    released_at: dt.datetime | None

    @classmethod
    def from_row(cls, row: sa.Row) -> "Lease":
        return cls(row.lease_id, row.job_key, row.job_name, row.namespace, row.heartbeat_at, row.released_at)


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


class LeaseStore:
    """The operator's reads of `embedjob_pool_leases`, the pool lock, and the removal marks."""

    def __init__(self, url: str):
        self._engine = sa.create_engine(engine_url(url), pool_size=1, max_overflow=2, pool_pre_ping=True)

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
            grouped.setdefault((row.cluster, row.pool), []).append(Lease.from_row(row))
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
        return now, [Lease.from_row(row) for row in rows]

    def mark_removed(self, leases: list[Lease]) -> None:
        t = db.pool_leases
        self.conn.execute(t.update().where(t.c.lease_id.in_([lease.lease_id for lease in leases]))
                          .values(pool_removed_at=sa.func.now()))
        self.conn.commit()


@dataclass(frozen=True)
class Removal:
    cluster: str
    pool: str
    reason: str
    leases: list[Lease]
    output: str  # the removal job's output: which actors it killed


class PoolSweeper:
    """Finds idle pools every EMBEDJOB_POOL_SWEEP_SECONDS (or sooner when woken) and removes them."""

    def __init__(self, settings: Settings, cluster: Cluster, store: LeaseStore):
        self.settings, self.cluster, self.store = settings, cluster, store
        self._wakeup = asyncio.Event()

    def wake(self) -> None:
        """A job ended or was deleted: sweep once its pool has been idle long enough."""
        asyncio.get_running_loop().call_later(self.settings.pool_idle_seconds, self._wakeup.set)

    async def run(self) -> None:
        while True:
            self._wakeup.clear()
            try:
                with metrics.reconcile("pool_sweep"):
                    await self.sweep()
            except Exception as exc:  # noqa: BLE001 - the next sweep tries again
                log.warning("pool sweep failed: %s: %s", type(exc).__name__, exc)
            try:
                await asyncio.wait_for(self._wakeup.wait(), self.settings.pool_sweep_seconds)
            except TimeoutError:
                pass

    def _watched(self, namespace: str) -> bool:
        return self.settings.clusterwide or namespace in self.settings.watch_namespaces

    async def sweep(self) -> list[Removal]:
        now, pools = await asyncio.to_thread(self.store.pools)
        job_uids: dict[str, set[str]] = {}
        for namespace in {lease.namespace for leases in pools.values() for lease in leases}:
            if self._watched(namespace):
                job_uids[namespace] = await self.cluster.list_job_uids(namespace)

        def job_exists(lease: Lease) -> bool | None:
            uids = job_uids.get(lease.namespace)
            return None if uids is None else lease.job_key in uids

        removals = []
        for (cluster_id, pool), leases in pools.items():
            if removal_reason(leases, now, self.settings.pool_idle_seconds,
                              self.settings.pool_lease_expiry_seconds, job_exists) is None:
                continue
            try:
                removal = await self._remove(cluster_id, pool, job_exists)
            except DashboardError as exc:
                log.warning("removing pool %s on %s failed: %s", pool, cluster_id, exc)
                continue
            if removal is not None:
                removals.append(removal)
                await self._report(removal, job_exists)
        return removals

    async def _remove(self, cluster_id: str, pool: str, job_exists: Callable[[Lease], bool | None]) -> Removal | None:
        namespace, name = cluster_id.split("/", 1)
        raycluster = await self.cluster.get_raycluster(namespace, name)
        token = None
        if raycluster is not None and (secret_name := auth_secret_name(raycluster)):
            secret = await self.cluster.read_secret(namespace, secret_name)
            encoded = (secret or {}).get("data", {}).get(AUTH_TOKEN_KEY)
            if encoded is None:
                raise DashboardError(f"Secret {namespace}/{secret_name} has no key {AUTH_TOKEN_KEY}")
            token = base64.b64decode(encoded).decode()
        client = RayJobsClient(dashboard_url(raycluster), token) if raycluster is not None else None
        return await asyncio.to_thread(self._remove_locked, cluster_id, pool, client, job_exists)

    def _remove_locked(self, cluster_id: str, pool: str, client: RayJobsClient | None,
                       job_exists: Callable[[Lease], bool | None]) -> Removal | None:
        with self.store.locked(cluster_id, pool) as locked:
            # Checked again under the lock: a job may have leased the pool since the sweep's read.
            now, leases = locked.leases()
            if not leases:  # removed by an earlier sweep
                return None
            reason = removal_reason(leases, now, self.settings.pool_idle_seconds,
                                    self.settings.pool_lease_expiry_seconds, job_exists)
            if reason is None:
                return None
            if client is None:
                output = "the RayCluster is gone, and its actors with it"
            else:
                submission_id = f"embedjob-remove-{pool}-{uuid.uuid4().hex[:8]}"
                output = client.run(removal_entrypoint(pool), submission_id, REMOVAL_TIMEOUT_SECONDS).strip()
            locked.mark_removed(leases)
        return Removal(cluster_id, pool, reason, leases, output)

    async def _report(self, removal: Removal, job_exists: Callable[[Lease], bool | None]) -> None:
        metrics.POOL_REMOVALS.labels(removal.reason).inc()
        message = f"removed actor pool {removal.pool} on RayCluster {removal.cluster} ({removal.reason}): " \
                  f"{removal.output[-300:]}"
        log.info("%s", message)
        jobs = {(lease.namespace, lease.job_name, lease.job_key) for lease in removal.leases if job_exists(lease)}
        for namespace, name, uid in sorted(jobs):
            await self.cluster.post_job_event(namespace, name, uid, "PoolRemoved", message)
