"""Tenants on the test API server: a user with rights in one namespace only, and RayJobs made by hand (a tenant's own, or one forged to look like the operator's)."""

from __future__ import annotations

import json

TENANT_RULES = [  # what a team gets in its own namespace: its jobs, RayJobs of its own, Secrets, Events
    {"apiGroups": ["embedjob.dev"], "resources": ["embeddingjobs"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    {"apiGroups": ["ray.io"], "resources": ["rayjobs"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["secrets", "events"], "verbs": ["get", "list", "create"]},
]


def apply(kube, *objects: dict, kubeconfig: str | None = None) -> None:
    kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}),
                 kubeconfig=kubeconfig)


def tenant_user(kube, namespace: str, user: str) -> str:
    """A kubeconfig of `user`, who may use TENANT_RULES in `namespace` and nothing anywhere else."""
    apply(kube,
          {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
           "metadata": {"name": "tenant", "namespace": namespace}, "rules": TENANT_RULES},
          {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
           "metadata": {"name": f"tenant-{user}", "namespace": namespace},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
           "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    return kube.kubeconfig_for_user(user)


def rayjob(namespace: str, name: str, suspend: bool, labels: dict | None = None,
           owner: dict | None = None) -> dict:
    """A RayJob made by hand, not by the operator (with `labels`/`owner` it poses as the operator's)."""
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {},
                         "ownerReferences": [owner] if owner else []},
            "spec": {"entrypoint": "python -c 'print(1)'", "suspend": suspend,
                     "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {
                         "containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0"}]}}}}}}


def forged_rayjob(namespace: str, name: str, job: dict) -> dict:
    """A RayJob in `namespace` carrying the operator's labels and a controller ownerReference to `job`, a job
    of another namespace (its uid is visible to whoever reads its Events, its pods' labels or the run table)."""
    meta = job["metadata"]
    return rayjob(namespace, name, suspend=False,
                  labels={"app.kubernetes.io/managed-by": "embedjob", "embedjob.dev/job-uid": meta["uid"],
                          "embedjob.dev/job-name": meta["name"]},
                  owner={"apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob", "name": meta["name"],
                         "uid": meta["uid"], "controller": True})
