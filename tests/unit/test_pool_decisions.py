"""Detached actor pools: the operator's pure decisions (pool names, the dashboard address,
which leases Kubernetes confirms, when a pool may go)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from controller.pool_policy import (
    HEARTBEAT_EXPIRED, IDLE, JOB_DELETED, JOB_IN_OTHER_NAMESPACE, JOB_NOT_FOUND, JOB_ON_OTHER_CLUSTER,
    MALFORMED_CLUSTER, NAMESPACE_NOT_LISTED, JobRecord, Lease, check_lease, confirm, job_record, removal_reason,
    split_cluster,
)
from controller.ray_jobs_client import auth_secret_name, dashboard_url
from embedjob.contract import pool_removal_command
from embedjob_worker.encode.model import ResolvedModel
from embedjob_worker.core.actor_names import pool_actor_name
from embedjob_worker.encode.pools import pool_name

MODEL = ResolvedModel("m", "rev1", "/models/m", None, True, None)


def test_pool_names_separate_models_revisions_and_resources():
    same = pool_name(MODEL, 1, 0)
    assert same == pool_name(ResolvedModel("m", "rev1", "/elsewhere/m", None, True, None), 1.0, 0.0)
    others = {
        pool_name(ResolvedModel("m", "rev2", "/models/m", None, True, None), 1, 0),
        pool_name(ResolvedModel("n", "rev1", "/models/m", None, True, None), 1, 0),
        pool_name(ResolvedModel("m", "rev1", "/models/m", None, False, None), 1, 0),
        pool_name(ResolvedModel("m", "rev1", "/models/m", None, True, 128), 1, 0),
        pool_name(MODEL, 2, 0),
        pool_name(MODEL, 1, 0.5),
    }
    assert same not in others and len(others) == 6
    assert same.startswith("pool-") and len(same) == len("pool-") + 16
    assert pool_actor_name(same, 3) == f"{same}-3"


def test_dashboard_address_and_token_secret_come_from_the_raycluster():
    bare = {"metadata": {"name": "shared", "namespace": "team"}, "spec": {}}
    assert dashboard_url(bare) == "http://shared-head-svc.team.svc:8265"
    assert auth_secret_name(bare) is None
    reported = {**bare, "spec": {"authOptions": {"mode": "token"}},
                "status": {"head": {"serviceName": "shared-head-svc", "serviceIP": "10.96.0.7"},
                           "endpoints": {"dashboard": "8266"}}}
    assert dashboard_url(reported) == "http://10.96.0.7:8266"
    assert auth_secret_name(reported) == "shared"
    named = {**bare, "spec": {"authOptions": {"mode": "token", "secretName": "ray-token"}}}
    assert auth_secret_name(named) == "ray-token"
    assert auth_secret_name({**bare, "spec": {"authOptions": {"mode": "disabled"}}}) is None
    assert pool_removal_command("pool-0123456789abcdef") == \
        "python -m embedjob_worker.pools remove --pool pool-0123456789abcdef"


NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
CLUSTER = "team/shared"


def lease(job: str, heartbeat_s_ago: float, released_s_ago: float | None = None) -> Lease:
    released = None if released_s_ago is None else NOW - dt.timedelta(seconds=released_s_ago)
    return Lease(str(uuid.uuid4()), job, job, "team", NOW - dt.timedelta(seconds=heartbeat_s_ago), released)


def on_cluster(*uids: str, gone: frozenset = frozenset()) -> dict[str, JobRecord]:
    return {uid: JobRecord(uid, "team", f"job-{uid}", CLUSTER, exists=uid not in gone) for uid in uids}


@pytest.mark.parametrize("leases, deleted_jobs, reason", [
    ([lease("a", 2)], set(), None),  # running
    ([lease("a", 700, released_s_ago=700), lease("b", 2)], set(), None),  # one job still running
    ([lease("a", 30, released_s_ago=30)], set(), None),  # released, not idle long enough
    ([lease("a", 700, released_s_ago=601)], set(), IDLE),
    ([lease("a", 700)], set(), HEARTBEAT_EXPIRED),  # a driver killed without releasing
    ([lease("a", 90)], set(), None),  # heartbeat expired, but last used less than the idle time ago
    ([lease("a", 700)], {"a"}, JOB_DELETED),
    ([lease("a", 2)], {"a"}, None),  # job gone a moment ago: still the idle time to wait
    ([], set(), None),  # nothing confirmed: never acted on
])
def test_a_pool_goes_only_when_no_lease_is_live_and_it_has_been_idle(leases, deleted_jobs, reason):
    jobs = on_cluster("a", "b", gone=frozenset(deleted_jobs))
    assert removal_reason(leases, NOW, idle_s=600, expiry_s=60, jobs=jobs) == reason


def embedding_job(uid: str, namespace: str, selector: dict | None) -> dict:
    spec = {"clusterSelector": selector} if selector is not None else {}
    return {"metadata": {"uid": uid, "namespace": namespace, "name": f"job-{uid}"}, "spec": spec}


def test_a_job_record_names_the_cluster_its_selector_picks_in_its_own_namespace():
    assert job_record(embedding_job("u", "team", {"ray.io/cluster": "shared", "tier": "gpu"})) == \
        JobRecord("u", "team", "job-u", "team/shared")
    assert job_record(embedding_job("u", "team", None)).cluster is None


@pytest.mark.parametrize("cluster", ["shared", "team/", "/shared", "Team/shared", "team/shared/x", "te am/shared",
                                     "team/" + "a" * 254, "a" * 64 + "/shared", "team/-shared"])
def test_a_malformed_cluster_id_is_not_a_cluster(cluster):
    assert split_cluster(cluster) is None
    assert check_lease(lease("a", 700), cluster, on_cluster("a"), {"team"}) == MALFORMED_CLUSTER


def test_well_formed_cluster_ids_split():
    assert split_cluster("team/shared") == ("team", "shared")
    assert split_cluster("team-2/ray.cluster-1") == ("team-2", "ray.cluster-1")


# A forged row in the shared table: a lease on `victim/shared` naming some job.
@pytest.mark.parametrize("jobs, listed, expected", [
    ({"a": JobRecord("a", "victim", "j", "victim/shared")}, {"victim"}, None),  # the real thing
    ({"a": JobRecord("a", "victim", "j", "victim/shared", exists=False)}, {"victim"}, None),  # gone, seen before
    ({}, {"victim"}, JOB_NOT_FOUND),  # a made-up uid
    ({"a": JobRecord("a", "attacker", "j", "attacker/shared")}, {"victim", "attacker"}, JOB_IN_OTHER_NAMESPACE),
    ({"a": JobRecord("a", "victim", "j", "victim/other")}, {"victim"}, JOB_ON_OTHER_CLUSTER),
    ({"a": JobRecord("a", "victim", "j", None)}, {"victim"}, JOB_ON_OTHER_CLUSTER),  # a job with its own cluster
    ({"a": JobRecord("a", "victim", "j", "victim/shared")}, {"attacker"}, NAMESPACE_NOT_LISTED),  # not watched
])
def test_a_lease_counts_only_when_kubernetes_confirms_its_job_on_that_cluster(jobs, listed, expected):
    forged = Lease("l1", "a", "anything", "anything", NOW, None)
    assert check_lease(forged, "victim/shared", jobs, listed) == expected


def test_unconfirmed_leases_neither_keep_nor_remove_a_pool():
    real = lease("a", 700, released_s_ago=700)
    forged_live = Lease("forged", "zzz", "a", "team", NOW, None)  # copies the real job's name and namespace
    confirmed, unconfirmed = confirm(CLUSTER, [real, forged_live], on_cluster("a"), {"team"})
    assert confirmed == [real] and unconfirmed == [(forged_live, JOB_NOT_FOUND)]
    assert removal_reason(confirmed, NOW, idle_s=600, expiry_s=60, jobs=on_cluster("a")) == IDLE
    only_forged, _ = confirm(CLUSTER, [Lease("f2", "zzz", "a", "team", NOW - dt.timedelta(days=1), NOW)],
                             on_cluster("a"), {"team"})
    assert removal_reason(only_forged, NOW, idle_s=600, expiry_s=60, jobs=on_cluster("a")) is None
