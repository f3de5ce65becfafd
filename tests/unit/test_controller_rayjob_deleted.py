"""A RayJob deleted under an unfinished job: the job ends with the run's outcome, else Failed/RayJobDeleted."""

import asyncio

import pytest

from controller import status
from controller.acceptance import ACCEPTED, Verdict
from controller.keeper import StatusKeeper
from controller.metrics import JobStates
from controller.reconcile import Context
from controller.run_reader import RunRow, RunUnavailable
from controller.settings import Settings

RUNNING = {"state": "Running", "reason": "JobRunning", "rayJobName": "ej-pep-1234abcd",
           "jobDeploymentStatus": "Running", "conditions": []}


def observe(deleted: bool, run: RunRow | None = None) -> status.Observation:
    return status.Observation(generation=1, suspend=False, verdict=ACCEPTED, rayjob=None, run=run,
                              progress_error=None, now="2026-01-01T00:05:00Z", rayjob_deleted=deleted)


def test_a_deleted_rayjob_fails_the_job():
    st = status.desired_status(RUNNING, observe(deleted=True))
    assert (st["state"], st["reason"]) == ("Failed", "RayJobDeleted")
    assert st["completionTime"] == "2026-01-01T00:05:00Z" and st["rayJobName"] == "ej-pep-1234abcd"
    (failed,) = [c for c in st["conditions"] if c["type"] == "Failed"]
    assert failed["status"] == "True" and "ej-pep-1234abcd was deleted" in failed["message"]
    assert status.is_final(st)


@pytest.mark.parametrize("run, outcome", [
    (RunRow(state="succeeded", batches_total=4, batches_succeeded=4, records_total=10, records_embedded=10),
     ("Complete", "Succeeded")),
    (RunRow(state="failed", reason="TooManyFailedBatches", error="3 batches failed"),
     ("Failed", "TooManyFailedBatches")),
    (RunRow(state="running", batches_succeeded=2), ("Failed", "RayJobDeleted")),
])
def test_the_run_row_decides_when_it_has_an_outcome(run, outcome):
    st = status.desired_status(RUNNING, observe(deleted=True, run=run))
    assert (st["state"], st["reason"]) == outcome


def test_a_rayjob_not_yet_seen_is_not_deleted():
    st = status.desired_status({}, observe(deleted=False))
    assert (st["state"], st["reason"]) == ("Pending", "CreatingRayJob")


class FlakyRuns:
    """The run table, readable only from the second read on."""

    def __init__(self, row: RunRow):
        self.row, self.reads = row, 0

    def latest(self, uid, namespace, name):
        self.reads += 1
        if self.reads == 1:
            raise RunUnavailable("connection refused")
        return self.row


class StoringKube:
    def __init__(self):
        self.patches = []

    async def patch_job_status(self, namespace, name, patch, resource_version=None):
        self.patches.append(patch)
        return patch

    async def get_rayjob(self, namespace, name):
        return None  # deleted, as the API server confirms

    async def namespace_terminating(self, namespace):
        return False


@pytest.mark.parametrize("rayjob", [None, {"metadata": {"name": "ej-pep-1234abcd", "namespace": "ns", "uid": "r",
                                                        "ownerReferences": [{"kind": "EmbeddingJob", "uid": "u-1",
                                                                             "controller": True}]},
                                           "spec": {}, "status": {"jobDeploymentStatus": "Complete",
                                                                  "jobStatus": "SUCCEEDED"}}],
                         ids=["rayjob-deleted", "rayjob-complete"])
def test_a_failed_read_of_the_run_never_decides_the_final_state(rayjob):
    """Issue 26 item 9: the run row says succeeded, 400/400; the one read at the end fails. The status
    stays as it was (not Failed/RayJobDeleted at 120/400, not Complete at 120/400) and the next sync,
    whose read gets through, decides from the whole run."""
    row = RunRow(state="succeeded", batches_total=400, batches_succeeded=400, records_total=400,
                 records_embedded=400)
    kube, runs = StoringKube(), FlakyRuns(row)
    ctx = Context(settings=Settings.from_env({}), kube=kube, runs=runs, job_states=JobStates())
    keeper = StatusKeeper(ctx, emit=lambda job, change: None)
    running = {**RUNNING, "progress": {"batchesSucceeded": 120, "batchesTotal": 400}}
    job = {"metadata": {"name": "pep", "namespace": "ns", "uid": "u-1", "generation": 1},
           "spec": {"suspend": False}, "status": running}
    keeper.attach({"u-1": [job]}, {("ns", "u-1"): [rayjob]} if rayjob else {})
    keeper.note_verdict("u-1", ACCEPTED, 1)

    asyncio.run(keeper.sync("u-1"))
    assert kube.patches == [] and runs.reads == 1  # nothing decided on the failed read
    asyncio.run(keeper.sync("u-1"))
    [patch] = kube.patches
    assert (patch["state"], patch["reason"]) == ("Complete", "Succeeded"), patch
    assert patch["progress"]["batchesSucceeded"] == 400


def test_a_job_being_deleted_gets_no_sync_gauge_or_event_and_nothing_of_it_is_kept():
    """Issue 26 item 10: the RayJob's DELETED event comes while the finalizer holds the job; the sync
    it asks for wrote Failed/RayJobDeleted with a Warning on a job the user deleted, and put it back
    into the gauge and the keeper's maps for good."""
    kube, emitted, states = StoringKube(), [], JobStates()
    ctx = Context(settings=Settings.from_env({}), kube=kube, runs=None, job_states=states)
    keeper = StatusKeeper(ctx, emit=lambda job, change: emitted.append(change))
    job = {"metadata": {"name": "pep", "namespace": "ns", "uid": "u-1", "generation": 1,
                        "deletionTimestamp": "2026-01-01T00:04:00Z"}, "spec": {"suspend": False}, "status": RUNNING}
    keeper.attach({"u-1": [job]}, {})
    keeper.forget("u-1")  # the cleanup handler's first step

    asyncio.run(keeper.sync("u-1"))  # the RayJob's deletion, seen while the finalizer runs
    assert kube.patches == [] and emitted == []
    assert states._states == {} and states._samples == {} and keeper._written == {} and keeper._locks == {}


def test_observed_generation_names_the_reviewed_generation_not_an_edit_waiting_for_its_review():
    """Issue 26 item 11: a periodic sync between an edit (generation 2) and its review stamped 2."""
    kube = StoringKube()
    ctx = Context(settings=Settings.from_env({}), kube=kube, runs=None, job_states=JobStates())
    keeper = StatusKeeper(ctx, emit=lambda job, change: None)
    refused = {"state": "Pending", "reason": "SecretNotFound", "observedGeneration": 1, "conditions": []}
    job = {"metadata": {"name": "pep", "namespace": "ns", "uid": "u-1", "generation": 2},  # edited since
           "spec": {"suspend": False}, "status": refused}
    keeper.attach({"u-1": [job]}, {})
    keeper.note_verdict("u-1", Verdict(False, "SecretNotFound", "Secret 'db' does not exist"), 1)

    asyncio.run(keeper.sync("u-1"))
    assert all(patch.get("observedGeneration", 1) == 1 for patch in kube.patches), kube.patches
    assert all(c["observedGeneration"] == 1 for patch in kube.patches for c in patch.get("conditions", []))
    keeper.note_verdict("u-1", Verdict(False, "SecretNotFound", "Secret 'db' does not exist"), 2)  # its review
    asyncio.run(keeper.sync("u-1"))
    assert kube.patches[-1]["observedGeneration"] == 2
