"""A RayJob the API server refuses to create (a ResourceQuota allowing no RayJobs) is reported as
refused, never as created (issue 26 item 8): the operator as a ServiceAccount with exactly its rules,
the real quota admission and the real resource-quota controller."""

from __future__ import annotations

import pytest

from support.kubectl import apply_job, condition, create_database_secret, events_for, get_json, rayjobs
from support.polling import wait_until

pytestmark = pytest.mark.k8s

DB_URL = "postgresql://writer:secret@db.example:5432/embed"
QUOTA = "no-rayjobs"


def reasons(kube, namespace: str, name: str) -> dict[str, str]:
    """Event reason -> type, of the job's Events."""
    return {e["reason"]: e["type"] for e in events_for(kube, namespace, name)}


def test_a_quota_refusal_is_a_warning_naming_the_quota_and_the_job_starts_once_it_is_gone(
        kube, namespace, kube_controllers, kuberay_operator, start_operator):
    kube.kubectl("create", "quota", QUOTA, "-n", namespace, "--hard=count/rayjobs.ray.io=0")
    # the quota controller fills in what is used: from then on admission refuses with "exceeded quota"
    wait_until("the quota's status", lambda: get_json(kube, "quota", QUOTA, "-n", namespace).get("status", {}).get(
        "hard"), timeout=60)
    create_database_secret(kube, namespace, DB_URL)
    start_operator(kube, namespace)
    apply_job(kube, namespace, "pep")

    def refused():
        job = get_json(kube, "ej", "pep", "-n", namespace)
        accepted = condition(job, "Accepted") or {}
        return job if accepted.get("reason") == "RayJobCreateRefused" else None

    try:
        job = wait_until("Accepted=False RayJobCreateRefused", refused, timeout=60)
    except AssertionError:  # show what the status says instead
        job = get_json(kube, "ej", "pep", "-n", namespace)
        pytest.fail(f"the refusal is not reported: Accepted is {condition(job, 'Accepted')}, the job is "
                    f"{job['status'].get('state')}/{job['status'].get('reason')}, its Events "
                    f"{reasons(kube, namespace, 'pep')}")
    accepted = condition(job, "Accepted")
    assert accepted["status"] == "False" and job["status"]["state"] == "Pending", job["status"]
    assert f"exceeded quota: {QUOTA}" in accepted["message"], accepted
    assert job["status"]["reason"] == "RayJobCreateRefused" and "rayJobName" not in job["status"]
    warning = wait_until("the Warning Event", lambda: [e for e in events_for(kube, namespace, "pep")
                                                       if e["reason"] == "RayJobCreateRefused"], timeout=30)
    assert warning[0]["type"] == "Warning" and f"exceeded quota: {QUOTA}" in warning[0]["message"], warning
    assert rayjobs(kube, namespace) == []
    assert "RayJobCreated" not in reasons(kube, namespace, "pep")

    kube.kubectl("delete", "quota", QUOTA, "-n", namespace)
    job = wait_until("the RayJob's cluster in the status", lambda: (lambda j: j if j.get("status", {}).get(
        "rayClusterName") else None)(get_json(kube, "ej", "pep", "-n", namespace)), timeout=90)
    assert (condition(job, "Accepted")["status"], condition(job, "Accepted")["reason"]) == ("True", "RayJobCreated")
    [rayjob] = rayjobs(kube, namespace)
    assert job["status"]["rayJobName"] == rayjob["metadata"]["name"]
    assert wait_until("the RayJobCreated Event", lambda: reasons(kube, namespace, "pep").get("RayJobCreated"),
                      timeout=30) == "Normal"
