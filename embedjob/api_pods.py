"""Pod settings of the Ray head and workers: partial pod templates, as KubeRay's own group templates are shaped.

`spec.head.template` and `spec.workers.template` take the fields of a core/v1
PodTemplateSpec that decide placement, identity, how a pod stops and what the Ray
container sees: labels and annotations; nodeSelector, tolerations, affinity,
serviceAccountName, imagePullSecrets, priorityClassName, terminationGracePeriodSeconds,
securityContext, volumes; and, in `containers`, the Ray container (named ray-head or
ray-worker) with env, envFrom, volumeMounts, securityContext and, on the head only,
resources. `controller.pod_templates` merges them into the RayJob's templates with
strategic-merge semantics (docs/pod-settings.md); the operator's defaults (`PodDefaults`)
use the same models.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import Field, field_validator

from .api_base import DNS_SUBDOMAIN, ApiModel
from .api_pod_placement import Affinity, LabelValue, ContainerSecurityContext, PodSecurityContext, Toleration
from .api_pod_rules import MAX_LIST, MAX_MAP, NO_NUL, ObjectRule, RuledModel, field_rule, label_map_rule
from .api_pod_volumes import EnvFromSource, EnvVar, Resources, Volume, VolumeMount

# A day: longer holds a suspended or preempted job's quota for nothing (its next run recomputes what was in flight).
MAX_GRACE_SECONDS = 86_400
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
# Labels the operator (embedjob.dev/job-name, ...) and KubeRay (ray.io/node-type, ...) put on the pods.
RESERVED_LABEL_PREFIXES = ("embedjob.dev/", "ray.io/")

LABELS_RULE = label_map_rule("labels", RESERVED_LABEL_PREFIXES)
ANNOTATIONS_RULE = label_map_rule("annotations")
NODE_SELECTOR_RULE = label_map_rule("nodeSelector")


def _map_list(key: str) -> dict[str, object]:
    """A list merged by `key`: the API server refuses two items with the same key (Duplicate value)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}


def _unique(items: list | None, key: str, what: str) -> list | None:
    keys = [getattr(item, key) for item in items or ()]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(f"{what} listed twice: {', '.join(duplicates)}")
    return items


class PodMetadata(RuledModel):
    """Labels and annotations added to the pods."""

    RULES = (field_rule(LABELS_RULE), field_rule(ANNOTATIONS_RULE))

    labels: dict[str, LabelValue] | None = Field(
        None, max_length=MAX_MAP,
        description="Labels of the pods; not under embedjob.dev/ or ray.io/ (the operator's and KubeRay's).")
    annotations: dict[str, Annotated[str, Field(max_length=4096, pattern=NO_NUL)]] | None = Field(
        None, max_length=MAX_LIST,
        description="Annotations of the pods (at most 32, values up to 4096 characters: a pod's annotations are "
        "limited to 256 KiB in all).")


class HeadContainerName(str, Enum):
    ray_head = HEAD_CONTAINER


class WorkerContainerName(str, Enum):
    ray_worker = WORKER_CONTAINER


class WorkerContainer(ApiModel):
    """What the Ray container of a worker pod gets besides what the operator sets (image, resources, our env)."""

    name: WorkerContainerName = Field(description=f"The Ray container: {WORKER_CONTAINER}.")
    env: list[EnvVar] | None = Field(
        None, max_length=MAX_LIST, json_schema_extra=_map_list("name"),
        description="Extra variables, merged by name; the operator's (EMBEDJOB_*) cannot be set.")
    env_from: list[EnvFromSource] | None = Field(
        None, max_length=16, description="Secrets or ConfigMaps whose keys become variables; appended.")
    volume_mounts: list[VolumeMount] | None = Field(
        None, max_length=MAX_LIST, json_schema_extra=_map_list("mountPath"),
        description="Mounts of this template's volumes, merged by mountPath.")
    security_context: ContainerSecurityContext | None = Field(None, description="The container's security "
                                                              "settings.")

    @field_validator("env")
    @classmethod
    def _env_once(cls, env: list[EnvVar] | None) -> list[EnvVar] | None:
        return _unique(env, "name", "env name")

    @field_validator("volume_mounts")
    @classmethod
    def _mounts_once(cls, mounts: list[VolumeMount] | None) -> list[VolumeMount] | None:
        return _unique(mounts, "mount_path", "mountPath")


class HeadContainer(WorkerContainer):
    """What the Ray container of the head pod gets besides what the operator sets; also its resources."""

    name: HeadContainerName = Field(description=f"The Ray container: {HEAD_CONTAINER}.")
    resources: Resources | None = Field(
        None, description="Requests and limits of the head, which runs the driver; given, they replace the "
        "default (1 CPU, 2Gi) as a whole.")


class ImagePullSecret(ApiModel):
    """A Secret (type kubernetes.io/dockerconfigjson) in the job's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN, description="The Secret's name.")


_MOUNTS_HAVE_VOLUMES = ObjectRule(
    "containers",
    "!has(self.containers) || self.containers.all(c, !has(c.volumeMounts) || c.volumeMounts.all(m, "
    "has(self.volumes) && self.volumes.exists(v, v.name == m.name)))",
    lambda spec: all(mount.name in {v.name for v in spec.volumes or ()}
                     for c in spec.containers or () for mount in c.volume_mounts or ()),
    "every volumeMounts[].name must be one of this template's volumes",
)


class PodSpecSettings(RuledModel):
    """The pod-level fields of a Ray pod's template that the job may set."""

    RULES = (_MOUNTS_HAVE_VOLUMES, field_rule(NODE_SELECTOR_RULE))

    node_selector: dict[str, LabelValue] | None = Field(
        None, max_length=MAX_MAP, description="Node labels the pods must run on.")
    tolerations: list[Toleration] | None = Field(
        None, max_length=MAX_LIST, description="Taints the pods tolerate; appended to the operator's defaults.")
    affinity: Affinity | None = Field(None, description="Node and pod (anti-)affinity.")
    service_account_name: str | None = Field(
        None, min_length=1, max_length=253, pattern=DNS_SUBDOMAIN,
        description="ServiceAccount the pods run as (e.g. one with an IRSA or Workload Identity annotation).")
    image_pull_secrets: list[ImagePullSecret] | None = Field(
        None, max_length=16, json_schema_extra=_map_list("name"),
        description="Secrets to pull the worker image with; merged by name.")
    priority_class_name: str | None = Field(
        None, min_length=1, max_length=253, pattern=DNS_SUBDOMAIN, description="PriorityClass of the pods.")
    termination_grace_period_seconds: int | None = Field(
        None, ge=0, le=MAX_GRACE_SECONDS,
        description="Seconds a deleted pod's processes get between SIGTERM and SIGKILL (Kubernetes' default: 30). "
                    "A pod is deleted on suspension, preemption and the job's deletion; its actors' batches in "
                    "flight are computed again by the next run either way.")
    security_context: PodSecurityContext | None = Field(None, description="Pod-level security settings.")
    volumes: list[Volume] | None = Field(
        None, max_length=MAX_LIST, json_schema_extra=_map_list("name"),
        description="Volumes of the pods, merged by name; mount them with the container's volumeMounts.")

    @field_validator("volumes")
    @classmethod
    def _volumes_once(cls, volumes: list[Volume] | None) -> list[Volume] | None:
        return _unique(volumes, "name", "volume name")

    @field_validator("image_pull_secrets")
    @classmethod
    def _secrets_once(cls, secrets: list[ImagePullSecret] | None) -> list[ImagePullSecret] | None:
        return _unique(secrets, "name", "imagePullSecrets name")


class HeadPodSpec(PodSpecSettings):
    """The head pod's settings."""

    containers: list[HeadContainer] | None = Field(
        None, max_length=1, json_schema_extra=_map_list("name"),
        description=f"The Ray container ({HEAD_CONTAINER}), merged by name; no other containers.")


class WorkerPodSpec(PodSpecSettings):
    """The worker pods' settings."""

    containers: list[WorkerContainer] | None = Field(
        None, max_length=1, json_schema_extra=_map_list("name"),
        description=f"The Ray container ({WORKER_CONTAINER}), merged by name; no other containers. Its resources "
        "come from cpusPerActor, gpusPerActor and memory.")


class HeadPodTemplate(ApiModel):
    """A partial pod template for the head pod (which also runs the driver), merged into the RayJob's."""

    metadata: PodMetadata | None = Field(None, description="Labels and annotations of the pod.")
    spec: HeadPodSpec | None = Field(None, description="Placement, identity, volumes and the Ray container.")


class WorkerPodTemplate(ApiModel):
    """A partial pod template for the worker pods, merged into the RayJob's."""

    metadata: PodMetadata | None = Field(None, description="Labels and annotations of the pods.")
    spec: WorkerPodSpec | None = Field(None, description="Placement, identity, volumes and the Ray container.")


class Head(ApiModel):
    """The Ray head pod of the job's own cluster; it runs the driver (reading, sorting, writing). See
    docs/pod-settings.md."""

    template: HeadPodTemplate | None = Field(
        None, description="Pod settings of the head, merged over the operator's defaults (docs/pod-settings.md).")


class PodDefaults(ApiModel):
    """The operator's default pod settings (EMBEDJOB_POD_DEFAULTS, the chart's podDefaults); a job's own merge
    over them."""

    head: HeadPodTemplate | None = Field(None, description="Default head pod template.")
    workers: WorkerPodTemplate | None = Field(None, description="Default worker pod template.")
