"""The EmbeddingJob API model the operator and the driver share: the spec and a run's counters.

`EmbeddingJobSpec` is the one source of the CRD's spec schema; the controller validates
and maps it to a RayJob and the driver parses the same model from the job config it is
given. Its sections (source, model, batching, workers, sink, retry) live in
`embedjob.api_sections` and are re-exported here; the pod settings of the Ray head and
workers in `embedjob.api_pods` (docs/pod-settings.md). `RunCounters` is what the driver counts
in its run row and the operator shows as `status.progress` (the status model is
`embedjob.api_status`). Field names are camelCase on the wire (Kubernetes convention) and
snake_case in Python.

CEL rules (`x-kubernetes-validations`) sit next to the fields they constrain so that
`kubectl apply` rejects malformed manifests with a field-specific message.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, ValidationError, model_validator

from .api_base import DNS_LABEL, DNS_SUBDOMAIN, SecretKeyRef
from .api_rules import LABEL_KEY, LABEL_VALUE, cel
from .api_pod_volumes import RESERVED_ENV_PREFIX
from .api_pods import HEAD_CONTAINER, WORKER_CONTAINER, Head, PodDefaults
from .api_model import HALF_PRECISIONS, Model, ModelBackend, ModelPrecision, ModelPrompt
from .api_batching import Batching, ChosenBatching, choose_batching
from .api_sections import FULL_SCAN_NEEDS_CHANGES, ApiModel, Chunking, Retry, Sync, Workers
from .api_source import MAX_METADATA_BYTES, Source
from .api_sink import HNSW_DEFAULT_EF_CONSTRUCTION, HNSW_DEFAULT_M, IndexType, Sink, VectorIndex
from .api_schedule import MAX_SCHEDULED_NAME, Schedule
from .api_table import NULL_OPS, SOURCE_IDENTIFIER, SourceTable, TableFilter

# The facade: what the operator, the driver and the CLI import, from here (the status model is
# embedjob.api_status; the modules behind this one are the API's own building blocks).
__all__ = [
    "API_VERSION", "DEFAULT_TTL_SECONDS_AFTER_FINISHED", "DNS_LABEL", "DNS_SUBDOMAIN", "GROUP", "HALF_NEEDS_GPU",
    "HALF_PRECISIONS", "HEAD_CONTAINER", "HNSW_DEFAULT_EF_CONSTRUCTION", "HNSW_DEFAULT_M", "KIND", "MAX_METADATA_BYTES",
    "MAX_SCHEDULED_NAME", "NULL_OPS",
    "PLURAL", "RAY_CLUSTER_SELECTOR_KEY", "RESERVED_ENV_PREFIX", "SHORT_NAMES", "SINGULAR", "SOURCE_IDENTIFIER",
    "VERSION", "WORKER_CONTAINER", "CHUNK_WITHIN_MODEL", "OVERLAP_WITHIN_MODEL",
    "ApiModel", "Batching", "ChosenBatching", "Chunking", "EmbeddingJobSpec", "Head", "IndexType", "Model",
    "ModelBackend", "ModelPrecision", "ModelPrompt", "PodDefaults", "Retry", "RunCounters", "Schedule", "SecretKeyRef",
    "Sink", "Source",
    "SourceTable", "SpecError", "Sync", "TableFilter", "VectorIndex", "Workers", "choose_batching", "parse_spec",
]

GROUP = "embedjob.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "EmbeddingJob"
PLURAL = "embeddingjobs"
SINGULAR = "embeddingjob"
SHORT_NAMES = ["ej"]

# How long a finished job's own RayCluster stays when the spec does not say: long enough
# to read the driver's log from the head (`embedjob logs`, docs/troubleshooting.md).
# Not a schema default: a clusterSelector job must leave the field unset.
DEFAULT_TTL_SECONDS_AFTER_FINISHED = 600

# KubeRay selects the cluster of a RayJob by this label (utils.RayJobClusterSelectorKey).
RAY_CLUSTER_SELECTOR_KEY = "ray.io/cluster"
HALF_NEEDS_GPU = "model.precision float16/bfloat16 runs on a GPU: set workers.gpusPerActor above 0"
# (CEL rule, message): a chunk the model would truncate is never planned (EmbeddingJobSpec checks the same).
CHUNK_WITHIN_MODEL = (
    "!has(self.chunking) || !has(self.chunking.maxTokens) || !has(self.model.maxSeqLength) "
    "|| self.chunking.maxTokens <= self.model.maxSeqLength",
    "chunking.maxTokens must be at most model.maxSeqLength (the model truncates longer texts)",
)
OVERLAP_WITHIN_MODEL = (
    "!has(self.chunking) || has(self.chunking.maxTokens) || !has(self.chunking.overlapTokens) "
    "|| !has(self.model.maxSeqLength) || 2 * self.chunking.overlapTokens <= self.model.maxSeqLength",
    "chunking.overlapTokens must be at most half of the chunk size (unset maxTokens: model.maxSeqLength)",
)

METADATA_INDEX_NEEDS_FIELDS = (
    "!has(self.sink.index) || !has(self.sink.index.metadata) || !self.sink.index.metadata "
    "|| has(self.source.metadataFields) || has(self.source.metadataFieldMap)",
    "sink.index.metadata indexes the metadata that source.metadataFields (or metadataFieldMap) keeps: set one",
)


class EmbeddingJobSpec(ApiModel):
    """What to embed (source), with which model, on how many Ray workers, into which PostgreSQL table
    (sink). Immutable once the job is accepted, except suspend."""

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
                    "!has(self.clusterSelector) || !self.suspend || has(self.schedule)",
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
                cel(
                    "!has(self.clusterSelector) || (!has(self.head) && !has(self.workers.template))",
                    "pod settings (head, workers.template) apply to the job's own cluster; unset them with "
                    "clusterSelector",
                    ".clusterSelector",
                ),
                # Kueue admits a job's own RayCluster; a RayJob on an existing cluster is no Kueue workload.
                cel(
                    "!has(self.queueName) || !has(self.clusterSelector)",
                    "a job in a Kueue queue (queueName) runs on its own cluster; unset clusterSelector",
                    ".queueName",
                ),
                # Kueue starts and stops a queued job (it unsuspends an admitted one); a schedule's suspend is its own.
                cel(
                    "!has(self.queueName) || !self.suspend || has(self.schedule)",
                    "a job in a Kueue queue (queueName) is started and stopped by Kueue; unset suspend "
                    "(deactivate its Workload to hold it: docs/kueue.md)",
                    ".suspend",
                ),
                cel(
                    f"!has(self.model.precision) || !(self.model.precision in {list(HALF_PRECISIONS)}) "
                    "|| (has(self.workers) && has(self.workers.gpusPerActor) && self.workers.gpusPerActor > 0.0)",
                    HALF_NEEDS_GPU,
                    ".model.precision",
                ),
                cel(*CHUNK_WITHIN_MODEL, ".chunking.maxTokens"),
                cel(*OVERLAP_WITHIN_MODEL, ".chunking.overlapTokens"),
                cel(*METADATA_INDEX_NEEDS_FIELDS, ".sink.index.metadata"),
                cel(*FULL_SCAN_NEEDS_CHANGES, ".sync.fullScanEvery"),
            ]
        }
    )

    source: Source
    model: Model
    batching: Batching = Field(default_factory=Batching)
    workers: Workers = Field(default_factory=Workers)
    sink: Sink
    retry: Retry = Field(default_factory=Retry)
    sync: Sync = Field(default_factory=Sync)
    chunking: Chunking | None = Field(
        None, description="Cut long texts into overlapping chunks, one vector each (docs/chunking.md). Unset: one "
        "vector per record, its text truncated at the model's token limit (counted as truncated).",
    )
    active_deadline_seconds: int | None = Field(
        None, ge=1, le=31_536_000,
        description="Seconds the whole job may run, from its start, before it is stopped and Failed "
        "(RayJob activeDeadlineSeconds). Unset: no deadline.",
    )
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, le=31_536_000,
        description="Seconds a finished job's own RayCluster (head and worker pods, with the driver's log on the "
        f"head) is kept before it is deleted (RayJob ttlSecondsAfterFinished). Unset: "
        f"{DEFAULT_TTL_SECONDS_AFTER_FINISHED}; 0 deletes it at once. Not with clusterSelector.",
    )
    suspend: bool = Field(
        False,
        description="true stops the job (its RayCluster is deleted) or keeps it from starting; false resumes "
        "it on a new cluster, skipping the batches already written. Not with clusterSelector. With schedule: "
        "true starts no run until it is false again.",
    )
    schedule: Schedule | None = Field(None, description="Run on a cron schedule, as a CronJob (docs/schedules.md).")
    cluster_selector: dict[str, Annotated[str, Field(min_length=1, max_length=63, pattern=LABEL_VALUE)]] | None = Field(
        None,
        json_schema_extra={"maxProperties": 16},
        description="Labels of an existing RayCluster to run on instead of creating one; must include "
        f"{RAY_CLUSTER_SELECTOR_KEY} (the cluster's name). The cluster is shared and kept (docs/pools.md).",
    )
    head: Head | None = Field(
        None, description="The Ray head pod (which runs the driver): its pod settings and resources "
        "(docs/pod-settings.md). Not with clusterSelector.",
    )
    queue_name: str | None = Field(
        None, min_length=1, max_length=63, pattern=DNS_LABEL,
        description="The Kueue LocalQueue (in the job's namespace) to run in: the RayJob is created suspended with "
        "the label kueue.x-k8s.io/queue-name and Kueue starts it once the queue's ClusterQueue admits it "
        "(docs/kueue.md). Unset: the operator's default queue (chart value defaultQueueName), if any.",
    )
    workload_priority_class: str | None = Field(
        None, min_length=1, max_length=63, pattern=DNS_SUBDOMAIN,
        description="A Kueue WorkloadPriorityClass for the job in its queue (label kueue.x-k8s.io/priority-class): "
        "it orders the queue and lets a job preempt lower-priority ones.",
    )

    @property
    def chosen_batching(self) -> ChosenBatching:
        """The batch size and token budget this job runs with, unset fields given their defaults."""
        return choose_batching(self.batching, self.workers.gpus_per_actor)

    @model_validator(mode="after")
    def _half_precision_on_gpu(self) -> "EmbeddingJobSpec":
        if self.model.precision in HALF_PRECISIONS and not self.workers.gpus_per_actor:
            raise ValueError(HALF_NEEDS_GPU)
        return self

    @model_validator(mode="after")
    def _metadata_index_has_metadata(self) -> "EmbeddingJobSpec":
        if self.sink.index is not None and self.sink.index.metadata and not self.source.metadata:
            raise ValueError(METADATA_INDEX_NEEDS_FIELDS[1])
        return self

    @model_validator(mode="after")
    def _full_scans_of_a_change_window(self) -> "EmbeddingJobSpec":
        table = self.source.table
        if self.sync.full_scan_every is not None and (table is None or table.change_column is None
                                                      or not self.sync.delete_missing):
            raise ValueError(FULL_SCAN_NEEDS_CHANGES[1])
        return self

    @model_validator(mode="after")
    def _chunks_within_the_model(self) -> "EmbeddingJobSpec":
        chunking, limit = self.chunking, self.model.max_seq_length
        if chunking is None or limit is None:
            return self
        if chunking.max_tokens is not None and chunking.max_tokens > limit:
            raise ValueError(CHUNK_WITHIN_MODEL[1])
        if chunking.max_tokens is None and 2 * chunking.overlap_tokens > limit:
            raise ValueError(OVERLAP_WITHIN_MODEL[1])
        return self


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

    batches_total: int | None = Field(
        None, ge=0, description="Batches in the whole input; known once the input has been read through."
    )
    batches_succeeded: int = Field(0, ge=0, description="Batches embedded and written, including those an earlier "
                                   "attempt of the job wrote (skipped, not recomputed).")
    batches_failed: int = Field(0, ge=0, description="Batches that failed for good, after their retries.")
    records_total: int | None = Field(
        None, ge=0, description="Records in the whole input; known once the input has been read through."
    )
    records_embedded: int = Field(0, ge=0, description="Records whose vectors are written, including those an "
                                  "earlier attempt of the job wrote.")
    records_failed: int = Field(0, ge=0, description="Records not embedded: invalid records and those of failed "
                                "batches.")
    texts_per_second: float = Field(0, ge=0, description="Records embedded per second since the workers were "
                                    "ready (this attempt only).")
    index_build_seconds: float | None = Field(
        None, ge=0, description="Seconds the run spent building the vector index (spec.sink.index) after the load; "
        "unset when it built none (none asked for, or the index existed already).")
    records_new: int = Field(0, ge=0, description="Records embedded whose id had no vector for this model and "
                             "revision in the collection (incremental runs; docs/table-source.md).")
    records_changed: int = Field(0, ge=0, description="Records re-embedded because their text (content hash) "
                                 "changed since their vector was written.")
    records_unchanged: int = Field(0, ge=0, description="Records whose vector was already up to date: not sent to "
                                   "the model, not written again (counted in recordsEmbedded).")
    records_deleted: int = Field(0, ge=0, description="Records whose vectors (all their chunks) were deleted at the end "
                                 "of the run because their id is no longer in the source (sync.deleteMissing).")
    chunks_embedded: int = Field(0, ge=0, description="Vectors the model embedded and the run wrote: one per record "
                                 "without spec.chunking, one per chunk with it (unchanged records' not included).")
    precision_cosine_mean: float | None = Field(
        None, ge=-1, le=1, description="A reduced precision (spec.model.precision not float32): the mean cosine "
        "between its vectors and float32's on a sample of the job's first texts, measured as the run started "
        "(spec.model.minCosine); unset for float32.")
    precision_cosine_min: float | None = Field(
        None, ge=-1, le=1, description="The least cosine of that sample: the text the reduced precision changed most.")
