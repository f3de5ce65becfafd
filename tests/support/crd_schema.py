"""Walking the EmbeddingJob CRD's schema: every field's path (as `kubectl explain` names it) and node."""

from __future__ import annotations

from typing import Any, Iterator

from embedjob import api, crd


#: fields of every object that the API server describes itself (a CRD may not describe metadata)
STANDARD_FIELDS = ("apiVersion", "kind", "metadata")


def root_schema() -> dict[str, Any]:
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def fields(node: dict[str, Any], path: str = api.PLURAL) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, schema node) of `node` and every field below it but the standard ones; list items and
    map values are explained under the list's or map's own path (`ej.status.conditions.reason`)."""
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        if path == api.PLURAL and name in STANDARD_FIELDS:
            continue
        yield from fields(child, f"{path}.{name}")
    for nested in (node.get("items"), node.get("additionalProperties")):
        if isinstance(nested, dict):
            for name, child in (nested.get("properties") or {}).items():
                yield from fields(child, f"{path}.{name}")
