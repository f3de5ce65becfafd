"""End to end: EmbeddingJob -> operator -> RayJob -> the driver on a local Ray -> vectors in
PostgreSQL -> status. `RayJobRunner` plays KubeRay + kubelet on a control plane where the
real KubeRay operator does not run; everything else is real (API server, operator as a
ServiceAccount, Ray, the packaged model, PostgreSQL with pgvector)."""

from __future__ import annotations

import json
import signal

import pytest

from support.kubectl import apply_job, condition, events_for, get_json, rayjobs, wait_for_condition
from support.polling import wait_until
from support.sql import vectors
from support.standin_jobs import MODEL, finished, sample

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def test_job_runs_to_complete_with_exact_vectors(e2e, database_url, tmp_path):
    kube, namespace, operator, runner = e2e
    uri, ids = sample(tmp_path, 200)
    runner()
    apply_job(kube, namespace, "pep", source={"uri": uri}, model=MODEL, batching={"batchSize": 16})

    job = wait_until("the job to finish", lambda: finished(kube, namespace, "pep"), timeout=300)
    assert job["status"]["state"] == "Complete", (job["status"], operator.log()[-3000:])
    assert kube.kubectl("wait", "--for=condition=Complete", "ej/pep", "-n", namespace, "--timeout=10s").returncode == 0

    status = job["status"]
    assert status["state"] == "Complete" and status["reason"] == "Succeeded"
    assert status["jobDeploymentStatus"] == "Complete" and status["jobStatus"] == "SUCCEEDED"
    assert status["progress"]["recordsEmbedded"] == 200 and status["progress"]["recordsFailed"] == 0
    total = status["progress"]["batchesTotal"]
    assert status["progress"]["summary"] == f"{total}/{total} batches" and total >= 200 // 16
    assert status["startTime"] <= status["completionTime"] and status["rayClusterName"].startswith("ej-pep-")
    assert condition(job, "Failed")["status"] == "False" and condition(job, "Running")["status"] == "False"

    rows = vectors(database_url)
    assert sorted(r[0] for r in rows) == sorted(ids)  # one row per record, no duplicates
    assert {(r[1], r[2], float(r[3])) for r in rows} == {("all-MiniLM-L6-v2", 384, 1.0)}

    reasons = [e["reason"] for e in events_for(kube, namespace, "pep")]
    assert {"RayJobCreated", "JobRunning", "Succeeded"} <= set(reasons)
    assert len(rayjobs(kube, namespace)) == 1


def test_driver_failure_fails_the_job_with_its_reason(e2e, tmp_path):
    kube, namespace, operator, runner = e2e
    uri, _ = sample(tmp_path, 40)
    # Every batch hits an (injected) out-of-memory error, down to single texts.
    runner(EMBEDJOB_FAULT_INJECTION=json.dumps({"oom_above": 0}))
    apply_job(kube, namespace, "oom", source={"uri": uri}, model=MODEL, batching={"batchSize": 8},
              retry={"attemptsPerBatch": 1})

    job = wait_until("the job to finish", lambda: finished(kube, namespace, "oom"), timeout=300)
    assert job["status"]["state"] == "Failed" and job["status"]["reason"] == "TooManyFailedBatches", job["status"]
    assert condition(job, "Failed")["reason"] == "TooManyFailedBatches"
    assert job["status"]["rayJobReason"] == "AppFailed"
    assert "exit code 1" in job["status"]["rayJobMessage"]
    assert kube.kubectl("wait", "--for=condition=Failed", "ej/oom", "-n", namespace, "--timeout=5s").returncode == 0
    warning = [e for e in events_for(kube, namespace, "oom") if e["reason"] == "TooManyFailedBatches"]
    assert warning and warning[0]["type"] == "Warning"


def test_operator_restart_mid_job_creates_no_second_rayjob(e2e, tmp_path):
    kube, namespace, operator, runner = e2e
    uri, ids = sample(tmp_path, 600)
    standin = runner()
    apply_job(kube, namespace, "long", source={"uri": uri}, model=MODEL, batching={"batchSize": 8})
    running = wait_for_condition(kube, namespace, "long", "Running", timeout=120)
    accepted_at = condition(running, "Accepted")["lastTransitionTime"]

    operator.restart(signal.SIGKILL)
    wait_until("progress after the restart", lambda: get_json(kube, "ej", "long", "-n", namespace)["status"]
               .get("progress", {}).get("batchesSucceeded", 0) > 0, timeout=120)
    operator.restart(signal.SIGTERM)

    job = wait_until("the job to finish", lambda: finished(kube, namespace, "long"), timeout=300)
    assert job["status"]["state"] == "Complete", job["status"]
    assert job["status"]["progress"]["recordsEmbedded"] == len(ids)
    assert condition(job, "Accepted")["lastTransitionTime"] == accepted_at
    assert len(rayjobs(kube, namespace)) == 1
    assert [len(runs) for runs in standin.runs.values()] == [1]  # the entrypoint ran once
