"""Resolving and loading the sentence-transformers model of a job.

A model is pinned one of four ways: a hub name + revision (commit), a directory
(`path`, e.g. baked into the worker image), a Python distribution that ships the
files (`package`), or a directory in storage (`uri` + the revision its weights hash to:
embedjob_worker.encode.model_store). For the last three the recorded revision is a hash of
the weights, so two actors with different files can never silently write under the same revision.

The revision recorded with every vector also names the backend and precision that
produced it, the document prompt and the dimensions kept (`tagged_revision`), so vectors of
an int8 OpenVINO model, or of another prompt, never overwrite or mix with float32 torch
vectors of the same weights. onnx and openvino models are exported once per job
(`embedjob_worker.encode.exported`) and loaded from that export.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from embedjob.api import Model, ModelBackend, ModelPrecision
from embedjob.db import runs
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.worker_reports import EmbedResult, WorkerInfo
from embedjob_worker.encode.model_card import ChosenPrompt, document_prompt, model_prompts, pooling_includes_prompt
from embedjob_worker.encode.model_store import fetch_model, weights_revision
from embedjob_worker.encode.onnx_export import INT8_SCHEME

# A directory holding a sentence-transformers model has one of these.
_MODEL_MARKERS = ("modules.json", "config_sentence_transformers.json")
# The revision columns (of the run rows and the vectors table) hold at most this many characters.
REVISION_MAX_CHARS = runs.c.revision.type.length
# How much of a long prompt the summary and the status show (the run identity keeps all of it).
PROMPT_SHOWN_CHARS = 200
# A spec revision never contains "+" (its pattern), so the tag cannot be mistaken for one.
BACKEND_TAG_SEPARATOR = "+"
# What each backend needs installed in the worker image (the `backends` extra).
_BACKEND_DISTRIBUTIONS = {"onnx": (("onnxruntime", "onnx", "onnxscript"), "embedjob[backends]"),
                          "openvino": (("optimum-intel", "openvino", "nncf"), "sentence-transformers[openvino]")}


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # recorded with every vector
    revision: str  # recorded with every vector
    location: str  # directory, or hub repository id
    hub_revision: str | None  # for hub models: the pinned commit to download
    normalize: bool
    max_seq_length: int | None
    backend: str = ModelBackend.torch.value
    precision: str = ModelPrecision.float32.value
    uri: str | None = None  # a model from storage (spec.model.uri): `location` is where this node keeps it
    prompt: ChosenPrompt = ChosenPrompt("", "none")  # put before each document (model_card.document_prompt)
    dimensions: int | None = None  # the first N dimensions kept (spec.model.dimensions), None: all

    @property
    def weights_revision(self) -> str:
        """The revision of the weights alone, without the tags of backend, precision, prompt and dimensions."""
        return self.revision.split(BACKEND_TAG_SEPARATOR)[0]

    @property
    def exported(self) -> bool:
        """Whether actors load an export (onnx, openvino) rather than the torch weights."""
        return self.backend != ModelBackend.torch.value


def tagged_revision(revision: str, backend: str, precision: str, prompt_tag: str = "",
                    dimensions: int | None = None) -> str:
    """The revision recorded with a vector: the weights' revision, then `+backend-precision` unless torch
    float32 (onnx int8 with its quantization's scheme: `+onnx-int8v2`), `+p<hash>` for a document prompt,
    `+d<N>` for the first N dimensions.

    torch float32 without a prompt or truncation keeps the bare revision (the vectors written before these
    existed stay valid); anything else is e.g. `3f2a...+openvino-int8` or `3f2a...+p1f2e3d4c+d256`.
    """
    tagged = revision
    if (backend, precision) != (ModelBackend.torch.value, ModelPrecision.float32.value):
        scheme = INT8_SCHEME if (backend, precision) == (ModelBackend.onnx.value, ModelPrecision.int8.value) else ""
        tagged += f"{BACKEND_TAG_SEPARATOR}{backend}-{precision}{scheme}"
    if prompt_tag:
        tagged += f"{BACKEND_TAG_SEPARATOR}p{prompt_tag}"
    if dimensions is not None:
        tagged += f"{BACKEND_TAG_SEPARATOR}d{dimensions}"
    if len(tagged) > REVISION_MAX_CHARS:
        raise ValueError(f"revision {revision!r} with backend {backend}, precision {precision}, its prompt and "
                         f"dimensions is longer than {REVISION_MAX_CHARS} characters")
    return tagged


def check_backend_installed(backend: str) -> None:
    """A clear refusal, naming the field, when the image lacks what a backend needs (checked
    by distribution, without importing the heavy runtime)."""
    distributions, extra = _BACKEND_DISTRIBUTIONS.get(backend, ((), ""))
    missing = []
    for distribution in distributions:
        try:
            importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            missing.append(distribution)
    if missing:
        raise ValueError(f"backend {backend} needs {', '.join(missing)} ({extra}), not installed in this image")


def package_model_dir(distribution: str) -> Path:
    """The directory inside an installed distribution that holds the model files."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"model package {distribution!r} is not installed") from None
    candidates = [
        Path(dist.locate_file(f)).parent for f in dist.files or () if Path(str(f)).name in _MODEL_MARKERS
    ]
    if not candidates:
        raise FileNotFoundError(f"package {distribution!r} ships no sentence-transformers model")
    return min(candidates, key=lambda p: len(p.parts))


def local_model_dir(model: Model) -> Path | None:
    """The folder a model's files are in on this machine when the spec names one (a path or a package); None for
    a hub id or a model from storage."""
    if model.path:
        return Path(model.path)
    return package_model_dir(model.package) if model.package else None


def resolve_model(model: Model) -> ResolvedModel:
    """Where to load the model from and which revision its vectors are recorded under. A model from storage
    (`uri`) is fetched into this node's cache and verified here, so that a wrong one stops the job at its start."""
    directory = local_model_dir(model)
    if directory is not None:
        location, revision, hub_revision = str(directory), weights_revision(directory), None
    elif model.uri:
        location, revision, hub_revision = str(fetch_model(model.uri, model.revision)), model.revision, None
    else:
        location, revision, hub_revision = model.name, model.revision, model.revision
    check_backend_installed(model.backend)
    prompt = document_prompt(model.prompt, model_prompts(location, hub_revision))
    if model.backend == ModelBackend.onnx.value and prompt.text and not pooling_includes_prompt(location,
                                                                                                hub_revision):
        raise JobFailed("BackendCannotPrompt", f"spec.model.backend onnx: model {model.name}'s pooling leaves the "
                                               "prompt's tokens out (include_prompt false), which its exported graph "
                                               "cannot; use backend torch or openvino")
    return ResolvedModel(model.name, tagged_revision(revision, model.backend, model.precision, prompt.tag,
                                                     model.dimensions),
                         location, hub_revision, model.normalize, model.max_seq_length, model.backend,
                         model.precision, model.uri, prompt, model.dimensions)


def on_this_node(resolved: ResolvedModel) -> ResolvedModel:
    """`resolved` with its files on this node: a model from storage fetched into (or found in) this node's
    cache, verified; any other as it is."""
    if resolved.uri is None:
        return resolved
    return dataclasses.replace(resolved, location=str(fetch_model(resolved.uri, resolved.weights_revision)))


def float32_reference(resolved: ResolvedModel) -> ResolvedModel:
    """The same weights in float32 torch: what a reduced precision is compared with."""
    return dataclasses.replace(resolved, backend=ModelBackend.torch.value, precision=ModelPrecision.float32.value)


def loaded_revision(resolved: ResolvedModel) -> str:
    """The tagged revision of the files at `resolved.location` (hashed again for path/package models)."""
    weights = resolved.hub_revision if resolved.hub_revision is not None else weights_revision(resolved.location)
    return tagged_revision(weights, resolved.backend, resolved.precision, resolved.prompt.tag, resolved.dimensions)


def load_model(resolved: ResolvedModel, device: str, exported_dir: str | Path | None = None,
               threads: int | None = None):
    """The model in its backend and precision: onnx/openvino (on CPU, with `threads` threads) from
    `exported_dir`, an export of `embedjob_worker.encode.exported`; torch from its own files, cast to a
    half precision if asked."""
    if resolved.exported and exported_dir is None:
        raise ValueError(f"backend {resolved.backend} loads an exported model; none was given")
    if resolved.backend == ModelBackend.onnx.value:
        from embedjob_worker.encode.onnx_model import OnnxSentenceModel

        model = OnnxSentenceModel(exported_dir, threads)
    elif resolved.exported:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(exported_dir), backend=resolved.backend, device="cpu",
                                    model_kwargs=_runtime_threads(threads))
    else:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(resolved.location, revision=resolved.hub_revision, device=device)
        if resolved.precision != ModelPrecision.float32.value:
            import torch

            model.to(getattr(torch, resolved.precision))
    if resolved.max_seq_length:
        model.max_seq_length = resolved.max_seq_length
    return model


def _runtime_threads(threads: int | None) -> dict:
    """OpenVINO uses every core of the node unless told: an actor gets its CPUs' worth."""
    return {"ov_config": {"INFERENCE_NUM_THREADS": str(threads)}} if threads else {}


def check_model(reported: WorkerInfo | EmbedResult, resolved: ResolvedModel) -> None:
    """An actor's info() or result must come from the job's model and revision."""
    if (reported.model, reported.revision) != (resolved.name, resolved.revision):
        raise JobFailed("ModelMismatch", f"worker {reported.worker} has {reported.model}@"
                        f"{reported.revision}, the job pins {resolved.name}@{resolved.revision}")


def check_dimensions(resolved: ResolvedModel, model_dimension: int) -> None:
    """spec.model.dimensions may keep at most the model's own dimensions (DimensionsTooMany)."""
    if resolved.dimensions is not None and resolved.dimensions > model_dimension:
        raise JobFailed("DimensionsTooMany", f"spec.model.dimensions: {resolved.dimensions} is more than model "
                                             f"{resolved.name}'s {model_dimension} dimensions")


def described_prompt(resolved: ResolvedModel) -> str:
    """The document prompt for the summary and the log: `"passage: " (the model's 'passage' prompt ...)`."""
    prompt = resolved.prompt
    if not prompt.text:
        return prompt.chosen_by
    shown = prompt.text if len(prompt.text) <= PROMPT_SHOWN_CHARS else prompt.text[:PROMPT_SHOWN_CHARS] + "…"
    return f"{shown!r} ({prompt.chosen_by})"
