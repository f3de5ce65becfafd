"""Deleting a watched namespace that holds a job with its RayJob completes in both RBAC modes
(issue 26 item 4): the real namespace controller deletes everything in it, the chart's RoleBinding
too when the operator watches some namespaces, and the operator still takes its finalizer off."""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest

from plugins.operator_process import namespaced_grant
from support.kubectl import apply_job, create_database_secret, get_json
from support.polling import wait_until

pytestmark = pytest.mark.k8s

DB_URL = "postgresql://writer:secret@db.example:5432/embed"
# The namespace controller retries what is left with a backoff; a deletion that completes does so well within.
DELETION_BOUND_SECONDS = 120


def log_clock(seconds: float) -> str:
    """A time as the operator's log writes it: "YYYY-mm-dd HH:MM:SS,mmm", local time."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) + f",{int(seconds % 1 * 1000):03d}"


def errors_since(log: str, since: str) -> list[str]:
    """The operator's logged tracebacks from `since` (log_clock) on."""
    entries = re.split(r"\n(?=\[\d{4}-\d\d-\d\d )", log)
    return [entry for entry in entries if entry[1:24] >= since and "Traceback" in entry]


def namespace_gone(kube, name: str) -> bool:
    found = kube.kubectl("get", "namespace", name, "--ignore-not-found", "-o", "name", check=False)
    return not found.stdout.strip()


@pytest.mark.parametrize("clusterwide,case", [(False, ""), (False, "restarted"), (False, "reconnected"), (True, "")],
                         ids=["watchNamespaces", "watchNamespaces-restarted", "watchNamespaces-reconnected",
                              "cluster-wide"])
def test_deleting_a_watched_namespace_with_a_job_completes(kube, namespace, kube_controllers, start_operator,
                                                           clusterwide, case):
    # the operator's ServiceAccount lives in `namespace`, as the chart's lives in its release namespace
    watched = f"watched-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", watched)
    try:
        if not clusterwide:  # the chart's Role and RoleBinding in each watched namespace
            kube.kubectl("apply", "-f", "-", input=json.dumps(
                {"apiVersion": "v1", "kind": "List", "items": namespaced_grant(watched, namespace)}))
        create_database_secret(kube, watched, DB_URL)
        env = {} if clusterwide else {"EMBEDJOB_WATCH_NAMESPACES": f"{namespace},{watched}"}
        operator = start_operator(kube, namespace, clusterwide=clusterwide, **env)
        # suspended: the RayJob is made, and KubeRay (running when earlier tests started it) makes no RayCluster.
        # Unsuspended, its pods went to the test node: a CI run timed out with the job released at once and the
        # namespace controller still waiting for those pods after 120 s (reconnected, after the API server restart).
        apply_job(kube, watched, "pep", suspend=True)
        job = wait_until("the job's RayJob", lambda: (lambda j: j if j.get("status", {}).get("rayJobName")
                                                      else None)(get_json(kube, "ej", "pep", "-n", watched)), timeout=60)
        assert job["metadata"]["finalizers"] == ["embedjob.dev/cleanup"]

        if case == "reconnected":
            # The RoleBinding gone first (the namespace controller deletes in no set order), then kopf's
            # watches there reconnect and list again, as they do now and then: before, 403 for a minute,
            # then the operator exited, and the namespace stayed Terminating.
            kube.kubectl("delete", "rolebinding", "embedjob-operator", "-n", watched)
            kube.restart_apiserver(down_seconds=2)
        if case == "restarted":
            # The operator (re)started while the namespace is being deleted: kopf never watches a namespace
            # already terminating when it starts, and before, the job's finalizer stayed for good.
            operator.stop()
            kube.kubectl("delete", "namespace", watched, "--wait=false")
            wait_until("the namespace's RoleBinding gone", lambda: not kube.kubectl(
                "get", "rolebindings", "-n", watched, "-o", "name", check=False).stdout.strip(), timeout=60)
            operator.start()
        else:
            kube.kubectl("delete", "namespace", watched, "--wait=false")
        # Before this (reconnected), a sync may rightly fail: the RoleBinding gone, or the API server restarting.
        deleting_since = log_clock(time.time())
        try:
            wait_until(f"namespace {watched} gone", lambda: namespace_gone(kube, watched),
                       timeout=DELETION_BOUND_SECONDS)
        except AssertionError:  # wait_until's timeout: show what holds the namespace
            left = kube.kubectl("get", "ej,rayjobs,rolebindings", "-n", watched, "-o", "yaml", check=False)
            conditions = kube.kubectl("get", "namespace", watched, "-o", "jsonpath={.status}", check=False)
            # the operator's own lines, not the traceback bodies between them
            lines = [line for line in operator.log().splitlines() if line.startswith("[")]
            pytest.fail(f"namespace {watched} still there after {DELETION_BOUND_SECONDS}s: {conditions.stdout}\n"
                        f"{left.stdout[-4000:]}\noperator log:\n" + "\n".join(lines[-60:]))
        # none, such as a RayJob call or a status write refused (403) once the RoleBinding went
        errors = errors_since(operator.log(), deleting_since)
        assert not errors, errors[0][-5000:]
    finally:
        kube.kubectl("delete", "namespace", watched, "--wait=false", "--ignore-not-found", check=False)
