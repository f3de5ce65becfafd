"""The sweep that removes idle detached actor pools from shared Ray clusters (see docs/pools.md).

Drivers on an existing RayCluster (`spec.clusterSelector`) keep their EmbeddingWorker
actors in detached pools and lease them in `embedjob_pool_leases`. `PoolSweeper`
removes a pool once `pool_policy.removal_reason` says it may go: it runs
`python -m embedjob_worker.pools remove` on the cluster through its Ray Jobs API, with
the cluster's token, while it holds the pool's lock, then marks the leases and posts an
Event on each job that used the pool.

Only what Kubernetes confirms counts (`pool_policy.check_lease`): a lease row whose
EmbeddingJob does not exist in the cluster's namespace, or does not select that cluster,
is ignored and logged, and a pool without a confirmed lease is never acted on: its
RayCluster and token Secret are not even read. The EmbeddingJobs are listed again while
the pool's lock is held, so a lease taken since the sweep's read is confirmed or not
before anything is removed.

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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from kubernetes.client.exceptions import ApiException

from embedjob.contract import pool_removal_command

from . import metrics
from .kube import KubeApi
from .pool_leases import LeaseStore
from .pool_policy import (
    JOB_IN_OTHER_NAMESPACE, JOB_NOT_FOUND, JOB_ON_OTHER_CLUSTER, MALFORMED_CLUSTER, NAMESPACE_NOT_LISTED,
    JobRecord, Lease, confirm, job_record, removal_reason, split_cluster,
)
from .ray_jobs_client import AUTH_TOKEN_KEY, DashboardError, RayJobsClient, auth_secret_name, dashboard_url
from .settings import Settings

log = logging.getLogger("controller.pool_sweeper")

REMOVAL_TIMEOUT_SECONDS = 120
MAX_BACKOFF_SECONDS = 3600
# How long the check under a pool's lock waits for the EmbeddingJobs to be listed.
LIST_UNDER_LOCK_SECONDS = 60
UNCONFIRMED_REASONS = (MALFORMED_CLUSTER, NAMESPACE_NOT_LISTED, JOB_NOT_FOUND, JOB_IN_OTHER_NAMESPACE,
                       JOB_ON_OTHER_CLUSTER)

PoolKey = tuple[str, str]  # (<namespace>/<RayCluster name>, pool)


@dataclass(frozen=True)
class Removal:
    cluster: str  # <namespace>/<RayCluster name>
    pool: str
    reason: str
    leases: list[Lease]  # the confirmed ones
    output: str  # the removal job's output: which actors it killed


class PoolSweeper:
    """Finds idle pools every EMBEDJOB_POOL_SWEEP_SECONDS (or sooner when woken) and removes them."""

    def __init__(self, settings: Settings, kube: KubeApi, store: LeaseStore,
                 clock: Callable[[], float] = time.monotonic):
        self.settings, self.kube, self.store, self._clock = settings, kube, store, clock
        self._wakeup = asyncio.Event()
        self._failures: dict[PoolKey, tuple[int, float]] = {}  # failed removals: (count, not before)
        # The EmbeddingJobs listed so far, by uid; one gone since keeps its record (exists False)
        # while a lease names it, so that its pool can go (JobDeleted). Lost on a restart.
        self._jobs: dict[str, JobRecord] = {}
        # unconfirmed lease id -> the reason logged for it: logged again when the reason changes (a job the watch
        # had not seen yet is JobNotFound first, then JobInOtherNamespace)
        self._reported: dict[str, str] = {}

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

    def _removal_reason(self, confirmed: list[Lease], now: dt.datetime) -> str | None:
        return removal_reason(confirmed, now, self.settings.pool_idle_seconds,
                              self.settings.pool_lease_expiry_seconds, self._jobs)

    def _backing_off(self, key: PoolKey) -> bool:
        return key in self._failures and self._clock() < self._failures[key][1]

    def _failed(self, key: PoolKey, exc: Exception) -> None:
        count = self._failures.get(key, (0, 0.0))[0] + 1
        delay = min(self.settings.pool_sweep_seconds * 2 ** (count - 1), MAX_BACKOFF_SECONDS)
        self._failures[key] = (count, self._clock() + delay)
        log.warning("removing pool %s on %s failed (%d in a row; next try in %.0fs): %s: %s",
                    key[1], key[0], count, delay, type(exc).__name__, exc)

    async def _list_jobs(self, namespaces: set[str]) -> set[str]:
        """List the EmbeddingJobs of the watched `namespaces` into the records; the namespaces listed
        (one that cannot be listed stays unknown, and no lease of a cluster there is confirmed)."""
        listed = set()
        for namespace in sorted(filter(self._watched, namespaces)):
            try:
                current = {record.uid: record for record in map(job_record, await self.kube.list_jobs(namespace))}
            except ApiException as exc:
                log.warning("cannot list the EmbeddingJobs of %s: HTTP %s %s", namespace, exc.status, exc.reason)
                continue
            listed.add(namespace)
            for uid, record in self._jobs.items():
                if record.namespace == namespace and uid not in current:
                    self._jobs[uid] = replace(record, exists=False)
            self._jobs.update(current)
        return listed

    def _confirmed(self, cluster: str, pool: str, leases: list[Lease], listed: set[str],
                   unconfirmed_by_reason: Counter | None = None) -> list[Lease]:
        """The leases Kubernetes confirms; each other one is logged once per reason it has."""
        confirmed, unconfirmed = confirm(cluster, leases, self._jobs, listed)
        for lease, reason in unconfirmed:
            if unconfirmed_by_reason is not None:
                unconfirmed_by_reason[reason] += 1
            if self._reported.get(lease.lease_id) != reason:
                self._reported[lease.lease_id] = reason
                log.warning("lease %s of pool %s on %s (job key %r) is not confirmed by Kubernetes (%s): "
                            "ignored; it never makes the operator read or change that cluster",
                            lease.lease_id, pool, cluster, lease.job_key, reason)
        return confirmed

    def _forget(self, pools: dict[PoolKey, list[Lease]]) -> None:
        """Keep the records of gone jobs and the logged lease ids only while a lease row names them."""
        keys = {lease.job_key for leases in pools.values() for lease in leases}
        lease_ids = {lease.lease_id for leases in pools.values() for lease in leases}
        self._jobs = {uid: record for uid, record in self._jobs.items() if record.exists or uid in keys}
        self._reported = {lease_id: reason for lease_id, reason in self._reported.items() if lease_id in lease_ids}

    async def sweep(self) -> list[Removal]:
        now, pools = await asyncio.to_thread(self.store.pools)
        self._failures = {key: failure for key, failure in self._failures.items() if key in pools}
        listed = await self._list_jobs({where[0] for cluster, _ in pools if (where := split_cluster(cluster))})
        self._forget(pools)
        unconfirmed_by_reason: Counter = Counter()
        removals = []
        for (cluster, pool), leases in pools.items():
            confirmed = self._confirmed(cluster, pool, leases, listed, unconfirmed_by_reason)
            if self._backing_off((cluster, pool)) or self._removal_reason(confirmed, now) is None:
                continue
            try:
                removal = await self._remove(cluster, pool)
            except Exception as exc:  # noqa: BLE001 - one pool's failure is its own
                self._failed((cluster, pool), exc)
                continue
            self._failures.pop((cluster, pool), None)
            if removal is not None:
                removals.append(removal)
                await self._report(removal)
        for reason in UNCONFIRMED_REASONS:
            metrics.POOL_LEASES_UNCONFIRMED.labels(reason).set(unconfirmed_by_reason[reason])
        return removals

    async def _client(self, namespace: str, name: str) -> RayJobsClient | None:
        """The Ray Jobs client of the RayCluster; None once the cluster is gone."""
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

    async def _remove(self, cluster: str, pool: str) -> Removal | None:
        """Called only for a pool with a confirmed lease, so `cluster` is well formed."""
        namespace, name = split_cluster(cluster)
        client = await self._client(namespace, name)
        return await asyncio.to_thread(self._remove_locked, cluster, pool, client, asyncio.get_running_loop())

    def _remove_locked(self, cluster: str, pool: str, client: RayJobsClient | None,
                       loop: asyncio.AbstractEventLoop) -> Removal | None:
        with self.store.locked(cluster, pool) as locked:
            # Checked again under the lock: a job may have leased the pool since the sweep's read,
            # and only a listing made now can confirm (or not) that job.
            now, leases = locked.leases()
            if not leases:  # removed by an earlier sweep
                return None
            listing = asyncio.run_coroutine_threadsafe(self._list_jobs({split_cluster(cluster)[0]}), loop)
            confirmed = self._confirmed(cluster, pool, leases, listing.result(LIST_UNDER_LOCK_SECONDS))
            reason = self._removal_reason(confirmed, now)
            if reason is None:
                return None
            if client is None:
                output = "the RayCluster is gone, and its actors with it"
            else:
                submission_id = f"embedjob-remove-{pool}-{uuid.uuid4().hex[:8]}"
                output = client.run(pool_removal_command(pool), submission_id, REMOVAL_TIMEOUT_SECONDS).strip()
            locked.mark_removed(leases)  # every row of the pool: its actors are gone for all of them
        return Removal(cluster, pool, reason, confirmed, output)

    async def _report(self, removal: Removal) -> None:
        metrics.POOL_REMOVALS.labels(removal.reason).inc()
        message = f"removed actor pool {removal.pool} on RayCluster {removal.cluster} ({removal.reason}): " \
                  f"{removal.output[-300:]}"
        log.info("%s", message)
        # Events go to the jobs as Kubernetes knows them, never to what a lease row says.
        jobs = {self._jobs[lease.job_key] for lease in removal.leases}
        for job in sorted((job for job in jobs if job.exists), key=lambda job: (job.namespace, job.name)):
            try:
                await self.kube.post_job_event(job.namespace, job.name, job.uid, "PoolRemoved", message)
            except ApiException as exc:
                log.warning("no PoolRemoved Event on %s/%s: HTTP %s %s", job.namespace, job.name, exc.status,
                            exc.reason)
