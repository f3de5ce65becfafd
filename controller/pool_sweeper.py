"""The sweep that removes idle detached actor pools from shared Ray clusters (see docs/pools.md).

Drivers on an existing RayCluster (`spec.clusterSelector`) keep their EmbeddingWorker
actors in detached pools and lease them in `embedjob_pool_leases`. `PoolSweeper`
removes a pool once `pool_policy.removal_reason` says it may go: it runs
`python -m embedjob_worker.pools remove` on the cluster through its Ray Jobs API, with
the cluster's token, while it holds the pool's lock, then marks the leases and posts an
Event on each job that used the pool.

Each pool fails alone: an error on one (a 403 for a namespace this operator may not read,
a malformed cluster id, a bad token) is logged and the sweep goes on with the others.
A pool whose removal failed is tried again only after a backoff that doubles with each
failure (EMBEDJOB_POOL_SWEEP_SECONDS, up to an hour), not with a new Ray job every sweep;
a removal job that runs past its timeout is stopped through the Ray Jobs API.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from embedjob.contract import pool_removal_command

from . import metrics
from .kube import KubeApi
from .pool_leases import LeaseStore
from .pool_policy import Lease, removal_reason
from .ray_jobs_client import AUTH_TOKEN_KEY, DashboardError, RayJobsClient, auth_secret_name, dashboard_url
from .settings import Settings

log = logging.getLogger("controller.pool_sweeper")

REMOVAL_TIMEOUT_SECONDS = 120
MAX_BACKOFF_SECONDS = 3600

PoolKey = tuple[str, str]  # (<namespace>/<RayCluster name>, pool)


@dataclass(frozen=True)
class Removal:
    cluster: str  # <namespace>/<RayCluster name>
    pool: str
    reason: str
    leases: list[Lease]
    output: str  # the removal job's output: which actors it killed


class PoolSweeper:
    """Finds idle pools every EMBEDJOB_POOL_SWEEP_SECONDS (or sooner when woken) and removes them."""

    def __init__(self, settings: Settings, kube: KubeApi, store: LeaseStore,
                 clock: Callable[[], float] = time.monotonic):
        self.settings, self.kube, self.store, self._clock = settings, kube, store, clock
        self._wakeup = asyncio.Event()
        self._failures: dict[PoolKey, tuple[int, float]] = {}  # failed removals: (count, not before)

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

    def _removal_reason(self, leases: list[Lease], now: dt.datetime,
                        job_exists: Callable[[Lease], bool | None]) -> str | None:
        return removal_reason(leases, now, self.settings.pool_idle_seconds,
                              self.settings.pool_lease_expiry_seconds, job_exists)

    def _backing_off(self, key: PoolKey) -> bool:
        return key in self._failures and self._clock() < self._failures[key][1]

    def _failed(self, key: PoolKey, exc: Exception) -> None:
        count = self._failures.get(key, (0, 0.0))[0] + 1
        delay = min(self.settings.pool_sweep_seconds * 2 ** (count - 1), MAX_BACKOFF_SECONDS)
        self._failures[key] = (count, self._clock() + delay)
        log.warning("removing pool %s on %s failed (%d in a row; next try in %.0fs): %s: %s",
                    key[1], key[0], count, delay, type(exc).__name__, exc)

    async def _job_uids(self, namespaces: set[str]) -> dict[str, set[str]]:
        """The jobs of each watched namespace; a namespace that cannot be listed stays unknown."""
        job_uids = {}
        for namespace in filter(self._watched, namespaces):
            try:
                job_uids[namespace] = await self.kube.list_job_uids(namespace)
            except ApiException as exc:
                log.warning("cannot list the EmbeddingJobs of %s: HTTP %s %s", namespace, exc.status, exc.reason)
        return job_uids

    async def sweep(self) -> list[Removal]:
        now, pools = await asyncio.to_thread(self.store.pools)
        self._failures = {key: failure for key, failure in self._failures.items() if key in pools}
        job_uids = await self._job_uids({lease.namespace for leases in pools.values() for lease in leases})

        def job_exists(lease: Lease) -> bool | None:
            uids = job_uids.get(lease.namespace)
            return None if uids is None else lease.job_key in uids

        removals = []
        for (cluster, pool), leases in pools.items():
            if self._backing_off((cluster, pool)) or self._removal_reason(leases, now, job_exists) is None:
                continue
            try:
                removal = await self._remove(cluster, pool, job_exists)
            except Exception as exc:  # noqa: BLE001 - one pool's failure is its own
                self._failed((cluster, pool), exc)
                continue
            self._failures.pop((cluster, pool), None)
            if removal is not None:
                removals.append(removal)
                await self._report(removal, job_exists)
        return removals

    async def _client(self, cluster: str) -> RayJobsClient | None:
        """The Ray Jobs client of the RayCluster `<namespace>/<name>`; None once the cluster is gone."""
        namespace, slash, name = cluster.partition("/")
        if not (namespace and slash and name):
            raise DashboardError(f"malformed cluster id {cluster!r} (expected <namespace>/<RayCluster name>)")
        raycluster = await self.kube.get_raycluster(namespace, name)
        if raycluster is None:
            return None
        token = None
        if secret_name := auth_secret_name(raycluster):
            secret = await self.kube.read_secret(namespace, secret_name)
            encoded = (secret or {}).get("data", {}).get(AUTH_TOKEN_KEY)
            if encoded is None:
                raise DashboardError(f"Secret {namespace}/{secret_name} has no key {AUTH_TOKEN_KEY}")
            try:
                token = base64.b64decode(encoded, validate=True).decode()
            except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
                raise DashboardError(f"Secret {namespace}/{secret_name}: {AUTH_TOKEN_KEY} is not base64 text") from None
        return RayJobsClient(dashboard_url(raycluster), token)

    async def _remove(self, cluster: str, pool: str, job_exists: Callable[[Lease], bool | None]) -> Removal | None:
        client = await self._client(cluster)
        return await asyncio.to_thread(self._remove_locked, cluster, pool, client, job_exists)

    def _remove_locked(self, cluster: str, pool: str, client: RayJobsClient | None,
                       job_exists: Callable[[Lease], bool | None]) -> Removal | None:
        with self.store.locked(cluster, pool) as locked:
            # Checked again under the lock: a job may have leased the pool since the sweep's read.
            now, leases = locked.leases()
            if not leases:  # removed by an earlier sweep
                return None
            reason = self._removal_reason(leases, now, job_exists)
            if reason is None:
                return None
            if client is None:
                output = "the RayCluster is gone, and its actors with it"
            else:
                submission_id = f"embedjob-remove-{pool}-{uuid.uuid4().hex[:8]}"
                output = client.run(pool_removal_command(pool), submission_id, REMOVAL_TIMEOUT_SECONDS).strip()
            locked.mark_removed(leases)
        return Removal(cluster, pool, reason, leases, output)

    async def _report(self, removal: Removal, job_exists: Callable[[Lease], bool | None]) -> None:
        metrics.POOL_REMOVALS.labels(removal.reason).inc()
        message = f"removed actor pool {removal.pool} on RayCluster {removal.cluster} ({removal.reason}): " \
                  f"{removal.output[-300:]}"
        log.info("%s", message)
        jobs = {(lease.namespace, lease.job_name, lease.job_key) for lease in removal.leases if job_exists(lease)}
        for namespace, name, uid in sorted(jobs):
            try:
                await self.kube.post_job_event(namespace, name, uid, "PoolRemoved", message)
            except ApiException as exc:
                log.warning("no PoolRemoved Event on %s/%s: HTTP %s %s", namespace, name, exc.status, exc.reason)
