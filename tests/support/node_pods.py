"""Reading pods on the test node: phase predicates, `kubectl get -o json`, termination messages."""

from __future__ import annotations

import json


def phase_in(*phases):
    """A predicate for `real_node.wait_for_pod`: the pod's phase is one of `phases`."""
    return lambda pod: pod.get("status", {}).get("phase") in phases


def kubectl_json(kube, *args) -> dict:
    return json.loads(kube.kubectl(*args, "-o", "json").stdout)


def termination_message(pod: dict, container: str) -> dict:
    """The JSON a container wrote to /dev/termination-log."""
    status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == container)
    return json.loads(status["state"]["terminated"]["message"])
