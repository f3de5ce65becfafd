"""The operator removes idle and orphaned actor pools from a shared RayCluster, never a
leased one, keeps the cluster's Ray token out of every log and object but its Secret, and
acts only on leases Kubernetes confirms: a forged lease row for another namespace's
cluster does not make it touch that cluster.

Real API server (the control plane without KubeRay: the shared RayCluster's status is
written the way KubeRay reports it, its head Service being the local Ray head), the
operator as a ServiceAccount with exactly controller.permissions, a Ray head with token
authentication, drivers run as the RayJob would run them, PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import uuid

import pytest
import sqlalchemy as sa

from embedjob import db, schema
from embedjob.contract import DATABASE_URL_ENV
from embedjob_worker.core.actor_names import pool_actor_name
from plugins.operator_process import namespaced_grant
from support.kubectl import apply_job, create_database_secret, events_for, get_json, wait_for_condition
from support.polling import wait_until
from support.pools import PACKAGED_MODEL, SHARED_CLUSTER, other_revision_model, sample_input, shared_job
from support.sql import query

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


# The namespace's database Secret (support.kubectl.create_database_secret) into the head's Ray container.
DATABASE_FROM_SECRET = {"name": DATABASE_URL_ENV, "valueFrom": {"secretKeyRef": {"name": "embedjob-db", "key": "url"}}}


def create_shared_raycluster(kube, namespace: str, token_ray, name: str = SHARED_CLUSTER,
                             env: tuple = (DATABASE_FROM_SECRET,)) -> None:
    """The RayCluster with token auth, its token Secret (as KubeRay generates it), and the
    status KubeRay writes: the head Service's IP and the dashboard port."""
    kube.kubectl("create", "secret", "generic", name, "-n", namespace, f"--from-literal=auth_token={token_ray.token}")
    head = {"name": "ray-head", "image": "ray", "env": list(env)}
    raycluster = {
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"rayVersion": "2.60.0", "authOptions": {"mode": "token"},
                 "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [head]}}}},
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(raycluster))
    port = token_ray.dashboard_url.rsplit(":", 1)[1]
    status = {"head": {"serviceName": f"{name}-head-svc", "serviceIP": "127.0.0.1"},
              "endpoints": {"dashboard": port}}
    kube.kubectl("patch", "raycluster", name, "-n", namespace, "--subresource=status", "--type=merge",
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


def write_lease(database_url: str, cluster: str, pool: str, job: dict) -> None:
    """A lease row as a tenant with the shared writer role can write one: released an hour ago."""
    engine = db.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(db.pool_leases.insert().values(
            lease_id=str(uuid.uuid4()), pool=pool, cluster=cluster, job_key=job["metadata"]["uid"],
            job_name=job["metadata"]["name"], namespace=job["metadata"]["namespace"], actors=1,
            heartbeat_at=sa.func.now() - sa.text("interval '1 hour'"),
            released_at=sa.func.now() - sa.text("interval '1 hour'")))
    engine.dispose()


def removal_submissions(token_ray, pool: str) -> list[str]:
    """The Ray jobs submitted to remove `pool` (any namespace's cluster: both use this one head)."""
    jobs = token_ray.client()._call("GET", "/api/jobs/")
    prefix = f"embedjob-remove-{pool}-"
    return [job["submission_id"] for job in jobs if (job.get("submission_id") or "").startswith(prefix)]


def sweeps(operator) -> float:
    """How many pool sweeps the operator has run."""
    line = next(line for line in operator.metrics().splitlines()
                if line.startswith('embedjob_reconciles_total{handler="pool_sweep"}'))
    return float(line.rsplit(" ", 1)[1])


def test_a_forged_lease_for_another_namespaces_cluster_is_ignored(kube_without_kuberay, standin_namespace, token_ray,
                                                                   database_url, start_operator):
    kube, namespace = kube_without_kuberay, standin_namespace
    victim = f"victim-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", victim)
    for ns in (namespace, victim):
        create_database_secret(kube, ns, database_url)
        create_shared_raycluster(kube, ns, token_ray)
    create_shared_raycluster(kube, namespace, token_ray, name="bare", env=())
    kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                        "items": namespaced_grant(victim, namespace)}))
    operator = start_operator(kube, namespace, EMBEDJOB_WATCH_NAMESPACES=f"{namespace},{victim}",
                              EMBEDJOB_DATABASE_URL=database_url, EMBEDJOB_POOL_IDLE_SECONDS="1",
                              EMBEDJOB_POOL_SWEEP_SECONDS="1")

    # Issue 10 item 4: the shared cluster hands the job's own Secret to the driver, or the job is refused.
    mine = apply_job(kube, namespace, "mine", clusterSelector={"ray.io/cluster": SHARED_CLUSTER})
    wait_for_condition(kube, namespace, "mine", "Accepted")
    apply_job(kube, namespace, "on-bare", clusterSelector={"ray.io/cluster": "bare"})
    refused = wait_for_condition(kube, namespace, "on-bare", "Accepted", status="False")
    accepted = next(c for c in refused["status"]["conditions"] if c["type"] == "Accepted")
    assert accepted["reason"] == "SharedClusterDatabaseMismatch" and "embedjob-db" in accepted["message"]
    assert database_url not in json.dumps(refused)

    # Issue 10 item 5: the attacker's own genuine lease, and a forged one on the victim's cluster naming its job.
    tag = uuid.uuid4().hex[:8]
    own_pool, their_pool = f"pool-own{tag}", f"pool-their{tag}"
    schema.migrate(database_url)
    write_lease(database_url, f"{victim}/{SHARED_CLUSTER}", their_pool, mine)
    write_lease(database_url, f"{namespace}/{SHARED_CLUSTER}", own_pool, mine)

    wait_until("the genuine idle pool removed", lambda: removal_submissions(token_ray, own_pool), timeout=60)
    swept = sweeps(operator)
    wait_until("three more sweeps", lambda: sweeps(operator) >= swept + 3, timeout=30)
    assert removal_submissions(token_ray, their_pool) == []
    rows = dict(query(database_url, "SELECT pool, pool_removed_at IS NOT NULL FROM embedjob_pool_leases"))
    assert rows == {own_pool: True, their_pool: False}
    assert 'embedjob_pool_leases_unconfirmed{reason="JobInOtherNamespace"} 1.0' in operator.metrics()
    log = operator.log()
    assert f"{victim}/{SHARED_CLUSTER}" in log and "JobInOtherNamespace" in log
    assert f"removed actor pool {their_pool}" not in log
