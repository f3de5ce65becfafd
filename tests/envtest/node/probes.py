"""Container probes as the kubelet runs them: exec, httpGet and tcpSocket.

HTTP and TCP probes connect from the host to the pod's address over the bridge (the
kubelet also probes from the node); an exec probe runs its command in the container's
network, mount and UTS namespaces (``nsenter`` into the container's main process) with
the container's environment. gRPC probes are not supported (reported as a failure
that says so).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import threading
import time


def _port(value, container: dict) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for port in container.get("ports", []):
        if port.get("name") == value:
            return int(port["containerPort"])
    raise ValueError(f"no container port named {value!r}")


def run_once(probe: dict, container: dict, pod_ip: str, pid: int | None, env: dict[str, str]) -> tuple[bool, str]:
    """One probe attempt: (success, message)."""
    timeout = probe.get("timeoutSeconds", 1)
    try:
        if "exec" in probe:
            if pid is None:
                return False, "container not running"
            cmd = ["nsenter", "-t", str(pid), "-n", "-m", "-u", "--", *probe["exec"]["command"]]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            return res.returncode == 0, (res.stdout + res.stderr)[-500:]
        if "httpGet" in probe:
            get = probe["httpGet"]
            host = get.get("host") or pod_ip
            port = _port(get["port"], container)
            if get.get("scheme", "HTTP").upper() == "HTTPS":
                conn = http.client.HTTPSConnection(host, port, timeout=timeout,
                                                   context=ssl._create_unverified_context())
            else:
                conn = http.client.HTTPConnection(host, port, timeout=timeout)
            headers = {h["name"]: h["value"] for h in get.get("httpHeaders", [])}
            headers.setdefault("User-Agent", "kube-probe/embedjob-test-node")
            try:
                conn.request("GET", get.get("path", "/"), headers=headers)
                status = conn.getresponse().status
            finally:
                conn.close()
            return 200 <= status < 400, f"HTTP probe failed with statuscode: {status}"
        if "tcpSocket" in probe:
            tcp = probe["tcpSocket"]
            with socket.create_connection((tcp.get("host") or pod_ip, _port(tcp["port"], container)), timeout):
                return True, ""
        if "grpc" in probe:
            return False, "grpc probes are not supported by the test node"
        return False, f"unknown probe handler {sorted(probe)}"
    except subprocess.TimeoutExpired:
        return False, f"command timed out after {timeout}s"
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return False, str(exc)


class Prober(threading.Thread):
    """Runs one probe of one container run periodically; ``result`` is True/False/None (not yet known)."""

    def __init__(self, kind: str, probe: dict, container: dict, pod_ip: str, pid: int, env: dict[str, str],
                 gate: threading.Event | None = None):
        super().__init__(name=f"probe-{kind}-{container['name']}", daemon=True)
        self.kind, self.probe, self.container = kind, probe, container
        self.pod_ip, self.pid, self.env = pod_ip, pid, env
        self.gate = gate  # startup probe passed (or none): liveness/readiness only run after it
        self.stopped = threading.Event()
        self.result: bool | None = None
        self.message = ""
        self.successes = self.failures = 0

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        p = self.probe
        period = p.get("periodSeconds", 10)
        success_threshold = p.get("successThreshold", 1)
        failure_threshold = p.get("failureThreshold", 3)
        if self.gate is not None:
            while not self.gate.wait(0.2):
                if self.stopped.is_set():
                    return
        if self.stopped.wait(p.get("initialDelaySeconds", 0)):
            return
        while not self.stopped.is_set():
            started = time.monotonic()
            ok, message = run_once(p, self.container, self.pod_ip, self.pid, self.env)
            if ok:
                self.successes, self.failures = self.successes + 1, 0
                if self.successes >= success_threshold:
                    self.result = True
            else:
                self.successes, self.failures = 0, self.failures + 1
                self.message = message
                if self.failures >= failure_threshold:
                    self.result = False
            self.stopped.wait(max(0.0, period - (time.monotonic() - started)))
