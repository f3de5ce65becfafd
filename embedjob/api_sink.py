"""The sink section of the EmbeddingJob spec: the pgvector table, its vector type and its index."""

from __future__ import annotations

from enum import Enum

from pydantic import ConfigDict, Field, field_validator, model_validator

from .api_base import SQL_IDENTIFIER, ApiModel, SecretKeyRef
from .api_pod_rules import QUANTITY, quantity_value
from .api_rules import NOT_BLANK, TABLE_RULE, FieldRule, cel


class VectorType(str, Enum):
    vector = "vector"  # 4 bytes a dimension
    halfvec = "halfvec"  # 2 bytes a dimension (IEEE half precision)


class IndexType(str, Enum):
    hnsw = "hnsw"
    none = "none"


# pgvector's HNSW bounds (hnsw.h: HNSW_MIN_M .. HNSW_MAX_M, HNSW_MAX_EF_CONSTRUCTION) and its defaults.
HNSW_DEFAULT_M = 16
HNSW_DEFAULT_EF_CONSTRUCTION = 64
_EF_RULE = (f"(has(self.efConstruction) ? self.efConstruction : {HNSW_DEFAULT_EF_CONSTRUCTION}) >= "
            f"2 * (has(self.m) ? self.m : {HNSW_DEFAULT_M})")
_EF_MESSAGE = "efConstruction must be at least 2 * m (pgvector's rule)"
_NONE_RULE = "self.type == 'hnsw' || (!has(self.m) && !has(self.efConstruction) && !has(self.buildMemory))"
_NONE_MESSAGE = "m, efConstruction and buildMemory apply to type hnsw only"
# PostgreSQL's maintenance_work_mem bounds, in whole kB: 1 MiB (below that pgvector's graph cannot be held
# at all) to 2047 GiB (its MAX_KILOBYTES is INT_MAX kB).
_BUILD_MEMORY_MIN, _BUILD_MEMORY_MAX = "1Mi", "2047Gi"
BUILD_MEMORY_RULE = FieldRule(
    "buildMemory",
    f"quantity(self.buildMemory).compareTo(quantity('{_BUILD_MEMORY_MIN}')) >= 0 && "
    f"quantity(self.buildMemory).compareTo(quantity('{_BUILD_MEMORY_MAX}')) <= 0",
    lambda text: quantity_value(_BUILD_MEMORY_MIN) <= quantity_value(text) <= quantity_value(_BUILD_MEMORY_MAX),
    f"buildMemory must be between {_BUILD_MEMORY_MIN} and {_BUILD_MEMORY_MAX}",
)


class VectorIndex(ApiModel):
    """The approximate nearest-neighbour index on the vectors table (pgvector), built after the load when missing."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [
            cel(_EF_RULE, _EF_MESSAGE, ".efConstruction"), cel(_NONE_RULE, _NONE_MESSAGE, ".type"),
            BUILD_MEMORY_RULE.cel()]}
    )

    type: IndexType = Field(
        IndexType.none,
        description="hnsw: a pgvector HNSW index with the operator class that matches model.normalize (inner "
        "product for normalised vectors, cosine otherwise); none: no index (exact search by sequential scan).",
    )
    m: int | None = Field(
        None, ge=2, le=100,
        description=f"HNSW links per node (2-100). Unset: {HNSW_DEFAULT_M}. More gives better recall, a larger "
        "index and a slower build.",
    )
    ef_construction: int | None = Field(
        None, ge=4, le=1000,
        description=f"HNSW candidate list size while building (4-1000, at least 2 * m). Unset: "
        f"{HNSW_DEFAULT_EF_CONSTRUCTION}.",
    )
    build_memory: str | None = Field(
        None, max_length=64, pattern=QUANTITY,
        description=f"Memory the index build may use in PostgreSQL (its maintenance_work_mem for the build's "
        f"transaction only), a Kubernetes quantity from {_BUILD_MEMORY_MIN} to {_BUILD_MEMORY_MAX}, e.g. 1Gi. "
        "Unset: the database's own setting (64MB by default). A graph that does not fit is built far more "
        "slowly (about as slowly as maintaining the index during the load); the run's log says when it did not "
        "fit. The memory is taken from the database server.",
    )
    metadata: bool | None = Field(
        None, description="true: a GIN index (jsonb_path_ops) on the vectors' metadata (source.metadataFields), for "
        "searches that filter on it (`embedjob search --where`); built after the load when missing. Unset or "
        "false: none.",
    )

    @property
    def hnsw_m(self) -> int:
        return self.m or HNSW_DEFAULT_M

    @property
    def hnsw_ef_construction(self) -> int:
        return self.ef_construction or HNSW_DEFAULT_EF_CONSTRUCTION

    @property
    def build_memory_kb(self) -> int | None:
        """buildMemory in whole kB (rounded up), as PostgreSQL's maintenance_work_mem takes it; None if unset."""
        if self.build_memory is None:
            return None
        return -(-int(quantity_value(self.build_memory)) // 1024)

    @field_validator("build_memory")
    @classmethod
    def _build_memory_bounds(cls, build_memory: str | None) -> str | None:
        return BUILD_MEMORY_RULE.enforce(build_memory)

    @model_validator(mode="after")
    def _pgvector_rules(self) -> "VectorIndex":
        if self.type != IndexType.hnsw and any(v is not None for v in (self.m, self.ef_construction,
                                                                        self.build_memory)):
            raise ValueError(_NONE_MESSAGE)
        if self.hnsw_ef_construction < 2 * self.hnsw_m:
            raise ValueError(f"{_EF_MESSAGE}: efConstruction {self.hnsw_ef_construction} < 2 * m {self.hnsw_m}")
        return self


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

    retain_previous: int = Field(
        1, ge=0, le=100, strict=True,
        description="Revisions (model and revision) of the collection kept, besides the ready one, after a run makes "
        "another ready: retired ones past this many are deleted with their vectors after the switch. 0: the previous "
        "revision goes right after the switch. Searches read only the ready revision (the table's <table>_current "
        "view; docs/revisions.md).",
    )
    vector_type: VectorType = Field(
        VectorType.vector,
        description="Column type of the vectors: vector (32-bit floats) or halfvec (16-bit floats, half the "
        "bytes per row). A table keeps the type it was created with; a job of the other type is refused.",
    )
    writers: int = Field(
        0, ge=0, le=64, strict=True,  # as the CRD: 2, not "2" or true
        description="Writer actors (0-64) that write finished batches, each on its own database connection, in the "
        "same one-transaction-per-group form: a batch's vectors go from its EmbeddingWorker through Ray's object "
        "store to a writer, never through the driver. 0: one writer thread in the driver (docs/driver.md). Writer "
        "actors ask Ray for no CPU.",
    )
    index: VectorIndex | None = Field(
        None,
        description="Vector index built on the table after a successful run when missing (docs/vector-index.md); "
        "none unless type is hnsw.",
    )

    @field_validator("table")
    @classmethod
    def _not_reserved(cls, table: str) -> str:
        return TABLE_RULE.enforce(table)

    @property
    def hnsw(self) -> VectorIndex | None:
        """The HNSW index the job asks for, or None."""
        return self.index if self.index is not None and self.index.type == IndexType.hnsw else None
