"""pytest plugin: the test-only stand-in for "KubeRay + kubelet".

No kubelet runs here, so no RayCluster ever runs a RayJob. `RayJobRunner` stands in: it
runs each RayJob's own entrypoint on a local Ray and reports status the way KubeRay does.
It acts on `kube_without_kuberay`, a second envtest control plane on which the real KubeRay
operator does not run (the session's `kuberay_operator` watches every namespace of `kube`);
`standin_namespace` is a fresh namespace there.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from embedjob.contract import DRIVER_METRICS_PORT_ENV
from envtest.control_plane import KubectlError, running_control_plane
from support.kubectl import create_database_secret, get_json
from support.paths import REPO
from support.ray_env import RAY_CLIENT_ENV


@pytest.fixture(scope="session")
def kube_without_kuberay(envtest_binaries, tmp_path_factory):
    """A second envtest control plane (same binaries and CRDs) on which no KubeRay
    operator runs, so that `RayJobRunner` is the only one acting on RayJobs there."""
    with running_control_plane(tmp_path_factory.mktemp("standin-envtest"), envtest_binaries) as kube:
        yield kube


@pytest.fixture
def standin_namespace(kube_without_kuberay, request):
    name = "e2e-" + re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:6]
    kube_without_kuberay.kubectl("create", "namespace", name)
    return name


UNREACHABLE_PATIENCE = 120.0  # seconds the runner waits for a restarted API server


def unreachable(exc: KubectlError) -> bool:
    """kubectl failed because the API server did not answer (down or starting), not because it refused."""
    text = f"{exc.stderr or ''}{exc.stdout or ''}"
    return any(s in text for s in ("connection refused", "was refused", "connection reset", "EOF",
                                   "the server is currently unable", "i/o timeout", "TLS handshake timeout"))


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
    cluster); resuming starts it again. backoffLimit is not emulated. While the API server
    is unreachable (restarted by a test) it waits and retries, as KubeRay's requeue does."""

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
                # kubectl, not get_json's in-process read: this loop rides out API server restarts
                # (test_apiserver_restart.py) as a client-go client does, with its retries
                listed = self.kube.kubectl("get", "rayjobs", "-n", self.namespace, "-o", "json").stdout
                for rayjob in json.loads(listed)["items"]:
                    self._step(rayjob)
            except KubectlError as exc:
                if not unreachable(exc):
                    self.errors.append(exc)
                    return
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
            # Drivers here share the host's ports, unlike head pods: none serves metrics unless a test asks.
            DRIVER_METRICS_PORT_ENV: "0",
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
        """Patch the RayJob's status; while the API server is unreachable, again until it is back
        (a transition is never lost)."""
        deadline = time.monotonic() + UNREACHABLE_PATIENCE
        while True:
            try:
                self.kube.kubectl("patch", "rayjob", name, "-n", self.namespace, "--subresource=status",
                                  "--type=merge", "-p", json.dumps({"status": fields}))
                return
            except KubectlError as exc:
                if not unreachable(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


@pytest.fixture
def e2e(kube_without_kuberay, standin_namespace, local_ray, database_url, start_operator, tmp_path):
    """(kube, namespace, operator, runner factory) with the database Secret in place; `runner(**env)` starts a
    RayJobRunner whose entrypoints get `env` over the head container's."""
    kube, namespace = kube_without_kuberay, standin_namespace
    create_database_secret(kube, namespace, database_url)
    operator = start_operator(kube, namespace, EMBEDJOB_DATABASE_URL=database_url)
    runners = []

    def runner(**extra_env: str) -> RayJobRunner:
        runners.append(RayJobRunner(kube, namespace, local_ray, tmp_path, extra_env).__enter__())
        return runners[-1]

    yield kube, namespace, operator, runner
    for r in runners:
        r.__exit__(None, None, None)
        assert not r.errors, r.errors
