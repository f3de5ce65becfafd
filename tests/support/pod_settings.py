"""Pod settings for tests: a head and a worker template that set every field, and malformed ones with the field
the API server (and `parse_spec`) must name."""

from __future__ import annotations

import json
from typing import Any

AFFINITY = {
    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}},
    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "podAffinityTerm": {"labelSelector": {"matchLabels": {"team": "search"}},
                                           "topologyKey": "kubernetes.io/hostname"}}]},
}
SERVICE_ACCOUNT = "embedder"
#: EMBEDJOB_POD_POLICY of an operator whose admin allowed SERVICE_ACCOUNT (embedjob/pod_policy.py)
POLICY_ALLOWING_SERVICE_ACCOUNT = json.dumps({"allowedServiceAccounts": SERVICE_ACCOUNT})
PRIORITY_CLASS = "batch-low"


def pod_spec(container: dict[str, Any]) -> dict[str, Any]:
    """A pod spec that sets every pod-level field, with `container` as its Ray container."""
    return {
        "nodeSelector": {"pool": "embedding"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute",
                         "tolerationSeconds": 60}],
        "affinity": AFFINITY,
        "serviceAccountName": SERVICE_ACCOUNT,
        "imagePullSecrets": [{"name": "regcred"}],
        "priorityClassName": PRIORITY_CLASS,
        "terminationGracePeriodSeconds": 120,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": [{"name": "model-cache", "emptyDir": {"sizeLimit": "1Gi"}},
                    {"name": "corpus", "persistentVolumeClaim": {"claimName": "corpus", "readOnly": True}},
                    {"name": "settings", "configMap": {"name": "embed-settings", "items": [
                        {"key": "a", "path": "a.conf"}]}}],
        "containers": [container],
    }


def ray_container(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "env": [{"name": "HF_HOME", "value": "/cache"},
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "envFrom": [{"configMapRef": {"name": "aws"}}, {"secretRef": {"name": "s3-keys"}, "prefix": "S3_"}],
        "volumeMounts": [{"name": "model-cache", "mountPath": "/cache"},
                         {"name": "corpus", "mountPath": "/data", "readOnly": True},
                         {"name": "settings", "mountPath": "/etc/embed", "subPath": "conf"}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }


HEAD_RESOURCES = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
METADATA = {"labels": {"team": "search"}, "annotations": {"example.com/owner": "search@example.com"}}
HEAD_TEMPLATE = {"metadata": METADATA,
                 "spec": pod_spec({**ray_container("ray-head"), "resources": HEAD_RESOURCES})}
WORKER_TEMPLATE = {"metadata": METADATA, "spec": pod_spec(ray_container("ray-worker"))}
#: spec fields that set every pod setting of the head and the workers
EVERY_POD_SETTING = {"head": {"template": HEAD_TEMPLATE}, "workers": {"template": WORKER_TEMPLATE}}


def workers(spec: dict[str, Any]) -> dict[str, Any]:
    return {"workers": {"template": {"spec": spec}}}


def worker_container(**fields: Any) -> dict[str, Any]:
    return workers({"containers": [{"name": "ray-worker", **fields}]})


def head_container(**fields: Any) -> dict[str, Any]:
    return {"head": {"template": {"spec": {"containers": [{"name": "ray-head", **fields}]}}}}


W = "spec.workers.template.spec"
H = "spec.head.template.spec"
#: (case id, spec fields merged into a valid minimal spec, the field the refusal names (API server form),
#:  whether `parse_spec` checks it too: spec-level CEL rules are the API server's alone)
MALFORMED_POD_SETTINGS = [
    ("toleration-unknown-operator", workers({"tolerations": [{"key": "a", "operator": "Maybe"}]}),
     f"{W}.tolerations[0].operator", True),
    ("toleration-unknown-effect", workers({"tolerations": [{"key": "a", "effect": "NoRun"}]}),
     f"{W}.tolerations[0].effect", True),
    ("toleration-exists-with-value", workers({"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}),
     f"{W}.tolerations[0].value", True),
    ("toleration-seconds-not-noexecute", workers({"tolerations": [{"key": "a", "tolerationSeconds": 5}]}),
     f"{W}.tolerations[0].tolerationSeconds", True),
    ("tolerations-too-many", workers({"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(33)]}),
     f"{W}.tolerations", True),
    ("mount-without-volume", worker_container(volumeMounts=[{"name": "cache", "mountPath": "/cache"}]),
     f"{W}.containers", True),
    ("mount-path-relative", workers({"volumes": [{"name": "c", "emptyDir": {}}], "containers": [
        {"name": "ray-worker", "volumeMounts": [{"name": "c", "mountPath": "cache"}]}]}),
     f"{W}.containers[0].volumeMounts[0].mountPath", True),
    ("sub-path-escapes", workers({"volumes": [{"name": "c", "emptyDir": {}}], "containers": [
        {"name": "ray-worker", "volumeMounts": [{"name": "c", "mountPath": "/c", "subPath": "a/../../etc"}]}]}),
     f"{W}.containers[0].volumeMounts[0].subPath", True),
    ("env-overrides-database-url", head_container(env=[{"name": "EMBEDJOB_DATABASE_URL", "value": "x"}]),
     f"{H}.containers[0].env[0].name", True),
    ("env-reserved-prefix", worker_container(env=[{"name": "EMBEDJOB_FAULT_INJECTION", "value": "{}"}]),
     f"{W}.containers[0].env[0].name", True),
    ("env-ray-address", worker_container(env=[{"name": "RAY_ADDRESS", "value": "elsewhere:6379"}]),
     f"{W}.containers[0].env[0].name", True),
    ("env-name-invalid", worker_container(env=[{"name": "A=B", "value": "x"}]),
     f"{W}.containers[0].env[0].name", True),
    ("env-value-nul", worker_container(env=[{"name": "A", "value": "a\u0000b"}]),
     f"{W}.containers[0].env[0].value", True),
    ("env-value-and-value-from", worker_container(env=[{"name": "A", "value": "x", "valueFrom": {
        "secretKeyRef": {"name": "s", "key": "k"}}}]), f"{W}.containers[0].env[0].value", True),
    ("env-twice", worker_container(env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
     f"{W}.containers[0].env", True),
    ("env-from-reserved-prefix", worker_container(envFrom=[{"prefix": "EMBEDJOB_", "secretRef": {"name": "s"}}]),
     f"{W}.containers[0].envFrom[0].prefix", True),
    ("env-from-two-sources", worker_container(envFrom=[{"secretRef": {"name": "s"}, "configMapRef": {"name": "c"}}]),
     f"{W}.containers[0].envFrom[0].secretRef", True),
    ("head-quantity-malformed", head_container(resources={"requests": {"memory": "8 gigs"}}),
     f"{H}.containers[0].resources.requests", True),
    ("head-request-above-limit", head_container(resources={"requests": {"memory": "8Gi"},
                                                           "limits": {"memory": "4Gi"}}),
     f"{H}.containers[0].resources.requests", True),
    ("head-resource-name-invalid", head_container(resources={"limits": {"Bad Name": "1"}}),
     f"{H}.containers[0].resources.requests", True),
    ("worker-resources", worker_container(resources={"limits": {"cpu": "2"}}), "resources", True),
    ("container-not-ray", worker_container(name="sidecar"), f"{W}.containers[0].name", True),
    ("label-key-invalid", {"workers": {"template": {"metadata": {"labels": {"bad key": "x"}}}}},
     "spec.workers.template.metadata.labels", True),
    ("label-reserved", {"workers": {"template": {"metadata": {"labels": {"ray.io/node-type": "head"}}}}},
     "spec.workers.template.metadata.labels", True),
    ("label-value-invalid", {"head": {"template": {"metadata": {"labels": {"team": "a b"}}}}},
     "spec.head.template.metadata.labels", True),
    ("annotation-value-nul", {"head": {"template": {"metadata": {"annotations": {"a": "x\u0000"}}}}},
     "spec.head.template.metadata.annotations", True),
    ("node-selector-key-invalid", workers({"nodeSelector": {"-pool": "gpu"}}), f"{W}.nodeSelector", True),
    ("volume-two-sources", workers({"volumes": [{"name": "v", "emptyDir": {}, "secret": {"secretName": "s"}}]}),
     f"{W}.volumes[0].emptyDir", True),
    ("volume-no-source", workers({"volumes": [{"name": "v"}]}), f"{W}.volumes[0].emptyDir", True),
    ("volume-kuberays", workers({"volumes": [{"name": "shared-mem", "emptyDir": {}}]}), f"{W}.volumes[0].name", True),
    ("volume-name-not-dns", workers({"volumes": [{"name": "Model_Cache", "emptyDir": {}}]}),
     f"{W}.volumes[0].name", True),
    ("volume-twice", workers({"volumes": [{"name": "v", "emptyDir": {}}, {"name": "v", "emptyDir": {}}]}),
     f"{W}.volumes", True),
    ("service-account-not-dns", {"head": {"template": {"spec": {"serviceAccountName": "Bad_SA"}}}},
     f"{H}.serviceAccountName", True),
    ("pull-secret-not-dns", workers({"imagePullSecrets": [{"name": "reg cred"}]}), f"{W}.imagePullSecrets[0].name",
     True),
    ("priority-class-not-dns", workers({"priorityClassName": "Batch Low"}), f"{W}.priorityClassName", True),
    ("grace-negative", workers({"terminationGracePeriodSeconds": -1}), f"{W}.terminationGracePeriodSeconds", True),
    ("grace-over-a-day", {"head": {"template": {"spec": {"terminationGracePeriodSeconds": 86_401}}}},
     f"{H}.terminationGracePeriodSeconds", True),
    ("grace-not-a-number", workers({"terminationGracePeriodSeconds": "30s"}), f"{W}.terminationGracePeriodSeconds",
     True),
    ("affinity-in-without-values", workers({"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In"}]}]}}}}),
     f"{W}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].values", True),
    ("seccomp-localhost-without-profile", workers({"securityContext": {"seccompProfile": {"type": "Localhost"}}}),
     f"{W}.securityContext.seccompProfile.localhostProfile", True),
    ("run-as-user-negative", workers({"securityContext": {"runAsUser": -1}}), f"{W}.securityContext.runAsUser",
     True),
    ("pod-settings-with-cluster-selector", {"clusterSelector": {"ray.io/cluster": "shared"},
                                           **workers({"nodeSelector": {"pool": "gpu"}})},
     "spec.clusterSelector", False),
]
