"""The test node agent: registers a Node and runs the pods the scheduler binds to it.

    python -m envtest.node.agent --kubeconfig NODE.kubeconfig --proxy-kubeconfig PROXY.kubeconfig \\
        --node-name NAME --workdir DIR [--apiserver 127.0.0.1:PORT] [--cpu 16] [--memory 64Gi] [--gpus 4]

Runs as root (network namespaces, mounts, cgroups). Talks to the API server as
``system:node:NAME`` (group ``system:nodes``: the Node authorizer's rules, as a
kubelet) for its Node, Lease, pods, their Secrets/ConfigMaps/tokens and Events, and as
``system:kube-proxy`` for Services and EndpointSlices (services.py). See README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import runs
from .apiproxy import Forwarder
from .kubeapi import ApiError, Client, Informer, now_micro, now_rfc3339
from .network import PodNetwork
from .pods import PodWorker
from .services import ServiceProxy

REQUIRED_TOOLS = ("ip", "unshare", "nsenter", "nft")


# The checkout the tests run from: its packages are installed in editable mode, so in a
# container it is part of the "image" (tests/envtest/node/agent.py -> the repository root).
REPO = Path(__file__).resolve().parents[3]


def image_paths(with_sys_path: bool = True) -> list[str]:
    """Where the Python runtime and this project's code live: what a worker image would hold."""
    paths = [sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, str(REPO),
             *(p for p in sys.path if p and with_sys_path)]
    return sorted({form for p in paths for form in (os.path.abspath(p), os.path.realpath(p))})


def runtime_home_entries(home: str = "/root") -> list[str]:
    """The entries of root's home that the runtime and the code live in (pyenv, the virtualenvs,
    a checkout): a container's /root keeps these and nothing else of the developer's home."""
    return sorted({p[len(home) + 1:].split("/")[0] for p in image_paths() if p.startswith(home + "/")})


def runtime_tmp_paths() -> list[str]:
    """The runtime and the checkout where they lie under /tmp (e.g. a CI clone there): bound into
    each container's private /tmp at the same place, outermost only. Not sys.path: the agent's
    working directory is no part of an image."""
    under = [p for p in image_paths(with_sys_path=False) if p.startswith("/tmp/") and os.path.exists(p)]
    return [p for p in under if not any(p != q and p.startswith(q + "/") for q in under)]


class Node:
    """What every pod worker shares: the API client, the network, the services, the node's facts."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.name = args.node_name
        self.workdir = Path(args.workdir)
        self.cluster_domain = args.cluster_domain
        self.backoff = args.restart_backoff
        self.client = Client(args.kubeconfig)
        self.allocatable = {"cpu": args.cpu, "memory": args.memory, "pods": str(args.pods),
                            "ephemeral-storage": "100Gi", "nvidia.com/gpu": str(args.gpus)}
        venv_bin = os.path.dirname(sys.executable)
        self.path = f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        self.home_keep = runtime_home_entries()
        self.tmp_keep = runtime_tmp_paths()
        # What an image's ENV lines would give every container (no image is pulled): the
        # container's own env overrides it, as in a kubelet.
        self.image_env = dict(item.split("=", 1) for item in args.image_env)
        self.names = runs.RunNames(runs.new_run_id())
        self.network = PodNetwork(self.names)
        self.services: ServiceProxy | None = None
        self.forwarder: Forwarder | None = None
        self.workers: dict[str, PodWorker] = {}
        self.finished: set[str] = set()
        self._wlock = threading.Lock()
        self._log_lock = threading.Lock()
        self.stopped = threading.Event()

    def log(self, msg: str) -> None:
        with self._log_lock:
            print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)

    # -- start-up --------------------------------------------------------------------
    def setup_host(self) -> subprocess.Popen:
        with runs.host_lock():
            swept = runs.sweep(exclude=self.names.run_id)
            for run_id, removed in swept.items():
                self.log(f"swept leftovers of dead run {run_id}: {removed}")
            runs.record_alive(self.names, os.getpid(), node=self.name)
            self.names.cgroup.mkdir(parents=True, exist_ok=True)
            self.network.create_bridge()
        self.log(f"run {self.names.tag}: bridge {self.names.bridge} {self.network.gateway}/{self.network.subnet.prefixlen}")
        # the reaper cleans up after us when we die, however we die
        return subprocess.Popen([sys.executable, str(Path(__file__).with_name("reaper.py")), self.names.run_id],
                                stdin=subprocess.PIPE, start_new_session=True)

    def start_services(self) -> None:
        target = None
        if self.args.apiserver:
            host, _, port = self.args.apiserver.rpartition(":")
            self.forwarder = Forwarder(self.network.gateway, (host, int(port))).start()
            target = self.forwarder.address
        self.services = ServiceProxy(Client(self.args.proxy_kubeconfig), self.cluster_domain, self.log, target)
        self.services.start()

    def node_status(self) -> dict:
        now = now_rfc3339()
        cond = lambda kind, status, reason, message: {  # noqa: E731
            "type": kind, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": self._started}
        resources = dict(self.allocatable)
        return {
            "capacity": resources, "allocatable": resources,
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "test node"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "test node"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "test node"),
                cond("Ready", "True", "KubeletReady", "embedjob test node is posting ready status"),
            ],
            "addresses": [{"type": "InternalIP", "address": self.network.gateway},
                          {"type": "Hostname", "address": self.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {"machineID": self.names.run_id, "systemUUID": self.names.run_id, "bootID": self.names.run_id,
                         "kernelVersion": platform.release(), "osImage": "embedjob test node (no images)",
                         "containerRuntimeVersion": "embedjob-test-node://1", "kubeletVersion": self.args.kubelet_version,
                         "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
        }

    def register(self) -> None:
        self._started = now_rfc3339()
        labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
                  "node.embedjob.dev/test-node": "true"}
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "labels": labels},
                "spec": {}, "status": self.node_status()}
        try:
            self.client.create("/api/v1/nodes", body)
        except ApiError as exc:
            if exc.status != 409:
                raise
        self.client.patch(f"/api/v1/nodes/{self.name}/status", {"status": self.node_status()}, strategic=True)
        self.log(f"node {self.name} registered: {self.allocatable}")

    def heartbeat(self) -> None:
        """Renew the node's Lease every 10 s and its status every 60 s (the kubelet's defaults)."""
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        last_status = time.monotonic()
        while True:
            spec = {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": now_micro()}
            try:
                try:
                    self.client.patch(lease_path, {"spec": spec})
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    node = self.client.get(f"/api/v1/nodes/{self.name}")
                    owner = {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": node["metadata"]["uid"]}
                    self.client.create(lease_path.rsplit("/", 1)[0], {
                        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.name, "ownerReferences": [owner]}, "spec": spec})
                if time.monotonic() - last_status >= 60:
                    self.client.patch(f"/api/v1/nodes/{self.name}/status", {"status": self.node_status()},
                                      strategic=True)
                    last_status = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - retried at the next beat
                self.log(f"heartbeat failed: {exc!r}")
            if self.stopped.wait(10):
                return

    # -- pods ------------------------------------------------------------------------
    def reconcile(self, informer: Informer) -> None:
        with self._wlock:
            seen = set()
            for pod in informer.snapshot():
                uid = pod["metadata"]["uid"]
                seen.add(uid)
                if uid in self.finished or self.stopped.is_set():
                    continue
                worker = self.workers.get(uid)
                if worker is None:
                    worker = self.workers[uid] = PodWorker(self, pod)
                    worker.start()
                else:
                    worker.update(pod)
            for uid, worker in self.workers.items():
                if uid not in seen:
                    worker.gone.set()

    def worker_done(self, worker: PodWorker) -> None:
        with self._wlock:
            self.workers.pop(worker.uid, None)
            self.finished.add(worker.uid)

    def event(self, pod: dict, reason: str, message: str, kind: str = "Normal") -> None:
        meta = pod["metadata"]
        now = now_rfc3339()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": meta["namespace"],
                                   "name": meta["name"], "uid": meta["uid"]},
                "reason": reason, "message": message[:1024], "type": kind, "count": 1,
                "firstTimestamp": now, "lastTimestamp": now,
                "source": {"component": "kubelet", "host": self.name},
                "reportingComponent": "kubelet", "reportingInstance": self.name}
        try:
            self.client.create(f"/api/v1/namespaces/{meta['namespace']}/events", body)
        except ApiError as exc:
            if exc.status not in (403, 404):  # the namespace may be terminating
                self.log(f"event {reason} failed: {exc}")

    def shutdown(self) -> None:
        self.stopped.set()
        with self._wlock:
            workers = list(self.workers.values())
        for w in workers:
            w.stopping.set()
        for w in workers:
            w.join(timeout=20)
        if self.services:
            self.services.stop()
        if self.forwarder:
            self.forwarder.stop()
        with runs.host_lock():
            removed = runs.remove_run(self.names)
        self.log(f"stopped; removed {removed}")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", required=True, help="identity system:node:NAME, group system:nodes")
    p.add_argument("--proxy-kubeconfig", required=True, help="identity system:kube-proxy")
    p.add_argument("--node-name", default="embedjob-test-node")
    p.add_argument("--workdir", required=True, help="pod directories (volumes, logs, hosts files)")
    p.add_argument("--apiserver", help="HOST:PORT of the API server, forwarded to pods as the kubernetes Service")
    p.add_argument("--cpu", default="16")
    p.add_argument("--memory", default="64Gi")
    p.add_argument("--gpus", type=int, default=4, help="nvidia.com/gpu count advertised (no GPU is used)")
    p.add_argument("--pods", type=int, default=110)
    p.add_argument("--cluster-domain", default="cluster.local")
    p.add_argument("--kubelet-version", default="v0.0.0-embedjob-test-node")
    p.add_argument("--restart-backoff", type=float, default=10.0, help="first restart back-off in seconds")
    p.add_argument("--image-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an image's ENV, given to every container (no image is pulled); repeatable")
    p.add_argument("--ready-file", help="written (JSON: run id, bridge, subnet, gateway) once the node is registered")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("the test node agent needs root (network namespaces, mounts, cgroups)", file=sys.stderr)
        return 2
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing:
        print(f"missing tools: {missing} (Debian: apt-get install -y iproute2 util-linux nftables)", file=sys.stderr)
        return 2
    node = Node(args)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    reaper = node.setup_host()
    try:
        node.start_services()
        node.register()
        threading.Thread(target=node.heartbeat, name="heartbeat", daemon=True).start()
        pods = Informer(node.client, "/api/v1/pods", node.reconcile,
                        params={"fieldSelector": f"spec.nodeName={node.name}"}, name="pods").start()
        if args.ready_file:
            Path(args.ready_file).write_text(json.dumps({
                "run_id": node.names.run_id, "tag": node.names.tag, "bridge": node.names.bridge,
                "subnet": str(node.network.subnet), "gateway": node.network.gateway, "pid": os.getpid(),
                "reaper_pid": reaper.pid}))
        node.log("ready")
        while not stop.wait(1):
            pass
        pods.stop()
    finally:
        node.shutdown()
        reaper.stdin.close()
        reaper.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
