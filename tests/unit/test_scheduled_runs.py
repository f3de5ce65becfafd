"""A scheduled job (spec.schedule): its review creates no RayJob, its runs' manifests, reading them back from the
index, and its status (controller.scheduled_runs, controller.reconcile)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from controller import events, indexes, reconcile, status
from controller.acceptance import SCHEDULE_ACCEPTED
from controller.metrics import JobStates
from controller.schedule_plan import Run, ScheduleSpec
from controller.scheduled_runs import (ANNOTATION_SCHEDULED_TIME, LABEL_SCHEDULED_BY_UID, run_manifest, runs_of,
                                       schedule_spec, view)
from controller.settings import Settings
from embedjob.api import parse_spec
from support.manifests import MINIMAL_SPEC

T0 = datetime(2026, 12, 5, 10, 0, tzinfo=timezone.utc)
SCHEDULE = {"cron": "*/5 * * * *", "timeZone": "Europe/Berlin", "concurrencyPolicy": "Forbid",
            "successfulRunsHistoryLimit": 3, "failedRunsHistoryLimit": 1}


def scheduled_job(name: str = "sync", **spec) -> dict:
    return {"apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
            "metadata": {"name": name, "namespace": "ns", "uid": "u-1", "generation": 1, "resourceVersion": "5",
                         "creationTimestamp": "2026-12-05T09:00:00Z"},
            "spec": {**MINIMAL_SPEC, "schedule": SCHEDULE, "suspend": True, **spec}, "status": {}}


class Kube:
    def __init__(self):
        self.created = []

    async def read_secret(self, namespace, name):
        return {"data": {"url": "eA=="}}

    async def create_or_get_rayjob(self, manifest):
        self.created.append(manifest)
        return manifest

    async def set_rayjob_suspend(self, *args):
        raise AssertionError("a scheduled job has no RayJob to suspend")


def launch(job: dict) -> tuple:
    kube, accepted = Kube(), []

    async def accept(body):
        accepted.append(body["metadata"]["name"])
        return True

    context = reconcile.Context(settings=Settings.from_env({}), kube=kube, runs=None, job_states=JobStates())
    return asyncio.run(reconcile.launch(job, [], context, accept)), accepted, kube.created


def test_a_scheduled_job_is_accepted_and_gets_no_rayjob_of_its_own():
    verdict, accepted, created = launch(scheduled_job())
    assert verdict == SCHEDULE_ACCEPTED and accepted == ["sync"] and created == []


def test_a_scheduled_jobs_name_leaves_room_for_its_runs():
    verdict, accepted, created = launch(scheduled_job("x" * 53))
    assert (verdict.accepted, verdict.reason, accepted, created) == (False, "NameTooLong", [], [])
    assert launch(scheduled_job("x" * 52))[0].accepted


def test_a_run_is_the_jobs_spec_without_schedule_or_suspend_named_and_owned():
    tick = T0 + timedelta(minutes=5)
    run = run_manifest(scheduled_job(), tick)
    assert run["metadata"]["name"] == f"sync-{int(tick.timestamp()) // 60}" and len(run["metadata"]["name"]) <= 63
    assert run["metadata"]["labels"][LABEL_SCHEDULED_BY_UID] == "u-1"
    assert run["metadata"]["annotations"][ANNOTATION_SCHEDULED_TIME] == "2026-12-05T10:05:00Z"
    assert run["metadata"]["ownerReferences"] == [{"apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
                                                   "name": "sync", "uid": "u-1", "controller": True}]
    assert run["spec"] == MINIMAL_SPEC
    parse_spec(run["spec"])  # a job of its own


def test_runs_are_read_back_from_the_index_and_strangers_ignored():
    tick = T0 + timedelta(minutes=5)
    child = {**run_manifest(scheduled_job(), tick), "status": {"state": "Complete",
                                                                "completionTime": "2026-12-05T10:06:00Z"}}
    child["metadata"]["uid"] = "u-2"
    stranger = {**child, "metadata": {**child["metadata"], "uid": "u-3", "name": "other",
                                      "annotations": {ANNOTATION_SCHEDULED_TIME: "garbage"}}}
    entries = [next(iter(indexes.job_entry(j).values())) for j in (scheduled_job(), child, stranger)]
    assert runs_of("u-1", entries) == [Run(child["metadata"]["name"], tick, "Complete",
                                           datetime(2026, 12, 5, 10, 6, tzinfo=timezone.utc))]


def test_the_status_of_a_schedule_between_during_and_paused():
    spec = schedule_spec({"schedule": SCHEDULE})
    assert spec == ScheduleSpec(cron="*/5 * * * *", time_zone="Europe/Berlin")
    done = Run("sync-1", T0, "Complete", T0 + timedelta(minutes=1))
    failed = Run("sync-2", T0 + timedelta(minutes=5), "Failed", T0 + timedelta(minutes=6))
    phase, schedule = view({}, spec, False, [done, failed], T0 + timedelta(minutes=7))
    assert (phase.state, phase.reason) == ("Scheduled", "Scheduled")
    assert (schedule.last_schedule_time, schedule.last_successful_time, schedule.next_schedule_time) == (
        "2026-12-05T10:05:00Z", "2026-12-05T10:01:00Z", "2026-12-05T10:10:00Z")
    assert [run.name for run in schedule.runs] == ["sync-2", "sync-1"] and schedule.active == []

    running = Run("sync-3", T0 + timedelta(minutes=10), "Running")
    phase, schedule = view({}, spec, True, [done, running], T0 + timedelta(minutes=11))
    assert (phase.state, schedule.active, schedule.next_schedule_time) == ("Running", ["sync-3"], None)
    phase, _ = view({}, spec, True, [done], T0 + timedelta(minutes=11))
    assert (phase.state, phase.reason) == ("Suspended", "ScheduleSuspended")


def test_the_stored_times_outlive_the_runs_history():
    """The runs are gone (history limit 0): the status keeps the last tick and the last success."""
    spec = schedule_spec({"schedule": SCHEDULE})
    current = {"schedule": {"lastScheduleTime": "2026-12-05T10:05:00Z", "lastSuccessfulTime": "2026-12-05T10:06:00Z"}}
    _, schedule = view(current, spec, False, [], T0 + timedelta(minutes=7))
    assert (schedule.last_schedule_time, schedule.last_successful_time) == ("2026-12-05T10:05:00Z",
                                                                            "2026-12-05T10:06:00Z")


def test_a_scheduled_jobs_status_never_becomes_final_and_names_its_state():
    spec = schedule_spec({"schedule": SCHEDULE})
    obs = status.Observation(generation=1, suspend=False, verdict=SCHEDULE_ACCEPTED, rayjob=None, run=None,
                             progress_error=None, now="2026-12-05T10:07:00Z",
                             schedule=view({}, spec, False, [], T0 + timedelta(minutes=7)))
    desired = status.desired_status({}, obs)
    assert desired["state"] == "Scheduled" and not status.is_final(desired)
    assert desired["schedule"]["nextScheduleTime"] == "2026-12-05T10:10:00Z"
    assert {c["type"]: c["status"] for c in desired["conditions"]} == {
        "Accepted": "True", "Running": "False", "Complete": "False", "Failed": "False", "Suspended": "False"}
    # not RayJobCreated: it has no RayJob (its status and Event said so, seen on the real path)
    accepted = [(t.reason, t.message) for t in events.transitions({}, desired) if t.type == "Accepted"]
    assert accepted == [("ScheduleAccepted", "each tick of spec.schedule starts a run, a child EmbeddingJob")]


def test_pausing_a_schedule_deletes_its_next_tick_from_the_stored_status():
    """A JSON merge patch keeps what it does not name: the patch names nextScheduleTime to delete it (found by
    test_real_path_schedule.py: a suspended job went on showing its next tick)."""
    spec, done = schedule_spec({"schedule": SCHEDULE}), Run("sync-1", T0, "Complete", T0 + timedelta(minutes=1))

    def desired(suspend: bool, current: dict) -> dict:
        return status.desired_status(current, status.Observation(
            generation=1, suspend=suspend, verdict=SCHEDULE_ACCEPTED, rayjob=None, run=None, progress_error=None,
            now="2026-12-05T10:07:00Z", schedule=view(current, spec, suspend, [done], T0 + timedelta(minutes=7))))

    scheduled = desired(False, {})
    assert scheduled["schedule"]["nextScheduleTime"] == "2026-12-05T10:10:00Z"
    paused = desired(True, scheduled)
    assert paused["state"] == "Suspended" and "nextScheduleTime" not in paused["schedule"]
    patch = status.status_patch(scheduled, paused)
    assert patch["schedule"] == {"nextScheduleTime": None} and patch["state"] == "Suspended"
