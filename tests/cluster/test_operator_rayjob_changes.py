"""The operator against the real API server when things change under an unfinished job: its RayJob
deleted by someone else, its spec edited before it is accepted."""

from __future__ import annotations

import time

import pytest

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
