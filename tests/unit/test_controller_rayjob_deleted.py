"""A RayJob deleted under an unfinished job: the job ends with the run's outcome, else Failed/RayJobDeleted."""

import pytest

from controller import status
from controller.acceptance import ACCEPTED
from controller.run_reader import RunRow

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
