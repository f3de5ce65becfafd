"""EmbeddingJobs, RayJobs, Secrets and Events read and written through a `Kube`'s kubectl."""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

from support.manifests import ej_manifest
from support.polling import wait_until


def get_json(kube, *args: str) -> dict:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


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


def create_database_secret(kube, namespace: str, url: str, name: str = "embedjob-db", key: str = "url") -> None:
    kube.kubectl("create", "secret", "generic", name, "-n", namespace, f"--from-literal={key}={url}")


def apply_job(kube, namespace: str, name: str, **spec: Any) -> dict:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest(name, **spec))
    return get_json(kube, "ej", name, "-n", namespace)


def wait_for_condition(kube, namespace: str, name: str, type_: str, status: str = "True",
                       timeout: float = 60) -> dict:
    def check():
        job = get_json(kube, "ej", name, "-n", namespace)
        cond = condition(job, type_)
        return job if cond and cond["status"] == status else None

    return wait_until(f"{name}: {type_}={status}", check, timeout)


def rayjobs(kube, namespace: str) -> list[dict]:
    return get_json(kube, "rayjobs", "-n", namespace)["items"]


def events_for(kube, namespace: str, name: str) -> list[dict]:
    items = get_json(kube, "events", "-n", namespace)["items"]
    return [e for e in items if e["involvedObject"].get("name") == name]


class Watch:
    """Every version of the objects `kubectl get ARGS --watch -o json` streams, in order, while used as a context
    manager: unlike a poll, it misses no version however briefly it was the stored one."""

    def __init__(self, kube, *args: str):
        self._cmd = [kube.bin.kubectl, f"--kubeconfig={kube.kubeconfig}", "get", *args, "--watch", "-o", "json"]
        self.versions: list[dict] = []

    def __enter__(self):
        self._proc = subprocess.Popen(self._cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        lines: list[str] = []
        for line in self._proc.stdout:
            lines.append(line)
            if line.startswith("}"):  # kubectl indents an object's fields: its own closing brace ends it
                self.versions.append(json.loads("".join(lines)))
                lines = []

    def __exit__(self, *exc) -> None:
        self._proc.terminate()
        self._proc.wait(10)
        self._thread.join(10)
