"""Exporting a job's model to its onnx/openvino backend and precision once, and handing it to the actors.

Where the export happens, and why: the driver exports (and, for int8, quantizes) the
model once per job into a local cache directory keyed by the model's location, revision,
backend, precision and the exporting libraries' versions, then puts the exported files
into the Ray object store once (`model_for_actors`). Every actor receives that one object (Ray
copies it once per node) and writes it into the same-keyed cache directory on its node
before loading it (`materialize`). The alternatives were worse: actors exporting into a
node-local cache export once per node and need a file lock so that actors on one node do
not export concurrently, and a cache on a shared volume needs a volume the RayJob does not
have. The exported MiniLM is tens of MB: the object store holds it once while the job
runs. `embedjob search` uses the same cache (`export_model`), so a query is embedded by
the same exported model as the vectors it is compared with.

onnx is embedjob's own export (`embedjob_worker.encode.onnx_export`: one graph, checked against
the model, int8 by ONNX Runtime's dynamic quantization); openvino is sentence-transformers'
export through optimum-intel, int8 NNCF's data-free weight compression (OpenVINO's CPU plugin
quantizes the activations at run time). sentence-transformers' `export_static_quantized_openvino_model` needs a
calibration data set from the Hugging Face hub, which clusters without hub access lack.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from embedjob.api import HALF_PRECISIONS

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.encode.model import ResolvedModel, load_model

# The libraries whose version changes what an export contains.
_EXPORT_LIBRARIES = ("sentence-transformers", "transformers", "tokenizers", "torch", "onnx", "onnxscript", "onnxruntime",
                     "optimum", "optimum-intel", "openvino", "nncf")
# What an export's directory holds, by embedjob's own code: another layout is another key (2: the onnx backend's
# tokenizer kept as transformers built it, so that an actor runs it without transformers; 3: onnx int8 quantized
# before the fusion, onnx_export.INT8_SCHEME).
EXPORT_LAYOUT = 3
_COMPLETE_MARKER = ".embedjob-export-complete"
KEY_HEX_CHARS = 24


@dataclass(frozen=True)
class ExportedModel:
    """An export's cache key and its files (relative path -> content), as shipped to the actors."""

    key: str
    files: dict[str, bytes]


def cache_root() -> Path:
    """Where exports are kept on this machine ($XDG_CACHE_HOME/embedjob-models, default ~/.cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "embedjob-models"


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def export_key(resolved: ResolvedModel) -> str:
    """The cache key: what the model is and how (and by which library versions) it is exported (one export serves
    every prompt and every number of dimensions)."""
    identity = [resolved.location, resolved.weights_revision, resolved.backend, resolved.precision,
                {name: _version(name) for name in _EXPORT_LIBRARIES}, EXPORT_LAYOUT]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:KEY_HEX_CHARS]


def export_model(resolved: ResolvedModel) -> Path:
    """The exported model's directory in this machine's cache, exporting it first if missing."""
    target = cache_root() / export_key(resolved)
    if (target / _COMPLETE_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".export-") as scratch:
        staging = Path(scratch) / "model"
        _export_into(resolved, staging)
        (staging / _COMPLETE_MARKER).touch()
        _publish(staging, target)
    return target


def _export_into(resolved: ResolvedModel, directory: Path) -> None:
    if resolved.backend == "onnx":
        from embedjob_worker.encode.onnx_export import export_onnx

        export_onnx(resolved.location, resolved.hub_revision, directory, int8=resolved.precision == "int8")
        return
    from sentence_transformers import SentenceTransformer

    # Loading a torch checkpoint with backend= makes sentence-transformers export it (through optimum-intel).
    model = SentenceTransformer(resolved.location, revision=resolved.hub_revision, backend=resolved.backend,
                                device="cpu")
    model.save(str(directory))
    if resolved.precision == "int8":
        import nncf
        import openvino

        xml = directory / "openvino" / "openvino_model.xml"
        compressed = nncf.compress_weights(openvino.Core().read_model(str(xml)), mode=nncf.CompressWeightsMode.INT8_ASYM)
        for stale in (xml, xml.with_suffix(".bin")):
            stale.unlink()
        openvino.save_model(compressed, str(xml))


def _publish(staging: Path, target: Path) -> None:
    """Move a finished export into place; another process that got there first wins."""
    try:
        staging.rename(target)
    except OSError:
        if not (target / _COMPLETE_MARKER).exists():  # a crashed earlier attempt: replace it
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)


def load_on_this_machine(resolved: ResolvedModel, threads: int | None = None):
    """The model in its backend on this machine's CPU: an onnx/openvino model from this machine's export
    (made first if missing), as the actors run it."""
    return load_model(resolved, "cpu", export_model(resolved) if resolved.exported else None, threads)


def read_export(resolved: ResolvedModel) -> ExportedModel:
    directory = export_model(resolved)
    files = {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
    return ExportedModel(directory.name, files)


def model_for_actors(resolved: ResolvedModel):
    """Driver side, once per job: the export in the Ray object store (None for torch: nothing to
    export). Refuses a half precision on a Ray cluster without GPUs, and names the field."""
    import ray

    if resolved.precision in HALF_PRECISIONS and not ray.cluster_resources().get("GPU"):
        raise JobFailed("NoGPU", f"spec.model.precision {resolved.precision} runs on a GPU and the Ray cluster "
                                 "has none")
    if not resolved.exported:
        return None
    try:
        exported = read_export(resolved)
    except Exception as exc:  # noqa: BLE001 - any export failure refuses the job with its reason
        raise JobFailed("ModelExportFailed", f"spec.model.backend {resolved.backend}, precision "
                                             f"{resolved.precision}: {type(exc).__name__}: {exc}"[:4000]) from None
    return ray.put(exported)


def materialize(exported: ExportedModel) -> Path:
    """Actor side: the shipped export as a directory in this node's cache (written once per node)."""
    target = cache_root() / exported.key
    if (target / _COMPLETE_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".ship-") as scratch:
        staging = Path(scratch) / "model"
        for relative, content in exported.files.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        _publish(staging, target)
    return target
