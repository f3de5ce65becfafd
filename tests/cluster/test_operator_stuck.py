"""Jobs that say why they are stuck, refusals reviewed at their change, the operator's logs
and Events: the operator (as a ServiceAccount with exactly controller.permissions) against
the real API server on the control plane where KubeRay does not run, so nothing but the
test writes the pods' status (through the pods/status subresource, as a kubelet and the
scheduler would)."""

from __future__ import annotations

import json
import re
import time

import pytest

from support.kubectl import (apply_job, condition, create_database_secret, events_for, get_json,
                             wait_for_rayjobs)
from support.polling import wait_until

pytestmark = pytest.mark.k8s

DB_URL = "postgresql://writer:not-a-real-password@db.example:5432/embed"
CLUSTER = "ej-stuck-x7k2p"
SCHEDULER = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 No preemption victims."


@pytest.fixture
def kube_ns(kube_without_kuberay, standin_namespace):
    kube, namespace = kube_without_kuberay, standin_namespace
    kube.ensure_default_serviceaccount(namespace)
    return kube, namespace


def create_pod(kube, namespace: str, name: str, node_type: str, memory: str = "2Gi") -> None:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {"ray.io/cluster": CLUSTER, "ray.io/node-type": node_type}},
           "spec": {"containers": [{"name": f"ray-{node_type}", "image": "embedjob-worker:test",
                                    "resources": {"limits": {"memory": memory}}}]}}
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))


def set_pod_status(kube, namespace: str, name: str, status: dict) -> None:
    kube.kubectl("patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": status}))


def container_status(name: str, state: dict, last: dict | None = None, restarts: int = 0) -> dict:
    return {"name": name, "image": "embedjob-worker:test", "imageID": "", "ready": False, "started": False,
            "restartCount": restarts, "state": state, "lastState": last or {}}


def columns(kube, namespace: str, name: str, *flags: str) -> dict[str, str]:
    """`kubectl get ej NAME` as {column header: value}."""
    header, row = kube.kubectl("get", "ej", name, "-n", namespace, *flags).stdout.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    cells = [row[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
    return dict(zip(header.split(), cells))


def wait_for_reason(kube, namespace: str, name: str, reason: str) -> dict:
    return wait_until(f"REASON {reason}", lambda: (lambda c: c if c.get("REASON") == reason else None)(
        columns(kube, namespace, name)), timeout=30)


def test_a_job_whose_pods_cannot_start_says_why(kube_ns, start_operator):
    kube, namespace = kube_ns
    operator = start_operator(kube, namespace)
    create_database_secret(kube, namespace, DB_URL)
    apply_job(kube, namespace, "stuck")
    rayjob = wait_for_rayjobs(kube, namespace)[0]
    # What KubeRay reports while the cluster starts (no KubeRay runs on this control plane).
    kube.kubectl("patch", "rayjob", rayjob["metadata"]["name"], "-n", namespace, "--subresource=status",
                 "--type=merge", "-p", json.dumps({"status": {"jobDeploymentStatus": "Initializing",
                                                              "rayClusterName": CLUSTER}}))
    create_pod(kube, namespace, f"{CLUSTER}-head-a1b2c", "head")
    create_pod(kube, namespace, f"{CLUSTER}-worker-d3e4f", "worker")
    wait_until("the pods' progress in the message", lambda: "head pod" in condition(
        get_json(kube, "ej", "stuck", "-n", namespace), "Running")["message"], timeout=30)
    cols = columns(kube, namespace, "stuck")
    assert (cols["STATUS"], cols["REASON"], cols["PROGRESS"]) == ("Pending", "Initializing", "")
    assert columns(kube, namespace, "stuck", "-o", "wide")["TEXTS/S"] == ""  # never ran: no rate, not 0

    head, worker = f"{CLUSTER}-head-a1b2c", f"{CLUSTER}-worker-d3e4f"
    set_pod_status(kube, namespace, head, {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": SCHEDULER,
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
    cols = wait_for_reason(kube, namespace, "stuck", "Unschedulable")
    assert cols["STATUS"] == "Pending"
    described = kube.kubectl("describe", "ej", "stuck", "-n", namespace).stdout
    assert f"head pod {head} cannot be scheduled: {SCHEDULER}" in " ".join(described.split())
    warning = wait_until("the Warning Event", lambda: [e for e in events_for(kube, namespace, "stuck")
                                                      if e["reason"] == "Unschedulable"], timeout=30)
    assert warning[0]["type"] == "Warning"
    assert warning[0]["source"]["component"] == "embedjob-operator"

    set_pod_status(kube, namespace, head, {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"}],
        "containerStatuses": [container_status("ray-head", {"waiting": {
            "reason": "ImagePullBackOff", "message": 'Back-off pulling image "embedjob-worker:test"'}})]})
    wait_for_reason(kube, namespace, "stuck", "ImagePullBackOff")
    message = condition(get_json(kube, "ej", "stuck", "-n", namespace), "Running")["message"]
    assert message.startswith(f"head pod {head}: image 'embedjob-worker:test' of container ray-head cannot be pulled")

    set_pod_status(kube, namespace, head, {"phase": "Running", "containerStatuses": [container_status(
        "ray-head", {"running": {"startedAt": "2026-01-01T00:00:02Z"}})]})
    set_pod_status(kube, namespace, worker, {"phase": "Running", "containerStatuses": [container_status(
        "ray-worker", {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}},
        {"terminated": {"reason": "Error", "exitCode": 1, "message": "ray start failed",
                        "startedAt": "2026-01-01T00:00:02Z", "finishedAt": "2026-01-01T00:00:03Z"}}, restarts=3)]})
    wait_for_reason(kube, namespace, "stuck", "CrashLoopBackOff")
    message = condition(get_json(kube, "ej", "stuck", "-n", namespace), "Running")["message"]
    assert message == (f"worker pod {worker}: container ray-worker keeps crashing "
                       "(restarted 3 times, last exit code 1: ray start failed)")

    set_pod_status(kube, namespace, worker, {"containerStatuses": [container_status(
        "ray-worker", {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 80s restarting"}},
        {"terminated": {"reason": "OOMKilled", "exitCode": 137,
                        "startedAt": "2026-01-01T00:00:04Z", "finishedAt": "2026-01-01T00:00:05Z"}}, restarts=4)]})
    wait_for_reason(kube, namespace, "stuck", "OOMKilled")
    described = " ".join(kube.kubectl("describe", "ej", "stuck", "-n", namespace).stdout.split())
    assert f"worker pod {worker}: container ray-worker was killed for running out of memory (limit 2Gi)" in described
    stuck = {"Unschedulable", "ImagePullBackOff", "CrashLoopBackOff", "OOMKilled"}
    wait_until("a Warning Event for each", lambda: stuck <= {
        e["reason"] for e in events_for(kube, namespace, "stuck") if e["type"] == "Warning"}, timeout=30)
    assert "forbidden" not in operator.log().lower()


def test_a_fixed_spec_is_reviewed_at_once_and_refusals_are_logged_once(kube_ns, start_operator):
    kube, namespace = kube_ns
    # Retries far apart: only the change itself can make the job proceed in time.
    operator = start_operator(kube, namespace, EMBEDJOB_RETRY_DELAY_SECONDS="30")
    create_database_secret(kube, namespace, DB_URL)
    apply_job(kube, namespace, "typo", sink={"databaseSecretRef": {"name": "embedjob-dbb"}})
    wait_until("SecretNotFound", lambda: columns(kube, namespace, "typo")["REASON"] == "SecretNotFound", timeout=30)
    assert columns(kube, namespace, "typo")["STATUS"] == "Pending"

    fixed_at = time.monotonic()
    kube.kubectl("patch", "ej", "typo", "-n", namespace, "--type=merge",
                 "-p", json.dumps({"spec": {"sink": {"databaseSecretRef": {"name": "embedjob-db"}}}}))
    wait_until("Accepted", lambda: (condition(get_json(kube, "ej", "typo", "-n", namespace), "Accepted") or {})
               .get("status") == "True", timeout=30)
    assert time.monotonic() - fixed_at < 10
    assert len(wait_for_rayjobs(kube, namespace)) == 1
    # the operator logs the acceptance after it created the RayJob
    accepted_line = f"[{namespace}/typo] accepted after it was refused (SecretNotFound)"
    wait_until("the accepted line in the log", lambda: accepted_line in operator.log(), timeout=30)
    log = operator.log()
    refusals = [line for line in log.splitlines() if "SecretNotFound" in line and "refused," in line]
    assert len(refusals) == 1, refusals
    assert f"[{namespace}/typo]" in refusals[0] and "[WARNING" in refusals[0]
    assert "[ERROR" not in log and "failed temporarily" not in log


def test_refused_jobs_are_reviewed_again_and_logged_once_per_reason(kube_ns, start_operator):
    kube, namespace = kube_ns
    operator = start_operator(kube, namespace, EMBEDJOB_RETRY_DELAY_SECONDS="1")
    apply_job(kube, namespace, "waits")
    wait_until("SecretNotFound", lambda: columns(kube, namespace, "waits")["REASON"] == "SecretNotFound", timeout=30)
    time.sleep(4)  # several re-reviews
    kube.kubectl("create", "secret", "generic", "embedjob-db", "-n", namespace, "--from-literal=other=x")
    wait_until("SecretKeyMissing", lambda: columns(kube, namespace, "waits")["REASON"] == "SecretKeyMissing",
               timeout=30)
    log = operator.log()
    for reason in ("SecretNotFound", "SecretKeyMissing"):
        assert len([line for line in log.splitlines() if reason in line and "refused," in line]) == 1, log
    assert "[ERROR" not in log
    events = wait_until("both Warning Events", lambda: (lambda found: found if len(found) == 2 else None)(
        [e for e in events_for(kube, namespace, "waits") if e["type"] == "Warning"]), timeout=30)
    assert {e["reason"] for e in events} == {"SecretNotFound", "SecretKeyMissing"}
    assert {e["source"]["component"] for e in events} == {"embedjob-operator"}
