"""Stand-ins for what `PoolSweeper` talks to: the API server, the lease table (with the pool
lock) and the Ray dashboard. They record what the sweeper read and ran."""

from __future__ import annotations

import base64
import datetime as dt
from contextlib import contextmanager

from kubernetes.client.exceptions import ApiException

from controller import pool_sweeper
from controller.pool_policy import Lease
from controller.ray_jobs_client import RayJobsClient
from controller.settings import Settings

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
LONG_AGO = NOW - dt.timedelta(days=1)


def idle_lease(pool: str, uid: str | None = None, namespace: str = "team") -> Lease:
    """A lease released a day ago by the job `uid` (default `uid-<pool>`)."""
    uid = uid or f"uid-{pool}"
    return Lease(f"l-{pool}-{uid}", uid, f"job-{uid}", namespace, LONG_AGO, LONG_AGO)


def idle_pool(cluster: str, pool: str) -> tuple[tuple[str, str], list[Lease]]:
    return (cluster, pool), [idle_lease(pool, namespace=cluster.partition("/")[0] or "nowhere")]


def embedding_job(uid: str, namespace: str, cluster_name: str | None) -> dict:
    spec = {"clusterSelector": {"ray.io/cluster": cluster_name}} if cluster_name else {}
    return {"metadata": {"uid": uid, "namespace": namespace, "name": f"job-{uid}"}, "spec": spec}


def jobs_of(pools) -> dict[str, list[dict]]:
    """The EmbeddingJobs that confirm every lease of `pools` (each on its pool's cluster)."""
    jobs: dict[str, list[dict]] = {}
    for (cluster, _), leases in pools:
        namespace, _, name = cluster.partition("/")
        jobs.setdefault(namespace, []).extend(embedding_job(lease.job_key, namespace, name) for lease in leases)
    return jobs


class Locked:
    """One pool's rows as seen under its lock; `joining` leases appear once the lock is taken,
    and `on_lock` runs then (what changed in Kubernetes meanwhile)."""

    def __init__(self, leases, joining=()):
        self._leases, self.joining, self.removed = list(leases), list(joining), False
        self.on_lock = lambda: None

    def leases(self):
        self.on_lock()
        return NOW, [] if self.removed else self._leases + self.joining

    def mark_removed(self, leases):
        self.removed, self.marked = True, list(leases)


class Store:
    def __init__(self, pools):
        self._pools, self.locks = dict(pools), {key: Locked(leases) for key, leases in pools}

    def pools(self):
        return NOW, {key: leases for key, leases in self._pools.items() if not self.locks[key].removed}

    @contextmanager
    def locked(self, cluster, pool):
        yield self.locks[(cluster, pool)]


class Kube:
    """`jobs`: the EmbeddingJobs by namespace; `forbidden` namespaces answer 403; every RayCluster
    has token auth; a cluster named `bad-token` has a broken token. `reads` records every
    RayCluster and Secret read as (kind, namespace, name)."""

    def __init__(self, jobs=None, forbidden=()):
        self.jobs, self.forbidden = jobs or {}, set(forbidden)
        self.events, self.reads = [], []

    async def list_jobs(self, namespace):
        if namespace in self.forbidden:
            raise ApiException(status=403, reason="Forbidden")
        return list(self.jobs.get(namespace, []))

    async def get_raycluster(self, namespace, name):
        self.reads.append(("RayCluster", namespace, name))
        if namespace in self.forbidden:
            raise ApiException(status=403, reason="Forbidden")
        return {"metadata": {"name": name, "namespace": namespace}, "spec": {"authOptions": {"mode": "token"}}}

    async def read_secret(self, namespace, name):
        self.reads.append(("Secret", namespace, name))
        token = "%%%not-base64" if name == "bad-token" else base64.b64encode(b"tok").decode()
        return {"data": {"auth_token": token}}

    async def post_job_event(self, *args):
        self.events.append(args)


def fake_dashboard(monkeypatch) -> list[tuple[str, str]]:
    """Every removal job 'succeeds' unless its pool is named 'hangs' (then it never finishes);
    returns the (method, path) of every dashboard call."""
    calls = []

    def call(client, method, path, body=None):
        calls.append((method, path))
        if method == "POST" and path == "/api/jobs/":
            return {"submission_id": body["submission_id"]}
        if path.endswith("/logs"):
            return {"logs": "killed 1 actor"}
        return {"status": "RUNNING" if "-hangs-" in path else "SUCCEEDED"}

    monkeypatch.setattr(RayJobsClient, "_call", call)
    monkeypatch.setattr(pool_sweeper, "REMOVAL_TIMEOUT_SECONDS", 0)
    return calls


def sweeper(store, kube, clock=(0.0,), **env: str) -> pool_sweeper.PoolSweeper:
    """A sweeper watching every namespace (unless EMBEDJOB_WATCH_NAMESPACES says otherwise)."""
    settings = Settings.from_env({"EMBEDJOB_POOL_SWEEP_SECONDS": "10", **env})
    return pool_sweeper.PoolSweeper(settings, kube, store, clock=lambda: clock[0])
