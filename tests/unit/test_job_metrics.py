"""Per-job Prometheus series: computed from the stored status by a pure function, removed with the job."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from controller.job_metrics import job_samples
from controller.metrics import JobStates

META = {"namespace": "team-a", "name": "pep", "uid": "u-1"}
SPEC = {"sink": {"table": "pep_vectors", "collection": "docs"}}
COMPLETE = {"state": "Complete", "completionTime": "2026-12-05T10:00:00Z",
            "progress": {"recordsEmbedded": 1000, "recordsFailed": 2, "recordsNew": 10, "recordsChanged": 3,
                         "recordsUnchanged": 987, "recordsDeleted": 1, "textsPerSecond": 95.5}}


def test_a_completed_job_has_its_state_its_success_time_by_collection_and_its_counters():
    samples = job_samples(META, SPEC, COMPLETE)
    assert samples == {
        ("embedjob_job_state", ("team-a", "pep", "Complete")): 1.0,
        ("embedjob_job_last_success_timestamp_seconds", ("team-a", "pep", "pep_vectors", "docs")): 1796464800.0,
        ("embedjob_job_records", ("team-a", "pep", "embedded")): 1000.0,
        ("embedjob_job_records", ("team-a", "pep", "failed")): 2.0,
        ("embedjob_job_records", ("team-a", "pep", "new")): 10.0,
        ("embedjob_job_records", ("team-a", "pep", "changed")): 3.0,
        ("embedjob_job_records", ("team-a", "pep", "unchanged")): 987.0,
        ("embedjob_job_records", ("team-a", "pep", "deleted")): 1.0,
        ("embedjob_job_texts_per_second", ("team-a", "pep")): 95.5,
    }


@pytest.mark.parametrize("status", [
    {"state": "Failed", "completionTime": "2026-12-05T10:00:00Z"},  # finished, not a success
    {"state": "Running"},
    {"state": "Complete"},  # no completionTime (yet)
    {"state": "Complete", "completionTime": "yesterday"},
    {"state": "Complete", "completionTime": "2026-12-05T10:00:00"},  # no zone: not a moment
    {"state": "Complete", "completionTime": 1796464800},
])
def test_only_a_complete_job_with_a_completion_time_has_a_last_success(status):
    samples = job_samples(META, SPEC, status)
    assert not [key for key in samples if key[0] == "embedjob_job_last_success_timestamp_seconds"]
    assert samples[("embedjob_job_state", ("team-a", "pep", status["state"]))] == 1.0


@pytest.mark.parametrize("progress", [None, "garbage", {"recordsEmbedded": "12", "textsPerSecond": "fast"},
                                      {"recordsEmbedded": None}, {"recordsEmbedded": 1.5},
                                      {"recordsEmbedded": True}, ["recordsEmbedded"]])
def test_hostile_progress_gives_no_counter_series_and_no_crash(progress):
    samples = job_samples(META, {}, {"progress": progress})
    assert samples == {}


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_the_series_follow_the_job_and_go_with_it():
    states = JobStates()
    job = {"metadata": {**META, "uid": "u-metrics"}, "spec": SPEC}
    states.observe("u-metrics", job, {"state": "Running", "progress": {"recordsEmbedded": 10}})
    assert _value("embedjob_job_state", namespace="team-a", embeddingjob="pep", state="Running") == 1.0
    assert _value("embedjob_job_records", namespace="team-a", embeddingjob="pep", outcome="embedded") == 10.0

    states.observe("u-metrics", job, COMPLETE)
    assert _value("embedjob_job_state", namespace="team-a", embeddingjob="pep", state="Running") is None
    assert _value("embedjob_job_state", namespace="team-a", embeddingjob="pep", state="Complete") == 1.0
    assert _value("embedjob_job_last_success_timestamp_seconds", namespace="team-a", embeddingjob="pep",
                  vectors_table="pep_vectors", collection="docs") == 1796464800.0

    states.forget("u-metrics")
    for outcome in ("embedded", "unchanged"):
        assert _value("embedjob_job_records", namespace="team-a", embeddingjob="pep", outcome=outcome) is None
    assert _value("embedjob_job_state", namespace="team-a", embeddingjob="pep", state="Complete") is None
    assert states._samples == {} and states._states == {}


def test_a_scheduled_jobs_last_success_is_its_latest_completed_runs():
    status = {"state": "Scheduled", "schedule": {"lastSuccessfulTime": "2026-12-05T10:00:00Z"}}
    samples = job_samples(META, SPEC, status)
    assert samples[("embedjob_job_last_success_timestamp_seconds", ("team-a", "pep", "pep_vectors", "docs"))] == (
        1796464800.0)
    assert ("embedjob_job_state", ("team-a", "pep", "Scheduled")) in samples
    assert job_samples(META, SPEC, {"state": "Scheduled", "schedule": "garbage"}) == {
        ("embedjob_job_state", ("team-a", "pep", "Scheduled")): 1.0}
