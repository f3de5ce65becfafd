"""The real KubeRay operator as a child process against a `Kube`, with its own identity."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from envtest.control_plane import Kube
from support.net import free_port
from support.processes import http_ok, spawn, stop, tail, wait_for


@dataclass
class KubeRayOperator:
    """The running KubeRay operator."""

    process: subprocess.Popen
    log_path: Path  #: its stdout/stderr
    kubeconfig: str  #: the operator's own identity (client cert, user kuberay-operator)
    metrics_url: str
    health_url: str
    version: str

    def log_tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)


@contextmanager
def running_kuberay_operator(kube: Kube) -> Iterator[KubeRayOperator]:
    """KubeRay's operator (user kuberay-operator, group system:masters; no leader election, no
    webhooks; metrics and health probes on free ports) until /readyz; stopped on exit.

    ``--use-kubernetes-proxy``: the operator reaches a head's dashboard (to submit and follow
    RayJobs) through the API server's service proxy, as the host does not resolve cluster
    DNS names or ClusterIPs (tests/envtest/node/README.md)."""
    workdir = kube.workdir / "kuberay-operator"
    workdir.mkdir(exist_ok=True)
    kubeconfig = kube.kubeconfig_for_user("kuberay-operator", ["system:masters"])
    metrics_port, probe_port = free_port(), free_port()
    log_path = workdir / "operator.log"
    env = {**os.environ, "KUBECONFIG": kubeconfig, "ENABLE_WEBHOOKS": "false"}
    proc = spawn([
        kube.bin.ray_operator,
        f"--metrics-addr=127.0.0.1:{metrics_port}",
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        "--enable-leader-election=false",
        "--log-stdout-encoder=console",
        "--use-kubernetes-proxy",
    ], log_path, env=env)
    operator = KubeRayOperator(
        process=proc, log_path=log_path, kubeconfig=kubeconfig,
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        health_url=f"http://127.0.0.1:{probe_port}/readyz",
        version=kube.versions["KUBERAY_VERSION"],
    )
    try:
        wait_for("kuberay operator /readyz", lambda: http_ok(operator.health_url), 120, proc, log_path)
        sys.stderr.write(f"envtest: kuberay operator log: {log_path}\n")
        yield operator
    finally:
        stop(proc)
