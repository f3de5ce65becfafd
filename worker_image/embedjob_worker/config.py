"""The job config the driver runs: manifest metadata plus the parsed spec."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedjob.api import API_VERSION, KIND, EmbeddingJobSpec, SpecError, load_manifest, parse_spec


@dataclass(frozen=True)
class JobConfig:
    name: str
    namespace: str
    uid: str | None
    spec: EmbeddingJobSpec
    # Relative source paths resolve against this directory (the manifest's, for `embedjob run`).
    base_dir: Path | None = None

    @property
    def job_key(self) -> str:
        """The EmbeddingJob's uid in a cluster; `local/<namespace>/<name>` for local runs."""
        return self.uid or f"local/{self.namespace}/{self.name}"

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], base_dir: Path | None = None) -> "JobConfig":
        problems = []
        if manifest.get("apiVersion") != API_VERSION:
            problems.append(("apiVersion", f"must be {API_VERSION}, got {manifest.get('apiVersion')!r}"))
        if manifest.get("kind") != KIND:
            problems.append(("kind", f"must be {KIND}, got {manifest.get('kind')!r}"))
        metadata = manifest.get("metadata")
        if not isinstance(metadata, dict) or not metadata.get("name"):
            problems.append(("metadata.name", "is required"))
            metadata = {}
        if not isinstance(manifest.get("spec"), dict):
            problems.append(("spec", "is required"))
        if problems:
            raise SpecError(problems)
        return cls(
            name=str(metadata["name"]),
            namespace=str(metadata.get("namespace") or "default"),
            uid=metadata.get("uid") or None,
            spec=parse_spec(manifest["spec"]),
            base_dir=base_dir,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> "JobConfig":
        path = Path(path)
        return cls.from_manifest(load_manifest(path), base_dir=path.resolve().parent)


def config_fingerprint(spec: EmbeddingJobSpec, model_revision: str) -> str:
    """Hash of every setting that changes which batches exist or what their vectors are.

    Replicas, CPUs, maxInFlight and retry settings are left out: changing them neither
    changes a batch nor a vector, so a resumed job may use different ones.
    """
    relevant = {
        "format": spec.source.format,
        "idField": spec.source.id_field,
        "textField": spec.source.text_field,
        "model": spec.model.name,
        "revision": model_revision,
        "normalize": spec.model.normalize,
        "maxSeqLength": spec.model.max_seq_length,
        "batchSize": spec.batching.batch_size,
        "sortWindow": spec.batching.sort_window,
    }
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()
