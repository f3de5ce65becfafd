"""Merge pod settings into the RayJob's pod templates with strategic-merge semantics (pure functions).

The operator's own template (image, resources, the database env) is the base; the
operator's defaults (settings) are merged over it, then the job's own settings:
- maps (labels, nodeSelector, affinity, securityContext, ...) merge key by key, the later
  value winning;
- containers, volumes, env and imagePullSecrets merge by name, volumeMounts by mountPath, ports by
  containerPort (the core/v1 patch merge keys);
- tolerations and envFrom are appended (an entry already there is not repeated);
- resources are replaced as a whole (a request merged under another limit could exceed it);
- any other list is replaced.
What may not be overridden (our env, our labels, KubeRay's volumes) is refused when the
settings are parsed (`embedjob.api_pods`), so the merge never has to drop anything.
"""

from __future__ import annotations

import copy
from typing import Any

from embedjob.api import ApiModel

MERGE_KEYS = {"containers": "name", "volumes": "name", "env": "name", "imagePullSecrets": "name",
              "volumeMounts": "mountPath", "ports": "containerPort"}
APPENDED = frozenset({"tolerations", "envFrom"})
REPLACED = frozenset({"resources"})

# The submitter pod (KubeRay's `ray job submit`) runs the worker image too: it needs the head's
# pull secrets, placement and identity, not its volumes or env.
SUBMITTER_POD_FIELDS = ("serviceAccountName", "imagePullSecrets", "nodeSelector", "tolerations", "affinity",
                        "priorityClassName", "securityContext")
SUBMITTER_CONTAINER = "ray-job-submitter"
# KubeRay's own default for the submitter container (common.GetDefaultSubmitterContainer).
SUBMITTER_RESOURCES = {"requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}


def strategic_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """`overlay` merged over a copy of `base` (see the module's rules)."""
    merged = copy.deepcopy(base)
    for key, value in overlay.items():
        current = merged.get(key)
        if current is None or key in REPLACED:
            merged[key] = copy.deepcopy(value)
        elif key in MERGE_KEYS:
            merged[key] = _merge_by(current, value, MERGE_KEYS[key])
        elif key in APPENDED:
            merged[key] = current + [copy.deepcopy(item) for item in value if item not in current]
        elif isinstance(current, dict) and isinstance(value, dict):
            merged[key] = strategic_merge(current, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _merge_by(base: list[dict], overlay: list[dict], key: str) -> list[dict]:
    merged = copy.deepcopy(base)
    position = {item[key]: index for index, item in enumerate(merged)}
    for item in overlay:
        if item[key] in position:
            merged[position[item[key]]] = strategic_merge(merged[position[item[key]]], item)
        else:
            position[item[key]] = len(merged)
            merged.append(copy.deepcopy(item))
    return merged


def wire(settings: ApiModel | None) -> dict[str, Any]:
    """Pod settings as they are written in a manifest (camelCase, unset fields left out)."""
    return settings.model_dump(by_alias=True, exclude_none=True, mode="json") if settings else {}


def pod_template(base: dict[str, Any], *settings: ApiModel | None) -> dict[str, Any]:
    """The operator's `base` template with each of `settings` (defaults first, the job's last) merged over it."""
    template = base
    for layer in settings:
        template = strategic_merge(template, wire(layer))
    return template


def submitter_template(head: dict[str, Any], image: str, *settings: ApiModel | None) -> dict[str, Any] | None:
    """The RayJob's submitterPodTemplate: the merged `head` template's placement, identity and pull secrets on
    KubeRay's default submitter container; None (KubeRay's default) when no `settings` set any of those."""
    given = [wire(layer).get("spec", {}) for layer in settings]
    if not any(field in spec for spec in given for field in SUBMITTER_POD_FIELDS):
        return None
    head_spec = head.get("spec", {})
    container = {"name": SUBMITTER_CONTAINER, "image": image, "resources": copy.deepcopy(SUBMITTER_RESOURCES)}
    ray_container = (head_spec.get("containers") or [{}])[0]
    if "securityContext" in ray_container:
        container["securityContext"] = copy.deepcopy(ray_container["securityContext"])
    spec = {field: copy.deepcopy(head_spec[field]) for field in SUBMITTER_POD_FIELDS if field in head_spec}
    return {"metadata": copy.deepcopy(head.get("metadata", {})),
            "spec": {**spec, "restartPolicy": "Never", "containers": [container]}}
