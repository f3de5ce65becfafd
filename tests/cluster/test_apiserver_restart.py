"""Fault matrix, "API server restarted": kube-apiserver stops and starts again (same etcd) while a job
runs; the operator recovers (its watches come back), the job completes with every vector once and a
true final status.

The stand-in for KubeRay + kubelet (plugins.standin) runs the RayJob's entrypoint on a local Ray,
so the driver keeps writing while the API server is away, as it would on a cluster (it never talks
to the API server); the real path covers the pods (test_real_path_e2e.py), this the operator.
"""

from __future__ import annotations

import pytest

from plugins.standin import RayJobRunner
from support.kubectl import apply_job, create_database_secret, rayjobs
from support.polling import wait_until
from support.real_path import MODEL, progress, sample, succeeded_batch_counts, wait_complete
from support.sql import vectors

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def test_api_server_restarted_mid_job_the_operator_recovers_and_the_job_completes_exactly(
        kube_without_kuberay, standin_namespace, local_ray, database_url, start_operator, tmp_path):
    kube, namespace = kube_without_kuberay, standin_namespace
    create_database_secret(kube, namespace, database_url)
    operator = start_operator(kube, namespace, EMBEDJOB_DATABASE_URL=database_url)
    uri, ids = sample(tmp_path, 900)
    with RayJobRunner(kube, namespace, local_ray, tmp_path, {}) as runner:
        apply_job(kube, namespace, "steady", source={"uri": uri}, model=MODEL,
                  batching={"batchSize": 8}, sink={"collection": "steady"})
        wait_until("the first batches", lambda: progress(kube, namespace, "steady").get("batchesSucceeded", 0) >= 5,
                   timeout=300)
        done_before = progress(kube, namespace, "steady")["batchesSucceeded"]

        down = kube.restart_apiserver(down_seconds=5)
        assert operator.process.poll() is None, operator.log()[-3000:]  # it waited, it did not crash

        # a job created after the restart is seen: the operator's watches came back
        later_uri, later_ids = sample(tmp_path, 24)
        apply_job(kube, namespace, "after", source={"uri": later_uri}, model=MODEL, sink={"collection": "after"})
        job = wait_complete(kube, namespace, "steady", lambda: f"{runner.errors}\n{operator.log()[-4000:]}")
        later = wait_complete(kube, namespace, "after", lambda: operator.log()[-4000:])
    assert runner.errors == []
    print(f"\nAPI server down {down:.1f}s with {done_before} of {job['status']['progress']['batchesTotal']} "
          f"batches done; status {job['status']['progress']}")

    status = job["status"]
    assert status["state"] == "Complete" and status["reason"] == "Succeeded", status
    assert status["progress"]["recordsEmbedded"] == len(ids) and status["progress"]["recordsFailed"] == 0
    assert done_before < status["progress"]["batchesTotal"]  # the restart fell inside the job
    rows = vectors(database_url, "steady")
    assert len(rows) == len(ids) and sorted(r[0] for r in rows) == sorted(ids)  # 0 lost, 0 duplicated
    assert set(succeeded_batch_counts(database_url).values()) == {1}  # nothing recomputed
    assert later["status"]["state"] == "Complete"
    assert sorted(r[0] for r in vectors(database_url, "after")) == sorted(later_ids)
    assert len(rayjobs(kube, namespace)) == 2  # one RayJob each: none created twice across the restart
