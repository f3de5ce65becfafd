"""Reading an EmbeddingJob manifest: the one check of its envelope (apiVersion, kind, metadata.name, spec).

`embedjob run` loads a manifest file with `load_manifest`; the driver checks the job
config the operator hands it with `check_envelope`. The spec itself is parsed by
`embedjob.api.parse_spec`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from embedjob.api import API_VERSION, KIND, SpecError
from embedjob.api_base import DNS_LABEL, DNS_SUBDOMAIN

# What the API server accepts as a custom resource's name (an RFC 1123 subdomain) and as
# a namespace (an RFC 1123 label); a local run refuses what a cluster would.
_SUBDOMAIN = re.compile(DNS_SUBDOMAIN)
_LABEL = re.compile(DNS_LABEL)


def _name_problem(value: Any, pattern: re.Pattern, limit: int, rule: str) -> str | None:
    if isinstance(value, str) and pattern.fullmatch(value) and len(value) <= limit:
        return None
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    return f"must be {rule}, starting and ending with a letter or digit, at most {limit} characters; got {shown}"


def check_envelope(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest, if it is an EmbeddingJob with a name and a spec; else SpecError naming each field."""
    problems = []
    if manifest.get("apiVersion") != API_VERSION:
        problems.append(("apiVersion", f"must be {API_VERSION}, got {manifest.get('apiVersion')!r}"))
    if manifest.get("kind") != KIND:
        problems.append(("kind", f"must be {KIND}, got {manifest.get('kind')!r}"))
    metadata = manifest.get("metadata")
    if not isinstance(metadata, dict) or not metadata.get("name"):
        problems.append(("metadata.name", "is required"))
    else:
        for field, pattern, limit, rule in (
            ("name", _SUBDOMAIN, 253, "a lowercase RFC 1123 subdomain (a-z, 0-9, '-' and '.')"),
            ("namespace", _LABEL, 63, "a lowercase RFC 1123 label (a-z, 0-9 and '-')"),
        ):
            if field in metadata and (problem := _name_problem(metadata[field], pattern, limit, rule)):
                problems.append((f"metadata.{field}", problem))
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
