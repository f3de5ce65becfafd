"""Jobs in a Kueue queue against the real API server, the real KubeRay operator, real Kueue (its
controllers, built from its Go module: tests/envtest/kueue.py) and the operator as a process.

No node runs the jobs' pods here (the scheduler finds none), so they never start: admission, waiting and preemption are
checked on the RayJob (suspended or not, its RayCluster deleted) and on the EmbeddingJob's
status, with the Kueue Workload states seen along the way printed for the record.
"""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from support.chart import RELEASE, assert_refused, container_env, helm, render_chart, values_args
from support.kubectl import condition, create_database_secret, get_json, rayjobs
from support.kueue import (QUEUE, WorkloadLog, admitted_status, apply_kueue_objects, preempted_rayjob, queue_spec,
                           rayjob_of, wait_state)
from support.manifests import ej_manifest
from support.paths import CHART, REPO
from support.polling import wait_until

pytestmark = pytest.mark.k8s

DB_URL = "postgresql://writer:not-a-real-password@db.example:5432/embed"


def submit(kube, namespace: str, name: str, priority: str) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest(name, **queue_spec(namespace, priority)))


def test_a_job_waits_queued_is_admitted_when_quota_frees_and_is_preempted_then_readmitted(
        kube, namespace, kuberay_operator, kueue, kube_controllers, start_operator):
    """kube_controllers: the garbage collector deletes a deleted RayJob's Workload (owned by it), which
    frees its quota."""
    apply_kueue_objects(kube, namespace)
    start_operator(kube, namespace)
    create_database_secret(kube, namespace, DB_URL)
    log = WorkloadLog(kube, namespace)
    try:
        # first: admitted at once (the quota is free); its RayJob was created suspended, Kueue unsuspended it
        submit(kube, namespace, "first", "low")
        wait_until("first admitted", lambda: (log.poll(), admitted_status(kube, namespace, "first"))[1], 120)
        assert not rayjob_of(kube, namespace, "first")["spec"].get("suspend")

        # second: the quota is used by first, so it waits as Queued, its RayJob suspended
        submit(kube, namespace, "second", "low")
        queued = wait_state(kube, namespace, "second", "Queued", "WaitingForAdmission", log)
        cond = condition({"status": queued}, "Queued")
        assert cond["status"] == "True" and f"LocalQueue {QUEUE}" in cond["message"], cond
        second_rayjob = rayjob_of(kube, namespace, "second")
        assert second_rayjob["spec"].get("suspend") is True
        assert second_rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
        assert second_rayjob["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == f"low-{namespace}"
        assert "startTime" not in queued
        entrypoint = second_rayjob["spec"]["entrypoint"]

        # first goes away: second is admitted and starts
        kube.kubectl("delete", "ej", "first", "-n", namespace, "--wait=false")
        wait_until("second admitted", lambda: (log.poll(), admitted_status(kube, namespace, "second"))[1], 180)
        wait_until("second's RayCluster", lambda: rayjob_of(kube, namespace, "second").get("status", {}).get(
            "rayClusterName") and rayjob_of(kube, namespace, "second")["status"]["jobDeploymentStatus"]
            == "Initializing", 120)

        # urgent (higher priority) preempts second: Kueue suspends its RayJob, KubeRay deletes its cluster
        submit(kube, namespace, "urgent", "high")
        preempted = wait_state(kube, namespace, "second", "Suspended", "Preempted", log, timeout=180)
        assert condition({"status": preempted}, "Suspended")["status"] == "True"
        wait_until("second's RayJob Suspended, its cluster gone", lambda: preempted_rayjob(kube, namespace, "second"),
                   120)
        assert get_json(kube, "rayclusters", "-n", namespace, "-l",
                        f"ray.io/originated-from-cr-name={preempted['rayJobName']}")["items"] == []
        wait_until("urgent admitted", lambda: (log.poll(), admitted_status(kube, namespace, "urgent"))[1], 120)
        assert not rayjob_of(kube, namespace, "urgent")["spec"].get("suspend")
        wait_state(kube, namespace, "second", "Suspended", "Preempted", log)  # still, while urgent holds the quota

        # urgent goes away: second is readmitted, on the same RayJob with the same entrypoint (its run key)
        kube.kubectl("delete", "ej", "urgent", "-n", namespace, "--wait=false")
        readmitted = wait_until("second readmitted", lambda: (log.poll(), admitted_status(
            kube, namespace, "second"))[1], 180)
        again = rayjob_of(kube, namespace, "second")
        assert not again["spec"].get("suspend") and again["spec"]["entrypoint"] == entrypoint
        assert readmitted["rayJobName"] == second_rayjob["metadata"]["name"]
        assert readmitted["startTime"] == preempted["startTime"]
        assert [rj["metadata"]["name"] for rj in rayjobs(kube, namespace)].count(readmitted["rayJobName"]) == 1
        log.poll()
    except Exception:
        sys.stderr.write(kube.kubectl("get", "ej,rayjobs", "-n", namespace, "-o", "yaml", check=False).stdout[-20000:])
        raise
    finally:
        log.dump()

    second_states = " | ".join(log.states_of(second_rayjob["metadata"]["name"]))
    assert "QuotaReserved=False(Pending)" in second_states and "Admitted=True" in second_states
    assert "Evicted=True(Preempted)" in second_states and "Preempted=True" in second_states


def test_the_example_applies(kube, kueue, namespace):
    """examples/kueue.yaml, in a namespace of its own (the example's team-a), passes the API server's
    validation of every object (server-side dry run: nothing is created)."""
    documents = [doc for doc in yaml.safe_load_all((REPO / "examples" / "kueue.yaml").read_text()) if doc]
    for doc in documents:
        if "namespace" in doc["metadata"]:
            doc["metadata"]["namespace"] = namespace
    kube.kubectl("apply", "--dry-run=server", "-f", "-",
                 input=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}))


@pytest.mark.parametrize("spec,field", [
    ({"queueName": "batch", "clusterSelector": {"ray.io/cluster": "pool"}, "retry": {"backoffLimit": 0}},
     "spec.queueName"),
    ({"queueName": "batch", "suspend": True}, "spec.suspend"),
    ({"queueName": "Batch_Queue"}, "spec.queueName"),
    ({"workloadPriorityClass": "High"}, "spec.workloadPriorityClass"),
])
def test_queue_fields_are_refused_at_apply_time_naming_the_field(kube, namespace, spec, field):
    res = kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest("refused", **spec), check=False)
    assert res.returncode != 0 and field in res.stderr, res.stderr


def test_the_charts_default_queue_reaches_the_operator():
    env = container_env(render_chart({"defaultQueueName": "team-queue"}))
    assert env["EMBEDJOB_DEFAULT_QUEUE_NAME"] == {"name": "EMBEDJOB_DEFAULT_QUEUE_NAME", "value": "team-queue"}
    assert "EMBEDJOB_DEFAULT_QUEUE_NAME" not in container_env(render_chart())
    for bad in ("Team_Queue", "q" * 64):
        assert_refused(helm("template", RELEASE, str(CHART), *values_args({"defaultQueueName": bad}), check=False),
                       "defaultQueueName")
