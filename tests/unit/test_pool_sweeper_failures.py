"""`PoolSweeper` with stand-ins for the API server, the lease table and the dashboard: each pool fails
alone, a failed removal waits out a doubling backoff, a removal that times out is stopped."""

import asyncio
import base64
import datetime as dt
from contextlib import contextmanager

import pytest
from kubernetes.client.exceptions import ApiException

from controller import pool_sweeper
from controller.pool_policy import Lease
from controller.ray_jobs_client import DashboardError, RayJobsClient
from controller.settings import Settings

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
LONG_AGO = NOW - dt.timedelta(days=1)


def idle_pool(cluster: str, pool: str) -> tuple[tuple[str, str], list[Lease]]:
    namespace = cluster.partition("/")[0] or "nowhere"
    return (cluster, pool), [Lease(f"l-{pool}", f"uid-{pool}", f"job-{pool}", namespace, LONG_AGO, LONG_AGO)]


class Locked:
    def __init__(self, leases):
        self._leases, self.removed = leases, False

    def leases(self):
        return NOW, [] if self.removed else self._leases

    def mark_removed(self, leases):
        self.removed = True


class Store:
    def __init__(self, pools):
        self._pools, self.locks = dict(pools), {key: Locked(leases) for key, leases in pools}

    def pools(self):
        return NOW, {key: leases for key, leases in self._pools.items() if not self.locks[key].removed}

    @contextmanager
    def locked(self, cluster, pool):
        yield self.locks[(cluster, pool)]


class Kube:
    """`forbidden` namespaces answer 403; every RayCluster has token auth; `bad-token` has a broken token."""

    def __init__(self, forbidden=()):
        self.forbidden, self.events = set(forbidden), []

    async def list_job_uids(self, namespace):
        if namespace in self.forbidden:
            raise ApiException(status=403, reason="Forbidden")
        return set()

    async def get_raycluster(self, namespace, name):
        if namespace in self.forbidden:
            raise ApiException(status=403, reason="Forbidden")
        return {"metadata": {"name": name, "namespace": namespace}, "spec": {"authOptions": {"mode": "token"}}}

    async def read_secret(self, namespace, name):
        token = "%%%not-base64" if name == "bad-token" else base64.b64encode(b"tok").decode()
        return {"data": {"auth_token": token}}

    async def post_job_event(self, *args):
        self.events.append(args)


@pytest.fixture
def dashboard(monkeypatch):
    """Every removal job 'succeeds' unless its pool is named 'hangs' (then it never finishes)."""
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


def sweeper(store, kube, clock):
    settings = Settings.from_env({"EMBEDJOB_POOL_SWEEP_SECONDS": "10"})
    return pool_sweeper.PoolSweeper(settings, kube, store, clock=lambda: clock[0])


def test_one_bad_pool_does_not_stop_the_sweep_for_the_others(dashboard):
    store = Store([idle_pool("locked-ns/ray", "p1"), idle_pool("malformed", "p2"), idle_pool("team/bad-token", "p3"),
                   idle_pool("team/ray", "good")])
    removals = asyncio.run(sweeper(store, Kube(forbidden={"locked-ns"}), [0.0]).sweep())
    assert [r.pool for r in removals] == ["good"]
    assert [key for key, lock in store.locks.items() if lock.removed] == [("team/ray", "good")]


def test_a_failed_removal_backs_off_and_a_timed_out_one_is_stopped(dashboard):
    store, clock = Store([idle_pool("team/ray", "hangs")]), [0.0]
    sweep = sweeper(store, Kube(), clock)

    def submissions():
        return [path for method, path in dashboard if method == "POST" and path == "/api/jobs/"]

    assert asyncio.run(sweep.sweep()) == []
    assert len(submissions()) == 1
    assert [p for m, p in dashboard if p.endswith("/stop")], "the timed-out removal job was not stopped"

    for at, expected in ((5.0, 1), (10.0, 2), (25.0, 2), (30.0, 3)):  # backoff 10 s, then 20 s
        clock[0] = at
        asyncio.run(sweep.sweep())
        assert len(submissions()) == expected, at


def test_the_stop_failing_is_reported_not_hidden(monkeypatch):
    def call(client, method, path, body=None):
        if path.endswith("/stop"):
            raise DashboardError("POST /stop: HTTP 500")
        return {"submission_id": "s"} if method == "POST" else {"status": "PENDING"}

    monkeypatch.setattr(RayJobsClient, "_call", call)
    with pytest.raises(DashboardError, match="still PENDING after 0s; stopping it failed"):
        RayJobsClient("http://ray:8265", "tok").run("true", "s", 0)
