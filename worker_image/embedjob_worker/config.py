"""The job config the driver runs: manifest metadata plus the parsed spec."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedjob.api import EmbeddingJobSpec, parse_spec
from embedjob.manifest import check_envelope, load_manifest


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
        metadata = check_envelope(manifest)["metadata"]
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
