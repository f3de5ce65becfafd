"""What a job that has not started yet waits for, from its RayCluster and pods (pure functions).

The pods are KubeRay's (label `ray.io/cluster`: the head and the workers) and the
submitter Job's (K8sJobMode, label `batch.kubernetes.io/job-name` = the RayJob's name),
as the API server returns them (camelCase dicts). The worst problem found names the
job's reason: a pod the scheduler cannot place, an image that cannot be pulled, a
container that crashes or was killed for memory, a config error (e.g. a missing Secret
key), a failed pod, a RayCluster that cannot create its pods. Without a problem the
reason stays `Initializing` and the message says how far the cluster got.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

# KubeRay's labels on a RayCluster's pods.
CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
# The Job controller's label on a Job's pods; KubeRay names the submitter Job after the RayJob.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"

IMAGE_PULL = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull")
CONFIG_ERRORS = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")

# The reasons a job can be stuck with, worst first (the order decides which one a job shows).
STUCK_REASONS = ("OOMKilled", "CrashLoopBackOff", "ImagePullBackOff", *CONFIG_ERRORS, "PodFailed",
                 "Unschedulable", "RayClusterReplicaFailure", "RayClusterFailed")
INITIALIZING = "Initializing"
MAX_DETAIL = 300


@dataclass(frozen=True)
class Waiting:
    """Why the job is not running yet."""

    reason: str
    message: str


def _clip(text: str | None) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."


def _who(pod: dict[str, Any], submitter: bool) -> str:
    labels = pod.get("metadata", {}).get("labels") or {}
    role = "submitter" if submitter else labels.get(NODE_TYPE_LABEL, "ray")
    return f"{role} pod {pod.get('metadata', {}).get('name', '?')}"


def _memory_limit(pod: dict[str, Any], container: str) -> str | None:
    spec = pod.get("spec") or {}
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        if c.get("name") == container:
            return ((c.get("resources") or {}).get("limits") or {}).get("memory")
    return None


def _container_problem(pod: dict[str, Any], cs: dict[str, Any], who: str) -> Waiting | None:
    name, state, last = cs.get("name", "?"), cs.get("state") or {}, cs.get("lastState") or {}
    waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
    last_terminated = last.get("terminated") or {}
    restarts = cs.get("restartCount", 0)
    if "OOMKilled" in (terminated.get("reason"), last_terminated.get("reason")):
        limit = _memory_limit(pod, name)
        return Waiting("OOMKilled", f"{who}: container {name} was killed for running out of memory"
                       + (f" (limit {limit})" if limit else "") + f", restarted {restarts} times; "
                       "raise spec.workers.memory or lower the batch size")
    reason = waiting.get("reason", "")
    if reason == "CrashLoopBackOff":
        exit_code = last_terminated.get("exitCode")
        detail = _clip(last_terminated.get("message") or last_terminated.get("reason"))
        return Waiting("CrashLoopBackOff", f"{who}: container {name} keeps crashing (restarted {restarts} times"
                       + (f", last exit code {exit_code}" if exit_code is not None else "")
                       + (f": {detail}" if detail else "") + ")")
    if reason in IMAGE_PULL:
        return Waiting("ImagePullBackOff", f"{who}: image {cs.get('image', '?')!r} of container {name} cannot be "
                       f"pulled ({reason}: {_clip(waiting.get('message'))})")
    if reason in CONFIG_ERRORS:
        return Waiting(reason, f"{who}: container {name} cannot start: {_clip(waiting.get('message'))}")
    return None


def _scheduling_problem(pod: dict[str, Any], who: str) -> Waiting | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            return Waiting("Unschedulable", f"{who} cannot be scheduled: {_clip(cond.get('message'))}")
    return None


def pod_problem(pod: dict[str, Any], submitter: bool = False) -> Waiting | None:
    """The worst thing that keeps this pod from running, None if nothing does (yet)."""
    who, status = _who(pod, submitter), pod.get("status") or {}
    found = [_container_problem(pod, cs, who)
             for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])]
    if status.get("phase") == "Failed":
        found.append(Waiting("PodFailed", f"{who} failed: {status.get('reason', '')} {_clip(status.get('message'))}"
                             .rstrip()))
    found.append(_scheduling_problem(pod, who))
    return _worst(w for w in found if w is not None)


def _worst(found: Iterable[Waiting]) -> Waiting | None:
    return min(found, key=lambda w: STUCK_REASONS.index(w.reason), default=None)


def _cluster_problem(raycluster: dict[str, Any]) -> Waiting | None:
    status, name = raycluster.get("status") or {}, raycluster.get("metadata", {}).get("name", "?")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return Waiting("RayClusterReplicaFailure",
                           f"RayCluster {name} cannot create its pods ({cond.get('reason', '')}): "
                           f"{_clip(cond.get('message'))}")
    if status.get("state") == "failed" or status.get("reason"):
        return Waiting("RayClusterFailed", f"RayCluster {name} is {status.get('state') or 'failing'}: "
                       f"{_clip(status.get('reason'))}")
    return None


def _pod_summary(pod: dict[str, Any], submitter: bool) -> str:
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    init = [cs.get("name") for cs in status.get("initContainerStatuses") or []
            if (cs.get("state") or {}).get("running")]
    waiting = [(cs.get("state") or {}).get("waiting", {}).get("reason")
               for cs in status.get("containerStatuses") or [] if (cs.get("state") or {}).get("waiting")]
    detail = (f"in init container {init[0]}" if init
              else waiting[0] if waiting and waiting[0] else "")
    return f"{_who(pod, submitter)} {phase}" + (f" ({detail})" if detail else "")


def waiting_for(cluster_name: str | None, raycluster: dict[str, Any] | None,
                cluster_pods: list[dict[str, Any]], submitter_pods: list[dict[str, Any]]) -> Waiting:
    """What the job waits for: the worst problem of its pods or its RayCluster, else its progress."""
    pods = [(pod, False) for pod in cluster_pods] + [(pod, True) for pod in submitter_pods]
    problems = [p for p in (pod_problem(pod, submitter) for pod, submitter in pods) if p is not None]
    worst = _worst(problems)
    if worst is not None:
        others = len(problems) - 1
        return Waiting(worst.reason, worst.message + (f" (and {others} more pods with problems)" if others else ""))
    if raycluster is not None and (problem := _cluster_problem(raycluster)):
        return problem
    if not cluster_name or (raycluster is None and not pods):
        return Waiting(INITIALIZING, "waiting for KubeRay to create the RayCluster")
    state = ((raycluster or {}).get("status") or {}).get("state") or "starting"
    if not pods:
        return Waiting(INITIALIZING, f"RayCluster {cluster_name} is {state}; no pods yet")
    ordered = sorted(pods, key=lambda p: (p[1], (p[0].get("metadata", {}).get("labels") or {})
                                          .get(NODE_TYPE_LABEL) != "head"))
    return Waiting(INITIALIZING, f"RayCluster {cluster_name} is {state}: "
                   + ", ".join(_pod_summary(pod, submitter) for pod, submitter in ordered))
