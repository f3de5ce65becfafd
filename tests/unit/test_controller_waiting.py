"""What a job that has not started waits for, from pods and RayClusters as the API server
returns them (pure; no cluster), and how it shows in the status."""

from __future__ import annotations

import pytest

from controller import events, status
from controller.acceptance import ACCEPTED
from controller.waiting import Waiting, pod_problem, waiting_for

T0 = "2026-01-01T00:00:00Z"
CLUSTER = "ej-pep-1234abcd-x7k2p"
UNSCHEDULABLE = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available."


def pod(name="ej-pep-1234abcd-x7k2p-head-abcde", node_type="head", phase="Pending", conditions=(),
        containers=(), init=(), memory=None, **status_fields) -> dict:
    limits = {"limits": {"memory": memory}} if memory else {}
    return {
        "metadata": {"name": name, "labels": {"ray.io/cluster": CLUSTER, "ray.io/node-type": node_type}},
        "spec": {"containers": [{"name": "ray-head", "image": "embedjob-worker:0.1.0", "resources": limits}]},
        "status": {"phase": phase, "conditions": list(conditions), "containerStatuses": list(containers),
                   "initContainerStatuses": list(init), **status_fields},
    }


def container(name="ray-head", state=None, last=None, restarts=0, image="embedjob-worker:0.1.0") -> dict:
    return {"name": name, "image": image, "state": state or {"waiting": {"reason": "ContainerCreating"}},
            "lastState": last or {}, "restartCount": restarts, "ready": False}


def unschedulable() -> dict:
    return {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}


def test_unschedulable_carries_the_schedulers_message():
    found = pod_problem(pod(conditions=[unschedulable()]))
    assert found.reason == "Unschedulable"
    assert found.message == f"head pod ej-pep-1234abcd-x7k2p-head-abcde cannot be scheduled: {UNSCHEDULABLE}"


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "ErrImagePull", "InvalidImageName"])
def test_image_that_cannot_be_pulled(reason):
    waiting = {"waiting": {"reason": reason, "message": 'Back-off pulling image "reg.example/worker:9"'}}
    found = pod_problem(pod(containers=[container(state=waiting, image="reg.example/worker:9")]))
    assert found.reason == "ImagePullBackOff"
    assert "'reg.example/worker:9'" in found.message and reason in found.message
    assert "Back-off pulling image" in found.message


def test_crash_loop_with_the_last_exit():
    crash = container(state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                      last={"terminated": {"reason": "Error", "exitCode": 3, "message": "ray start failed"}},
                      restarts=4)
    found = pod_problem(pod(phase="Running", containers=[crash]))
    assert found == Waiting("CrashLoopBackOff", "head pod ej-pep-1234abcd-x7k2p-head-abcde: container ray-head "
                                                "keeps crashing (restarted 4 times, last exit code 3: ray start failed)")


def test_oom_killed_in_the_last_termination_wins_over_the_crash_loop():
    oom = container(state={"waiting": {"reason": "CrashLoopBackOff"}},
                    last={"terminated": {"reason": "OOMKilled", "exitCode": 137}}, restarts=2)
    found = pod_problem(pod(phase="Running", containers=[oom], memory="2Gi"))
    assert found.reason == "OOMKilled"
    assert "container ray-head was killed for running out of memory (limit 2Gi), restarted 2 times" in found.message
    assert "spec.workers.memory" in found.message


def test_oom_killed_just_now():
    oom = container(state={"terminated": {"reason": "OOMKilled", "exitCode": 137}})
    assert pod_problem(pod(phase="Running", containers=[oom])).reason == "OOMKilled"


def test_missing_secret_key_is_a_config_error():
    bad = container(state={"waiting": {"reason": "CreateContainerConfigError",
                                       "message": 'couldn\'t find key url in Secret ns/embedjob-db'}})
    found = pod_problem(pod(containers=[bad]))
    assert found.reason == "CreateContainerConfigError" and "couldn't find key url" in found.message


def test_stuck_init_container_of_a_worker():
    init = container("wait-gcs-ready", state={"waiting": {"reason": "CrashLoopBackOff"}},
                     last={"terminated": {"reason": "Error", "exitCode": 1}}, restarts=6)
    found = pod_problem(pod("w-1", node_type="worker", init=[init]))
    assert found.reason == "CrashLoopBackOff" and found.message.startswith("worker pod w-1: container wait-gcs-ready")


def test_failed_pod():
    found = pod_problem(pod(phase="Failed", reason="Evicted", message="The node was low on resource: memory."))
    assert found == Waiting("PodFailed", "head pod ej-pep-1234abcd-x7k2p-head-abcde failed: Evicted "
                                         "The node was low on resource: memory.")


def test_a_pod_on_its_way_has_no_problem():
    assert pod_problem(pod(containers=[container()])) is None
    running = container(state={"running": {"startedAt": T0}})
    assert pod_problem(pod(phase="Running", containers=[running])) is None


def test_the_worst_problem_names_the_job_and_the_others_are_counted():
    head = pod(conditions=[unschedulable()])
    worker = pod("w-1", node_type="worker",
                 containers=[container(state={"waiting": {"reason": "ImagePullBackOff", "message": "x"}})])
    found = waiting_for(CLUSTER, {"status": {}}, [head, worker], [])
    assert found.reason == "ImagePullBackOff" and found.message.endswith("(and 1 more pods with problems)")


def test_the_submitter_pod_is_diagnosed_too():
    submitter = pod("ej-pep-1234abcd-q8z", node_type="", phase="Running", containers=[container(
        "ray-job-submitter", state={"waiting": {"reason": "CrashLoopBackOff"}}, restarts=3)])
    found = waiting_for(CLUSTER, {"status": {"state": "ready"}}, [], [submitter])
    assert found.reason == "CrashLoopBackOff" and found.message.startswith("submitter pod ej-pep-1234abcd-q8z")


def test_raycluster_that_cannot_create_its_pods():
    cluster = {"metadata": {"name": CLUSTER}, "status": {"conditions": [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreateHeadPod",
         "message": 'pods "x" is forbidden: exceeded quota: compute'}]}}
    found = waiting_for(CLUSTER, cluster, [], [])
    assert found.reason == "RayClusterReplicaFailure"
    assert "FailedCreateHeadPod" in found.message and "exceeded quota" in found.message


def test_progress_without_a_problem():
    assert waiting_for(None, None, [], []) == Waiting("Initializing", "waiting for KubeRay to create the RayCluster")
    init = container("wait-gcs-ready", state={"running": {"startedAt": T0}})
    worker = pod("w-1", node_type="worker", init=[init])
    head = pod(phase="Running", containers=[container(state={"running": {"startedAt": T0}})])
    found = waiting_for(CLUSTER, {"status": {"state": ""}}, [worker, head], [])
    assert found == Waiting("Initializing", f"RayCluster {CLUSTER} is starting: head pod "
                            "ej-pep-1234abcd-x7k2p-head-abcde Running, worker pod w-1 Pending (in init container "
                            "wait-gcs-ready)")


# --- in the status ---------------------------------------------------------------------


def rayjob(deployment="Initializing") -> dict:
    return {"metadata": {"name": "ej-pep-1234abcd"}, "spec": {},
            "status": {"jobDeploymentStatus": deployment, "rayClusterName": CLUSTER}}


def observe(waiting: Waiting | None, deployment="Initializing") -> status.Observation:
    return status.Observation(generation=1, suspend=False, verdict=ACCEPTED, rayjob=rayjob(deployment), run=None,
                              progress_error=None, now=T0, waiting=waiting)


def test_a_stuck_job_shows_the_reason_and_the_message_and_warns_once():
    stuck = Waiting("Unschedulable", f"head pod h cannot be scheduled: {UNSCHEDULABLE}")
    first = status.desired_status({}, observe(Waiting("Initializing", "waiting for KubeRay to create the RayCluster")))
    running = status.find_condition(first, "Running")
    assert (running["status"], running["reason"]) == ("False", "Initializing") and "KubeRay" in running["message"]

    st = status.desired_status(first, observe(stuck))
    assert (st["state"], st["reason"]) == ("Pending", "Unschedulable")
    running = status.find_condition(st, "Running")
    assert (running["status"], running["reason"], running["message"]) == ("False", "Unschedulable", stuck.message)
    assert status.find_condition(st, "Complete")["message"] == ""
    [event] = events.transitions(first, st)
    assert (event.type, event.status, event.reason, event.warning) == ("Running", "False", "Unschedulable", True)
    assert events.transitions(st, status.desired_status(st, observe(stuck))) == []


def test_a_running_job_is_not_stuck():
    running = status.desired_status({}, observe(None, deployment="Running"))
    assert running["state"] == "Running" and "progress" not in running
