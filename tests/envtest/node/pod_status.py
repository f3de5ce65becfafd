"""A pod's phase and conditions, derived from its containers as the kubelet does, and the status it reports.

Terminal phases (Succeeded, Failed) are final; a condition keeps its lastTransitionTime until its
status or reason changes. pods.py decides when to recompute and when to patch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .kubeapi import now_rfc3339

if TYPE_CHECKING:
    from .containers import Container

TERMINAL_PHASES = ("Succeeded", "Failed")


class PodStatus:
    def __init__(self) -> None:
        self.phase = "Pending"
        self.conditions: dict[str, dict] = {}
        self.start_time = ""

    def set_condition(self, kind: str, status: str, reason: str = "", message: str = "") -> None:
        old = self.conditions.get(kind)
        if old and old["status"] == status and old.get("reason", "") == reason:
            return
        cond = {"type": kind, "status": status, "lastTransitionTime": now_rfc3339(), "lastProbeTime": None}
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        self.conditions[kind] = cond

    def update_phase(self, inits: list[Container], containers: list[Container]) -> None:
        """The phase and the readiness conditions from the containers' states."""
        if self.phase not in TERMINAL_PHASES:
            if any(c.done and c.exit_code for c in inits):
                self.phase = "Failed"
            elif all(c.done for c in containers):
                self.phase = "Succeeded" if all(c.exit_code == 0 for c in containers) else "Failed"
            elif any(c.run is not None or c.restarts or c.done for c in containers):
                self.phase = "Running"
            else:
                self.phase = "Pending"
        terminal_phase = self.phase in TERMINAL_PHASES
        ready = all(c.ready for c in containers) and not terminal_phase
        reason = "PodCompleted" if terminal_phase else "ContainersNotReady"
        self.set_condition("ContainersReady", "True" if ready else "False", "" if ready else reason)
        self.set_condition("Ready", "True" if ready else "False", "" if ready else reason)

    def body(self, inits: list[Container], containers: list[Container], host_ip: str, pod_ip: str) -> dict:
        """The pods/status patch's `status` (after `update_phase`)."""
        status = {
            "phase": self.phase,
            "conditions": list(self.conditions.values()),
            "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
            "startTime": self.start_time,
            "initContainerStatuses": [c.status() for c in inits],
            "containerStatuses": [c.status() for c in containers],
        }
        if pod_ip:
            status["podIP"] = pod_ip
            status["podIPs"] = [{"ip": pod_ip}]
        return status
