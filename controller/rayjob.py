"""The RayJob for an EmbeddingJob: a pure function of the EmbeddingJob, its parsed spec and the settings.

Credentials reach the Ray pods only as `env[].valueFrom.secretKeyRef` (the user's
Secret); the entrypoint carries the job config, which holds the Secret's name but
never its contents.
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any

from embedjob import api
from embedjob.api import HEAD_CONTAINER, WORKER_CONTAINER
from embedjob.contract import (DRIVER_ENV, DRIVER_ENV_VALUES, DRIVER_METRICS_PORT, DRIVER_METRICS_PORT_NAME,
                               driver_command)

from .acceptance import database_secrets
from .pod_templates import pod_template, submitter_template
from .queueing import queue_labels
from .settings import Settings

RAY_API_VERSION = "ray.io/v1"
RAY_GROUP, RAY_VERSION, RAY_PLURAL = "ray.io", "v1", "rayjobs"
# KubeRay: MaxRayJobNameLength (RayCluster names get a 6-character suffix).
MAX_RAYJOB_NAME = 47
NAME_PREFIX = "ej-"
HASH_LENGTH = 8

LABEL_JOB_NAME = "embedjob.dev/job-name"
LABEL_JOB_UID = "embedjob.dev/job-uid"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "embedjob"

WORKER_GROUP = "embedders"
GPU_RESOURCE = "nvidia.com/gpu"
# The head runs the driver and Ray's control processes, no EmbeddingWorker actors
# (num-cpus 0 keeps them off it).
HEAD_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}


def rayjob_name(job_name: str, job_uid: str) -> str:
    """`ej-<name, truncated>-<hash of the uid>`: stable for one EmbeddingJob, distinct
    for a later EmbeddingJob of the same name, a DNS-1035 label of at most 47 characters."""
    digest = hashlib.sha256(job_uid.encode()).hexdigest()[:HASH_LENGTH]
    room = MAX_RAYJOB_NAME - len(NAME_PREFIX) - 1 - HASH_LENGTH
    stem = re.sub(r"[^a-z0-9-]+", "-", job_name.lower())[:room].strip("-")
    return f"{NAME_PREFIX}{stem}-{digest}" if stem else f"{NAME_PREFIX}{digest}"


@dataclass(frozen=True)
class WorkerLayout:
    """How `spec.workers` becomes worker pods: one actor per pod, except that actors
    with fractional GPUs are packed so that they share a pod's whole GPU."""

    pods: int
    actors_per_pod: int
    cpus_per_pod: float
    gpus_per_pod: int


def worker_layout(workers: api.Workers) -> WorkerLayout:
    gpus = workers.gpus_per_actor
    if 0 < gpus < 1:
        actors_per_pod = min(workers.replicas, math.floor(1 / gpus))
        return WorkerLayout(
            pods=math.ceil(workers.replicas / actors_per_pod),
            actors_per_pod=actors_per_pod,
            cpus_per_pod=workers.cpus_per_actor * actors_per_pod,
            gpus_per_pod=1,
        )
    return WorkerLayout(
        pods=workers.replicas, actors_per_pod=1, cpus_per_pod=workers.cpus_per_actor, gpus_per_pod=math.ceil(gpus)
    )


def _cpu_quantity(cpus: float) -> str:
    millis = round(cpus * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def _worker_resources(workers: api.Workers, layout: WorkerLayout) -> dict[str, dict[str, str]]:
    cpu = _cpu_quantity(layout.cpus_per_pod)
    requests, limits = {"cpu": cpu}, {"cpu": cpu}
    if workers.memory:
        requests["memory"] = limits["memory"] = workers.memory
    if layout.gpus_per_pod:
        limits[GPU_RESOURCE] = str(layout.gpus_per_pod)
    return {"requests": requests, "limits": limits}


def driver_env(spec: api.EmbeddingJobSpec) -> list[dict[str, Any]]:
    """Every variable the driver reads (contract.DRIVER_ENV): the sink's database URL and a table source's own
    from their Secrets, the metrics port, the others empty. Set in `env`, which wins over `envFrom`, so that a Secret or
    ConfigMap given without a prefix cannot set one (docs/pod-settings.md)."""
    refs = {name: ref for name, ref, _ in database_secrets(spec)}
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": refs[name].name, "key": refs[name].key}}}
            if name in refs else {"name": name, "value": DRIVER_ENV_VALUES.get(name, "")} for name in DRIVER_ENV]


def labels(job: dict[str, Any]) -> dict[str, str]:
    meta = job["metadata"]
    return {LABEL_JOB_NAME: meta["name"], LABEL_JOB_UID: meta["uid"], LABEL_MANAGED_BY: MANAGED_BY}


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def entrypoint(job: dict[str, Any]) -> str:
    return driver_command(job)


# The head's ports. The driver runs on the head: its metrics port is named for the chart's PodMonitor. KubeRay
# gives the head Service the container's declared ports, and its own defaults only when none is declared, so
# those are declared too (without the dashboard's, a RayJob never gets past Initializing).
HEAD_PORTS = [{"name": name, "containerPort": port, "protocol": "TCP"}
              for name, port in (("gcs-server", 6379), ("dashboard", 8265), ("client", 10001), ("metrics", 8080),
                                 (DRIVER_METRICS_PORT_NAME, DRIVER_METRICS_PORT))]


def _container(name: str, image: str, env: list, resources: dict) -> dict[str, Any]:
    return {"name": name, "image": image, "env": env, "resources": copy.deepcopy(resources)}


def _head_settings(spec: api.EmbeddingJobSpec, settings: Settings) -> tuple:
    """The head's pod settings, in merge order: the operator's defaults, then the job's."""
    return settings.pod_defaults.head, spec.head.template if spec.head else None


def _cluster_spec(job: dict[str, Any], spec: api.EmbeddingJobSpec, settings: Settings) -> dict[str, Any]:
    image = spec.workers.image or settings.worker_image
    layout = worker_layout(spec.workers)
    return {
        "rayVersion": settings.ray_version,
        # KubeRay generates the token into a Secret named like the RayCluster and gives it to
        # every Ray container and the submitter; the operator never needs to read it.
        "authOptions": {"mode": "token"},
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": "0"},
            "template": pod_template({
                "metadata": {"labels": labels(job)},
                "spec": {"containers": [{**_container(HEAD_CONTAINER, image, driver_env(spec), HEAD_RESOURCES),
                                         "ports": copy.deepcopy(HEAD_PORTS)}]},
            }, *_head_settings(spec, settings)),
        },
        "workerGroupSpecs": [
            {
                "groupName": WORKER_GROUP,
                "replicas": layout.pods,
                "minReplicas": layout.pods,
                "maxReplicas": layout.pods,
                "rayStartParams": {},
                "template": pod_template({
                    "metadata": {"labels": labels(job)},
                    "spec": {
                        "containers": [
                            _container(WORKER_CONTAINER, image, driver_env(spec),
                                       _worker_resources(spec.workers, layout))
                        ]
                    },
                }, settings.pod_defaults.workers, spec.workers.template),
            }
        ],
    }


def build_rayjob(job: dict[str, Any], spec: api.EmbeddingJobSpec, settings: Settings) -> dict[str, Any]:
    """The RayJob manifest for the EmbeddingJob `job` (a dict with metadata and spec); `spec` is
    its spec as the operator parsed it once (the entrypoint carries the spec as written)."""
    meta = job["metadata"]
    in_queue = queue_labels(spec, settings)
    rayjob_spec: dict[str, Any] = {
        "entrypoint": entrypoint(job),
        "submissionMode": "K8sJobMode",
        "backoffLimit": spec.retry.backoff_limit,
        # Kueue admits a queued RayJob by unsuspending it.
        "suspend": spec.suspend or bool(in_queue),
    }
    if spec.active_deadline_seconds is not None:
        rayjob_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    if spec.cluster_selector:
        rayjob_spec["clusterSelector"] = dict(spec.cluster_selector)
        rayjob_spec["shutdownAfterJobFinishes"] = False
    else:
        rayjob_spec["rayClusterSpec"] = _cluster_spec(job, spec, settings)
        submitter = submitter_template(rayjob_spec["rayClusterSpec"]["headGroupSpec"]["template"],
                                       spec.workers.image or settings.worker_image, *_head_settings(spec, settings))
        if submitter:
            rayjob_spec["submitterPodTemplate"] = submitter
        rayjob_spec["shutdownAfterJobFinishes"] = True
        # KubeRay's own default, 0, deletes the cluster (and the driver's log on its head) at once.
        ttl = spec.ttl_seconds_after_finished
        rayjob_spec["ttlSecondsAfterFinished"] = api.DEFAULT_TTL_SECONDS_AFTER_FINISHED if ttl is None else ttl
    return {
        "apiVersion": RAY_API_VERSION,
        "kind": "RayJob",
        "metadata": {
            "name": rayjob_name(meta["name"], meta["uid"]),
            "namespace": meta["namespace"],
            "labels": {**labels(job), **in_queue},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": rayjob_spec,
    }


def owned_by(rayjob: dict[str, Any], job_meta: dict[str, Any]) -> bool:
    """Whether `rayjob` is the one the EmbeddingJob (its metadata) created: in the job's namespace,
    with a controller ownerReference to the job's uid. Labels, names and references are anyone's to
    write, so a RayJob of another namespace never is, whatever it carries."""
    meta = rayjob.get("metadata", {})
    return meta.get("namespace") == job_meta["namespace"] and any(
        ref.get("uid") == job_meta["uid"] and ref.get("kind") == api.KIND and ref.get("controller")
        for ref in meta.get("ownerReferences") or [])
