"""Jobs with `spec.clusterSelector` on a RayCluster the test made, on the real path: both share one
detached actor pool, and the operator sweeps the idle pool through the cluster's Ray Jobs API.

The shared RayCluster runs under the real KubeRay operator on the test node (head and worker pods,
token authentication: KubeRay generates the token Secret). Its head and worker templates give
`EMBEDJOB_DATABASE_URL` from the same Secret and key as the jobs' `spec.sink` (what a shared
cluster must do, docs/pools.md): the cluster is built as the operator builds a job's own cluster
(controller.rayjob), without the job's labels. KubeRay submits each RayJob to that cluster
(submitter Job, `ray job submit` with the cluster's token); the drivers run on its head and get
or create the pool's detached actors. After both jobs end, the operator's pool sweeper (sweep
every 2 s, idle grace 20 s) reads the RayCluster and its token Secret, runs
`python -m embedjob_worker.pools remove` on the cluster through the dashboard at the head pod's
address (KubeRay's head Service is headless, so its `serviceIP` is the pod's), marks the leases and
posts `PoolRemoved`. The test reads the actors from the same dashboard's state API.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
import uuid

import pytest

from controller.rayjob import build_rayjob
from controller.settings import Settings
from embedjob import api
from embedjob_worker.core.actor_names import pool_actor_name
from support.kubectl import apply_job, create_database_secret, events_for, get_json
from support.manifests import MINIMAL_SPEC, merged
from support.polling import wait_until
from support.real_path import MODEL, PodWatcher, diagnostics, ray_version, sample, wait_complete
from support.real_path import pod_visible_dir  # noqa: F401 - fixture
from support.sql import query, vectors

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

CLUSTER = "shared"
WORKERS = {"replicas": 1, "cpusPerActor": 1}
JOBS = ("first", "second")


def shared_raycluster(namespace: str, operator_env: dict[str, str]) -> dict:
    """The RayCluster `shared`: the cluster spec the operator would give a job with these workers
    and sink (token auth; the database URL from the sink's Secret in head and worker), unlabelled."""
    spec = merged(MINIMAL_SPEC, {"model": MODEL, "workers": WORKERS})
    template = {"metadata": {"name": "template", "namespace": namespace, "uid": str(uuid.uuid4())}, "spec": spec}
    rayjob = build_rayjob(template, api.parse_spec(spec), Settings.from_env(operator_env))
    cluster_spec = rayjob["spec"]["rayClusterSpec"]
    for group in (cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]):
        group["template"].pop("metadata", None)
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": CLUSTER, "namespace": namespace},
            "spec": cluster_spec}


def dashboard_actors(kube, namespace: str, prefix: str) -> list[dict]:
    """The cluster's actors whose name starts with `prefix`, from its dashboard's state API (at the
    head pod's address, with the cluster's token)."""
    head_ip = get_json(kube, "raycluster", CLUSTER, "-n", namespace)["status"]["head"]["podIP"]
    token = base64.b64decode(get_json(kube, "secret", CLUSTER, "-n", namespace)["data"]["auth_token"]).decode()
    request = urllib.request.Request(f"http://{head_ip}:8265/api/v0/actors?limit=10000&detail=true",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        actors = json.loads(resp.read())["data"]["result"]["result"]
    return [a for a in actors if (a.get("name") or "").startswith(prefix)]


def leases(database_url: str) -> list:
    return query(database_url, "SELECT job_name, pool, cluster, released_at, pool_removed_at "
                               "FROM embedjob_pool_leases ORDER BY job_name")


def test_two_jobs_share_a_pool_on_a_test_made_raycluster_and_the_operator_sweeps_it(
        kube, real_node, kuberay_operator, namespace, pod_database_url, start_operator, pod_visible_dir):
    create_database_secret(kube, namespace, pod_database_url)
    operator_env = {"EMBEDJOB_DATABASE_URL": pod_database_url, "EMBEDJOB_RAY_VERSION": ray_version(),
                    "EMBEDJOB_POOL_IDLE_SECONDS": "20", "EMBEDJOB_POOL_SWEEP_SECONDS": "2",
                    "EMBEDJOB_CLEANUP_TIMEOUT_SECONDS": "180"}
    operator = start_operator(kube, namespace, **operator_env)
    raycluster = shared_raycluster(namespace, {"EMBEDJOB_WORKER_IMAGE": "embedjob-worker:test", **operator_env})
    for group in (raycluster["spec"]["headGroupSpec"], *raycluster["spec"]["workerGroupSpecs"]):
        env = {e["name"]: e for e in group["template"]["spec"]["containers"][0]["env"]}
        assert env["EMBEDJOB_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "embedjob-db", "key": "url"}
    inputs = {name: sample(pod_visible_dir, lines) for name, lines in zip(JOBS, (120, 80))}

    with PodWatcher(kube, namespace) as watcher:
        kube.kubectl("apply", "-f", "-", input=json.dumps(raycluster))
        wait_until("the shared RayCluster ready", lambda: get_json(kube, "raycluster", CLUSTER, "-n", namespace)
                   .get("status", {}).get("state") == "ready", timeout=300)
        for name in JOBS:
            apply_job(kube, namespace, name, source={"uri": inputs[name][0]}, model=MODEL, workers=WORKERS,
                      batching={"batchSize": 8}, sink={"collection": name}, retry={"backoffLimit": 0},
                      clusterSelector={"ray.io/cluster": CLUSTER})
        jobs = {name: wait_complete(kube, namespace, name, lambda: diagnostics(
            kube, namespace, real_node, kuberay_operator, operator, watcher)) for name in JOBS}
        finished = time.monotonic()
        [pool] = {row.pool for row in leases(pod_database_url)}
        actors = dashboard_actors(kube, namespace, pool_actor_name(pool, 0))
        alive_after_jobs = [a for a in actors if a["state"] == "ALIVE"]
        removed = wait_until("the idle pool removed by the operator", lambda: (lambda rows: rows if all(
            r.pool_removed_at for r in rows) else None)(leases(pod_database_url)), timeout=180)
        swept = time.monotonic() - finished
        left = [a for a in dashboard_actors(kube, namespace, pool) if a["state"] == "ALIVE"]
        time.sleep(1.5)
    print(f"\nshared cluster: pool {pool} removed {swept:.0f}s after both jobs; pods:\n{watcher.summary()}")

    for name in JOBS:
        status = jobs[name]["status"]
        assert status["state"] == "Complete" and status["reason"] == "Succeeded", status
        assert status["rayClusterName"] == CLUSTER, status
        ids = inputs[name][1]
        rows = vectors(pod_database_url, name)
        assert len(rows) == len(ids) and sorted(r[0] for r in rows) == sorted(ids)
    # the jobs ran on the test's cluster only: one head, one worker, one submitter per job
    heads, workers = watcher.of_kind("head"), watcher.of_kind("worker")
    assert len(heads) == 1 and len(workers) == 1 and len(watcher.submitters()) == 2, watcher.summary()
    assert all(watcher.labels[p]["ray.io/cluster"] == CLUSTER for p in heads + workers)

    # one detached pool actor served both jobs, and outlived them until the sweep
    embedded_by = query(pod_database_url, "SELECT r.job_name, b.worker FROM embedjob_batches b "
                                          "JOIN embedjob_runs r USING (run_id) WHERE b.state = 'succeeded'")
    by_job = {name: {w for job, w in embedded_by if job == name} for name in JOBS}
    assert by_job["first"] == by_job["second"] and len(by_job["first"]) == 1, by_job
    assert len(alive_after_jobs) == 1 and alive_after_jobs[0]["ray_namespace"] == "embedjob", actors
    assert by_job["first"] == {w for w in by_job["first"] if alive_after_jobs[0]["actor_id"][:8] in w}

    # the operator removed it through the Ray Jobs API: the actors are dead, the leases marked
    assert left == [], left
    assert [r.job_name for r in removed] == sorted(JOBS) and all(r.released_at for r in removed)
    assert {r.cluster for r in removed} == {f"{namespace}/{CLUSTER}"}
    for name in JOBS:
        event = wait_until("the PoolRemoved Event", lambda: [e for e in events_for(kube, namespace, name)
                                                             if e["reason"] == "PoolRemoved"])[0]
        assert pool in event["message"] and "Idle" in event["message"], event
    assert 'embedjob_pool_removals_total{reason="Idle"} 1.0' in operator.metrics()
    # the shared cluster stays: it is not the jobs' to delete
    assert get_json(kube, "raycluster", CLUSTER, "-n", namespace)["status"]["state"] == "ready"
    kube.kubectl("delete", "raycluster", CLUSTER, "-n", namespace, "--wait=false")
