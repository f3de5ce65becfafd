"""The EmbeddingJob status model: the one source of the CRD's status schema and of what the operator writes.

The operator builds every status it writes through these models
(`model_dump(by_alias=True, exclude_none=True, mode="json")`), so a field the CRD does
not declare cannot be written (and silently pruned by the API server).
"""

from __future__ import annotations

from enum import Enum

from pydantic import Field

from embedjob.api import ApiModel, RunCounters


class Condition(ApiModel):
    """A Kubernetes-convention condition (metav1.Condition)."""

    type: str = Field(max_length=316)
    status: str = Field(json_schema_extra={"enum": ["True", "False", "Unknown"]})
    reason: str = Field(max_length=1024)
    message: str = Field("", max_length=32768)
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})
    observed_generation: int | None = Field(None, ge=0)


class JobState(str, Enum):
    """One-word summary of the conditions, for printer columns and humans."""

    pending = "Pending"
    running = "Running"
    suspended = "Suspended"
    complete = "Complete"
    failed = "Failed"


class Progress(RunCounters):
    summary: str | None = Field(None, max_length=64, description="e.g. 120/400 batches, for printer columns.")


class EmbeddingJobStatus(ApiModel):
    observed_generation: int | None = Field(None, ge=0)
    state: JobState | None = None
    reason: str | None = Field(
        None, max_length=1024, description="Reason of the condition behind `state`, e.g. SecretNotFound."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    ray_job_name: str | None = None
    ray_cluster_name: str | None = None
    job_deployment_status: str | None = Field(None, description="Mirrored RayJob status.jobDeploymentStatus.")
    job_status: str | None = Field(None, description="Mirrored RayJob status.jobStatus.")
    ray_job_reason: str | None = Field(None, max_length=1024, description="Mirrored RayJob status.reason.")
    ray_job_message: str | None = Field(None, max_length=32768, description="Mirrored RayJob status.message.")
    dashboard_url: str | None = Field(None, alias="dashboardURL")
    progress: Progress | None = None
    start_time: str | None = Field(None, json_schema_extra={"format": "date-time"})
    completion_time: str | None = Field(None, json_schema_extra={"format": "date-time"})
