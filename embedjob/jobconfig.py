"""The job config handed from the operator to the driver: base64 of compact JSON.

The operator puts `encode_job_config(manifest)` on the driver's command line
(`python -m embedjob_worker.driver --config-b64 ...`); the driver decodes it with
`decode_job_config`. Base64 keeps the JSON safe from shell quoting in the RayJob
entrypoint. Only the manifest's apiVersion, kind, metadata (name, namespace, uid)
and spec travel; credentials never do (the database URL comes from the environment).
This module imports nothing heavy: the controller uses it.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from embedjob.api import API_VERSION, KIND, SpecError

_METADATA_FIELDS = ("name", "namespace", "uid")


def job_config(manifest: dict[str, Any]) -> dict[str, Any]:
    """The part of an EmbeddingJob manifest the driver needs (no status, no annotations)."""
    metadata = manifest.get("metadata") or {}
    return {
        "apiVersion": manifest.get("apiVersion", API_VERSION),
        "kind": manifest.get("kind", KIND),
        "metadata": {k: metadata[k] for k in _METADATA_FIELDS if metadata.get(k)},
        "spec": manifest.get("spec") or {},
    }


def encode_job_config(manifest: dict[str, Any]) -> str:
    """Base64 (standard alphabet) of the compact, key-sorted JSON of `job_config(manifest)`."""
    payload = json.dumps(job_config(manifest), separators=(",", ":"), sort_keys=True)
    return base64.b64encode(payload.encode()).decode("ascii")


def decode_job_config(encoded: str) -> dict[str, Any]:
    """Inverse of `encode_job_config`; raises SpecError for anything that is not a job config."""
    try:
        manifest = json.loads(base64.b64decode(encoded.encode("ascii"), validate=True))
    except (binascii.Error, UnicodeError, ValueError) as exc:
        raise SpecError([("--config-b64", f"not base64 of a JSON object: {exc}")]) from None
    if not isinstance(manifest, dict):
        raise SpecError([("--config-b64", "expected a JSON object")])
    return manifest
