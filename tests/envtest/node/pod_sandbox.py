"""A pod's sandbox on the test node: its network namespace and IP, /etc/hosts and /etc/resolv.conf,
its volumes, and the Secrets, ConfigMaps and ServiceAccount tokens they are made from.

Made before the first container starts and torn down once (when the pod ends or is deleted).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from . import volumes
from .kubeapi import ApiError

if TYPE_CHECKING:
    from .agent import Node


class PodSandbox:
    def __init__(self, node: Node, pod: dict, pod_dir: Path):
        meta = pod["metadata"]
        self.node, self.pod, self.dir = node, pod, pod_dir
        self.ns, self.pod_name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.slot: int | None = None
        self.netns = ""
        self.pod_ip = ""
        self.hostname = ""
        self.hosts = pod_dir / "etc-hosts"
        self.resolv = pod_dir / "resolv.conf"
        self.volumes: dict[str, Path] = {}
        self.memory_dirs: list[Path] = []
        self.down = False

    def create(self, log: Callable[[str], None]) -> None:
        """The network namespace with the pod's IP, its hosts and resolv.conf files (kept current by
        services.py)."""
        self.slot, self.netns, self.pod_ip = self.node.network.add_pod()
        log(f"sandbox {self.netns} ip {self.pod_ip}")
        spec = self.pod["spec"]
        hostname = spec.get("hostname") or self.pod_name
        self.hostname = hostname[:63]
        own = f"{self.pod_ip}\t{hostname}"
        if spec.get("subdomain"):
            own += f"\t{hostname}.{spec['subdomain']}.{self.ns}.svc.{self.node.cluster_domain}"
        for alias in spec.get("hostAliases", []):
            own += f"\n{alias['ip']}\t{' '.join(alias.get('hostnames', []))}"
        domain = self.node.cluster_domain
        self.resolv.write_text(f"search {self.ns}.svc.{domain} svc.{domain} {domain}\noptions ndots:5\n")
        self.node.services.add_pod(self.uid, self.netns, self.ns, self.hosts, own)

    def teardown(self) -> None:
        if self.down:
            return
        self.down = True
        self.node.services.remove_pod(self.uid)
        if self.slot is not None:
            self.node.network.remove_pod(self.slot)
        volumes.remove(self.dir, self.memory_dirs)

    def lookup(self, kind: str, name: str) -> dict | None:
        """A Secret or ConfigMap of the pod's namespace; None when it does not exist."""
        plural = {"Secret": "secrets", "ConfigMap": "configmaps"}[kind]
        try:
            return self.node.client.get(f"/api/v1/namespaces/{self.ns}/{plural}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def token(self, sa: str, audiences: list[str], seconds: int) -> str:
        """A ServiceAccount token bound to this pod (TokenRequest)."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": audiences, "expirationSeconds": seconds,
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                            "name": self.pod_name, "uid": self.uid}}}
        for attempt in range(20):  # the node authorizer learns of a new pod a moment later
            try:
                res = self.node.client.create(f"/api/v1/namespaces/{self.ns}/serviceaccounts/{sa}/token", body)
                return res["status"]["token"]
            except ApiError as exc:
                if exc.status != 403 or attempt == 19:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def prepare_volumes(self, pod: dict) -> None:
        """Every volume of `pod` (its latest version); raises VolumeError or ApiError while one cannot
        be made yet (a missing Secret, ...)."""
        def shm(name: str) -> Path:
            path = self.node.names.shm_dir(self.uid, name)
            self.memory_dirs.append(path)
            return path

        self.volumes = volumes.prepare(pod, self.dir, shm, self.lookup, self.token, self.node.allocatable)
