"""Which changes of an EmbeddingJob's status become Kubernetes Events (pure functions).

An Event for each condition that became True, for each new status or reason of Accepted (a
refusal, the RayJob created), and for a new reason why its pods cannot start; the Warning ones are the refusals, failures and stuck pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .status import find_condition
from .waiting import STUCK_REASONS


@dataclass(frozen=True)
class Transition:
    """A condition that changed: one Kubernetes Event."""

    type: str
    status: str
    reason: str
    message: str

    @property
    def warning(self) -> bool:
        refused_or_failed = (self.type, self.status) in (("Failed", "True"), ("Accepted", "False"))
        return refused_or_failed or stuck(self.type, self.status, self.reason)


def stuck(type_: str, status_: str, reason: str) -> bool:
    """A Running=False condition whose reason says the job's pods cannot start."""
    return (type_, status_) == ("Running", "False") and reason in STUCK_REASONS


def transitions(current: dict[str, Any], desired: dict[str, Any]) -> list[Transition]:
    """Conditions that became True, a new status or reason of Accepted (so RayJobCreated after
    ReviewPassed, and each refusal), and a new reason why its pods cannot start: one Event each."""
    out = []
    for cond in desired.get("conditions", []):
        old = find_condition(current, cond["type"]) or {}
        became_true = cond["status"] == "True" and old.get("status") != "True"
        new_reason = (old.get("status"), old.get("reason")) != ("False", cond["reason"])
        accepted_anew = cond["type"] == "Accepted" and cond["status"] != "Unknown" and (
            old.get("status"), old.get("reason")) != (cond["status"], cond["reason"])
        stuck_anew = stuck(cond["type"], cond["status"], cond["reason"]) and new_reason
        if became_true or accepted_anew or stuck_anew:
            out.append(Transition(cond["type"], cond["status"], cond["reason"], cond["message"]))
    return out
