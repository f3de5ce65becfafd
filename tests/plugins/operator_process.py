"""pytest plugin: the operator (`python -m controller`) as a subprocess against a test API server.

`start_operator(kube, namespace, **env)` (a factory fixture) runs it watching `namespace`
(or every namespace, with `clusterwide=True`) as a ServiceAccount of `namespace` with exactly
the permissions of controller.permissions, bound as the chart binds them; an
`OperatorProcess` can be stopped, restarted and asked for its log and metrics.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from controller import permissions
from support.net import free_port
from support.paths import REPO
from support.processes import http_ok, spawn, stop, wait_for


def grant_operator_permissions(kube, namespace: str, account: str = "embedjob-operator",
                               clusterwide: bool = False) -> str:
    """A ServiceAccount in `namespace` bound to exactly controller.permissions, as the chart binds
    it: cluster-wide one ClusterRole, else a ClusterRole and a Role in `namespace` (watched);
    returns a kubeconfig that authenticates as it."""
    cluster_role = f"embedjob-operator-{namespace}"
    documents = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": cluster_role},
         "rules": permissions.policy_rules(permissions.cluster_rules(clusterwide=clusterwide))},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": cluster_role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
        *([] if clusterwide else namespaced_grant(namespace, namespace, account)),
    ]
    kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}))
    return kube.kubeconfig_for_serviceaccount(namespace, account)


def namespaced_grant(namespace: str, account_namespace: str, account: str = "embedjob-operator") -> list[dict]:
    """The Role with controller.permissions' namespaced rules in `namespace`, bound to the
    operator's ServiceAccount (in `account_namespace`): what the chart grants per watched namespace."""
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "embedjob-operator", "namespace": namespace},
         "rules": permissions.policy_rules(permissions.NAMESPACED_RULES)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "embedjob-operator", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "embedjob-operator"},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": account_namespace}]},
    ]


@dataclass
class OperatorProcess:
    """`python -m controller` against the test API server; stop/start/restart at will."""

    env: dict[str, str]
    log_path: Path
    health_port: int
    metrics_port: int
    process: subprocess.Popen | None = None

    def start(self) -> "OperatorProcess":
        self.process = spawn([sys.executable, "-m", "controller"], self.log_path, env=self.env, cwd=REPO)
        wait_for("operator /healthz", lambda: http_ok(f"http://127.0.0.1:{self.health_port}/healthz"), 60,
                 self.process, self.log_path)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None:
            stop(self.process, timeout=30, sig=sig)

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
    """Factory: start_operator(kube, namespace, clusterwide=False, **env) runs the operator watching
    `namespace` (every namespace with clusterwide=True) as a ServiceAccount with exactly the
    permissions of controller.permissions."""
    started: list[OperatorProcess] = []

    def start(kube, namespace: str, clusterwide: bool = False, **extra_env: str) -> OperatorProcess:
        health_port, metrics_port = free_port(), free_port()
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDJOB_")}
        env = {
            **inherited,
            "KUBECONFIG": grant_operator_permissions(kube, namespace, clusterwide=clusterwide),
            "EMBEDJOB_WATCH_NAMESPACES": "" if clusterwide else namespace,
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
