"""Generate the EmbeddingJob CRD from the pydantic models in `embedjob.api` and `embedjob.api_status`.

`python -m embedjob.crd > crds/embeddingjobs.embedjob.dev.yaml` writes the checked-in
file; a test fails when that file is stale.

Pydantic emits JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3.0
schema: no $ref, no anyOf around nullable fields, boolean exclusive bounds, and
`default: {}` on nested objects so the API server fills nested defaults.
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import yaml

from embedjob import api, api_status

_DROP_KEYS = {"title"}  # noise in `kubectl explain`


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        # Optional[X] -> X (absent means null; Kubernetes prunes explicit nulls).
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot express anyOf {node['anyOf']} structurally")
        rest = {k: v for k, v in node.items() if k not in ("anyOf", "default") or (k == "default" and v is not None)}
        return _structural({**branches[0], **rest}, defs)

    # An optional object (X | None) stays absent unless given: a default would make it present.
    nullable = {name for name, prop in (node.get("properties") or {}).items()
                if any(branch.get("type") == "null" for branch in prop.get("anyOf", ()))}
    out: dict[str, Any] = {}
    if "description" in node:
        # One line (docstrings wrap), and the default, which `kubectl explain` does not show.
        description = " ".join(node["description"].split())
        if "default" in node and not isinstance(node["default"], (dict, list)):
            description += f" Default: {json.dumps(node['default'])}."
        node = {**node, "description": description}
    for key, value in node.items():
        if key in _DROP_KEYS or (key == "additionalProperties" and value is False):
            # Kubernetes prunes unknown fields (and `kubectl apply` rejects them with
            # strict field validation); `additionalProperties: false` is not allowed.
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
            continue
        if key == "properties":
            out[key] = {name: _structural(prop, defs) for name, prop in value.items()}
            continue
        out[key] = _structural(value, defs)
    if out.get("type") == "object" and "properties" in out:
        for name, prop in out["properties"].items():
            # Nested objects that have a default_factory get `default: {}` so that the
            # API server applies their fields' defaults.
            if (prop.get("type") == "object" and "properties" in prop and name not in out.get("required", [])
                    and name not in nullable):
                if not any(f in prop.get("required", []) for f in prop.get("properties", {})):
                    prop.setdefault("default", {})
    return out


def openapi_schema(model: type[api.BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, mode="validation")
    defs = schema.pop("$defs", {})
    return _structural(schema, defs)


def _without_defaults(node: Any) -> Any:
    """The schema with no `default`: the operator writes the status whole, and a default
    there would show numbers nothing measured (e.g. 0 texts/s for a job that never ran)."""
    if isinstance(node, list):
        return [_without_defaults(item) for item in node]
    if not isinstance(node, dict):
        return node
    return {key: ({name: _without_defaults(prop) for name, prop in value.items()}  # field names, not keywords
                  if key == "properties" else _without_defaults(value))
            for key, value in node.items() if key != "default"}


def _spec_unchanged_rule() -> str:
    """CEL: every spec field but `suspend` equals its old value."""
    clauses = []
    for field in api.EmbeddingJobSpec.model_fields.values():
        name = field.alias
        if name == "suspend":
            continue
        new, old = f"self.spec.{name}", f"oldSelf.spec.{name}"
        if field.is_required():
            clauses.append(f"{new} == {old}")
        else:
            clauses.append(f"(has({new}) == has({old}) && (!has({new}) || {new} == {old}))")
    return " && ".join(clauses)


ACCEPTED_BEFORE = (
    "has(oldSelf.status) && has(oldSelf.status.conditions) && "
    "oldSelf.status.conditions.exists(c, c.type == 'Accepted' && c.status == 'True')"
)

# The reason is a default column: a Pending job says what it waits for (SecretNotFound,
# Unschedulable, ImagePullBackOff, ...) without `-o wide`.
PRINTER_COLUMNS = [
    {"name": "Status", "type": "string", "jsonPath": ".status.state"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
    {"name": "Progress", "type": "string", "jsonPath": ".status.progress.summary"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Texts/s", "type": "number", "jsonPath": ".status.progress.textsPerSecond", "priority": 1},
    {"name": "RayJob", "type": "string", "jsonPath": ".status.rayJobName", "priority": 1},
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name", "priority": 1},
    {"name": "Ray", "type": "string", "jsonPath": ".status.jobDeploymentStatus", "priority": 1},
]

# The job's name becomes a label value (embedjob.dev/job-name) on its RayJob.
NAME_RULE = {
    "rule": "size(self.metadata.name) <= 63",
    "message": "metadata.name must be at most 63 characters (it is used as a label value)",
    "reason": "FieldValueInvalid",
}


# What `kubectl explain embeddingjobs` says about the object.
DESCRIPTION = (
    "A batch job that embeds the texts of one input (spec.source) with a sentence-transformers model "
    "(spec.model) on a Ray cluster that KubeRay runs for it (spec.workers), and writes the vectors into a "
    "pgvector table in PostgreSQL (spec.sink). The operator creates one RayJob for it and reports progress "
    "and state in status. Troubleshooting: docs/troubleshooting.md; the driver's log: `embedjob logs NAME`."
)

def with_defaults(schema: dict[str, Any], value: Any) -> Any:
    """`value` as the API server stores it: the schema's defaults filled in where fields are
    absent, outside in (Kubernetes' structural defaulting), for `embedjob render`."""
    if isinstance(value, dict) and "properties" in schema:
        value = dict(value)
        for name, prop in schema["properties"].items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                value[name] = with_defaults(prop, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [with_defaults(schema["items"], item) for item in value]
    return value


def spec_as_stored(spec: dict[str, Any]) -> dict[str, Any]:
    """An EmbeddingJob's spec as the API server stores it (defaults applied)."""
    return with_defaults(openapi_schema(api.EmbeddingJobSpec), spec)


def crd() -> dict[str, Any]:
    root = {
        "type": "object",
        "description": DESCRIPTION,
        "required": ["spec"],
        "properties": {
            # the API server describes these standard fields itself (ObjectMeta and all)
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": openapi_schema(api.EmbeddingJobSpec),
            "status": _without_defaults(openapi_schema(api_status.EmbeddingJobStatus)),
        },
        "x-kubernetes-validations": [
            NAME_RULE,
            {
                "rule": f"!({ACCEPTED_BEFORE}) || ({_spec_unchanged_rule()})",
                "message": "spec is immutable once the job is accepted, except spec.suspend",
                "fieldPath": ".spec",
                "reason": "FieldValueForbidden",
            }
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": api.SHORT_NAMES,
                "categories": ["all", "embedjob"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def render() -> str:
    header = "# Generated by `python -m embedjob.crd` from embedjob/api.py and embedjob/api_status.py. Do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)


if __name__ == "__main__":
    sys.stdout.write(render())
