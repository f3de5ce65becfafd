"""The EmbeddingJob's status from what the operator observes (pure functions).

One `Phase` (state, reason, message) is derived from the review verdict, the RayJob's status (KubeRay's
`jobDeploymentStatus` and `jobStatus`), the driver's run row and, while the job has not started, what it waits for
(`controller.waiting`); the conditions follow from it with the Kubernetes conventions: `lastTransitionTime` changes
only when a condition's status changes, `observedGeneration` is always set. Complete and Failed are final: later
changes of the RayJob (its TTL, a deletion) do not reopen a finished job. Built through the status model (in its wire
form: it cannot hold a field the CRD does not declare). Its Events: `controller.events`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embedjob.api import ApiModel, RunCounters
from embedjob.api_status import Condition, EmbeddingJobStatus, JobState, Progress, ScheduleStatus

from . import queueing
from .acceptance import ACCEPTED, Verdict
from .run_reader import RunRow
from .failures import failure, shorten as _short, with_logs_hint as _with_logs_hint
from .waiting import STUCK_REASONS, Waiting

CONDITION_TYPES = ("Accepted", "Running", "Complete", "Failed", "Suspended")
# Only a job in a Kueue queue has it (controller.queueing).
QUEUED_CONDITION = "Queued"
FINAL_STATES = (JobState.complete.value, JobState.failed.value)
MAX_MIRRORED_MESSAGE = 4096

@dataclass(frozen=True)
class Phase:
    state: str  # a JobState value
    reason: str
    message: str


@dataclass(frozen=True)
class Observation:
    """Everything the status is computed from, at one moment."""

    generation: int
    suspend: bool
    verdict: Verdict | None  # this operator's latest review; None: none since it started
    rayjob: dict[str, Any] | None  # the job's own RayJob (metadata, spec, status)
    run: RunRow | None  # the driver's latest run row
    progress_error: str | None  # why the run row could not be read
    now: str  # RFC 3339, UTC
    rayjob_deleted: bool = False  # it existed (status.rayJobName) and the API server confirms it is gone
    waiting: Waiting | None = None  # what a job not started yet waits for (its RayCluster and pods)
    schedule: tuple[Phase, ScheduleStatus] | None = None  # a job with spec.schedule: controller.scheduled_runs


def _wire(model: ApiModel) -> dict[str, Any]:
    """A model as the API server stores it: camelCase, unset fields left out."""
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def _stored(status: dict[str, Any], field: str) -> Any:
    """A top-level field of a stored status (wire form), by its name in the status model."""
    return status.get(EmbeddingJobStatus.model_fields[field].alias)


def find_condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in _stored(status, "conditions") or [] if c.get("type") == type_), None)


def _summary(run: RunRow) -> str:
    done, total = run.batches_succeeded, run.batches_total
    text = f"{done}/{total} batches" if total is not None else f"{done} batches"
    return text + (f", {run.batches_failed} failed" if run.batches_failed else "")


def progress_of(run: RunRow) -> dict[str, Any]:
    """`status.progress`: the run's counters (texts/s to one decimal), a summary, its revision (docs/revisions.md)."""
    counters = run.model_dump(include=set(RunCounters.model_fields))
    counters["texts_per_second"] = round(run.texts_per_second, 1)
    return _wire(Progress(**counters, summary=_summary(run), prompt=run.prompt, revision_state=run.revision_state,
                          revision=f"{run.model}@{run.revision}" if run.model else None,
                          ready_revision=run.ready_revision, rows_read=run.rows_read))


def _running_message(obs: Observation) -> str:
    if obs.progress_error:
        return _short(f"progress unavailable: {obs.progress_error}")
    if obs.run is None:
        return "the driver has not reported progress yet"
    return f"{_summary(obs.run)}, {obs.run.texts_per_second:.1f} texts/s"


def _known_verdict(current: dict[str, Any], obs: Observation) -> Verdict | None:
    if obs.rayjob is not None:
        return ACCEPTED
    if obs.verdict is not None:
        return obs.verdict
    accepted = find_condition(current, "Accepted")
    if accepted and accepted.get("status") in ("True", "False"):
        return Verdict(accepted["status"] == "True", accepted.get("reason", ""), accepted.get("message", ""))
    return None


def _succeeded(run: RunRow | None) -> Phase:
    """The driver finished: Complete, unless the run counted records and embedded none."""
    if run and run.records_total and not run.records_embedded:
        return Phase(JobState.failed.value, "NothingEmbedded",
                     f"none of the {run.records_total} records was embedded ({_summary(run)})")
    return Phase(JobState.complete.value, "Succeeded", _summary(run) if run else "the driver finished")


def _without_rayjob(current: dict[str, Any], run: RunRow | None) -> Phase:
    """The RayJob was deleted (by someone else, or by its TTL) before the job was seen to finish:
    the run row's outcome when it has one, else Failed/RayJobDeleted (never recreated: deleting a
    RayJob stops its Ray job, and a second run would fight whoever deleted it)."""
    if run is not None and run.state == "succeeded":
        return _succeeded(run)
    if run is not None and run.state == "failed" and run.reason:
        return Phase(JobState.failed.value, run.reason, _short(run.error))
    return Phase(JobState.failed.value, "RayJobDeleted",
                 f"RayJob {_stored(current, 'ray_job_name')} was deleted before the job finished; "
                 "create the EmbeddingJob again to re-run it")


def phase(current: dict[str, Any], obs: Observation) -> Phase:
    if obs.schedule is not None:
        return obs.schedule[0]
    if is_final(current):
        state = _stored(current, "state")
        final = find_condition(current, state) or {}
        return Phase(state, _stored(current, "reason") or "", final.get("message", ""))
    if obs.rayjob is None and obs.rayjob_deleted:
        return _without_rayjob(current, obs.run)
    if obs.rayjob is None:
        verdict = _known_verdict(current, obs)
        if verdict is not None and not verdict.accepted:
            return Phase(JobState.pending.value, verdict.reason, verdict.message)
        return Phase(JobState.pending.value, "CreatingRayJob", "the RayJob is being created")

    status = obs.rayjob.get("status") or {}
    deployment, job_status = status.get("jobDeploymentStatus", ""), status.get("jobStatus", "")
    in_queue = queueing.phase_in_queue(obs.rayjob, has_started=bool(_stored(current, "start_time")))
    if in_queue is not None:
        return Phase(in_queue.state, in_queue.reason, in_queue.message)
    if deployment == "ValidationFailed":
        return Phase(JobState.failed.value, "RayJobValidationFailed", _short(status.get("message")))
    if deployment in ("Complete", "Failed"):
        if deployment == "Complete" and job_status == "SUCCEEDED" and not (obs.run and obs.run.state == "failed"):
            return _succeeded(obs.run)
        reason, message = failure(status, obs.run)
        return Phase(JobState.failed.value, reason, _with_logs_hint(message, obs.rayjob))
    if deployment in ("Suspending", "Suspended") or (obs.suspend and deployment in ("", "New")):
        return Phase(JobState.suspended.value, deployment or "Suspended", "spec.suspend is true")
    if deployment == "Running":
        return Phase(JobState.running.value, "JobRunning", _running_message(obs))
    failed_attempts = status.get("failed") or 0
    if deployment == "Retrying" or (failed_attempts and deployment in ("", "New", "Initializing", "Waiting")):
        # KubeRay's Retrying lasts one reconcile (it deletes the cluster and starts over from New):
        # the failed count says that a new attempt is starting, until it runs.
        backoff = (obs.rayjob.get("spec") or {}).get("backoffLimit")
        of = f" of {backoff + 1}" if isinstance(backoff, int) else ""
        attempt = f"attempt {failed_attempts + 1}{of}, after {failed_attempts} failed"
        if obs.waiting is not None and obs.waiting.reason in STUCK_REASONS:
            return Phase(JobState.pending.value, obs.waiting.reason, f"{attempt}: {obs.waiting.message}")
        why = obs.waiting.message if obs.waiting is not None else "waiting for its new RayCluster"
        return Phase(JobState.pending.value, "Retrying", f"{attempt}: {why}")
    if obs.waiting is not None:
        return Phase(JobState.pending.value, obs.waiting.reason, obs.waiting.message)
    return Phase(JobState.pending.value, "Initializing", "waiting for the RayCluster and the job submission")


def _condition(current: dict[str, Any], type_: str, status: str, reason: str, message: str,
               generation: int, now: str) -> Condition:
    old = find_condition(current, type_)
    changed = old is None or old.get("status") != status
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=_short(message),
        last_transition_time=now if changed else Condition.model_validate(old).last_transition_time,
        observed_generation=generation,
    )


def _conditions(current: dict[str, Any], ph: Phase, verdict: Verdict | None, obs: Observation) -> list[Condition]:
    if verdict is None:
        accepted = ("Unknown", "Reviewing", "the operator is reviewing the job")
    else:
        accepted = ("True" if verdict.accepted else "False", verdict.reason, verdict.message)
    conditions = [_condition(current, "Accepted", *accepted, obs.generation, obs.now)]
    queued = queueing.queue_of(obs.rayjob) or find_condition(current, QUEUED_CONDITION)
    for type_ in CONDITION_TYPES[1:] + ((QUEUED_CONDITION,) if queued else ()):
        holds = ph.state == type_
        # A pending job's Running condition says what it waits for.
        explains = holds or (type_ == "Running" and ph.state == JobState.pending.value)
        conditions.append(
            _condition(current, type_, "True" if holds else "False", ph.reason, ph.message if explains else "",
                       obs.generation, obs.now)
        )
    return conditions


# status field (the model's name) <- RayJob status field
MIRRORED = {
    "ray_cluster_name": "rayClusterName",
    "job_deployment_status": "jobDeploymentStatus",
    "job_status": "jobStatus",
    "ray_job_reason": "reason",
    "ray_job_message": "message",
    "dashboard_url": "dashboardURL",
    "failed_attempts": "failed",
}


def _mirror(current: dict[str, Any], rayjob: dict[str, Any] | None) -> dict[str, Any]:
    """The RayJob's status as it is; what was mirrored last while there is no RayJob."""
    if rayjob is None:
        return {field: _stored(current, field) for field in ("ray_job_name", *MIRRORED)}
    status = rayjob.get("status") or {}
    mirror = {ours: status.get(theirs) or None for ours, theirs in MIRRORED.items()}
    mirror["ray_job_message"] = _short(mirror["ray_job_message"], MAX_MIRRORED_MESSAGE) or None
    return {"ray_job_name": rayjob["metadata"]["name"], **mirror}


def _start_time(ph: Phase, obs: Observation) -> str | None:
    """KubeRay's (when the RayJob began initializing); for a job in a Kueue queue, when it was
    first seen admitted (KubeRay's marks when it was queued)."""
    if queueing.queue_of(obs.rayjob):
        return None if ph.state == JobState.queued.value else obs.now
    mirrored = (obs.rayjob or {}).get("status") or {}
    return mirrored.get("startTime") or (obs.now if ph.state == JobState.running.value else None)


def desired_status(current: dict[str, Any], obs: Observation) -> dict[str, Any] | None:
    """The whole status the job should have (wire form); None while nothing is known about it yet."""
    verdict = _known_verdict(current, obs)
    if verdict is None and not current:
        return None
    ph = phase(current, obs)
    mirrored = (obs.rayjob or {}).get("status") or {}
    desired = EmbeddingJobStatus(
        observed_generation=obs.generation,
        state=ph.state,
        reason=ph.reason,
        conditions=_conditions(current, ph, verdict, obs),
        **_mirror(current, obs.rayjob),
        progress=progress_of(obs.run) if obs.run else _stored(current, "progress"),
        start_time=_stored(current, "start_time") or _start_time(ph, obs),
        completion_time=_stored(current, "completion_time")
        or ((mirrored.get("endTime") or obs.now) if ph.state in FINAL_STATES else None),
        schedule=obs.schedule[1] if obs.schedule else None,
    )
    return _wire(desired)


def status_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch of the status: the fields that differ (None deletes), at every level: a merge patch keeps
    a nested field it does not name (a paused schedule's status.schedule.nextScheduleTime)."""
    patch = {}
    for key in current.keys() | desired.keys():
        old, new = current.get(key), desired.get(key)
        if old != new:
            patch[key] = status_patch(old, new) if isinstance(old, dict) and isinstance(new, dict) else new
    return patch


def accepted(status: dict[str, Any]) -> bool:
    """Accepted=True is stored: the API server refuses spec edits but `suspend`."""
    return (find_condition(status, "Accepted") or {}).get("status") == "True"


def is_final(status: dict[str, Any]) -> bool:
    return _stored(status, "state") in FINAL_STATES
