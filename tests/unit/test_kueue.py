"""Kueue queueing without a cluster: the RayJob's queue labels and suspend, the operator's default queue,
and the EmbeddingJob's Queued / Preempted states (controller.queueing, controller.status)."""

from __future__ import annotations

import pytest
import yaml

from controller import events, queueing, status
from controller.acceptance import ACCEPTED
from controller.rayjob import build_rayjob
from controller.settings import Settings, SettingsError
from embedjob import api
from embedjob.contract import decode_job_config
from embedjob_worker.core.config import JobConfig
from support.manifests import MINIMAL_SPEC, merged
from support.paths import REPO

UID = "0b5c6d3e-1111-2222-3333-444455556666"
T0, T1, T2, T3, T4 = (f"2026-01-01T00:0{m}:00Z" for m in range(5))


def job(**spec) -> dict:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": "pep", "namespace": "team-a", "uid": UID}, "spec": merged(MINIMAL_SPEC, spec)}


def build(settings: Settings | None = None, **spec) -> dict:
    manifest = job(**spec)
    return build_rayjob(manifest, api.parse_spec(manifest["spec"]), settings or Settings.from_env({}))


def kueue_labels(rayjob: dict) -> dict:
    return {k: v for k, v in rayjob["metadata"]["labels"].items() if k.startswith("kueue.x-k8s.io/")}


# --- the RayJob --------------------------------------------------------------------


def test_a_queued_job_is_created_suspended_with_its_queue_and_priority_class():
    rayjob = build(queueName="batch", workloadPriorityClass="high-priority")
    assert rayjob["spec"]["suspend"] is True
    assert kueue_labels(rayjob) == {"kueue.x-k8s.io/queue-name": "batch",
                                    "kueue.x-k8s.io/priority-class": "high-priority"}
    # what Kueue's RayJob webhook would refuse is not there
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True and "clusterSelector" not in rayjob["spec"]
    assert rayjob["metadata"]["labels"]["embedjob.dev/job-uid"] == UID  # our labels stay


def test_a_job_outside_a_queue_is_unchanged():
    rayjob = build()
    assert rayjob["spec"]["suspend"] is False and kueue_labels(rayjob) == {}
    assert build(suspend=True)["spec"]["suspend"] is True


def test_the_operators_default_queue_applies_when_the_job_names_none():
    settings = Settings.from_env({"EMBEDJOB_DEFAULT_QUEUE_NAME": "team-queue"})
    assert kueue_labels(build(settings)) == {"kueue.x-k8s.io/queue-name": "team-queue"}
    assert build(settings)["spec"]["suspend"] is True
    assert kueue_labels(build(settings, queueName="gpu"))["kueue.x-k8s.io/queue-name"] == "gpu"
    # an existing cluster is no Kueue workload: no queue
    shared = build(settings, clusterSelector={"ray.io/cluster": "pool"}, retry={"backoffLimit": 0})
    assert kueue_labels(shared) == {} and shared["spec"]["suspend"] is False


def test_the_run_key_is_the_jobs_uid_whatever_kueue_does_to_the_rayjob():
    """Kueue changes the RayJob's suspend and pod templates, never its entrypoint: the driver of a
    readmitted job resumes the same run (its key) and skips the batches already written."""
    config = decode_job_config(build(queueName="batch")["spec"]["entrypoint"].split()[-1])
    assert JobConfig.from_manifest(config).job_key == UID


# --- validation ---------------------------------------------------------------------


@pytest.mark.parametrize("field,value", [
    ("queueName", "Batch"), ("queueName", "team_queue"), ("queueName", "-batch"), ("queueName", "a" * 64),
    ("queueName", ""), ("queueName", "team.queue"), ("workloadPriorityClass", "High"),
    ("workloadPriorityClass", "p" * 64), ("workloadPriorityClass", "high-"),
])
def test_malformed_queue_fields_are_refused_naming_the_field(field, value):
    with pytest.raises(api.SpecError) as refused:
        api.parse_spec(merged(MINIMAL_SPEC, {field: value}))
    assert [path for path, _ in refused.value.problems] == [f"spec.{field}"]


def test_queue_fields_that_are_well_formed_parse():
    spec = api.parse_spec(merged(MINIMAL_SPEC, {"queueName": "a" * 63, "workloadPriorityClass": "prod.high"}))
    assert (spec.queue_name, spec.workload_priority_class) == ("a" * 63, "prod.high")


def test_default_queue_setting():
    assert Settings.from_env({}).default_queue_name is None
    assert Settings.from_env({"EMBEDJOB_DEFAULT_QUEUE_NAME": " "}).default_queue_name is None
    assert Settings.from_env({"EMBEDJOB_DEFAULT_QUEUE_NAME": "team-queue"}).default_queue_name == "team-queue"
    for bad in ("Team", "a_b", "x" * 64):
        with pytest.raises(SettingsError, match="EMBEDJOB_DEFAULT_QUEUE_NAME"):
            Settings.from_env({"EMBEDJOB_DEFAULT_QUEUE_NAME": bad})


def test_a_suspended_job_under_the_default_queue_is_refused():
    """Kueue would start it regardless (the CRD refuses suspend with an explicit queueName)."""
    settings = Settings.from_env({"EMBEDJOB_DEFAULT_QUEUE_NAME": "team-queue"})
    verdict = queueing.refusal(api.parse_spec(merged(MINIMAL_SPEC, {"suspend": True})), settings)
    assert (verdict.accepted, verdict.reason) == (False, "SuspendedInQueue")
    assert verdict.message.startswith("spec.suspend:") and "'team-queue'" in verdict.message
    assert queueing.refusal(api.parse_spec(merged(MINIMAL_SPEC, {"suspend": True})), Settings.from_env({})) is None
    assert queueing.refusal(api.parse_spec(MINIMAL_SPEC), settings) is None


# --- status --------------------------------------------------------------------------


def kueue_rayjob(suspend: bool, deployment: str = "", job_status: str = "", **status_fields) -> dict:
    st = {"jobDeploymentStatus": deployment, "jobStatus": job_status, **status_fields}
    return {"metadata": {"name": "ej-pep-1234abcd", "namespace": "team-a",
                         "labels": {"kueue.x-k8s.io/queue-name": "batch", "kueue.x-k8s.io/priority-class": "low"}},
            "spec": {"suspend": suspend}, "status": {k: v for k, v in st.items() if v}}


def sync(current: dict, now: str, rj: dict) -> dict:
    return status.desired_status(current, status.Observation(
        generation=1, suspend=False, verdict=ACCEPTED, rayjob=rj, run=None, progress_error=None, now=now))


def conditions(st: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}


def message(st: dict, type_: str) -> str:
    return next(c["message"] for c in st["conditions"] if c["type"] == type_)


@pytest.mark.parametrize("deployment", ["", "Initializing", "Suspending", "Suspended"])
def test_a_rayjob_waiting_for_admission_is_queued(deployment):
    """KubeRay takes a RayJob created suspended from New through Initializing and Suspending to
    Suspended without creating a cluster; each of these is Queued while Kueue has not admitted it."""
    st = sync({}, T0, kueue_rayjob(True, deployment, startTime=T0))
    assert (st["state"], st["reason"]) == ("Queued", "WaitingForAdmission")
    assert conditions(st)["Queued"] == ("True", "WaitingForAdmission")
    assert conditions(st)["Running"][0] == conditions(st)["Suspended"][0] == "False"
    assert "LocalQueue batch, priority class low" in message(st, "Queued")
    assert "startTime" not in st  # KubeRay's startTime marks when it was queued, not started
    [event] = [t for t in events.transitions({}, st) if t.type == "Queued"]
    assert (event.status, event.reason, event.warning) == ("True", "WaitingForAdmission", False)


def test_admitted_then_preempted_then_readmitted():
    queued = sync({}, T0, kueue_rayjob(True, "Suspended"))

    admitted = sync(queued, T1, kueue_rayjob(False, "Suspended"))  # Kueue unsuspended it; KubeRay has not moved
    assert (admitted["state"], admitted["reason"]) == ("Pending", "Admitted")
    assert conditions(admitted)["Queued"] == ("False", "Admitted") and admitted["startTime"] == T1

    running = sync(admitted, T2, kueue_rayjob(False, "Running", "RUNNING", rayClusterName="ej-pep-1234abcd-x1",
                                              startTime=T1))
    assert running["state"] == "Running" and conditions(running)["Queued"] == ("False", "JobRunning")

    for deployment in ("Running", "Suspending", "Suspended"):  # Kueue suspended it; KubeRay deletes the cluster
        preempted = sync(running, T3, kueue_rayjob(True, deployment))
        assert (preempted["state"], preempted["reason"]) == ("Suspended", "Preempted")
        assert conditions(preempted)["Suspended"] == ("True", "Preempted")
        assert conditions(preempted)["Queued"][0] == "False"
        assert "resumes when Kueue readmits it" in message(preempted, "Suspended")
    assert [(t.type, t.reason) for t in events.transitions(running, preempted)] == [("Suspended", "Preempted")]

    readmitted = sync(preempted, T4, kueue_rayjob(False, "Suspended"))
    assert (readmitted["state"], readmitted["reason"]) == ("Pending", "Admitted")
    rerun = sync(readmitted, T4, kueue_rayjob(False, "Initializing", rayClusterName="ej-pep-1234abcd-x2"))
    assert rerun["state"] == "Pending" and rerun["startTime"] == T1  # the first start stays


def test_a_finished_queued_job_is_final():
    done = sync({"startTime": T1, "state": "Running"}, T2,
                kueue_rayjob(False, "Complete", "SUCCEEDED", startTime=T1, endTime=T2))
    assert done["state"] == "Complete"
    # Kueue may still touch the finished RayJob; the job stays Complete
    assert sync(done, T3, kueue_rayjob(True, "Complete", "SUCCEEDED"))["state"] == "Complete"


def test_a_job_outside_a_queue_has_no_queued_condition():
    st = sync({}, T0, {"metadata": {"name": "ej-pep-1234abcd"}, "spec": {"suspend": False}, "status": {}})
    assert "Queued" not in conditions(st) and st["state"] == "Pending"


def test_the_example_job_is_queued_with_its_priority_class():
    documents = list(yaml.safe_load_all((REPO / "examples" / "kueue.yaml").read_text()))
    [manifest] = [d for d in documents if d["kind"] == api.KIND]
    [local_queue] = [d for d in documents if d["kind"] == "LocalQueue"]
    [priority] = [d for d in documents if d["kind"] == "WorkloadPriorityClass"]
    manifest["metadata"]["uid"] = UID
    rayjob = build_rayjob(manifest, api.parse_spec(manifest["spec"]), Settings.from_env({}))
    assert kueue_labels(rayjob) == {"kueue.x-k8s.io/queue-name": local_queue["metadata"]["name"],
                                    "kueue.x-k8s.io/priority-class": priority["metadata"]["name"]}
    assert local_queue["metadata"]["namespace"] == manifest["metadata"]["namespace"]
    assert rayjob["spec"]["suspend"] is True


def test_the_rayjob_index_keeps_the_labels_the_queue_states_need():
    labels = {"kueue.x-k8s.io/queue-name": "batch", "kueue.x-k8s.io/priority-class": "low",
              "embedjob.dev/job-uid": UID, "kueue.x-k8s.io/other": "x"}
    kept = queueing.kueue_labels_of(labels)
    assert kept == {"kueue.x-k8s.io/queue-name": "batch", "kueue.x-k8s.io/priority-class": "low"}
    assert queueing.queue_of({"metadata": {"labels": kept}}) == "batch"
