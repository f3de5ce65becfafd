"""Reading an EmbeddingJob manifest: the one check of its envelope (apiVersion, kind, metadata.name, spec).

`embedjob run` loads a manifest file with `load_manifest`; the driver checks the job
config the operator hands it with `check_envelope`. The spec itself is parsed by
`embedjob.api.parse_spec`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from embedjob.api import API_VERSION, KIND, SpecError


def check_envelope(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest, if it is an EmbeddingJob with a name and a spec; else SpecError naming each field."""
    problems = []
    if manifest.get("apiVersion") != API_VERSION:
        problems.append(("apiVersion", f"must be {API_VERSION}, got {manifest.get('apiVersion')!r}"))
    if manifest.get("kind") != KIND:
        problems.append(("kind", f"must be {KIND}, got {manifest.get('kind')!r}"))
    if not isinstance(manifest.get("metadata"), dict) or not manifest["metadata"].get("name"):
        problems.append(("metadata.name", "is required"))
    if not isinstance(manifest.get("spec"), dict):
        problems.append(("spec", "is required"))
    if problems:
        raise SpecError(problems)
    return manifest


def load_manifest(path: str | Path) -> dict[str, Any]:
    """Read an EmbeddingJob manifest (YAML or JSON) and check its envelope."""
    text = Path(path).read_text()
    try:
        manifest = yaml.safe_load(text) if not str(path).endswith(".json") else json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise SpecError([(str(path), f"not valid YAML/JSON: {exc}")]) from None
    if not isinstance(manifest, dict):
        raise SpecError([(str(path), "expected a single EmbeddingJob object")])
    return check_envelope(manifest)
