"""Resolving and loading the sentence-transformers model of a job.

A model is pinned one of three ways: a hub name + revision (commit), a directory
(`path`, e.g. baked into the worker image) or a Python distribution that ships the
files (`package`). For the last two the recorded revision is a hash of the weights, so
two actors with different files can never silently write under the same revision.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from embedjob.api import Model

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".onnx")
# A directory holding a sentence-transformers model has one of these.
_MODEL_MARKERS = ("modules.json", "config_sentence_transformers.json")
REVISION_HEX_CHARS = 16


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # recorded with every vector
    revision: str  # recorded with every vector
    location: str  # directory, or hub repository id
    hub_revision: str | None  # for hub models: the pinned commit to download
    normalize: bool
    max_seq_length: int | None


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


def weights_revision(directory: str | Path) -> str:
    """sha256 over the weight files (relative name + content), truncated: the path/package revision."""
    directory = Path(directory)
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"no weight files ({', '.join(_WEIGHT_SUFFIXES)}) under {directory}")
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(directory)).encode() + b"\x00")
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:REVISION_HEX_CHARS]


def resolve_model(model: Model) -> ResolvedModel:
    """Where to load the model from and which revision its vectors are recorded under."""
    if model.path or model.package:
        directory = Path(model.path) if model.path else package_model_dir(model.package)
        location, revision, hub_revision = str(directory), weights_revision(directory), None
    else:
        location, revision, hub_revision = model.name, model.revision, model.revision
    return ResolvedModel(model.name, revision, location, hub_revision, model.normalize, model.max_seq_length)


def load_model(resolved: ResolvedModel, device: str):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(resolved.location, revision=resolved.hub_revision, device=device)
    if resolved.max_seq_length:
        model.max_seq_length = resolved.max_seq_length
    return model
