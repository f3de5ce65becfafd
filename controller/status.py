"""The EmbeddingJob's status from what the operator observes (pure functions).

One `Phase` (state, reason, message) is derived from the review verdict, the RayJob's
status (KubeRay's `jobDeploymentStatus` and `jobStatus`) and the driver's run row;
the conditions follow from it with the Kubernetes conventions: `lastTransitionTime`
changes only when a condition's status changes, `observedGeneration` is always set.
Complete and Failed are final: later changes of the RayJob (its TTL, a deletion)
do not reopen a finished job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from embedjob.api_status import JobState
from embedjob.contract import EXIT_REASONS

from .acceptance import ACCEPTED, Verdict
from .run_reader import RunRow

CONDITION_TYPES = ("Accepted", "Running", "Complete", "Failed", "Suspended")
FINAL_STATES = (JobState.complete.value, JobState.failed.value)
MAX_MESSAGE = 1024
MAX_MIRRORED_MESSAGE = 4096

# The driver's exit code as KubeRay reports it in the RayJob's message
# ("Job entrypoint command failed with exit code 2, ...").
EXIT_CODE = re.compile(r"exit code (\d+)")


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


@dataclass(frozen=True)
class Transition:
    """A condition that changed: one Kubernetes Event."""

    type: str
    status: str
    reason: str
    message: str

    @property
    def warning(self) -> bool:
        return (self.type, self.status) in (("Failed", "True"), ("Accepted", "False"))


def _short(text: str | None, limit: int = MAX_MESSAGE) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def find_condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


def progress_of(run: RunRow) -> dict[str, Any]:
    done, total = run.batches_succeeded, run.batches_total
    summary = f"{done}/{total} batches" if total is not None else f"{done} batches"
    if run.batches_failed:
        summary += f", {run.batches_failed} failed"
    progress = {
        "batchesSucceeded": done,
        "batchesFailed": run.batches_failed,
        "recordsEmbedded": run.records_embedded,
        "recordsFailed": run.records_failed,
        "textsPerSecond": round(run.texts_per_second, 1),
        "summary": summary,
    }
    if total is not None:
        progress["batchesTotal"] = total
    return progress


def failure(rayjob_status: dict[str, Any], run: RunRow | None) -> tuple[str, str]:
    """The most specific reason a finished RayJob did not succeed, and a message."""
    message = _short(rayjob_status.get("message"))
    if run is not None and run.state == "failed" and run.reason:
        return run.reason, _short(run.error) or message
    if rayjob_status.get("reason") in ("DeadlineExceeded", "PreRunningDeadlineExceeded"):
        return "DeadlineExceeded", message
    exit_code = EXIT_CODE.search(message)
    if exit_code and int(exit_code.group(1)) in EXIT_REASONS:
        return EXIT_REASONS[int(exit_code.group(1))], message
    if rayjob_status.get("jobStatus") == "STOPPED":
        return "RayJobStopped", message
    return "RayJobFailed", message or f"RayJob {rayjob_status.get('jobDeploymentStatus', '')}".strip()


def _running_message(obs: Observation) -> str:
    if obs.progress_error:
        return _short(f"progress unavailable: {obs.progress_error}")
    if obs.run is None:
        return "the driver has not reported progress yet"
    return f"{progress_of(obs.run)['summary']}, {obs.run.texts_per_second:.1f} texts/s"


def _known_verdict(current: dict[str, Any], obs: Observation) -> Verdict | None:
    if obs.rayjob is not None:
        return ACCEPTED
    if obs.verdict is not None:
        return obs.verdict
    accepted = find_condition(current, "Accepted")
    if accepted and accepted.get("status") in ("True", "False"):
        return Verdict(accepted["status"] == "True", accepted.get("reason", ""), accepted.get("message", ""))
    return None


def phase(current: dict[str, Any], obs: Observation) -> Phase:
    if current.get("state") in FINAL_STATES:
        final = find_condition(current, current["state"]) or {}
        return Phase(current["state"], current.get("reason", ""), final.get("message", ""))
    if obs.rayjob is None:
        verdict = _known_verdict(current, obs)
        if verdict is not None and not verdict.accepted:
            return Phase(JobState.pending.value, verdict.reason, verdict.message)
        return Phase(JobState.pending.value, "CreatingRayJob", "the RayJob is being created")

    status = obs.rayjob.get("status") or {}
    deployment, job_status = status.get("jobDeploymentStatus", ""), status.get("jobStatus", "")
    if deployment == "ValidationFailed":
        return Phase(JobState.failed.value, "RayJobValidationFailed", _short(status.get("message")))
    if deployment in ("Complete", "Failed"):
        if deployment == "Complete" and job_status == "SUCCEEDED" and not (obs.run and obs.run.state == "failed"):
            summary = progress_of(obs.run)["summary"] if obs.run else "the driver finished"
            return Phase(JobState.complete.value, "Succeeded", summary)
        return Phase(JobState.failed.value, *failure(status, obs.run))
    if deployment in ("Suspending", "Suspended") or (obs.suspend and deployment in ("", "New")):
        return Phase(JobState.suspended.value, deployment or "Suspended", "spec.suspend is true")
    if deployment == "Running":
        return Phase(JobState.running.value, "JobRunning", _running_message(obs))
    if deployment == "Retrying":
        return Phase(JobState.pending.value, "Retrying", _short(status.get("message")) or "KubeRay retries the job")
    return Phase(JobState.pending.value, "Initializing", "waiting for the RayCluster and the job submission")


def _condition(current: dict[str, Any], type_: str, status: str, reason: str, message: str,
               generation: int, now: str) -> dict[str, Any]:
    old = find_condition(current, type_)
    changed = old is None or old.get("status") != status
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": _short(message),
        "lastTransitionTime": now if changed else old["lastTransitionTime"],
        "observedGeneration": generation,
    }


def _conditions(current: dict[str, Any], ph: Phase, verdict: Verdict | None, obs: Observation) -> list[dict]:
    if verdict is None:
        accepted = ("Unknown", "Reviewing", "the operator is reviewing the job")
    else:
        accepted = ("True" if verdict.accepted else "False", verdict.reason, verdict.message)
    conditions = [_condition(current, "Accepted", *accepted, obs.generation, obs.now)]
    for type_ in CONDITION_TYPES[1:]:
        holds = ph.state == type_
        conditions.append(
            _condition(current, type_, "True" if holds else "False", ph.reason, ph.message if holds else "",
                       obs.generation, obs.now)
        )
    return conditions


# status field <- RayJob status field
MIRRORED = {
    "rayClusterName": "rayClusterName",
    "jobDeploymentStatus": "jobDeploymentStatus",
    "jobStatus": "jobStatus",
    "rayJobReason": "reason",
    "rayJobMessage": "message",
    "dashboardURL": "dashboardURL",
}


def _mirror(current: dict[str, Any], rayjob: dict[str, Any] | None) -> dict[str, Any]:
    """The RayJob's status as it is; what was mirrored last while there is no RayJob."""
    if rayjob is None:
        return {field: current.get(field) for field in ("rayJobName", *MIRRORED)}
    status = rayjob.get("status") or {}
    mirror = {ours: status.get(theirs) or None for ours, theirs in MIRRORED.items()}
    mirror["rayJobMessage"] = _short(mirror["rayJobMessage"], MAX_MIRRORED_MESSAGE) or None
    return {"rayJobName": rayjob["metadata"]["name"], **mirror}


def desired_status(current: dict[str, Any], obs: Observation) -> dict[str, Any] | None:
    """The whole status the job should have; None while nothing is known about it yet."""
    verdict = _known_verdict(current, obs)
    if verdict is None and not current:
        return None
    ph = phase(current, obs)
    mirrored = (obs.rayjob or {}).get("status") or {}
    desired: dict[str, Any] = {
        "observedGeneration": obs.generation,
        "state": ph.state,
        "reason": ph.reason,
        "conditions": _conditions(current, ph, verdict, obs),
        **_mirror(current, obs.rayjob),
        "progress": progress_of(obs.run) if obs.run else current.get("progress"),
        "startTime": current.get("startTime") or mirrored.get("startTime")
        or (obs.now if ph.state == JobState.running.value else None),
        "completionTime": current.get("completionTime")
        or ((mirrored.get("endTime") or obs.now) if ph.state in FINAL_STATES else None),
    }
    return {key: value for key, value in desired.items() if value is not None}


def status_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch of the status: the top-level fields that differ (None deletes)."""
    return {key: desired.get(key) for key in current.keys() | desired.keys() if current.get(key) != desired.get(key)}


def transitions(current: dict[str, Any], desired: dict[str, Any]) -> list[Transition]:
    """Conditions that became True, and a new reason to refuse the job: one Event each."""
    out = []
    for cond in desired.get("conditions", []):
        old = find_condition(current, cond["type"]) or {}
        became_true = cond["status"] == "True" and old.get("status") != "True"
        refused_anew = (cond["type"], cond["status"]) == ("Accepted", "False") and (
            old.get("status"), old.get("reason")) != ("False", cond["reason"])
        if became_true or refused_anew:
            out.append(Transition(cond["type"], cond["status"], cond["reason"], cond["message"]))
    return out


def is_final(status: dict[str, Any]) -> bool:
    return status.get("state") in FINAL_STATES
