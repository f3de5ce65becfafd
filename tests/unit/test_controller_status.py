"""The review and the status functions (pure; no cluster)."""

from __future__ import annotations

import base64

import pytest

from controller import acceptance, events, failures, indexes, status
from controller.rayjob import build_rayjob
from controller.settings import Settings
from controller.acceptance import ACCEPTED, Verdict
from controller.run_reader import RunRow
from embedjob import api
from support.manifests import MINIMAL_SPEC, merged

T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"
SECRET = {"data": {"url": base64.b64encode(b"postgresql://u:p@db/x").decode()}}


def spec(**fields) -> api.EmbeddingJobSpec:
    return api.parse_spec(merged(MINIMAL_SPEC, fields))


# --- review ------------------------------------------------------------------------


@pytest.mark.parametrize("uri", ["/abs/in.jsonl", "file:///in.jsonl", "file:/in.jsonl", "s3://b/k.jsonl",
                                 "gs://b/k.csv", "https://host/x.parquet", "abfs://c/x.jsonl"])
def test_supported_sources_are_accepted(uri):
    assert acceptance.review(spec(source={"uri": uri}), SECRET) == ACCEPTED


@pytest.mark.parametrize("uri", ["pep-sample.jsonl", "data/in.jsonl", "./in.jsonl", "../in.jsonl", "~/in.jsonl",
                                 "file://in.jsonl", "file:in.jsonl"])
def test_relative_source_paths_are_refused_for_cluster_jobs(uri):
    """The driver's pod has no manifest directory to resolve a relative path against
    (`embedjob run` resolves it locally; the pod would fail with SourceUnavailable)."""
    verdict = acceptance.review(spec(source={"uri": uri}), SECRET)
    assert (verdict.accepted, verdict.reason) == (False, "RelativeSourcePath")
    assert verdict.message.startswith(f"spec.source.uri: {uri!r} is a relative path")
    assert acceptance.SAMPLE_IN_WORKER_IMAGE in verdict.message  # says what to write instead


@pytest.mark.parametrize("uri", ["ftp://host/x.jsonl", "hdfs://nn/x", "c:/data/x.jsonl", "postgres://db/t"])
def test_unsupported_source(uri):
    verdict = acceptance.review(spec(source={"uri": uri}), SECRET)
    assert (verdict.accepted, verdict.reason) == (False, "UnsupportedSource")
    assert "spec.source.uri" in verdict.message


def test_secret_missing_or_without_the_key():
    assert acceptance.review(spec(), None).reason == "SecretNotFound"
    for data in ({}, {"other": "eA=="}, {"url": ""}):
        verdict = acceptance.review(spec(), {"data": data})
        assert (verdict.accepted, verdict.reason) == (False, "SecretKeyMissing")
        assert "'url'" in verdict.message


def test_hub_model_must_be_a_commit():
    unpinned = spec(model={"package": None, "revision": "main"})
    assert acceptance.review(unpinned, SECRET).reason == "ModelNotPinned"
    pinned = spec(model={"package": None, "revision": "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"})
    assert acceptance.review(pinned, SECRET).accepted


def test_parse_names_the_field():
    verdict = acceptance.parse(merged(MINIMAL_SPEC, {"batching": {"batchSize": 0}}))
    assert isinstance(verdict, Verdict) and verdict.reason == "InvalidSpec"
    assert "spec.batching.batchSize" in verdict.message


# --- status ------------------------------------------------------------------------


def rayjob(deployment: str = "", job_status: str = "", **status_fields) -> dict:
    st = {"jobDeploymentStatus": deployment, "jobStatus": job_status, **status_fields}
    return {"metadata": {"name": "ej-pep-1234abcd"}, "spec": {"suspend": False},
            "status": {k: v for k, v in st.items() if v}}


def run(state="running", total=400, done=120, failed=0, reason=None, error=None) -> RunRow:
    return RunRow(state=state, reason=reason, error=error, batches_total=total, batches_succeeded=done,
                       batches_failed=failed, records_embedded=done * 64, records_failed=0,
                       texts_per_second=55.26, heartbeat_at=None)


def observe(now=T0, generation=1, suspend=False, verdict=None, rj=None, run_=None, progress_error=None):
    return status.Observation(generation=generation, suspend=suspend, verdict=verdict, rayjob=rj, run=run_,
                              progress_error=progress_error, now=now)


def conditions(st: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}


def test_nothing_is_written_before_anything_is_known():
    assert status.desired_status({}, observe()) is None


def test_refused_job_is_pending_with_the_reason():
    st = status.desired_status({}, observe(verdict=Verdict(False, "SecretNotFound", "Secret 'db' does not exist")))
    assert st["state"] == "Pending" and st["reason"] == "SecretNotFound" and st["observedGeneration"] == 1
    assert conditions(st) == {
        "Accepted": ("False", "SecretNotFound"), "Running": ("False", "SecretNotFound"),
        "Complete": ("False", "SecretNotFound"), "Failed": ("False", "SecretNotFound"),
        "Suspended": ("False", "SecretNotFound"),
    }
    [event] = events.transitions({}, st)
    assert (event.type, event.status, event.reason, event.warning) == ("Accepted", "False", "SecretNotFound", True)


def test_progress_names_the_runs_revision_its_state_and_the_collections_ready_one():
    incoming = run().model_copy(update={"model": "intfloat/e5-small-v2", "revision": "ffb93f3+p2e8e1ab",
                                        "revision_state": "embedding", "ready_revision": "all-MiniLM-L6-v2@7e54b3b"})
    progress = status.progress_of(incoming)
    assert (progress["revision"], progress["revisionState"], progress["readyRevision"]) == (
        "intfloat/e5-small-v2@ffb93f3+p2e8e1ab", "embedding", "all-MiniLM-L6-v2@7e54b3b")
    # a run row from before migration 0015 (no revision recorded) adds nothing
    assert not {"revision", "revisionState", "readyRevision"} & status.progress_of(run()).keys()


def test_progress_says_which_rows_a_table_run_read_by_its_change_column():
    windowed = run().model_copy(update={"rows_read": "changed since 2026-01-01T09:00:00+00:00 (or updated_at NULL); "
                                                     "watermark left 2026-01-01T10:00:00+00:00"})
    assert status.progress_of(windowed)["rowsRead"].startswith("changed since 2026-01-01T09:00:00+00:00")
    assert "rowsRead" not in status.progress_of(run())  # a file's run, or a table without a change column


def test_lifecycle_to_complete():
    pending = status.desired_status({}, observe(T0, verdict=ACCEPTED, rj=rayjob()))
    assert pending["state"] == "Pending" and pending["reason"] == "Initializing"
    assert conditions(pending)["Accepted"] == ("True", "RayJobCreated")
    assert pending["rayJobName"] == "ej-pep-1234abcd"

    running_rj = rayjob("Running", "RUNNING", rayClusterName="ej-pep-1234abcd-x7k2p",
                        dashboardURL="ej-head-svc:8265", startTime=T1)
    running = status.desired_status(pending, observe(T1, verdict=ACCEPTED, rj=running_rj, run_=run()))
    assert running["state"] == "Running" and running["startTime"] == T1
    assert running["rayClusterName"] == "ej-pep-1234abcd-x7k2p" and running["dashboardURL"] == "ej-head-svc:8265"
    assert running["jobDeploymentStatus"] == "Running" and running["jobStatus"] == "RUNNING"
    assert running["progress"] == {"batchesTotal": 400, "batchesSucceeded": 120, "batchesFailed": 0,
                                   "recordsEmbedded": 7680, "recordsFailed": 0, "textsPerSecond": 55.3,
                                   "recordsNew": 0, "recordsChanged": 0, "recordsUnchanged": 0,
                                   "recordsDeleted": 0, "chunksEmbedded": 0, "summary": "120/400 batches"}
    by_type = {c["type"]: c for c in running["conditions"]}
    assert by_type["Running"]["message"] == "120/400 batches, 55.3 texts/s"
    assert by_type["Running"]["lastTransitionTime"] == T1
    assert by_type["Accepted"]["lastTransitionTime"] == T0  # unchanged status keeps its time
    assert [(t.type, t.reason) for t in events.transitions(pending, running)] == [("Running", "JobRunning")]

    done_rj = rayjob("Complete", "SUCCEEDED", rayClusterName="ej-pep-1234abcd-x7k2p", startTime=T1, endTime=T2)
    done = status.desired_status(running, observe(T2, verdict=ACCEPTED, rj=done_rj,
                                                  run_=run(state="succeeded", done=400)))
    assert done["state"] == "Complete" and done["completionTime"] == T2
    assert conditions(done)["Complete"] == ("True", "Succeeded") and conditions(done)["Running"][0] == "False"
    assert done["progress"]["summary"] == "400/400 batches"
    assert status.is_final(done)
    [event] = events.transitions(running, done)
    assert (event.type, event.warning) == ("Complete", False)

    # Final: a later change of the RayJob (deleted after its TTL) does not reopen the job.
    later = status.desired_status(done, observe(T2, rj=None))
    assert status.status_patch(done, later) == {}


def test_observed_generation_follows_the_spec():
    first = status.desired_status({}, observe(verdict=ACCEPTED, rj=rayjob("Running", "RUNNING")))
    second = status.desired_status(first, observe(generation=2, verdict=ACCEPTED, rj=rayjob("Running", "RUNNING")))
    assert second["observedGeneration"] == 2
    assert all(c["observedGeneration"] == 2 for c in second["conditions"])
    assert status.status_patch(first, second).keys() == {"observedGeneration", "conditions"}


def test_progress_unavailable_is_reported_not_failed():
    before = status.desired_status({}, observe(verdict=ACCEPTED, rj=rayjob("Running", "RUNNING"), run_=run()))
    st = status.desired_status(before, observe(verdict=ACCEPTED, rj=rayjob("Running", "RUNNING"),
                                               progress_error="OperationalError: connection refused"))
    assert st["state"] == "Running"
    running = next(c for c in st["conditions"] if c["type"] == "Running")
    assert running["message"] == "progress unavailable: OperationalError: connection refused"
    assert st["progress"] == before["progress"]  # the last known numbers stay


@pytest.mark.parametrize(
    "rj, run_, reason",
    [
        (rayjob("Complete", "FAILED", message="Job entrypoint command failed with exit code 1"),
         run(state="failed", reason="TooManyFailedBatches", error="7 batches failed, 0 tolerated"),
         "TooManyFailedBatches"),
        (rayjob("Failed", "RUNNING", reason="DeadlineExceeded", message="deadline"), None, "DeadlineExceeded"),
        (rayjob("Complete", "FAILED", message="Job entrypoint command failed with exit code 2, last logs"), None,
         "InvalidSpec"),
        (rayjob("Complete", "FAILED", message="Job entrypoint command failed with exit code 3"), None,
         "RayUnavailable"),
        (rayjob("Complete", "STOPPED"), None, "RayJobStopped"),
        (rayjob("Failed", "", reason="SubmissionFailed", message="submitter failed"), None, "RayJobFailed"),
        (rayjob("ValidationFailed", message="spec invalid"), None, "RayJobValidationFailed"),
        (rayjob("Complete", "SUCCEEDED"), run(state="failed", reason="TooManyFailedBatches"), "TooManyFailedBatches"),
    ],
)
def test_failure_reasons_are_specific(rj, run_, reason):
    st = status.desired_status({}, observe(verdict=ACCEPTED, rj=rj, run_=run_))
    assert st["state"] == "Failed" and st["reason"] == reason
    assert conditions(st)["Failed"] == ("True", reason)
    [event] = [t for t in events.transitions({}, st) if t.type == "Failed"]
    assert event.warning


def test_failed_message_mirrors_the_rayjob():
    rj = rayjob("Complete", "FAILED", reason="AppFailed", message="Job entrypoint command failed with exit code 1")
    st = status.desired_status({}, observe(verdict=ACCEPTED, rj=rj))
    assert st["rayJobReason"] == "AppFailed" and st["rayJobMessage"].startswith("Job entrypoint command failed")
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["message"] == "Job entrypoint command failed with exit code 1"


def test_suspend_and_resume():
    running = status.desired_status({}, observe(T0, verdict=ACCEPTED, rj=rayjob("Running", "RUNNING")))
    suspended = status.desired_status(running, observe(T1, suspend=True, rj=rayjob("Suspended")))
    assert suspended["state"] == "Suspended"
    assert conditions(suspended)["Suspended"] == ("True", "Suspended")
    assert conditions(suspended)["Running"][0] == "False"
    assert [t.type for t in events.transitions(running, suspended)] == ["Suspended"]
    resumed = status.desired_status(suspended, observe(T2, rj=rayjob("Running", "RUNNING")))
    assert resumed["state"] == "Running" and conditions(resumed)["Suspended"][0] == "False"
    assert [t.type for t in events.transitions(suspended, resumed)] == ["Running"]


def test_created_suspended():
    st = status.desired_status({}, observe(suspend=True, verdict=ACCEPTED, rj=rayjob("")))
    assert st["state"] == "Suspended"


def test_acceptance_survives_a_restart_without_a_review():
    refused = status.desired_status({}, observe(T0, verdict=Verdict(False, "SecretKeyMissing", "no key")))
    again = status.desired_status(refused, observe(T1))  # restarted: no verdict yet, no RayJob
    assert status.status_patch(refused, again) == {}


def test_status_patch_removes_what_is_gone():
    assert status.status_patch({"a": 1, "b": 2}, {"a": 1, "c": 3}) == {"b": None, "c": 3}
    # nested too: a merge patch keeps the fields of an object it does not name
    assert status.status_patch({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"b": 1}, "d": [2]}) == {"a": {"c": None},
                                                                                            "d": [2]}


def test_progress_summary_without_a_total():
    assert status.progress_of(run(total=None, done=7, failed=2))["summary"] == "7 batches, 2 failed"
    assert "batchesTotal" not in status.progress_of(run(total=None))


def test_failed_message_says_where_the_drivers_log_is():
    """The RayJob as the operator's watch index keeps it (indexes.rayjob_entry), not as built by hand."""
    job = {"apiVersion": api.API_VERSION, "kind": api.KIND, "spec": MINIMAL_SPEC,
           "metadata": {"name": "pep", "namespace": "team-a", "uid": "u-1"}}
    manifest = build_rayjob(job, api.parse_spec(MINIMAL_SPEC), Settings.from_env({}))
    manifest["metadata"]["uid"] = "rj-1"
    manifest["status"] = {"jobDeploymentStatus": "Complete", "jobStatus": "FAILED",
                          "message": "Job entrypoint command failed with exit code 1 " + "x" * 2000}
    [[key, rj]] = indexes.rayjob_entry(manifest).items()
    assert key == ("team-a", "u-1")
    st = status.desired_status({}, observe(verdict=ACCEPTED, rj=rj))
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["message"].startswith("Job entrypoint command failed with exit code 1")
    assert failed["message"].endswith("; the driver's log: `embedjob logs pep -n team-a` (docs/troubleshooting.md)")
    assert len(failed["message"]) <= failures.MAX_MESSAGE


@pytest.mark.parametrize("deployment", ["Retrying", "New", "Initializing"])
def test_a_new_attempt_after_a_failed_one_shows_as_retrying(deployment):
    """KubeRay's Retrying lasts one reconcile; its failed count tells the next attempt's start apart
    from the first attempt's."""
    rj = rayjob(deployment, failed=1)
    rj["spec"]["backoffLimit"] = 2
    st = status.desired_status({}, observe(verdict=ACCEPTED, rj=rj))
    assert (st["state"], st["reason"], st["failedAttempts"]) == ("Pending", "Retrying", 1)
    running = next(c for c in st["conditions"] if c["type"] == "Running")
    assert running["message"] == "attempt 2 of 3, after 1 failed: waiting for its new RayCluster"


def test_a_first_attempt_has_no_failed_count():
    st = status.desired_status({}, observe(verdict=ACCEPTED, rj=rayjob("Initializing")))
    assert st["reason"] == "Initializing" and "failedAttempts" not in st


def test_progress_shows_the_document_prompt_of_the_run_row():
    prompted = run().model_copy(update={"prompt": "'passage: ' (the model's 'passage' prompt (its document prompt))"})
    assert status.progress_of(prompted)["prompt"] == "'passage: ' (the model's 'passage' prompt (its document prompt))"
    assert "prompt" not in status.progress_of(run())  # a run row from before migration 0013
