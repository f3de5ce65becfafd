"""Services for the test node's pods: ClusterIPs by NAT rules and names by /etc/hosts.

What kube-proxy and CoreDNS do in a cluster, in the least machinery that behaves the
same for a pod:

- **ClusterIP**: an nftables table ``embedjob_services`` *inside each pod's network
  namespace* DNATs ``<clusterIP>:<port>`` to one of the Service's ready endpoints
  (EndpointSlices written by the real EndpointSlice controller; random choice per
  connection) and rejects connections to a Service without endpoints, as kube-proxy
  does. Rules in the pod's own namespace need no forwarding, masquerading or hairpin
  handling on the host, and two runs with the same ClusterIPs never see each other's
  rules. The API server's own ``default/kubernetes`` Service (which has no endpoints
  here) goes to the agent's forwarder on the node address (apiproxy.py).
- **Names**: each pod's /etc/hosts (a file of the pod, bind-mounted into each
  container and rewritten in place when Services or endpoints change) lists
  ``<svc>.<ns>.svc.cluster.local``, ``<svc>.<ns>.svc``, ``<svc>.<ns>`` and, for the
  pod's own namespace, ``<svc>``; a headless Service's names list its ready endpoint
  addresses (and ``<hostname>.<svc>.<ns>.svc.cluster.local`` for endpoints with a
  hostname). /etc/resolv.conf carries the cluster search path but no name server:
  names outside the cluster do not resolve in a pod, as on a cluster without egress.

It watches Services and EndpointSlices as ``system:kube-proxy`` (kube-proxy's own
RBAC role).
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from . import envvars
from .kubeapi import Client, Informer

TABLE = "embedjob_services"


class ServiceProxy:
    def __init__(self, client: Client, cluster_domain: str, log, apiserver_forward: tuple[str, int] | None = None):
        self.domain = cluster_domain
        self.log = log
        self.apiserver_forward = apiserver_forward
        self._pods: dict[str, tuple[str, str, Path, str]] = {}  # uid -> (netns, namespace, hosts path, own line)
        self._applied: dict[str, tuple[str, str]] = {}  # uid -> (rules, hosts) last written
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        self._stopped = threading.Event()
        self.services = Informer(client, "/api/v1/services", self._changed, name="services")
        self.slices = Informer(client, "/apis/discovery.k8s.io/v1/endpointslices", self._changed, name="slices")
        self._thread = threading.Thread(target=self._loop, name="service-proxy", daemon=True)

    def start(self, timeout: float = 60) -> None:
        self.services.start()
        self.slices.start()
        for inf in (self.services, self.slices):
            if not inf.synced.wait(timeout):
                raise TimeoutError(f"{inf.path}: not listed after {timeout}s")
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._dirty.set()
        self.services.stop()
        self.slices.stop()

    def _changed(self, _informer) -> None:
        self._dirty.set()

    # -- pods ------------------------------------------------------------------------
    def add_pod(self, uid: str, netns: str, namespace: str, hosts: Path, own_line: str) -> None:
        """Register a pod and write its rules and hosts file now (before its containers start)."""
        with self._lock:
            self._pods[uid] = (netns, namespace, hosts, own_line)
            rules, by_ns = self._compute()
            self._apply(uid, rules, by_ns)

    def remove_pod(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)
            self._applied.pop(uid, None)

    def service_env(self, namespace: str) -> dict[str, str]:
        return envvars.service_links(self.services.snapshot(), namespace)

    # -- the computation --------------------------------------------------------------
    def _endpoints(self) -> dict[tuple[str, str], list[tuple[str, dict[str, int], str | None]]]:
        """(namespace, service) -> [(ip, {port name: port}, hostname)] of ready endpoints."""
        result: dict[tuple[str, str], list] = {}
        for sl in self.slices.snapshot():
            if sl.get("addressType") != "IPv4":
                continue
            svc = sl["metadata"].get("labels", {}).get("kubernetes.io/service-name")
            if not svc:
                continue
            ports = {p.get("name", "") or "": p.get("port") for p in sl.get("ports") or []}
            for ep in sl.get("endpoints") or []:
                if ep.get("conditions", {}).get("ready") is False:
                    continue
                for addr in ep.get("addresses", []):
                    result.setdefault((sl["metadata"]["namespace"], svc), []).append(
                        (addr, ports, ep.get("hostname")))
        return result

    def _compute(self) -> tuple[str, dict[str, str]]:
        endpoints = self._endpoints()
        nat, reject = [], []
        names: list[tuple[str, str, list[str]]] = []  # (ip, namespace, names)
        for svc in sorted(self.services.snapshot(), key=Informer.key):
            meta, spec = svc["metadata"], svc.get("spec", {})
            ns, name = meta["namespace"], meta["name"]
            fqdn = f"{name}.{ns}.svc.{self.domain}"
            aliases = [fqdn, f"{name}.{ns}.svc", f"{name}.{ns}"]
            eps = endpoints.get((ns, name), [])
            cluster_ip = spec.get("clusterIP")
            if spec.get("type") == "ExternalName":
                continue
            if not cluster_ip or cluster_ip == "None":  # headless: the names are the endpoints
                for ip, _, hostname in eps:
                    names.append((ip, ns, aliases))
                    if hostname:
                        names.append((ip, ns, [f"{hostname}.{fqdn}"]))
                continue
            names.append((cluster_ip, ns, aliases))
            for ep_ip, _, hostname in eps:
                if hostname:
                    names.append((ep_ip, ns, [f"{hostname}.{fqdn}"]))
            for port in spec.get("ports", []):
                proto = port.get("protocol", "TCP").lower()
                if proto not in ("tcp", "udp"):
                    continue
                targets = [(ip, ports[port.get("name", "") or ""]) for ip, ports, _ in eps
                           if ports.get(port.get("name", "") or "")]
                if not targets and (ns, name) == ("default", "kubernetes") and self.apiserver_forward:
                    targets = [self.apiserver_forward]
                match = f"ip daddr {cluster_ip} {proto} dport {port['port']}"
                if not targets:
                    reject.append(f"{match} reject" + (" with tcp reset" if proto == "tcp" else ""))
                elif len(targets) == 1:
                    nat.append(f"{match} dnat ip to {targets[0][0]}:{targets[0][1]}")
                else:
                    elements = ", ".join(f"{i} : {ip} . {p}" for i, (ip, p) in enumerate(targets))
                    nat.append(f"{match} dnat ip addr . port to numgen random mod {len(targets)} map {{ {elements} }}")
        rules = "\n".join([
            f"table ip {TABLE}", f"delete table ip {TABLE}", f"table ip {TABLE} {{",
            "  chain nat_output {", "    type nat hook output priority -100; policy accept;",
            *(f"    {r}" for r in nat), "  }",
            "  chain reject_output {", "    type filter hook output priority 0; policy accept;",
            *(f"    {r}" for r in reject), "  }", "}", ""])
        by_ns: dict[str, str] = {}
        for ns in {p[1] for p in self._pods.values()}:
            lines = []
            for ip, svc_ns, aliases in names:
                short = [aliases[0].split(".")[0]] if svc_ns == ns and len(aliases) == 3 else []
                lines.append(f"{ip}\t{' '.join(aliases + short)}")
            by_ns[ns] = "\n".join(lines)
        return rules, by_ns

    def _apply(self, uid: str, rules: str, by_ns: dict[str, str]) -> None:
        netns, ns, hosts_path, own = self._pods[uid]
        hosts = ("# Kubernetes-managed hosts file (embedjob test node).\n"
                 "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                 f"{own}\n\n# Services\n{by_ns.get(ns, '')}\n")
        old_rules, old_hosts = self._applied.get(uid, ("", ""))
        if hosts != old_hosts:
            # in place: the file is bind-mounted into running containers (the inode must stay)
            with open(hosts_path, "a+") as fh:
                fh.seek(0)
                fh.truncate()
                fh.write(hosts)
        if rules != old_rules:
            res = subprocess.run(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=rules,
                                 capture_output=True, text=True)
            if res.returncode != 0:
                self.log(f"nft in {netns} failed: {res.stderr.strip()}\n{rules}")
                rules = old_rules
        self._applied[uid] = (rules, hosts)

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._dirty.wait()
            if self._stopped.is_set():
                return
            time.sleep(0.1)  # let a burst of watch events settle
            self._dirty.clear()
            with self._lock:
                try:
                    rules, by_ns = self._compute()
                    for uid in list(self._pods):
                        self._apply(uid, rules, by_ns)
                except Exception as exc:  # noqa: BLE001 - keep serving; the next change retries
                    self.log(f"service proxy: {exc!r}")
