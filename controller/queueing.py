"""A job in a Kueue queue: its queue, the RayJob labels Kueue reads, and its state while Kueue holds it (pure functions).

Kueue (its RayJob integration) manages a RayJob that carries the label
`kueue.x-k8s.io/queue-name`: the operator creates it suspended, Kueue makes a Workload
for it and unsuspends it once the queue's ClusterQueue admits it. To preempt it,
Kueue suspends it again and KubeRay deletes its RayCluster (jobDeploymentStatus
`Suspending`, then `Suspended`); on readmission KubeRay starts it on a new cluster and
the driver skips the batches already written. While Kueue holds a RayJob, its
`spec.suspend` is Kueue's: the operator never sets it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from embedjob import api
from embedjob.api_status import JobState

from .acceptance import Verdict
from .settings import Settings

QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"

QUEUED = JobState.queued.value
WAITING_FOR_ADMISSION = "WaitingForAdmission"
PREEMPTED = "Preempted"
ADMITTED = "Admitted"


@dataclass(frozen=True)
class QueuePhase:
    state: str  # a JobState value
    reason: str
    message: str


def queue_for(spec: api.EmbeddingJobSpec, settings: Settings) -> str | None:
    """The LocalQueue the job runs in: its own, else the operator's default, except on an
    existing cluster (clusterSelector), which no Kueue workload can use."""
    if spec.queue_name:
        return spec.queue_name
    return None if spec.cluster_selector else settings.default_queue_name


def queue_labels(spec: api.EmbeddingJobSpec, settings: Settings) -> dict[str, str]:
    """The labels that put the RayJob in its queue (none outside a queue)."""
    queue = queue_for(spec, settings)
    if queue is None:
        return {}
    found = {QUEUE_NAME_LABEL: queue}
    if spec.workload_priority_class:
        found[PRIORITY_CLASS_LABEL] = spec.workload_priority_class
    return found


def refusal(spec: api.EmbeddingJobSpec, settings: Settings) -> Verdict | None:
    """A suspended job that the operator's default queue would put in Kueue's hands (the CRD
    refuses suspend with an explicit queueName): Kueue would start it regardless."""
    queue = queue_for(spec, settings)
    if queue is not None and spec.suspend:
        return Verdict(False, "SuspendedInQueue",
                       f"spec.suspend: the job would run in the Kueue LocalQueue {queue!r} (the operator's default "
                       "queue), where Kueue starts and stops it; unset suspend, or deactivate its Workload to "
                       "hold it (docs/kueue.md)")
    return None


def kueue_labels_of(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels of a RayJob that this module reads (the operator's RayJob index keeps only these)."""
    return {key: labels[key] for key in (QUEUE_NAME_LABEL, PRIORITY_CLASS_LABEL) if key in labels}


def queue_of(rayjob: dict[str, Any] | None) -> str | None:
    """The LocalQueue of a RayJob that Kueue manages, None for any other."""
    return ((rayjob or {}).get("metadata", {}).get("labels") or {}).get(QUEUE_NAME_LABEL) or None


def phase_in_queue(rayjob: dict[str, Any], has_started: bool) -> QueuePhase | None:
    """The job's state while Kueue holds its RayJob, None when it runs (or ended) as any other.

    `has_started`: the job was admitted and started before (its status has a startTime), so
    a RayJob that Kueue suspends now was preempted, not yet admitted."""
    queue = queue_of(rayjob)
    status = rayjob.get("status") or {}
    deployment = status.get("jobDeploymentStatus", "")
    if queue is None or deployment in ("Complete", "Failed", "ValidationFailed"):
        return None
    priority = (rayjob["metadata"].get("labels") or {}).get(PRIORITY_CLASS_LABEL)
    where = f"LocalQueue {queue}" + (f", priority class {priority}" if priority else "")
    if (rayjob.get("spec") or {}).get("suspend"):
        if has_started:
            return QueuePhase(JobState.suspended.value, PREEMPTED,
                              f"Kueue suspended the job ({where}) and KubeRay deleted its RayCluster"
                              f"{'' if deployment == 'Suspended' else ' (deleting)'}: preempted or evicted "
                              "(its Workload's Evicted condition says why); it resumes when Kueue readmits it, "
                              "skipping the batches already written")
        return QueuePhase(QUEUED, WAITING_FOR_ADMISSION,
                          f"waiting for Kueue to admit the job from {where} (quota of its ClusterQueue)")
    if deployment in ("Suspending", "Suspended"):
        return QueuePhase(JobState.pending.value, ADMITTED,
                          f"admitted by Kueue from {where}; KubeRay is starting its RayCluster")
    return None
