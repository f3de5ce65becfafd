"""The node's pod network: one bridge per run, one network namespace + veth pair per pod.

The bridge carries the node's address (``.1`` of a /24 chosen per run from
10.247.0.0/16, skipping any subnet this machine already routes) and is the pods'
default gateway. Pods reach each other over the bridge; the host (API server service
proxy, tests, the KubeRay operator) reaches them through the bridge's connected route.
Nothing is forwarded or NATed to the machine's own network: no ip_forward, no
masquerade. Service addresses are translated inside each pod's namespace
(services.py).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import threading

from .runs import RunNames

SUPERNET = ipaddress.ip_network("10.247.0.0/16")


class NetError(RuntimeError):
    pass


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and res.returncode != 0:
        raise NetError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


def _routed_networks() -> list[ipaddress.IPv4Network]:
    routes = json.loads(ip("-j", "-4", "route", "show", "table", "all").stdout or "[]")
    nets = []
    for r in routes:
        dst = r.get("dst", "")
        if dst and dst != "default" and not dst.startswith(("local", "broadcast")):
            try:
                nets.append(ipaddress.ip_network(dst, strict=False))
            except ValueError:
                pass
    return nets


class PodNetwork:
    """The bridge of one run and the address allocation of its pods."""

    def __init__(self, names: RunNames):
        self.names = names
        self.subnet: ipaddress.IPv4Network | None = None
        self.gateway = ""
        self._lock = threading.Lock()
        self._used: set[int] = set()
        self._next_slot = 2

    def create_bridge(self) -> None:
        """Pick a free /24 and create the bridge (call under runs.host_lock)."""
        taken = _routed_networks()
        for subnet in SUPERNET.subnets(new_prefix=24):
            if not any(subnet.overlaps(n) for n in taken):
                break
        else:
            raise NetError(f"no free /24 left in {SUPERNET}")
        self.subnet = subnet
        self.gateway = str(subnet.network_address + 1)
        br = self.names.bridge
        ip("link", "add", br, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/{subnet.prefixlen}", "dev", br)
        ip("link", "set", br, "up")

    def delete_bridge(self) -> None:
        ip("link", "delete", self.names.bridge, check=False)

    def add_pod(self) -> tuple[int, str, str]:
        """Create a network namespace wired to the bridge; returns (slot, netns name, pod IP)."""
        with self._lock:
            host_bits = self.subnet.num_addresses - 2
            for _ in range(host_bits):
                slot = self._next_slot
                self._next_slot = 2 if self._next_slot >= host_bits else self._next_slot + 1
                if slot not in self._used:
                    self._used.add(slot)
                    break
            else:
                raise NetError(f"no pod address left in {self.subnet}")
        netns, veth = self.names.netns(slot), self.names.veth(slot)
        pod_ip = str(self.subnet.network_address + slot)
        try:
            ip("netns", "add", netns)
            ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
            ip("link", "set", veth, "master", self.names.bridge, "up")
            ip("-n", netns, "addr", "add", f"{pod_ip}/{self.subnet.prefixlen}", "dev", "eth0")
            ip("-n", netns, "link", "set", "eth0", "up")
            ip("-n", netns, "link", "set", "lo", "up")
            ip("-n", netns, "route", "add", "default", "via", self.gateway)
        except NetError:
            self.remove_pod(slot)
            raise
        return slot, netns, pod_ip

    def remove_pod(self, slot: int) -> None:
        ip("netns", "delete", self.names.netns(slot), check=False)  # takes the veth pair with it
        ip("link", "delete", self.names.veth(slot), check=False)
        with self._lock:
            self._used.discard(slot)
