"""Detached actor pools: the operator's pure decisions (pool names, the dashboard address,
when a pool may go)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from controller.pool_policy import HEARTBEAT_EXPIRED, IDLE, JOB_DELETED, Lease, removal_reason
from controller.ray_jobs_client import auth_secret_name, dashboard_url
from embedjob.contract import pool_removal_command
from embedjob_worker.model import ResolvedModel
from embedjob_worker.pools import pool_actor_name, pool_name

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


def lease(job: str, heartbeat_s_ago: float, released_s_ago: float | None = None) -> Lease:
    released = None if released_s_ago is None else NOW - dt.timedelta(seconds=released_s_ago)
    return Lease(str(uuid.uuid4()), job, job, "team", NOW - dt.timedelta(seconds=heartbeat_s_ago), released)


@pytest.mark.parametrize("leases, deleted_jobs, reason", [
    ([lease("a", 2)], set(), None),  # running
    ([lease("a", 700, released_s_ago=700), lease("b", 2)], set(), None),  # one job still running
    ([lease("a", 30, released_s_ago=30)], set(), None),  # released, not idle long enough
    ([lease("a", 700, released_s_ago=601)], set(), IDLE),
    ([lease("a", 700)], set(), HEARTBEAT_EXPIRED),  # a driver killed without releasing
    ([lease("a", 90)], set(), None),  # heartbeat expired, but last used less than the idle time ago
    ([lease("a", 700)], {"a"}, JOB_DELETED),
    ([lease("a", 2)], {"a"}, None),  # job gone a moment ago: still the idle time to wait
])
def test_a_pool_goes_only_when_no_lease_is_live_and_it_has_been_idle(leases, deleted_jobs, reason):
    assert removal_reason(leases, NOW, idle_s=600, expiry_s=60,
                          job_exists=lambda lease: lease.job_key not in deleted_jobs) == reason
