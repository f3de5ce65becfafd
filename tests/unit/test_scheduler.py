"""`Scheduler.step` with a stand-in API and keeper: a due tick's run is created from the job as stored, history
beyond the limit deleted, a warning said once, nothing done for a job not accepted or being deleted; the job's
pending ticks gauge set at each step and removed with the job."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from prometheus_client import REGISTRY

from controller.reconcile import Context
from controller.metrics import JobStates
from controller.scheduled_runs import ANNOTATION_SCHEDULED_TIME, LABEL_SCHEDULED_BY_UID
from controller.scheduler import Scheduler
from controller.settings import Settings
from support.manifests import MINIMAL_SPEC

ACCEPTED = {"conditions": [{"type": "Accepted", "status": "True", "reason": "ReviewPassed", "message": "",
                            "lastTransitionTime": "2026-12-05T09:00:00Z"}]}


class Kube:
    def __init__(self, job):
        self.job, self.created, self.deleted, self.events = job, [], [], []

    async def get_job(self, namespace, name):
        return self.job

    async def create_or_get_job(self, manifest):
        self.created.append(manifest)
        return manifest

    async def delete_job(self, namespace, name):
        self.deleted.append(name)

    async def post_job_event(self, namespace, name, uid, reason, message, warning=False):
        self.events.append((reason, warning))


class Keeper:
    def __init__(self, status):
        self.status, self.synced = status, []

    def stored_status(self, uid):
        return self.status

    async def sync(self, uid):
        self.synced.append(uid)


def scheduled(schedule: dict, created: datetime, **meta) -> dict:
    return {"metadata": {"name": "sync", "namespace": "ns", "uid": "u-1",
                         "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"), **meta},
            "spec": {**MINIMAL_SPEC, "schedule": schedule}, "status": ACCEPTED}


def run(name: str, tick: datetime, state: str) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": name,
                         "labels": {LABEL_SCHEDULED_BY_UID: "u-1"},
                         "annotations": {ANNOTATION_SCHEDULED_TIME: tick.strftime("%Y-%m-%dT%H:%M:%SZ")}},
            "spec": MINIMAL_SPEC, "status": {"state": state}}


def scheduler_for(job: dict, *runs: dict, status=ACCEPTED) -> tuple[Scheduler, Kube, Keeper]:
    kube, keeper = Kube(job), Keeper(status)
    ctx = Context(settings=Settings.from_env({}), kube=kube, runs=None, job_states=JobStates())
    scheduler = Scheduler(ctx, keeper)
    scheduler.attach({"u-1": [job], **{r["metadata"]["uid"]: [r] for r in runs}})
    return scheduler, kube, keeper


def test_a_due_tick_creates_its_run_deletes_old_history_and_asks_for_a_status_sync():
    now = datetime.now(timezone.utc)
    job = scheduled({"cron": "* * * * *", "successfulRunsHistoryLimit": 1}, now - timedelta(minutes=10))
    old = [run(f"sync-{i}", now - timedelta(minutes=9 - i), "Complete") for i in range(3)]
    scheduler, kube, keeper = scheduler_for(job, *old)
    asyncio.run(scheduler.step("u-1"))
    (created,) = kube.created
    assert created["metadata"]["ownerReferences"][0]["uid"] == "u-1" and "schedule" not in created["spec"]
    assert kube.deleted == ["sync-0", "sync-1"] and keeper.synced == ["u-1"]
    assert kube.events == [("RunStarted", False)]


def test_a_missed_deadline_is_said_once():
    now = datetime.now(timezone.utc)
    job = scheduled({"cron": "0 0 1 1 *", "startingDeadlineSeconds": 60}, now - timedelta(days=800))
    scheduler, kube, _ = scheduler_for(job)
    for _ in range(3):
        asyncio.run(scheduler.step("u-1"))
    assert kube.created == [] and kube.events == [("MissedSchedule", True)]


def test_nothing_is_done_for_a_job_not_accepted_or_being_deleted():
    now = datetime.now(timezone.utc)
    refused = scheduled({"cron": "* * * * *"}, now - timedelta(minutes=5))
    scheduler, kube, _ = scheduler_for(refused, status={})
    asyncio.run(scheduler.step("u-1"))
    deleting = scheduled({"cron": "* * * * *"}, now - timedelta(minutes=5), deletionTimestamp="2026-12-05T10:00:00Z")
    scheduler2, kube2, _ = scheduler_for(deleting)
    asyncio.run(scheduler2.step("u-1"))
    assert kube.created == kube2.created == []


def pending_ticks() -> float | None:
    return REGISTRY.get_sample_value("embedjob_schedule_pending_ticks", {"namespace": "ns", "embeddingjob": "sync"})


def test_each_step_sets_the_pending_ticks_and_forgetting_the_job_removes_them():
    now = datetime.now(timezone.utc)
    job = scheduled({"cron": "* * * * *"}, now - timedelta(minutes=10))
    last = now.replace(second=0, microsecond=0) - timedelta(minutes=3)
    active = run("sync-active", last, "Running")
    scheduler, kube, _ = scheduler_for(job, active)
    asyncio.run(scheduler.step("u-1"))
    # The ticks since the active run's, held by Forbid (4 when a minute turns between the test's clock and the step's).
    assert kube.created == [] and pending_ticks() in (3, 4)
    scheduler.forget("u-1")
    assert pending_ticks() is None

    quiet = scheduled({"cron": "0 0 1 1 *"}, now - timedelta(minutes=1))
    scheduler, _, _ = scheduler_for(quiet)
    asyncio.run(scheduler.step("u-1"))
    assert pending_ticks() == 0  # a schedule with nothing due has its series, at 0
    quiet["metadata"]["deletionTimestamp"] = "2026-12-05T10:00:00Z"
    asyncio.run(scheduler.step("u-1"))
    assert pending_ticks() is None
