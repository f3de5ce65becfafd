"""`PoolSweeper` acts only on what Kubernetes confirms: a lease row any tenant could have written
(for another namespace's cluster, a made-up job, a job on another cluster) neither makes the
operator read a RayCluster or token Secret nor keeps or removes a pool."""

import asyncio
import logging

import pytest
from prometheus_client import REGISTRY

from controller.pool_policy import (
    JOB_DELETED, JOB_IN_OTHER_NAMESPACE, JOB_NOT_FOUND, JOB_ON_OTHER_CLUSTER, MALFORMED_CLUSTER, NAMESPACE_NOT_LISTED,
    Lease,
)
from controller.pool_sweeper import UNCONFIRMED_REASONS
from support.pool_sweeper import NOW, Kube, Store, embedding_job, fake_dashboard, idle_lease, sweeper


@pytest.fixture
def dashboard(monkeypatch):
    return fake_dashboard(monkeypatch)


def unconfirmed(reason: str) -> float:
    return REGISTRY.get_sample_value("embedjob_pool_leases_unconfirmed", {"reason": reason})


def submitted(dashboard) -> list[str]:
    return [path for method, path in dashboard if method == "POST" and path == "/api/jobs/"]


def test_forged_leases_never_make_the_operator_read_or_remove_another_namespaces_pool(dashboard):
    # The attacker has a real job on its own cluster and a shared writer role on the lease table.
    jobs = {"attacker": [embedding_job("attacker-job", "attacker", "shared")],
            "victim": [embedding_job("victim-job", "victim", "shared"), embedding_job("own", "victim", None)]}
    pools = [
        (("attacker/shared", "pool-own"), [idle_lease("pool-own", "attacker-job", "attacker")]),  # genuine, idle
        (("victim/shared", "pool-a"), [idle_lease("pool-a", "attacker-job", "attacker")]),  # its job, their cluster
        (("victim/shared", "pool-b"), [idle_lease("pool-b", "made-up-uid", "victim")]),
        (("victim/shared", "pool-c"), [idle_lease("pool-c", "own", "victim")]),  # a victim job with its own cluster
        (("victim/other", "pool-d"), [idle_lease("pool-d", "victim-job", "victim")]),  # that job is on victim/shared
        (("hidden/shared", "pool-e"), [idle_lease("pool-e", "made-up-uid", "hidden")]),  # not watched
        (("victim/shared/x", "pool-f"), [idle_lease("pool-f", "victim-job", "victim")]),
    ]
    store, kube = Store(pools), Kube(jobs)
    removals = asyncio.run(sweeper(store, kube, EMBEDJOB_WATCH_NAMESPACES="attacker,victim").sweep())

    assert [(r.cluster, r.pool) for r in removals] == [("attacker/shared", "pool-own")]
    assert {(kind, namespace) for kind, namespace, _ in kube.reads} == {("RayCluster", "attacker"),
                                                                         ("Secret", "attacker")}
    assert len(submitted(dashboard)) == 1
    assert [key for key, lock in store.locks.items() if lock.removed] == [("attacker/shared", "pool-own")]
    assert {reason: unconfirmed(reason) for reason in UNCONFIRMED_REASONS} == {
        JOB_IN_OTHER_NAMESPACE: 1, JOB_NOT_FOUND: 1, JOB_ON_OTHER_CLUSTER: 2, NAMESPACE_NOT_LISTED: 1,
        MALFORMED_CLUSTER: 1}


def test_a_forged_live_lease_does_not_keep_a_pool_and_events_go_to_the_real_job(dashboard):
    real = idle_lease("pool-x", "real", "team")
    forged = Lease("forged", "made-up", "victim-name", "victim", NOW, None)  # live, by its row
    store, kube = Store([(("team/shared", "pool-x"), [real, forged])]), Kube({"team": [
        embedding_job("real", "team", "shared")]})
    [removal] = asyncio.run(sweeper(store, kube).sweep())
    assert removal.reason == "Idle" and removal.leases == [real]
    assert store.locks[("team/shared", "pool-x")].marked == [real, forged]  # the pool is gone for every row
    assert [(namespace, name, uid) for namespace, name, uid, *_ in kube.events] == [("team", "job-real", "real")]


def test_a_job_deleted_after_it_was_listed_lets_its_pool_go_one_never_seen_does_not(dashboard):
    unreleased = idle_lease("pool-x", "gone", "team")
    unreleased = Lease(unreleased.lease_id, "gone", "job-gone", "team", unreleased.heartbeat_at, None)
    pools = [(("team/shared", "pool-x"), [unreleased])]
    kube = Kube({"team": [embedding_job("gone", "team", "shared")]})
    store = Store(pools)
    seen_it = sweeper(store, kube)
    store.locks[("team/shared", "pool-x")].joining = [Lease("l-new", "gone", "job-gone", "team", NOW, None)]
    assert asyncio.run(seen_it.sweep()) == []  # heartbeat expired long ago, but a fresh lease of the job joined

    store.locks[("team/shared", "pool-x")].joining = []
    kube.jobs["team"] = []  # deleted
    [removal] = asyncio.run(seen_it.sweep())
    assert removal.reason == JOB_DELETED and kube.events == []

    restarted_store = Store(pools)
    assert asyncio.run(sweeper(restarted_store, kube).sweep()) == []  # never saw the job: cannot confirm
    assert not restarted_store.locks[("team/shared", "pool-x")].removed


def test_a_lease_taken_after_the_sweeps_listing_is_checked_under_the_lock(dashboard):
    """A job created and leasing between the sweep's read and the lock keeps its pool; a forged
    lease written in that gap does not."""
    pool = ("team/shared", "pool-x")
    kube = Kube({"team": [embedding_job("old", "team", "shared")]})
    store = Store([(pool, [idle_lease("pool-x", "old", "team")])])
    store.locks[pool].joining = [Lease("l-newcomer", "newcomer", "job-newcomer", "team", NOW, None)]
    # The newcomer's job appears once the sweep's first listing is done (at the lock).
    store.locks[pool].on_lock = lambda: kube.jobs["team"].append(embedding_job("newcomer", "team", "shared"))
    assert asyncio.run(sweeper(store, kube).sweep()) == [] and not store.locks[pool].removed

    store = Store([(pool, [idle_lease("pool-x", "old", "team")])])
    store.locks[pool].joining = [Lease("l-forged", "made-up", "job-newcomer", "team", NOW, None)]
    assert [r.pool for r in asyncio.run(sweeper(store, kube).sweep())] == ["pool-x"]


def test_an_unconfirmed_lease_is_logged_once_with_its_reason(dashboard, caplog):
    store = Store([(("victim/shared", "pool-a"), [idle_lease("pool-a", "made-up", "victim")])])
    sweep = sweeper(store, Kube({"victim": []}))
    with caplog.at_level(logging.WARNING, logger="controller.pool_sweeper"):
        for _ in range(3):
            asyncio.run(sweep.sweep())
    lines = [r.getMessage() for r in caplog.records if "not confirmed" in r.getMessage()]
    assert len(lines) == 1 and "pool-a" in lines[0] and "victim/shared" in lines[0] and JOB_NOT_FOUND in lines[0]
