"""The operator removes idle and orphaned actor pools from a shared RayCluster, never a
leased one, and keeps the cluster's Ray token out of every log and object but its Secret.

Real API server (the control plane without KubeRay: the shared RayCluster's status is
written the way KubeRay reports it, its head Service being the local Ray head), the
operator as a ServiceAccount with exactly controller.permissions, a Ray head with token
authentication, drivers run as the RayJob would run them, PostgreSQL."""

from __future__ import annotations

import json
import os
import signal

import pytest

from embedjob_worker.pools import pool_actor_name
from support.kubectl import apply_job, create_database_secret, events_for, get_json
from support.polling import wait_until
from support.pools import PACKAGED_MODEL, SHARED_CLUSTER, other_revision_model, sample_input, shared_job
from support.sql import query

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def create_shared_raycluster(kube, namespace: str, token_ray) -> None:
    """The RayCluster with token auth, its token Secret (as KubeRay generates it), and the
    status KubeRay writes: the head Service's IP and the dashboard port."""
    kube.kubectl("create", "secret", "generic", SHARED_CLUSTER, "-n", namespace,
                 f"--from-literal=auth_token={token_ray.token}")
    raycluster = {
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": SHARED_CLUSTER, "namespace": namespace},
        "spec": {"rayVersion": "2.60.0", "authOptions": {"mode": "token"},
                 "headGroupSpec": {"rayStartParams": {},
                                   "template": {"spec": {"containers": [{"name": "ray-head", "image": "ray"}]}}}},
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(raycluster))
    port = token_ray.dashboard_url.rsplit(":", 1)[1]
    status = {"head": {"serviceName": f"{SHARED_CLUSTER}-head-svc", "serviceIP": "127.0.0.1"},
              "endpoints": {"dashboard": port}}
    kube.kubectl("patch", "raycluster", SHARED_CLUSTER, "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": status}))


def alive(token_ray, pool: str) -> bool:
    return any(a["state"] == "ALIVE" for a in token_ray.actors(pool_actor_name(pool, 0)))


def lease_of(database_url: str, job_name: str):
    rows = query(database_url, "SELECT pool, released_at, pool_removed_at FROM embedjob_pool_leases "
                               "WHERE job_name = :name", name=job_name)
    return rows[0] if rows else None


def removal_events(kube, namespace: str, name: str) -> list[dict]:
    return [e for e in events_for(kube, namespace, name) if e["reason"] == "PoolRemoved"]


def test_idle_and_orphaned_pools_are_removed_a_leased_one_never(kube_without_kuberay, standin_namespace, token_ray,
                                                                 database_url, start_operator, tmp_path):
    kube, namespace = kube_without_kuberay, standin_namespace
    create_database_secret(kube, namespace, database_url)
    create_shared_raycluster(kube, namespace, token_ray)
    operator = start_operator(kube, namespace, EMBEDJOB_DATABASE_URL=database_url,
                              EMBEDJOB_POOL_IDLE_SECONDS="3", EMBEDJOB_POOL_SWEEP_SECONDS="1",
                              EMBEDJOB_POOL_LEASE_EXPIRY_SECONDS="8")
    small, large = sample_input(tmp_path, 24), sample_input(tmp_path, 900)
    model_of = {"finished": PACKAGED_MODEL, "crashed": other_revision_model(tmp_path, "operator test revision")}
    source_of = {"finished": small, "crashed": large}
    manifests = {}
    for name in ("finished", "crashed"):
        # None drops the default spec's model fields that this model does not set (path or package).
        job = apply_job(kube, namespace, name, source={"uri": str(source_of[name])},
                        model={"path": None, "package": None, **model_of[name]},
                        clusterSelector={"ray.io/cluster": SHARED_CLUSTER})
        manifests[name] = shared_job(name, job["metadata"]["uid"], source_of[name], model_of[name], namespace)

    finished = token_ray.driver(manifests["finished"], database_url, tmp_path / "finished.log")
    assert finished.wait(240) == 0, (tmp_path / "finished.log").read_text()[-3000:]
    crashed = token_ray.driver(manifests["crashed"], database_url, tmp_path / "crashed.log")
    wait_until("the second job's first batches", lambda: query(
        database_url, "SELECT count(*) FROM embedjob_batches b JOIN embedjob_runs r USING (run_id) "
                      "WHERE r.job_name = 'crashed' AND b.state = 'succeeded'")[0][0] > 0, timeout=180)
    finished_pool, crashed_pool = lease_of(database_url, "finished").pool, lease_of(database_url, "crashed").pool

    # The finished job's pool goes once idle; the running job's pool stays.
    wait_until("the finished job's pool removed", lambda: not alive(token_ray, finished_pool), timeout=60)
    assert lease_of(database_url, "finished").pool_removed_at is not None
    assert crashed.poll() is None and alive(token_ray, crashed_pool)
    assert lease_of(database_url, "crashed").pool_removed_at is None
    event = wait_until("the PoolRemoved Event", lambda: removal_events(kube, namespace, "finished"))[0]
    assert finished_pool in event["message"] and "Idle" in event["message"]
    assert event["involvedObject"]["kind"] == "EmbeddingJob"

    # A driver killed without any cleanup: its lease's heartbeat stops and the sweep takes the pool.
    os.killpg(crashed.pid, signal.SIGKILL)
    crashed.wait(10)
    assert lease_of(database_url, "crashed").released_at is None
    wait_until("the crashed job's pool removed", lambda: not alive(token_ray, crashed_pool), timeout=90)
    event = wait_until("the PoolRemoved Event", lambda: removal_events(kube, namespace, "crashed"))[0]
    assert "HeartbeatExpired" in event["message"]
    metrics = operator.metrics()
    assert 'embedjob_pool_removals_total{reason="Idle"} 1.0' in metrics
    assert 'embedjob_pool_removals_total{reason="HeartbeatExpired"} 1.0' in metrics

    # The token is in its Secret, and nowhere else: no log line, no other object.
    secret = get_json(kube, "secret", SHARED_CLUSTER, "-n", namespace)
    assert secret["data"]["auth_token"]
    assert token_ray.token not in operator.log()
    for log in ("finished.log", "crashed.log"):
        assert token_ray.token not in (tmp_path / log).read_text(errors="replace")
    objects = kube.kubectl("get", "embeddingjobs,rayjobs,rayclusters,events,configmaps", "-n", namespace,
                           "-o", "json").stdout
    assert SHARED_CLUSTER in objects and token_ray.token not in objects
