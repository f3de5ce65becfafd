"""The job config the driver runs: manifest metadata plus the parsed spec."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedjob.api import EmbeddingJobSpec, parse_spec
from embedjob.db import runs
from embedjob.manifest import check_envelope, load_manifest

_JOB_KEY_LENGTH = runs.c.job_key.type.length


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
        """The EmbeddingJob's uid in a cluster (its spec is immutable once accepted: other settings
        are another EmbeddingJob, another uid). Locally `local/<namespace>/<name>/<table>/<collection>`:
        the same manifest name writing somewhere else is another job, not a changed one. A key over
        the column's length is hashed."""
        if self.uid:
            return self.uid
        key = f"local/{self.namespace}/{self.name}/{self.spec.sink.table}/{self.spec.sink.collection}"
        return key if len(key) <= _JOB_KEY_LENGTH else "local/sha256:" + hashlib.sha256(key.encode()).hexdigest()

    @property
    def how_to_start_anew(self) -> str:
        """What the user can do when a re-run is refused because the input or the settings changed."""
        if self.uid:
            # Nothing in an EmbeddingJob passes --new-run, and its spec cannot change once accepted.
            return ("Delete and re-create the EmbeddingJob: a new EmbeddingJob (a new uid) is a new job with "
                    "a new run; vectors already in the table that did not change are not written again")
        return "Pass --new-run (embedjob run --new-run, or the driver's --new-run) to start a new run"

    def with_max_tokens(self, max_tokens: int) -> "JobConfig":
        """The job with spec.batching.maxTokens set (`embedjob run --max-tokens`), validated like the
        manifest: SpecError names the field."""
        return self._with("batching", maxTokens=max_tokens)

    def with_chunking(self, max_tokens: int | None, overlap_tokens: int | None) -> "JobConfig":
        """The job with spec.chunking on, and those of its fields that are not None set (`embedjob run
        --chunk-max-tokens/--chunk-overlap-tokens`); SpecError names the field."""
        given = {"maxTokens": max_tokens, "overlapTokens": overlap_tokens}
        return self._with("chunking", **{name: value for name, value in given.items() if value is not None})

    def _with(self, section: str, **fields: Any) -> "JobConfig":
        spec = self.spec.model_dump(by_alias=True, exclude_none=True)
        spec[section] = {**spec.get(section, {}), **fields}
        return dataclasses.replace(self, spec=parse_spec(spec))

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


def run_identity(spec: EmbeddingJobSpec, model_revision: str, prompt: str = "") -> dict[str, Any]:
    """Every setting that decides which batches exist, what their vectors are and where they
    are written, keyed by its spec path (a refused re-run names the ones that changed).

    Replicas, CPUs, maxInFlight, sink.writers and retry settings are left out: changing them neither
    changes a batch nor a vector nor where it goes, so a resumed job may use different ones.
    batchSize and maxTokens are the ones the job runs with (spec.chosen_batching: unset ones defaulted).
    batching.maxTokens, chunking, source.textTemplate, the document prompt (its text, as the model's config or the
    spec gives it), model.dimensions and source.metadataFields are only present when there is one, so runs from
    before they existed keep their fingerprint.
    """
    chosen = spec.chosen_batching
    budget = {"batching.maxTokens": chosen.max_tokens} if chosen.max_tokens is not None else {}
    chunking = {} if spec.chunking is None else {"chunking.maxTokens": spec.chunking.max_tokens,
                                                 "chunking.overlapTokens": spec.chunking.overlap_tokens}
    return {
        "source.format": spec.source.format,
        "source.idField": spec.source.id_field,
        "source.textField": spec.source.text_field,
        "model.name": spec.model.name,
        "model.revision": model_revision,
        "model.normalize": spec.model.normalize,
        "model.maxSeqLength": spec.model.max_seq_length,
        "batching.batchSize": chosen.batch_size,
        "batching.sortWindow": spec.batching.sort_window,
        "sink.table": spec.sink.table,
        "sink.collection": spec.sink.collection,
        **budget,
        **chunking,
        **({"source.textTemplate": spec.source.text_template} if spec.source.text_template is not None else {}),
        **({"model.prompt": prompt} if prompt else {}),
        **({"model.dimensions": spec.model.dimensions} if spec.model.dimensions is not None else {}),
        **({"source.metadataFields": spec.source.metadata_fields} if spec.source.metadata_fields else {}),
        **({"source.metadataFieldMap": spec.source.metadata_field_map} if spec.source.metadata_field_map else {}),
    }


def config_fingerprint(identity: dict[str, Any]) -> str:
    """The hash of a run identity (run_identity): part of every batch id of the run."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def identity_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two run identities, one phrase per field: "sink.collection changed from 'a' to 'b'"."""
    return [f"{key} changed from {old.get(key)!r} to {new.get(key)!r}"
            for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key)]
