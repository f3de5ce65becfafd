"""EmbeddingJobs, RayJobs, Secrets and Events read and written through a `Kube`'s kubectl (plain reads in-process)."""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

from envtest.api_reads import ReadFailed
from envtest.control_plane import KubectlError
from support.manifests import ej_manifest
from support.polling import wait_until


def get_json(kube, *args: str) -> dict:
    """What `kubectl get ARGS -o json` prints. A plain read (a resource, an optional name, -n, -l) is made in this
    process (`kube.reads`: the tests poll, and a kubectl costs ~80 ms of CPU); a failed one raises KubectlError too."""
    plain = _plain_read(args)
    if plain is None:
        return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)
    try:
        return kube.reads.get(**plain)
    except ReadFailed as exc:
        raise KubectlError(1, ["kubectl", "get", *args], "", exc.message) from None


def read_or_none(kube, *args: str) -> dict | None:
    """get_json, or None where the read failed (for a poller, which looks again)."""
    try:
        return get_json(kube, *args)
    except KubectlError:
        return None


def _plain_read(args: tuple[str, ...]) -> dict[str, str] | None:
    """`kube.reads.get`'s arguments for kubectl get ARGS, or None where ARGS ask for more (several kinds, -o, ...)."""
    resource, *rest = args
    if not resource or resource.startswith("-") or "," in resource or "/" in resource:
        return None
    read, flags = {"resource": resource}, {"-n": "namespace", "--namespace": "namespace", "-l": "selector",
                                           "--selector": "selector"}
    while rest:
        arg = rest.pop(0)
        if arg in flags and rest:
            read[flags[arg]] = rest.pop(0)
        elif not arg.startswith("-") and "name" not in read:
            read["name"] = arg
        else:
            return None
    return read


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


def wait_for_rayjobs(kube, namespace: str, timeout: float = 30) -> list[dict]:
    """The namespace's RayJobs once there is one (the operator writes Accepted before it creates the RayJob)."""
    return wait_until("the RayJob", lambda: rayjobs(kube, namespace), timeout=timeout)


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
