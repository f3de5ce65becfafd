"""The operator against the real API server when things change under an unfinished job: its RayJob
deleted by someone else, its spec edited before it is accepted."""

from __future__ import annotations

import asyncio
import time

import kubernetes
import pytest

from controller.kube import KubeApi
from controller.metrics import JobStates
from controller.keeper import StatusKeeper
from controller.reconcile import Context
from controller.settings import Settings
from support.kubectl import apply_job, condition, create_database_secret, get_json, rayjobs, wait_for_condition
from support.polling import wait_until

pytestmark = pytest.mark.k8s

DB_URL = "postgresql://writer:secret@db.example:5432/embed"


def test_a_rayjob_deleted_by_someone_else_fails_the_job_and_is_not_recreated(kube, namespace, start_operator):
    operator = start_operator(kube, namespace)
    create_database_secret(kube, namespace, DB_URL)
    apply_job(kube, namespace, "orphan")
    job = wait_for_condition(kube, namespace, "orphan", "Accepted")
    name = wait_until("rayJobName in the status",
                      lambda: get_json(kube, "ej", "orphan", "-n", namespace).get("status", {}).get("rayJobName"))

    kube.kubectl("delete", "rayjob", name, "-n", namespace, "--timeout=30s")
    job = wait_for_condition(kube, namespace, "orphan", "Failed", timeout=30)
    assert (job["status"]["state"], job["status"]["reason"]) == ("Failed", "RayJobDeleted")
    assert name in condition(job, "Failed")["message"]

    operator.restart()  # a restart (resume) does not bring it back either
    for _ in range(10):
        assert rayjobs(kube, namespace) == []
        time.sleep(0.5)
    assert get_json(kube, "ej", "orphan", "-n", namespace)["status"]["reason"] == "RayJobDeleted"


def _keeper(kube):
    """The operator's StatusKeeper, with the operator's API client, against the test API server."""
    client = kubernetes.config.new_client_from_config(config_file=kube.kubeconfig)
    ctx = Context(settings=Settings.from_env({}), kube=KubeApi(client), runs=None, job_states=JobStates())
    return StatusKeeper(ctx, emit=lambda job, change: None)


def test_acceptance_is_refused_for_a_version_edited_after_its_review(kube, namespace):
    """The operator marks a job accepted only for the version it reviewed: an edit that came
    in between (a newer resourceVersion) makes the write fail, so the edit is reviewed, never
    ignored; once accepted, the API server refuses further spec edits."""
    reviewed = apply_job(kube, namespace, "edited")
    kube.kubectl("patch", "ej", "edited", "-n", namespace, "--type=merge",
                 "-p", '{"spec": {"batching": {"batchSize": 32}}}')
    keeper = _keeper(kube)

    assert asyncio.run(keeper.accept(reviewed)) is False
    assert "conditions" not in get_json(kube, "ej", "edited", "-n", namespace).get("status", {})

    latest = get_json(kube, "ej", "edited", "-n", namespace)
    assert asyncio.run(keeper.accept(latest)) is True
    job = get_json(kube, "ej", "edited", "-n", namespace)
    assert condition(job, "Accepted")["status"] == "True"
    assert job["status"]["observedGeneration"] == latest["metadata"]["generation"] == 2
    res = kube.kubectl("patch", "ej", "edited", "-n", namespace, "--type=merge",
                       "-p", '{"spec": {"batching": {"batchSize": 16}}}', check=False)
    assert res.returncode != 0 and "spec is immutable once the job is accepted" in res.stderr
