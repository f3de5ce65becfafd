"""The operator (`python -m controller`, as a ServiceAccount with exactly the rules of
controller.permissions) against the real API server and the real KubeRay operator."""

from __future__ import annotations

import json

import pytest

from controller.rayjob import build_rayjob, rayjob_name
from controller.settings import Settings
from embedjob.api import parse_spec
from support.kubectl import (apply_job, condition, create_database_secret, events_for, get_json, rayjobs,
                             wait_for_condition, wait_for_rayjobs)
from support.net import free_port
from support.polling import wait_until

pytestmark = pytest.mark.k8s

DB_URL = "postgresql://writer:not-a-real-password@db.example:5432/embed"


def the_rayjob(kube, namespace: str) -> dict:
    return wait_for_rayjobs(kube, namespace)[0]


def test_job_gets_one_rayjob_that_kuberay_accepts(kube, namespace, kuberay_operator, start_operator):
    operator = start_operator(kube, namespace)
    create_database_secret(kube, namespace, DB_URL)
    job = apply_job(kube, namespace, "pep", workers={"replicas": 2, "memory": "3Gi"}, ttlSecondsAfterFinished=300)
    uid = job["metadata"]["uid"]

    rayjob = the_rayjob(kube, namespace)
    assert rayjob["metadata"]["name"] == rayjob_name("pep", uid)
    assert rayjob["metadata"]["ownerReferences"][0]["uid"] == uid
    assert rayjob["metadata"]["labels"]["embedjob.dev/job-uid"] == uid
    spec = rayjob["spec"]
    assert spec["entrypoint"].startswith("python -m embedjob_worker.driver --config-b64 ")
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] == 300
    assert spec["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 2
    # The credentials never leave the Secret.
    for kind in ("rayjobs", "embeddingjobs", "configmaps"):
        assert "not-a-real-password" not in kube.kubectl("get", kind, "-n", namespace, "-o", "json").stdout
    assert "not-a-real-password" not in operator.log()

    # KubeRay validates the RayJob and starts its RayCluster (which never becomes ready: no kubelet).
    def kuberay_started_it():
        status = get_json(kube, "rayjob", rayjob["metadata"]["name"], "-n", namespace).get("status", {})
        assert status.get("jobDeploymentStatus") != "ValidationFailed", status
        return status if status.get("rayClusterName") else None

    status = wait_until("KubeRay to create the RayCluster", kuberay_started_it, timeout=60)
    cluster = get_json(kube, "raycluster", status["rayClusterName"], "-n", namespace)
    assert cluster["spec"]["workerGroupSpecs"][0]["replicas"] == 2

    # The job mirrors the RayJob.
    def mirrored():
        job = get_json(kube, "ej", "pep", "-n", namespace)
        return job if job["status"].get("rayClusterName") == status["rayClusterName"] else None

    job = wait_until("the mirrored RayJob status", mirrored, timeout=30)
    # what it waits for comes from its pods, which depend on what earlier tests of the session left
    # running: nothing binds them (Initializing), or a scheduler finds no room for them (Unschedulable)
    assert job["status"]["state"] == "Pending" and job["status"]["reason"] in ("Initializing", "Unschedulable")
    assert job["status"]["jobDeploymentStatus"] == "Initializing"
    assert condition(job, "Accepted")["status"] == "True"
    assert all(c["observedGeneration"] == job["metadata"]["generation"] for c in job["status"]["conditions"])
    assert job["metadata"]["finalizers"] == ["embedjob.dev/cleanup"]
    assert any(k.startswith("embedjob.dev/") for k in job["metadata"]["annotations"])
    accepted = [e for e in events_for(kube, namespace, "pep") if e["reason"] == "RayJobCreated"]
    assert accepted and accepted[0]["type"] == "Normal"

    assert len(rayjobs(kube, namespace)) == 1
    metrics = operator.metrics()
    assert 'embedjob_reconciles_total{handler="launch"}' in metrics and 'embedjob_jobs{state="Pending"} 1.0' in metrics
    assert "forbidden" not in operator.log().lower()


def test_missing_secret_is_waited_for_not_a_crash(kube, namespace, start_operator):
    operator = start_operator(kube, namespace)
    apply_job(kube, namespace, "waits")
    job = wait_for_condition(kube, namespace, "waits", "Accepted", "False")
    assert condition(job, "Accepted")["reason"] == "SecretNotFound" and job["status"]["state"] == "Pending"
    assert "embedjob-db" in condition(job, "Accepted")["message"]
    warning = wait_until("a Warning event", lambda: [e for e in events_for(kube, namespace, "waits")
                                                     if e["reason"] == "SecretNotFound"])
    assert warning[0]["type"] == "Warning"

    kube.kubectl("create", "secret", "generic", "embedjob-db", "-n", namespace, "--from-literal=other=x")
    wait_until("SecretKeyMissing", lambda: condition(get_json(kube, "ej", "waits", "-n", namespace),
                                                      "Accepted")["reason"] == "SecretKeyMissing")
    assert rayjobs(kube, namespace) == []

    kube.kubectl("delete", "secret", "embedjob-db", "-n", namespace)
    create_database_secret(kube, namespace, DB_URL)
    wait_for_condition(kube, namespace, "waits", "Accepted", "True", timeout=30)
    assert len(the_rayjob(kube, namespace)["metadata"]["ownerReferences"]) == 1
    assert operator.process.poll() is None


def test_semantic_errors_are_refused_and_can_be_fixed(kube, namespace, start_operator):
    start_operator(kube, namespace)
    create_database_secret(kube, namespace, DB_URL)
    apply_job(kube, namespace, "ftp", source={"uri": "ftp://files.example/in.jsonl"})
    apply_job(kube, namespace, "branch", model={"package": None, "revision": "main"})
    ftp = wait_for_condition(kube, namespace, "ftp", "Accepted", "False")
    assert condition(ftp, "Accepted")["reason"] == "UnsupportedSource"
    branch = wait_for_condition(kube, namespace, "branch", "Accepted", "False")
    assert condition(branch, "Accepted")["reason"] == "ModelNotPinned"
    assert rayjobs(kube, namespace) == []

    # Not accepted yet, so the spec may still change.
    kube.kubectl("patch", "ej", "ftp", "-n", namespace, "--type=merge",
                 "-p", json.dumps({"spec": {"source": {"uri": "s3://bucket/in.jsonl"}}}))
    wait_for_condition(kube, namespace, "ftp", "Accepted", "True", timeout=30)
    assert [rj["metadata"]["labels"]["embedjob.dev/job-name"] for rj in wait_for_rayjobs(kube, namespace)] == ["ftp"]


def test_accepted_spec_is_frozen_but_suspend_works(kube, namespace, start_operator):
    start_operator(kube, namespace)
    create_database_secret(kube, namespace, DB_URL)
    apply_job(kube, namespace, "frozen")
    wait_for_condition(kube, namespace, "frozen", "Accepted", "True")

    res = kube.kubectl("patch", "ej", "frozen", "-n", namespace, "--type=merge",
                       "-p", json.dumps({"spec": {"batching": {"batchSize": 8}}}), check=False)
    assert res.returncode != 0 and "spec is immutable once the job is accepted" in res.stderr

    kube.kubectl("patch", "ej", "frozen", "-n", namespace, "--type=merge", "-p", '{"spec": {"suspend": true}}')
    wait_until("the RayJob suspended", lambda: the_rayjob(kube, namespace)["spec"].get("suspend") is True, timeout=30)
    kube.kubectl("patch", "ej", "frozen", "-n", namespace, "--type=merge", "-p", '{"spec": {"suspend": false}}')
    wait_until("the RayJob resumed", lambda: the_rayjob(kube, namespace)["spec"].get("suspend") is False, timeout=30)
    assert len(rayjobs(kube, namespace)) == 1


def test_deleting_a_job_deletes_its_rayjob_and_releases_it(kube, namespace, start_operator):
    start_operator(kube, namespace)
    create_database_secret(kube, namespace, DB_URL)
    apply_job(kube, namespace, "doomed")
    wait_for_condition(kube, namespace, "doomed", "Accepted", "True")
    assert len(the_rayjob(kube, namespace)) > 0

    kube.kubectl("delete", "ej", "doomed", "-n", namespace, "--timeout=60s")
    assert kube.kubectl("get", "ej", "doomed", "-n", namespace, check=False).returncode != 0
    assert rayjobs(kube, namespace) == []


def test_deletion_is_bounded_when_the_rayjob_hangs(kube, namespace, start_operator):
    start_operator(kube, namespace, EMBEDJOB_CLEANUP_TIMEOUT_SECONDS="3")
    create_database_secret(kube, namespace, DB_URL)
    apply_job(kube, namespace, "stuck")
    wait_for_condition(kube, namespace, "stuck", "Accepted", "True")
    held = the_rayjob(kube, namespace)["metadata"]["name"]
    kube.kubectl("patch", "rayjob", held, "-n", namespace, "--type=merge",
                 "-p", '{"metadata": {"finalizers": ["test.embedjob.dev/hold"]}}')

    kube.kubectl("delete", "ej", "stuck", "-n", namespace, "--timeout=60s")
    warnings = [e for e in events_for(kube, namespace, "stuck") if e["reason"] == "CleanupTimedOut"]
    assert warnings and warnings[0]["type"] == "Warning"
    assert get_json(kube, "rayjob", held, "-n", namespace)["metadata"]["deletionTimestamp"]
    kube.kubectl("patch", "rayjob", held, "-n", namespace, "--type=merge", "-p", '{"metadata": {"finalizers": null}}')


def test_database_outage_degrades_progress_only(kube_without_kuberay, standin_namespace, start_operator):
    kube, namespace = kube_without_kuberay, standin_namespace
    dead = f"postgresql://reader:reader-secret@127.0.0.1:{free_port()}/embed"  # nobody listens there
    start_operator(kube, namespace, EMBEDJOB_DATABASE_URL=dead)
    create_database_secret(kube, namespace, DB_URL)
    apply_job(kube, namespace, "blind")
    name = the_rayjob(kube, namespace)["metadata"]["name"]
    # What KubeRay reports once the job runs (no KubeRay runs on this control plane).
    kube.kubectl("patch", "rayjob", name, "-n", namespace, "--subresource=status", "--type=merge", "-p",
                 json.dumps({"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}}))

    job = wait_for_condition(kube, namespace, "blind", "Running", timeout=30)
    message = condition(job, "Running")["message"]
    assert message.startswith("progress unavailable: OperationalError") and "reader-secret" not in message
    assert job["status"]["state"] == "Running" and condition(job, "Failed")["status"] == "False"


def test_an_existing_rayjob_of_that_name_is_adopted_only_when_owned(kube, namespace, start_operator):
    create_database_secret(kube, namespace, DB_URL)
    mine, theirs = apply_job(kube, namespace, "mine"), apply_job(kube, namespace, "theirs")
    # Before the operator runs: RayJobs under the names it will create, both owned by
    # `mine` (a create whose answer was lost), without the labels that would put them in
    # the operator's watch index -- so its creates meet 409 Conflict.
    for job in (mine, theirs):
        manifest = build_rayjob(job, parse_spec(job["spec"]), Settings.from_env({}))
        manifest["metadata"]["ownerReferences"] = build_rayjob(
            mine, parse_spec(mine["spec"]), Settings.from_env({}))["metadata"]["ownerReferences"]
        del manifest["metadata"]["labels"]
        kube.kubectl("create", "-f", "-", input=json.dumps(manifest))

    start_operator(kube, namespace)
    wait_for_condition(kube, namespace, "mine", "Accepted", "True")
    refused = wait_for_condition(kube, namespace, "theirs", "Accepted", "False")
    assert condition(refused, "Accepted")["reason"] == "RayJobConflict"
    assert len(rayjobs(kube, namespace)) == 2
