"""The RBAC rules the operator needs: exactly what its code and kopf call, nothing with `*`.

The Helm chart renders its ClusterRole/Roles from these lists, and a test runs the
operator under a ServiceAccount bound to nothing else. `python -m controller.permissions`
prints them as JSON.

- Cluster-wide (`EMBEDJOB_WATCH_NAMESPACES` empty): one ClusterRole with
  `cluster_rules(clusterwide=True)`, which include the namespaced rules.
- Namespaced: a ClusterRole with `cluster_rules(clusterwide=False)` plus, in each
  watched namespace, a Role with `NAMESPACED_RULES`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from embedjob import api

from .rayjob import RAY_GROUP


@dataclass(frozen=True)
class Rule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str

    def as_policy_rule(self) -> dict[str, list[str]]:
        return {"apiGroups": list(self.api_groups), "resources": list(self.resources), "verbs": list(self.verbs)}


# In the watched namespaces.
NAMESPACED_RULES = (
    Rule((api.GROUP,), (api.PLURAL,), ("get", "list", "watch", "patch", "create", "delete"),
         "kopf watches the jobs and patches their finalizer and its embedjob.dev/* annotations; "
         "a refused job is read again before each re-review; a scheduled job's runs are jobs the operator "
         "creates at their ticks and deletes (history limits, Replace, the scheduled job's deletion)"),
    Rule((api.GROUP,), (f"{api.PLURAL}/status",), ("patch",), "the operator writes status and conditions"),
    Rule((RAY_GROUP,), ("rayjobs",), ("get", "list", "watch", "create", "patch", "delete"),
         "one RayJob per job: created, watched for status, suspended/resumed, deleted by the finalizer"),
    Rule((RAY_GROUP,), ("rayclusters",), ("get",),
         "a selected RayCluster must hand the job's Secret to its driver (acceptance); a shared "
         "RayCluster's dashboard address and token Secret name, to remove idle actor pools; "
         "the state of a job's RayCluster while the job waits for it"),
    Rule(("",), ("pods",), ("list",),
         "what a job that has not started waits for: its RayCluster's and its submitter's pods"),
    Rule(("",), ("secrets",), ("get",),
         "checks that the job's database Secret and key exist; reads a shared RayCluster's Ray token"),
    Rule(("",), ("events",), ("create",), "an Event on every condition transition"),
)

# Cluster-scoped, in both modes.
CLUSTER_RULES = (
    Rule(("apiextensions.k8s.io",), ("customresourcedefinitions",), ("list", "watch"),
         "kopf notices the EmbeddingJob and RayJob CRDs being installed or removed"),
    Rule(("",), ("namespaces",), ("get",),
         "the finalizer releases a job whose namespace is being deleted without RayJob calls "
         "(the namespace controller deletes the RayJob, and a watched namespace's Role may be gone)"),
)

# Namespaced mode only: kopf lists and watches namespaces to follow the watched ones.
NAMESPACE_OBSERVATION = Rule(("",), ("namespaces",), ("list", "watch"),
                             "kopf follows the watched namespaces being created or deleted")


# Namespaced mode only: what kopf needs to see a job of a namespace being deleted and take its
# finalizer off after the namespace controller has deleted that namespace's RoleBinding, so it
# may not live there. Each of kopf's watch reconnects in a watched namespace (a new watch, or
# list after 410 Gone) is authorized anew; refused, it retries for a minute, then the operator exits.
NAMESPACE_DELETION = (
    Rule((api.GROUP,), (api.PLURAL,), ("get", "list", "watch", "patch"),
         "kopf sees a job of a namespace being deleted and takes its finalizer off, once the "
         "namespace controller may have deleted the RoleBinding there; at its start the operator "
         "releases the jobs of a watched namespace already being deleted, which kopf never watches"),
    Rule((RAY_GROUP,), ("rayjobs",), ("list", "watch"),
         "kopf's RayJob watch in a namespace being deleted, whose RoleBinding may be gone: refused, "
         "it stops the operator, and kopf handles no job before that watch has listed"),
)


def cluster_rules(clusterwide: bool) -> tuple[Rule, ...]:
    if clusterwide:
        return CLUSTER_RULES + NAMESPACED_RULES
    return CLUSTER_RULES + (NAMESPACE_OBSERVATION, *NAMESPACE_DELETION)


def policy_rules(rules: tuple[Rule, ...]) -> list[dict[str, list[str]]]:
    return [rule.as_policy_rule() for rule in rules]


def as_document() -> dict[str, dict[str, list[dict[str, list[str]]]]]:
    return {
        "clusterwide": {"clusterRole": policy_rules(cluster_rules(clusterwide=True))},
        "namespaced": {
            "clusterRole": policy_rules(cluster_rules(clusterwide=False)),
            "role": policy_rules(NAMESPACED_RULES),
        },
    }


if __name__ == "__main__":
    print(json.dumps(as_document(), indent=2))
