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
    """One aspect of the job's state (metav1.Condition)."""

    type: str = Field(max_length=316, description="Accepted, Running, Complete, Failed, Suspended or Queued.")
    status: str = Field(json_schema_extra={"enum": ["True", "False", "Unknown"]},
                        description="True, False or Unknown.")
    reason: str = Field(max_length=1024, description="Why, in one CamelCase word (e.g. SecretNotFound, JobRunning, "
                        "SourceUnavailable); docs/troubleshooting.md lists them.")
    message: str = Field("", max_length=32768, description="Why, for humans: what happened and where to look.")
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"},
                                      description="When status last changed.")
    observed_generation: int | None = Field(None, ge=0, description="The metadata.generation of the spec this "
                                            "condition was set for.")


class JobState(str, Enum):
    """One-word summary of the conditions, for printer columns and humans."""

    pending = "Pending"
    queued = "Queued"
    running = "Running"
    suspended = "Suspended"
    complete = "Complete"
    failed = "Failed"
    scheduled = "Scheduled"  # a job with spec.schedule between its runs (it never completes)


class ScheduledRun(ApiModel):
    """One run a schedule started: a child EmbeddingJob of the same namespace."""

    name: str = Field(max_length=63, description="The run's EmbeddingJob.")
    scheduled_time: str = Field(json_schema_extra={"format": "date-time"}, description="The tick it ran for.")
    state: str | None = Field(None, max_length=16, description="Its status.state.")
    completion_time: str | None = Field(None, json_schema_extra={"format": "date-time"},
                                        description="When it finished.")


class ScheduleStatus(ApiModel):
    """Where a job with spec.schedule stands (docs/schedules.md)."""

    last_schedule_time: str | None = Field(None, json_schema_extra={"format": "date-time"},
                                           description="The latest tick a run was started for.")
    last_successful_time: str | None = Field(None, json_schema_extra={"format": "date-time"},
                                             description="When the latest run that completed finished.")
    next_schedule_time: str | None = Field(None, json_schema_extra={"format": "date-time"},
                                           description="The next tick (none while suspended).")
    active: list[str] = Field(default_factory=list, max_length=16, description="Runs not finished yet.")
    runs: list[ScheduledRun] = Field(default_factory=list, max_length=210,
                                     description="The runs kept (history limits), newest first.")


class Progress(RunCounters):
    """The driver's counters of the job's newest run, as the operator last read them from its run row in
    PostgreSQL (the operator needs a database URL for this: docs/install.md)."""

    summary: str | None = Field(None, max_length=64, description="e.g. 120/400 batches, for printer columns.")
    prompt: str | None = Field(
        None, max_length=1024, description="The document prompt the run embedded its texts with (its first 200 "
        "characters), and why: e.g. "
        "'passage: ' (the model's 'passage' prompt (its document prompt)), or none (docs/prompts.md).")
    revision: str | None = Field(None, max_length=400, description="The model and revision the run embeds with "
                                 "(model@revision).")
    revision_state: str | None = Field(None, max_length=16, description="That revision's state in its collection: "
                                       "embedding (incoming: searches do not read it yet), ready (what searches "
                                       "read) or retired (docs/revisions.md).")
    ready_revision: str | None = Field(None, max_length=400, description="The collection's ready revision "
                                       "(model@revision): what searches read while another is incoming.")
    rows_read: str | None = Field(None, max_length=2048, description="For a table read by its change column "
                                  "(source.table.changeColumn): which rows the run read (changed since a watermark, "
                                  "or every row and why) and the watermark it left (docs/table-source.md).")


class EmbeddingJobStatus(ApiModel):
    """What the operator last saw of the job: its state and conditions, its RayJob and RayCluster, and the
    driver's progress. Written by the operator only."""

    observed_generation: int | None = Field(None, ge=0, description="The metadata.generation the operator last "
                                            "reviewed.")
    state: JobState | None = Field(None, description="One-word summary of the conditions: Pending, Queued (waiting "
                                   "for Kueue to admit it), Running, Suspended, Complete or Failed; Scheduled for a "
                                   "job with spec.schedule between its runs.")
    reason: str | None = Field(
        None, max_length=1024, description="Reason of the condition behind `state`, e.g. SecretNotFound."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="The job's conditions, one of each type: Accepted (True: the review passed, reason "
        "RayJobCreated once the RayJob exists; False: the reason the review or the RayJob's creation was "
        "refused), Running, Complete, Failed, Suspended, and Queued for a job in a Kueue queue; each with a "
        "reason and a message.",
    )
    ray_job_name: str | None = Field(None, description="The RayJob the operator created for this job (same "
                                     "namespace); its submitter Job has the same name and its pod's log holds the "
                                     "driver's output (`embedjob logs`).")
    ray_cluster_name: str | None = Field(None, description="The RayCluster the job runs on; the driver runs on its "
                                         "head pod.")
    job_deployment_status: str | None = Field(None, description="Mirrored RayJob status.jobDeploymentStatus.")
    job_status: str | None = Field(None, description="Mirrored RayJob status.jobStatus.")
    ray_job_reason: str | None = Field(None, max_length=1024, description="Mirrored RayJob status.reason.")
    ray_job_message: str | None = Field(None, max_length=32768, description="Mirrored RayJob status.message.")
    dashboard_url: str | None = Field(None, alias="dashboardURL", description="Mirrored RayJob "
                                      "status.dashboardURL: the Ray dashboard of the job's cluster (host:port).")
    failed_attempts: int | None = Field(None, ge=0, description="Mirrored RayJob status.failed: attempts "
                                        "of the job that failed; KubeRay retries on a new RayCluster while "
                                        "this is at most spec.retry.backoffLimit.")
    progress: Progress | None = None  # described by Progress's docstring
    start_time: str | None = Field(None, json_schema_extra={"format": "date-time"},
                                   description="When the job started running.")
    completion_time: str | None = Field(None, json_schema_extra={"format": "date-time"},
                                        description="When the job finished (Complete or Failed).")
    schedule: ScheduleStatus | None = None  # described by ScheduleStatus's docstring
