"""The spec sections workers, retry, sync and chunking of the EmbeddingJob.

`embedjob.api` assembles them into `EmbeddingJobSpec`; their base model is `embedjob.api_base.ApiModel`,
the source is in `embedjob.api_source`, the batching section in `embedjob.api_batching`, the model in
`embedjob.api_model`, the sink in `embedjob.api_sink`, the table source's parts in `embedjob.api_table` and the
pod settings (`workers.template`, `head`) in `embedjob.api_pods`. Every field has a description:
the CRD generated from these models (`embedjob.crd`) is what `kubectl explain` shows,
with each field's default appended there.
"""

from __future__ import annotations

import math

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .api_base import ApiModel
from .api_pods import WorkerPodTemplate
from .api_rules import (
    CPU_STEP, CPU_STEP_RULE, GPU_SHARE_RULE, MIN_GPU_SHARE, cel, ray_quantity,
)


WORKER_RULES = {
    "cpus_per_actor": [ray_quantity("cpusPerActor"), CPU_STEP_RULE],
    "gpus_per_actor": [ray_quantity("gpusPerActor"), GPU_SHARE_RULE],
}


class Workers(ApiModel):
    """The Ray worker pool: one EmbeddingWorker actor per replica, each in its own worker pod
    (actors with a fraction of a GPU share a pod). See docs/operator.md."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *(rule.cel() for rule in WORKER_RULES["cpus_per_actor"] + WORKER_RULES["gpus_per_actor"]),
            ]
        }
    )

    replicas: int = Field(1, ge=1, le=1024, description="EmbeddingWorker actors (1-1024), and so Ray worker pods.")
    cpus_per_actor: float = Field(
        1, gt=0, le=256,
        description=f"CPUs of each actor (Ray num_cpus, the pod's CPU request and limit); also its torch thread "
        f"count. A multiple of {CPU_STEP}; above 1 a whole number.",
    )
    gpus_per_actor: float = Field(
        0, ge=0, le=8,
        description=f"GPUs of each actor (Ray num_gpus, nvidia.com/gpu on the pod). Fractions (at least "
        f"{MIN_GPU_SHARE}) share one GPU among several actors in one pod; above 1 a whole number.",
    )
    memory: str | None = Field(
        None,
        pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$",
        description="Memory request and limit of each worker pod, a Kubernetes quantity (e.g. 4Gi). "
        "Unset: no memory request or limit.",
    )
    image: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        pattern=r"^[^\s]+$",
        description="Image of the Ray head, worker and submitter pods. Unset: the operator's worker image "
        "(EMBEDJOB_WORKER_IMAGE, the chart's worker.image).",
    )
    template: WorkerPodTemplate | None = Field(
        None, description="Pod settings of the worker pods (placement, identity, volumes, env), merged over the "
        "operator's defaults (docs/pod-settings.md). Not with clusterSelector.",
    )

    @field_validator("cpus_per_actor", "gpus_per_actor")
    @classmethod
    def _schedulable(cls, value: float, info: ValidationInfo) -> float:
        for rule in WORKER_RULES[info.field_name]:
            rule.enforce(value)
        return value


class Retry(ApiModel):
    """What failures the job retries and tolerates."""

    attempts_per_batch: int = Field(
        3, ge=1, le=100,
        description="Attempts per batch for retryable failures (a lost actor, a database error), with backoff.",
    )
    failed_batches_tolerated: int = Field(
        0, ge=0, le=10_000_000, description="Batches that may fail for good before the whole job fails."
    )
    failed_batches_tolerated_percent: float | None = Field(
        None, ge=0, le=100,
        description="Share of the batches (percent, 0-100) that may fail for good; the larger of this and "
        "failedBatchesTolerated applies.",
    )
    backoff_limit: int = Field(
        0, ge=0, le=100,
        description="Retries of the whole job on a new submitter pod (RayJob backoffLimit); the driver skips the "
        "batches already written. Must be 0 with clusterSelector.",
    )

    def failed_batches_allowed(self, batches: int) -> int:
        """How many of `batches` may fail for good: the count, or the percent of them if that is more."""
        percent = self.failed_batches_tolerated_percent or 0
        return max(self.failed_batches_tolerated, math.floor(batches * percent / 100))


# (CEL rule on the spec, message); EmbeddingJobSpec's validator checks the same in Python.
FULL_SCAN_NEEDS_CHANGES = (
    "!has(self.sync) || !has(self.sync.fullScanEvery) || (has(self.sync.deleteMissing) && self.sync.deleteMissing "
    "&& has(self.source.table) && has(self.source.table.changeColumn))",
    "sync.fullScanEvery spaces the id scans of a table read by its changes: it needs sync.deleteMissing and "
    "source.table.changeColumn",
)


class Sync(ApiModel):
    """Keeping the vectors in step with the source across re-runs (docs/table-source.md)."""

    delete_missing: bool = Field(
        False,
        description="At the end of a successful run, delete the vectors (this collection, model and revision) "
        "of ids the source no longer holds: rows deleted or outside the filter, records gone from the file.",
    )
    full_scan_every: int | None = Field(
        None, ge=1, le=10_000, strict=True,
        description="With deleteMissing and source.table.changeColumn: every this many runs, one also reads every "
        "id of the table (ids only, after the rows changed) and deletes the vectors of ids gone; the others delete "
        "nothing. Unset: 1, every run scans the ids.",
    )


# (CEL rule, message); Chunking's validator checks the same in Python.
OVERLAP_AT_MOST_HALF = (
    "!has(self.maxTokens) || !has(self.overlapTokens) || 2 * self.overlapTokens <= self.maxTokens",
    "overlapTokens must be at most half of maxTokens (each chunk then moves on by at least half a chunk)",
)


class Chunking(ApiModel):
    """Long texts cut into overlapping chunks by the model's own tokenizer, one vector per chunk, keyed by
    record id and chunk number, with the chunk's character offsets into the text (docs/chunking.md)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [cel(*OVERLAP_AT_MOST_HALF,
                                                                                    ".overlapTokens")]})

    max_tokens: int | None = Field(
        None, ge=8, le=8192,
        description="Tokens of each chunk as the model sees it, its special tokens included (8-8192); at most the "
        "model's token limit (model.maxSeqLength, else the model's own), so no chunk is truncated. Unset: the "
        "model's token limit. A text of at most this many tokens is one chunk, 0.",
    )
    overlap_tokens: int = Field(
        0, ge=0, le=4096,
        description="Tokens a chunk repeats from the end of the one before it (0-4096, at most half of "
        "maxTokens); rounded down to whole words.",
    )

    @model_validator(mode="after")
    def _overlap_at_most_half(self) -> "Chunking":
        if self.max_tokens is not None and 2 * self.overlap_tokens > self.max_tokens:
            raise ValueError(OVERLAP_AT_MOST_HALF[1])
        return self
