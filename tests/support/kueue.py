"""Kueue in the cluster tests: a queue with quota for one job, the Workload states seen, the job's queue states.

Shared by tests/cluster/test_kueue.py (checked on the RayJob, no pods) and
tests/cluster/test_real_path_kueue.py (through KubeRay's pods on the test node).
"""

from __future__ import annotations

import json
import sys
import threading

from envtest.kueue import API_VERSION
from support.kubectl import condition, get_json, read_or_none
from support.polling import BackgroundPoller, wait_until

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


def apply_kueue_objects(kube, namespace: str) -> None:
    kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                         "items": kueue_objects(namespace)}))


def queue_spec(namespace: str, priority: str) -> dict:
    """The spec fields that put a one-job-sized EmbeddingJob in the queue at `priority` (low, high)."""
    return {"queueName": QUEUE, "workloadPriorityClass": f"{priority}-{namespace}", **ONE_JOB}


class WorkloadLog(BackgroundPoller):
    """The distinct states of the namespace's Workloads, in the order seen (for the record): one look
    per `poll()`, and one every second while used as a context manager."""

    def __init__(self, kube, namespace: str):
        super().__init__()
        self.kube, self.namespace, self.seen = kube, namespace, []
        self._lock = threading.Lock()

    def poll(self) -> None:
        workloads = read_or_none(self.kube, "workloads.kueue.x-k8s.io", "-n", self.namespace)
        if workloads is None:
            return
        with self._lock:
            for wl in workloads["items"]:
                owner = (wl["metadata"].get("ownerReferences") or [{}])[0].get("name", "?")
                conds = sorted(f"{c['type']}={c['status']}({c['reason']})"
                               for c in wl.get("status", {}).get("conditions", []))
                entry = (owner, ", ".join(conds))
                if entry not in self.seen:
                    self.seen.append(entry)

    def states_of(self, rayjob: str) -> list[str]:
        with self._lock:
            return [state for owner, state in self.seen if owner == rayjob]

    def dump(self) -> None:
        with self._lock:
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


def preempted_rayjob(kube, namespace: str, name: str) -> dict | None:
    """The job's RayJob once Kueue suspended it and KubeRay finished deleting its cluster, else None."""
    rayjob = rayjob_of(kube, namespace, name)
    status = rayjob.get("status", {})
    done = rayjob["spec"].get("suspend") and status.get("jobDeploymentStatus") == "Suspended"
    return rayjob if done and not status.get("rayClusterName") else None


def workload_of(kube, namespace: str, rayjob: str) -> dict | None:
    """The Kueue Workload that a RayJob owns, None while Kueue has made none."""
    for wl in get_json(kube, "workloads.kueue.x-k8s.io", "-n", namespace)["items"]:
        if any(ref.get("name") == rayjob for ref in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None
