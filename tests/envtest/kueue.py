"""Kueue's controller manager (built from its Go module) as a child process against a `Kube`.

Kueue runs with its RayJob integration only (`integrations.frameworks: [ray.io/rayjob]`),
its own CRDs from the module (with the conversion-webhook stanza Kueue's install adds,
which its certificate manager needs to find), no leader election, and the visibility
API server off (an aggregated API this harness does not register).

Its webhooks are served (on a loopback port, with the certificates Kueue's internal
certificate manager makes for `kueue-webhook-service.kueue-system.svc`) but not
registered with the API server: the API server cannot reach a Service here (no cluster
DNS, no routing to a Service's endpoints), and the certificate names only that Service.
What Kueue's RayJob webhooks do, the operator does itself: it creates the RayJob
suspended with the queue-name label, and its CRD refuses what Kueue's validation
refuses (a queue with clusterSelector). Everything else, Workloads, quota, admission,
preemption and the RayJob integration's suspend / unsuspend, is Kueue's own controllers.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

from envtest.control_plane import Kube
from support.net import free_port
from support.processes import http_ok, spawn, stop, tail, wait_for

NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
# The CRDs Kueue's own install gives a conversion webhook (config/components/crd/kustomization.yaml).
CONVERTED_CRDS = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
API_VERSION = "kueue.x-k8s.io/v1beta2"


@dataclass
class Kueue:
    """The running Kueue controller manager."""

    process: subprocess.Popen
    log_path: Path
    health_url: str
    version: str

    def log_tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)


def _crd_files(crd_dir: Path, out_dir: Path) -> list[Path]:
    """Kueue's CRDs as its install applies them: the converted ones point their conversion
    webhook at Kueue's webhook Service."""
    out_dir.mkdir(exist_ok=True)
    written = []
    for src in sorted(crd_dir.glob("kueue.x-k8s.io_*.yaml")):
        crd = yaml.safe_load(src.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED_CRDS:
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"service": {"namespace": NAMESPACE, "name": WEBHOOK_SERVICE, "path": "/convert"}},
            }}
        dst = out_dir / src.name
        dst.write_text(json.dumps(crd))
        written.append(dst)
    return written


def _configuration(cert_dir: Path, health_port: int, metrics_port: int, webhook_port: int) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True, "webhookServiceName": WEBHOOK_SERVICE,
                                   "webhookSecretName": WEBHOOK_SECRET},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["ray.io/rayjob"]},
    }


def _mount_certificate(kube: Kube, cert_dir: Path) -> bool:
    """What the kubelet does for Kueue's pod: the Secret that its certificate manager fills, as
    files in certDir (the manager waits for them before it starts its controllers)."""
    secret = json.loads(kube.kubectl("get", "secret", WEBHOOK_SECRET, "-n", NAMESPACE, "-o", "json").stdout)
    data = secret.get("data") or {}
    if not {"tls.crt", "tls.key", "ca.crt"} <= data.keys():
        return False
    cert_dir.mkdir(exist_ok=True)
    for name in ("ca.crt", "tls.key", "tls.crt"):  # tls.crt last: its presence is what the manager waits for
        (cert_dir / name).write_bytes(base64.b64decode(data[name]))
    return True


def install_kueue_crds(kube: Kube, crd_dir: Path) -> None:
    kube.install_crds(_crd_files(crd_dir, kube.workdir / "kueue-crds"))


@contextmanager
def running_kueue(kube: Kube, binary: str, crd_dir: Path) -> Iterator[Kueue]:
    """Kueue's CRDs installed and its controller manager (user kueue-controller-manager, group
    system:masters) running until /readyz; stopped on exit. The CRDs and the kueue-system
    namespace stay (the API server lives for the session)."""
    workdir = kube.workdir / "kueue"
    workdir.mkdir(exist_ok=True)
    install_kueue_crds(kube, crd_dir)
    kube.apply(json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))
    # Kueue's certificate manager fills this Secret (it must exist) and writes the files to certDir.
    kube.apply(json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": WEBHOOK_SECRET,
                                                                              "namespace": NAMESPACE}}))
    health_port, metrics_port, webhook_port = free_port(), free_port(), free_port()
    config = workdir / "config.yaml"
    cert_dir = workdir / "webhook-certs"
    config.write_text(yaml.safe_dump(_configuration(cert_dir, health_port, metrics_port, webhook_port)))
    log_path = workdir / "kueue.log"
    env = {**os.environ, "KUBECONFIG": kube.kubeconfig_for_user("kueue-controller-manager", ["system:masters"])}
    proc = spawn([
        binary, f"--config={config}",
        # an aggregated API server (kubectl get --raw /apis/visibility...) this harness does not register
        "--feature-gates=VisibilityOnDemand=false",
        f"--visibility-server-port={free_port()}",
        "--zap-log-level=3",
    ], log_path, env=env)
    kueue = Kueue(process=proc, log_path=log_path, health_url=f"http://127.0.0.1:{health_port}/readyz",
                  version=kube.versions["KUEUE_VERSION"])
    try:
        wait_for("kueue's webhook certificate", lambda: _mount_certificate(kube, cert_dir), 120, proc, log_path)
        wait_for("kueue /readyz", lambda: http_ok(kueue.health_url), 180, proc, log_path)
        sys.stderr.write(f"envtest: kueue log: {log_path}\n")
        yield kueue
    finally:
        stop(proc)
