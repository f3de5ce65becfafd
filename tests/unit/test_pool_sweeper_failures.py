"""`PoolSweeper` with stand-ins for the API server, the lease table and the dashboard: each pool fails
alone, a failed removal waits out a doubling backoff, a removal that times out is stopped."""

import asyncio

import pytest

from controller.ray_jobs_client import DashboardError, RayJobsClient
from support.pool_sweeper import Kube, Store, fake_dashboard, idle_pool, jobs_of, sweeper


@pytest.fixture
def dashboard(monkeypatch):
    return fake_dashboard(monkeypatch)


def test_one_bad_pool_does_not_stop_the_sweep_for_the_others(dashboard):
    pools = [idle_pool("locked-ns/ray", "p1"), idle_pool("team/bad-token", "p3"), idle_pool("team/ray", "good")]
    store = Store(pools)
    removals = asyncio.run(sweeper(store, Kube(jobs_of(pools), forbidden={"locked-ns"})).sweep())
    assert [r.pool for r in removals] == ["good"]
    assert [key for key, lock in store.locks.items() if lock.removed] == [("team/ray", "good")]


def test_a_failed_removal_backs_off_and_a_timed_out_one_is_stopped(dashboard):
    pools = [idle_pool("team/ray", "hangs")]
    store, clock = Store(pools), [0.0]
    sweep = sweeper(store, Kube(jobs_of(pools)), clock)

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
