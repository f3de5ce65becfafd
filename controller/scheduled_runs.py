"""A scheduled job's runs: their manifests, reading them back, and the job's status from them (pure functions).

A run is a child EmbeddingJob: the job's spec without `schedule` (and not suspended), named by its
tick (`schedule_plan.run_name`), labelled with the job's uid, annotated with its tick, owned by the job.
Each run goes the way of any job (review, its one RayJob, Kueue, its own status and Events).
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any, Iterable

from embedjob import api
from embedjob.api_status import JobState, ScheduledRun, ScheduleStatus
from embedjob.cron import next_tick, parse, zone

from .rayjob import LABEL_MANAGED_BY, MANAGED_BY
from .schedule_plan import FINISHED, Run, ScheduleSpec, run_name
from .status import Phase
from .times import parse_time, rfc3339

LABEL_SCHEDULED_BY_UID = "embedjob.dev/scheduled-by-uid"
LABEL_SCHEDULED_BY = "embedjob.dev/scheduled-by"
ANNOTATION_SCHEDULED_TIME = "embedjob.dev/scheduled-time"


def schedule_spec(spec: dict[str, Any]) -> ScheduleSpec | None:
    """spec.schedule as stored (the API server's defaults applied), None without one."""
    schedule = spec.get("schedule")
    if not isinstance(schedule, dict) or not schedule.get("cron"):
        return None
    return ScheduleSpec(
        cron=schedule["cron"], time_zone=schedule.get("timeZone"),
        concurrency_policy=schedule.get("concurrencyPolicy", "Forbid"),
        starting_deadline_seconds=schedule.get("startingDeadlineSeconds"),
        successful_runs_history_limit=schedule.get("successfulRunsHistoryLimit", 3),
        failed_runs_history_limit=schedule.get("failedRunsHistoryLimit", 1))


def run_manifest(job: dict[str, Any], tick: datetime) -> dict[str, Any]:
    """The child EmbeddingJob that runs `job` for `tick`."""
    meta = job["metadata"]
    spec = {key: copy.deepcopy(value) for key, value in job["spec"].items() if key not in ("schedule", "suspend")}
    return {
        "apiVersion": api.API_VERSION, "kind": api.KIND,
        "metadata": {
            "name": run_name(meta["name"], tick), "namespace": meta["namespace"],
            "labels": {LABEL_SCHEDULED_BY_UID: meta["uid"], LABEL_SCHEDULED_BY: meta["name"],
                       LABEL_MANAGED_BY: MANAGED_BY},
            "annotations": {ANNOTATION_SCHEDULED_TIME: rfc3339(tick)},
            # no blockOwnerDeletion: that needs the owner's finalizers subresource; the job's cleanup deletes its runs
            "ownerReferences": [{"apiVersion": api.API_VERSION, "kind": api.KIND, "name": meta["name"],
                                 "uid": meta["uid"], "controller": True}],
        },
        "spec": spec,
    }


def runs_of(uid: str, jobs: Iterable[dict[str, Any]]) -> list[Run]:
    """The runs of job `uid` among the index's job entries, oldest tick first."""
    runs = []
    for job in jobs:
        meta = job["metadata"]
        if (meta.get("labels") or {}).get(LABEL_SCHEDULED_BY_UID) != uid or meta.get("deletionTimestamp"):
            continue
        scheduled = parse_time((meta.get("annotations") or {}).get(ANNOTATION_SCHEDULED_TIME))
        if scheduled is None:
            continue  # not one of ours: a run always carries its tick
        status = job.get("status") or {}
        runs.append(Run(meta["name"], scheduled, status.get("state"), parse_time(status.get("completionTime"))))
    return sorted(runs, key=lambda run: run.scheduled)


def last_scheduled(current: dict[str, Any], runs: list[Run]) -> datetime | None:
    """The latest tick a run was started for: the status's, or a run's newer one (the status write may have
    been lost to a restart)."""
    times = [t for t in (parse_time(((current.get("schedule") or {}).get("lastScheduleTime"))),
                         *(run.scheduled for run in runs)) if t is not None]
    return max(times, default=None)


def view(current: dict[str, Any], spec: ScheduleSpec, suspend: bool, runs: list[Run],
         now: datetime) -> tuple[Phase, ScheduleStatus]:
    """The job's phase and status.schedule. Running while a run is active, Suspended while paused,
    Scheduled between runs: a schedule never completes; each run's outcome is its own status's."""
    active = [run for run in runs if run.state not in FINISHED]
    stored = current.get("schedule") or {}
    succeeded = [run.completed for run in runs if run.state == JobState.complete.value and run.completed]
    last_success = max([t for t in (parse_time(stored.get("lastSuccessfulTime")), *succeeded) if t is not None],
                       default=None)
    upcoming = None if suspend else next_tick(parse(spec.cron), zone(spec.time_zone), now)
    schedule = ScheduleStatus(
        last_schedule_time=rfc3339(last_scheduled(current, runs)),
        last_successful_time=rfc3339(last_success),
        next_schedule_time=rfc3339(upcoming),
        active=[run.name for run in active][:16],
        runs=[ScheduledRun(name=run.name, scheduled_time=rfc3339(run.scheduled), state=run.state,
                           completion_time=rfc3339(run.completed)) for run in reversed(runs)][:210],
    )
    if active:
        phase = Phase(JobState.running.value, "RunActive", f"run {active[-1].name} is running")
    elif suspend:
        phase = Phase(JobState.suspended.value, "ScheduleSuspended", "spec.suspend is true: no run starts")
    else:
        phase = Phase(JobState.scheduled.value, "Scheduled",
                      f"next run at {schedule.next_schedule_time}" if upcoming else "the schedule has no next tick")
    return phase, schedule
