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

from envtest.kueue import API_VERSION
from support.chart import RELEASE, assert_refused, container_env, helm, render_chart, values_args
from support.kubectl import condition, create_database_secret, get_json, rayjobs
from support.manifests import ej_manifest
from support.paths import CHART, REPO
from support.polling import wait_until

pytestmark = pytest.mark.k8s

DB_URL = "postgresql://writer:not-a-real-password@db.example:5432/embed"
QUEUE = "batch"
# One job's pods request 2.5 CPUs (head 1, one worker 1, KubeRay's submitter 500m): the quota
# holds one job, not two.
ONE_JOB = {"workers": {"replicas": 1, "cpusPerActor": 1}}
QUOTA_CPUS = "3"


def kueue_objects(namespace: str) -> list[dict]:
    """A ResourceFlavor, a ClusterQueue that preempts lower priorities, the LocalQueue `batch` in
    `namespace` and two WorkloadPriorityClasses (cluster-scoped names carry the namespace)."""
    flavor, cq = f"flavor-{namespace}", f"cq-{namespace}"
    return [
        {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": cq}, "spec": {
            "namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": flavor, "resources": [
                {"name": "cpu", "nominalQuota": QUOTA_CPUS}, {"name": "memory", "nominalQuota": "64Gi"}]}]}]}},
        {"apiVersion": API_VERSION, "kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": namespace},
         "spec": {"clusterQueue": cq}},
        {"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass", "metadata": {"name": f"low-{namespace}"},
         "value": 100},
        {"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass", "metadata": {"name": f"high-{namespace}"},
         "value": 1000},
    ]


class WorkloadLog:
    """The distinct states of the namespace's Workloads, in the order seen (for the record)."""

    def __init__(self, kube, namespace: str):
        self.kube, self.namespace, self.seen = kube, namespace, []

    def poll(self) -> None:
        for wl in get_json(self.kube, "workloads.kueue.x-k8s.io", "-n", self.namespace)["items"]:
            owner = (wl["metadata"].get("ownerReferences") or [{}])[0].get("name", "?")
            conds = sorted(f"{c['type']}={c['status']}({c['reason']})" for c in wl.get("status", {}).get("conditions", []))
            entry = (owner, ", ".join(conds))
            if entry not in self.seen:
                self.seen.append(entry)

    def states_of(self, rayjob: str) -> list[str]:
        return [state for owner, state in self.seen if owner == rayjob]

    def dump(self) -> None:
        sys.stderr.write("Kueue Workload states seen:\n" + "".join(f"  {o}: {s}\n" for o, s in self.seen))


def job_status(kube, namespace: str, name: str) -> dict:
    return get_json(kube, "ej", name, "-n", namespace).get("status", {})


def rayjob_of(kube, namespace: str, name: str) -> dict:
    return get_json(kube, "rayjob", job_status(kube, namespace, name)["rayJobName"], "-n", namespace)


def wait_state(kube, namespace: str, name: str, state: str, reason: str | None, log: WorkloadLog,
               timeout: float = 120) -> dict:
    def check():
        log.poll()
        st = job_status(kube, namespace, name)
        return st if st.get("state") == state and (reason is None or st.get("reason") == reason) else None

    return wait_until(f"{name}: {state}/{reason}", check, timeout, interval=0.5)


def admitted_status(kube, namespace: str, name: str) -> dict | None:
    """The job's status once Kueue admitted it (Pending, Queued=False), else None."""
    st = job_status(kube, namespace, name)
    queued = condition({"status": st}, "Queued")
    return st if st.get("state") == "Pending" and queued and queued["status"] == "False" else None


def submit(kube, namespace: str, name: str, priority: str) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest(
        name, queueName=QUEUE, workloadPriorityClass=f"{priority}-{namespace}", **ONE_JOB))


def test_a_job_waits_queued_is_admitted_when_quota_frees_and_is_preempted_then_readmitted(
        kube, namespace, kuberay_operator, kueue, kube_controllers, start_operator):
    """kube_controllers: the garbage collector deletes a deleted RayJob's Workload (owned by it), which
    frees its quota."""
    kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                         "items": kueue_objects(namespace)}))
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
        wait_until("second's RayJob Suspended, its cluster gone", lambda: (lambda rj: rj["spec"].get("suspend") and rj.get(
            "status", {}).get("jobDeploymentStatus") == "Suspended" and not rj["status"].get("rayClusterName"))(
            rayjob_of(kube, namespace, "second")), 120)
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
