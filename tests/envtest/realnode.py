"""pytest plugin: a real scheduler, controller-manager and a test node on the envtest API server.

Load it with ``pytest_plugins = ["envtest.realnode"]`` (in a test module or the root
conftest). It builds on the ``kube`` fixture of ``envtest.plugin`` (same API server,
CA and kubeconfig helpers).

Fixtures
--------
``kube_controllers`` (session)
    kube-scheduler and kube-controller-manager (built from the pinned
    ``k8s.io/kubernetes`` module by ``tests/envtest/setup``), each with its own
    identity (``system:kube-scheduler``, ``system:kube-controller-manager`` with one
    ServiceAccount per controller), no leader election, serving /healthz on a free
    loopback port. Controllers: ``CONTROLLERS`` below. Returns :class:`Controllers`.
``real_node`` (session)
    The test node agent (``tests/envtest/node``) registered as ``embedjob-test-node``
    and Ready (its not-ready taint removed by the node-lifecycle controller). Returns
    :class:`RealNode`. Needs root, ``ip``, ``unshare``, ``nsenter`` and ``nft``; without
    them the fixture fails with what is missing (or skips with EMBEDJOB_ENVTEST_SKIP=1).

Tests using ``real_node`` are marked ``cluster`` (tests/run runs them in a session of their own);
tests using either run after a session's other tests. Teardown stops the agent (which stops its
pods and removes its network namespaces, bridge and cgroups); a reaper process
removes them if the agent is killed, and every agent start sweeps the leftovers of
dead runs.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from envtest.node import runs as node_runs
# the envtest plugin's process and readiness helpers (one definition, used here too)
from envtest.binaries import SETUP, SKIP_ENV
from envtest.control_plane import Kube
from support.kubectl import read_or_none
from support.net import free_port
from support.processes import spawn, stop, tail, wait_for

NODE_DIR = Path(__file__).resolve().parent / "node"
TESTS_DIR = NODE_DIR.parent.parent
NODE_NAME = "embedjob-test-node"
BINARY_ENV = {"kube_scheduler": "EMBEDJOB_KUBE_SCHEDULER", "kube_controller_manager": "EMBEDJOB_KUBE_CONTROLLER_MANAGER"}
#: The worker image's ENV (worker_image/Dockerfile, built with a baked-in MODEL_PACKAGE): no image
#: is pulled, so the node gives it to every container (the container's own env wins).
IMAGE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}

#: kube-controller-manager's controllers: what pods, Jobs, Services, ServiceAccounts,
#: garbage collection and namespace deletion need; no cloud, volume or certificate ones.
CONTROLLERS = [
    "job-controller", "cronjob-controller", "ttl-after-finished-controller",
    "garbage-collector-controller", "namespace-controller", "pod-garbage-collector-controller",
    "endpoints-controller", "endpointslice-controller", "endpointslice-mirroring-controller",
    "serviceaccount-controller", "serviceaccount-token-controller", "root-ca-certificate-publisher-controller",
    "replicaset-controller", "deployment-controller", "statefulset-controller", "daemonset-controller",
    "node-lifecycle-controller", "clusterrole-aggregation-controller", "resourcequota-controller",
    "disruption-controller",
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: runs pods for real on the test node (with the scheduler and "
                            "controller-manager); tests/run runs these in a session of their own")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "real_node" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
    # The scheduler and controller-manager, once started, run for the rest of the session and act on every later
    # test's objects (garbage collection, namespace deletion): the tests that start them run after the others.
    items.sort(key=lambda item: "kube_controllers" in getattr(item, "fixturenames", ()))


def _binaries() -> dict[str, str]:
    """Paths of kube-scheduler and kube-controller-manager: from the environment, else from setup."""
    found = {k: os.environ.get(v, "") for k, v in BINARY_ENV.items()}
    if all(p and os.access(p, os.X_OK) for p in found.values()):
        return found
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"kube-scheduler/kube-controller-manager missing and {SKIP_ENV}=1")
    res = subprocess.run([str(SETUP)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{SETUP} failed ({res.returncode}):\n{res.stderr[-4000:]}")
    for line in res.stdout.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            os.environ[key] = value
    found = {k: os.environ.get(v, "") for k, v in BINARY_ENV.items()}
    missing = [BINARY_ENV[k] for k, p in found.items() if not (p and os.access(p, os.X_OK))]
    if missing:
        raise RuntimeError(f"{SETUP} did not provide {missing}")
    return found


def _healthz(port: int) -> bool:
    ctx = ssl._create_unverified_context()  # self-signed serving certificate, loopback only
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=5) as resp:
        return resp.status == 200


@dataclass
class Controllers:
    scheduler: subprocess.Popen
    controller_manager: subprocess.Popen
    scheduler_log: Path
    controller_manager_log: Path


@pytest.fixture(scope="session")
def kube_controllers(kube: Kube) -> Iterator[Controllers]:
    binaries = _binaries()
    workdir = kube.workdir / "controllers"
    workdir.mkdir(exist_ok=True)
    sched_kc = kube.kubeconfig_for_user("system:kube-scheduler")
    kcm_kc = kube.kubeconfig_for_user("system:kube-controller-manager")
    sched_port, kcm_port = free_port(), free_port()
    sched_log, kcm_log = workdir / "kube-scheduler.log", workdir / "kube-controller-manager.log"
    common = ["--bind-address=127.0.0.1", "--leader-elect=false", "--v=1"]
    procs = []
    try:
        sched = spawn([binaries["kube_scheduler"], f"--kubeconfig={sched_kc}",
                        f"--authentication-kubeconfig={sched_kc}", f"--authorization-kubeconfig={sched_kc}",
                        f"--secure-port={sched_port}", *common], sched_log)
        procs.append(sched)
        kcm = spawn([binaries["kube_controller_manager"], f"--kubeconfig={kcm_kc}",
                      f"--authentication-kubeconfig={kcm_kc}", f"--authorization-kubeconfig={kcm_kc}",
                      f"--secure-port={kcm_port}", *common,
                      "--use-service-account-credentials=true",
                      f"--service-account-private-key-file={kube.workdir / 'pki' / 'sa.key'}",
                      f"--root-ca-file={kube.ca_cert}",
                      "--cluster-name=embedjob-envtest",
                      f"--controllers={','.join(CONTROLLERS)}"], kcm_log)
        procs.append(kcm)
        wait_for("kube-scheduler /healthz", lambda: _healthz(sched_port), 120, sched, sched_log)
        wait_for("kube-controller-manager /healthz", lambda: _healthz(kcm_port), 120, kcm, kcm_log)
        sys.stderr.write(f"envtest: scheduler log {sched_log}, controller-manager log {kcm_log}\n")
        yield Controllers(sched, kcm, sched_log, kcm_log)
    finally:
        for p in reversed(procs):
            stop(p)


@dataclass
class RealNode:
    """The running test node."""

    name: str
    kube: Kube
    process: subprocess.Popen
    log_path: Path
    workdir: Path  #: pod directories: volumes, container logs, hosts files
    info: dict  #: run_id, tag (the prefix of its host resources), bridge, subnet, gateway

    def log_tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)

    def pods_run(self, namespace: str) -> list[str]:
        """The pods this node ran in the namespace, deleted ones too (their directories stay): a pod
        that lived between two polls of a watcher, such as a Helm hook's, is still found here."""
        return sorted({d.name[len(namespace) + 1:].rsplit("_", 1)[0] for d in self.workdir.glob(f"pods/{namespace}_*")})

    def container_log(self, namespace: str, pod: str, container: str, restart: int | None = None) -> str:
        """A container's output (stdout and stderr): the test node's stand-in for ``kubectl logs``."""
        dirs = sorted(self.workdir.glob(f"pods/{namespace}_{pod}_*"), key=lambda p: p.stat().st_mtime)
        if not dirs:
            raise FileNotFoundError(f"no pod directory for {namespace}/{pod}")
        logs = dirs[-1] / "logs"
        if restart is None:
            candidates = sorted(logs.glob(f"{container}-*.log"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
            if not candidates:
                raise FileNotFoundError(f"no log of container {container} in {logs}")
            return candidates[-1].read_text(errors="replace")
        return (logs / f"{container}-{restart}.log").read_text(errors="replace")

    def wait_for_pod(self, namespace: str, name: str, predicate, timeout: float = 120, what: str = "condition") -> dict:
        """Poll a pod until ``predicate(pod)``; see :func:`wait_for_pod`."""
        return wait_for_pod(self.kube, namespace, name, predicate, timeout, what)

    def leftovers(self, run_id: str | None = None) -> list[str]:
        """Host resources of this node's run (or of ``run_id``'s): empty once that agent stopped."""
        owned = node_runs.leftovers(node_runs.RunNames(run_id or self.info["run_id"]))
        return [f"{kind} {item}" for kind, items in owned.items() for item in items]

    def start_agent(self, name: str, workdir: Path) -> subprocess.Popen:
        """Start one more agent (its own node ``name`` and run), in a session of its own; the
        caller stops it. For tests of the agent itself."""
        log = open(workdir / "agent.log", "ab")
        try:
            return subprocess.Popen(_agent_args(self.kube, name, workdir, apiserver=False), env=_agent_env(),
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()


def _agent_args(kube: Kube, name: str, workdir: Path, *, apiserver: bool = True) -> list[str]:
    """The agent's command line: node ``name`` (identity system:node:NAME), pods under ``workdir``,
    ``workdir/ready.json`` written once it is registered."""
    node_kc = kube.kubeconfig_for_user(f"system:node:{name}", ["system:nodes"])
    proxy_kc = kube.kubeconfig_for_user("system:kube-proxy")
    args = [sys.executable, "-m", "envtest.node.agent", f"--kubeconfig={node_kc}", f"--proxy-kubeconfig={proxy_kc}",
            f"--node-name={name}", f"--workdir={workdir}", f"--ready-file={workdir / 'ready.json'}",
            f"--kubelet-version={kube.versions['KUBERNETES_VERSION']}",
            *(f"--image-env={k}={v}" for k, v in IMAGE_ENV.items())]
    if apiserver:  # pods reach the API server through the kubernetes Service
        args.append(f"--apiserver={kube.server.removeprefix('https://')}")
    return args


def _agent_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}


def _node_ready(kube: Kube, name: str) -> bool:
    node = json.loads(kube.kubectl("get", "node", name, "-o", "json", check=False).stdout or "{}")
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))
    taints = [t["key"] for t in node.get("spec", {}).get("taints") or []]
    return ready and not any(t.startswith("node.kubernetes.io/") for t in taints)


def _require_host() -> None:
    problems = []
    if os.geteuid() != 0:
        problems.append("not root (network namespaces, mounts and cgroups need it)")
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"), ("nsenter", "util-linux"),
                          ("nft", "nftables")):
        if shutil.which(tool) is None:
            problems.append(f"`{tool}` missing (apt-get install -y {package})")
    if not Path("/sys/fs/cgroup/pids").is_dir():
        problems.append("no cgroup v1 pids hierarchy at /sys/fs/cgroup/pids")
    if problems:
        if os.environ.get(SKIP_ENV) == "1":
            pytest.skip("test node cannot run here: " + "; ".join(problems))
        raise RuntimeError("the test node cannot run here: " + "; ".join(problems))


@pytest.fixture(scope="session")
def real_node(kube: Kube, kube_controllers: Controllers) -> Iterator[RealNode]:
    _require_host()
    workdir = kube.workdir / "node"
    workdir.mkdir(exist_ok=True)
    log_path, ready_file = workdir / "agent.log", workdir / "ready.json"
    proc = spawn(_agent_args(kube, NODE_NAME, workdir), log_path, env=_agent_env())
    try:
        wait_for("test node agent", ready_file.exists, 60, proc, log_path)
        wait_for(f"node {NODE_NAME} Ready and untainted", lambda: _node_ready(kube, NODE_NAME), 120, proc, log_path)
        sys.stderr.write(f"envtest: test node log {log_path}\n")
        yield RealNode(NODE_NAME, kube, proc, log_path, workdir, json.loads(ready_file.read_text()))
    finally:
        stop(proc, timeout=60)


def wait_for_pod(kube: Kube, namespace: str, name: str, predicate, timeout: float = 120,
                 what: str = "condition") -> dict:
    """Poll a pod until ``predicate(pod)``; return it (raise with the pod's status and events otherwise)."""
    deadline = time.monotonic() + timeout
    pod: dict = {}
    while time.monotonic() < deadline:
        pod = read_or_none(kube, "pods", name, "-n", namespace) or pod
        if pod and predicate(pod):
            return pod
        time.sleep(0.5)
    events = kube.kubectl("get", "events", "-n", namespace, check=False).stdout
    raise TimeoutError(f"pod {namespace}/{name}: {what} not reached in {timeout}s; status:\n"
                       f"{json.dumps(pod.get('status'), indent=1)}\nevents:\n{events}")
