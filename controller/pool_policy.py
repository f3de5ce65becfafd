"""Which idle actor pools on shared Ray clusters may be removed, and why (pure functions; docs/pools.md).

A pool's leases (`embedjob_pool_leases`) say which jobs use it, but any role that can
write the table can write a lease: a row is only a hint. A lease counts only once
Kubernetes confirms it (`check_lease`): its job (the lease's `job_key`, an EmbeddingJob
uid) exists, or existed when this operator last listed it, in the namespace of the
lease's cluster, and its `spec.clusterSelector` names that cluster. A pool without a
confirmed lease is never acted on. A confirmed lease is live while it is not released,
its heartbeat is fresh and its EmbeddingJob still exists; a pool may go once none of
its confirmed leases is live and it has been unused long enough.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from embedjob.api import RAY_CLUSTER_SELECTOR_KEY


@dataclass(frozen=True)
class Lease:
    lease_id: str
    job_key: str  # the EmbeddingJob's uid, as the row says
    job_name: str
    namespace: str
    heartbeat_at: dt.datetime
    released_at: dt.datetime | None


@dataclass(frozen=True)
class JobRecord:
    """What Kubernetes says about an EmbeddingJob; `exists` False: listed before, gone since."""

    uid: str
    namespace: str
    name: str
    cluster: str | None  # `<namespace>/<RayCluster>` its clusterSelector names, None without one
    exists: bool = True


def job_record(job: dict[str, Any]) -> JobRecord:
    """The record of an EmbeddingJob object as the API server returned it."""
    meta = job["metadata"]
    selected = ((job.get("spec") or {}).get("clusterSelector") or {}).get(RAY_CLUSTER_SELECTOR_KEY)
    cluster = f"{meta['namespace']}/{selected}" if selected else None
    return JobRecord(meta["uid"], meta["namespace"], meta["name"], cluster)


# A DNS-1123 label (namespace) / subdomain (RayCluster name), as the API server requires them.
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def split_cluster(cluster: str) -> tuple[str, str] | None:
    """(namespace, RayCluster name) of a lease's `<namespace>/<name>`, None if it is not one."""
    namespace, slash, name = cluster.partition("/")
    return (namespace, name) if slash and _NAMESPACE.match(namespace) and _NAME.match(name) else None


# Why a lease is not confirmed (the `reason` label of embedjob_pool_leases_unconfirmed).
MALFORMED_CLUSTER = "MalformedCluster"
NAMESPACE_NOT_LISTED = "NamespaceNotListed"  # not watched, or its EmbeddingJobs could not be listed
JOB_NOT_FOUND = "JobNotFound"
JOB_IN_OTHER_NAMESPACE = "JobInOtherNamespace"
JOB_ON_OTHER_CLUSTER = "JobOnOtherCluster"


def check_lease(lease: Lease, cluster: str, jobs: Mapping[str, JobRecord], listed: Collection[str]) -> str | None:
    """None if Kubernetes confirms the lease of a pool on `cluster`, else why not.

    `jobs` are the EmbeddingJobs by uid (those listed now, and those listed before that
    are gone since), `listed` the namespaces whose EmbeddingJobs were listed just now.
    """
    where = split_cluster(cluster)
    if where is None:
        return MALFORMED_CLUSTER
    if where[0] not in listed:
        return NAMESPACE_NOT_LISTED
    job = jobs.get(lease.job_key)
    if job is None:
        return JOB_NOT_FOUND
    if job.namespace != where[0]:
        return JOB_IN_OTHER_NAMESPACE
    if job.cluster != cluster:
        return JOB_ON_OTHER_CLUSTER
    return None


# Why a pool was removed (the `reason` label of embedjob_pool_removals_total).
IDLE, HEARTBEAT_EXPIRED, JOB_DELETED = "Idle", "HeartbeatExpired", "JobDeleted"


def removal_reason(confirmed: list[Lease], now: dt.datetime, idle_s: float, expiry_s: float,
                   jobs: Mapping[str, JobRecord]) -> str | None:
    """Why the pool may go now, or None while it must stay (or nothing confirms it is ours).

    `confirmed` are the pool's leases that `check_lease` confirmed against `jobs`. A
    lease is live while it is not released, its heartbeat is younger than `expiry_s` and
    its EmbeddingJob still exists. A pool goes when no lease is live and its last use
    (release or heartbeat) is at least `idle_s` old.
    """
    if not confirmed:
        return None
    expiry, idle = dt.timedelta(seconds=expiry_s), dt.timedelta(seconds=idle_s)
    unreleased = [lease for lease in confirmed if lease.released_at is None]
    if any(now - lease.heartbeat_at < expiry and jobs[lease.job_key].exists for lease in unreleased):
        return None
    if now - max(lease.released_at or lease.heartbeat_at for lease in confirmed) < idle:
        return None
    if not unreleased:
        return IDLE
    return JOB_DELETED if any(not jobs[lease.job_key].exists for lease in unreleased) else HEARTBEAT_EXPIRED


def confirm(cluster: str, leases: list[Lease], jobs: Mapping[str, JobRecord],
            listed: Collection[str]) -> tuple[list[Lease], list[tuple[Lease, str]]]:
    """The pool's leases that Kubernetes confirms, and the others with the reason for each."""
    confirmed, unconfirmed = [], []
    for lease in leases:
        reason = check_lease(lease, cluster, jobs, listed)
        if reason is None:
            confirmed.append(lease)
        else:
            unconfirmed.append((lease, reason))
    return confirmed, unconfirmed
