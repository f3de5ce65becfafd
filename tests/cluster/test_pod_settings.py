"""Pod settings on the real API server (what `kubectl apply` refuses is in test_crd_validation.py): the settings and
the examples as the server takes them, and, with the operator and the real KubeRay operator, the head and worker Pods KubeRay creates from
the RayJob carry the placement, identity, volumes and env (the Pods need not run: no node runs them here)."""

from __future__ import annotations

import pytest

from support.kubectl import apply_job, create_database_secret, get_json, wait_for_rayjobs
from support.paths import REPO
from support.pod_settings import (AFFINITY, EVERY_POD_SETTING, HEAD_TEMPLATE, POLICY_ALLOWING_SERVICE_ACCOUNT,
                                  PRIORITY_CLASS, SERVICE_ACCOUNT, WORKER_TEMPLATE)
from support.polling import wait_until

pytestmark = pytest.mark.k8s

DB_URL = "postgresql://writer:not-a-real-password@db.example:5432/embed"
EXAMPLES = ["gpu-node-pool.yaml", "s3-irsa.yaml", "private-registry.yaml"]
CLUSTER_LABEL, NODE_TYPE_LABEL = "ray.io/cluster", "ray.io/node-type"


def test_every_pod_setting_is_stored_as_written(kube, namespace):
    spec = apply_job(kube, namespace, "placed", **EVERY_POD_SETTING)["spec"]
    assert spec["head"] == {"template": HEAD_TEMPLATE}
    assert spec["workers"]["template"] == WORKER_TEMPLATE  # no defaults added to optional parts
    plain = apply_job(kube, namespace, "plain")["spec"]
    assert "head" not in plain and "template" not in plain["workers"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_examples_pass_the_servers_validation(kube, namespace, example):
    res = kube.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(REPO / "examples" / example))
    assert "created (server dry run)" in res.stdout, res.stdout + res.stderr


def ray_pods(kube, namespace: str, cluster: str) -> dict[str, dict] | None:
    pods = get_json(kube, "pods", "-n", namespace, "-l", f"{CLUSTER_LABEL}={cluster}")["items"]
    by_type = {pod["metadata"]["labels"][NODE_TYPE_LABEL]: pod for pod in pods}
    return by_type if {"head", "worker"} <= set(by_type) else None


def within(given, stored) -> bool:
    """`given` is in `stored`, which may add defaults (a volume's defaultMode, ...) to any object in it."""
    if isinstance(given, dict):
        return isinstance(stored, dict) and all(k in stored and within(v, stored[k]) for k, v in given.items())
    if isinstance(given, list):
        return isinstance(stored, list) and len(given) == len(stored) and all(map(within, given, stored))
    return given == stored


def assert_carries(pod: dict, template: dict) -> None:
    """The Pod has every setting of `template` (KubeRay and admission add their own besides)."""
    meta, spec, given = pod["metadata"], pod["spec"], template["spec"]
    assert meta["labels"]["team"] == "search" and meta["labels"]["embedjob.dev/job-name"] == "placed"
    assert template["metadata"]["annotations"].items() <= meta["annotations"].items()
    assert spec["nodeSelector"] == given["nodeSelector"]
    assert all(t in spec["tolerations"] for t in given["tolerations"]), spec["tolerations"]
    assert spec["affinity"] == AFFINITY
    assert spec["serviceAccountName"] == SERVICE_ACCOUNT and spec["priorityClassName"] == PRIORITY_CLASS
    assert spec["imagePullSecrets"] == given["imagePullSecrets"]
    assert spec["terminationGracePeriodSeconds"] == given["terminationGracePeriodSeconds"]
    assert within(given["securityContext"], spec["securityContext"])
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert all(within(volume, volumes.get(volume["name"])) for volume in given["volumes"]), spec["volumes"]
    (wanted,) = given["containers"]
    container = spec["containers"][0]  # KubeRay runs Ray in the first container
    env = {e["name"]: e for e in container["env"]}
    assert env["EMBEDJOB_DATABASE_URL"]["valueFrom"] == {"secretKeyRef": {"name": "embedjob-db", "key": "url"}}
    assert all(within(e, env[e["name"]]) for e in wanted["env"]), container["env"]
    assert container["envFrom"] == wanted["envFrom"]
    assert all(m in container["volumeMounts"] for m in wanted["volumeMounts"])
    assert within(wanted["securityContext"], container["securityContext"])


def test_kuberays_pods_carry_the_pod_settings(kube, namespace, kuberay_operator, start_operator):
    kube.kubectl("create", "serviceaccount", SERVICE_ACCOUNT, "-n", namespace)
    kube.kubectl("apply", "-f", "-", input=f"""{{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                 "metadata": {{"name": "{PRIORITY_CLASS}"}}, "value": 100}}""")
    create_database_secret(kube, namespace, DB_URL)
    start_operator(kube, namespace, EMBEDJOB_POD_POLICY=POLICY_ALLOWING_SERVICE_ACCOUNT)
    apply_job(kube, namespace, "placed", **EVERY_POD_SETTING)

    rayjob = wait_for_rayjobs(kube, namespace, timeout=60)[0]
    submitter = rayjob["spec"]["submitterPodTemplate"]["spec"]  # KubeRay took it as written
    assert submitter["serviceAccountName"] == SERVICE_ACCOUNT
    assert submitter["imagePullSecrets"] == HEAD_TEMPLATE["spec"]["imagePullSecrets"]

    def cluster_name():
        status = get_json(kube, "rayjob", rayjob["metadata"]["name"], "-n", namespace).get("status", {})
        assert status.get("jobDeploymentStatus") != "ValidationFailed", status
        return status.get("rayClusterName")

    cluster = wait_until("KubeRay to create the RayCluster", cluster_name, timeout=90)
    pods = wait_until("KubeRay to create the head and worker Pods", lambda: ray_pods(kube, namespace, cluster),
                      timeout=120)
    assert_carries(pods["head"], HEAD_TEMPLATE)
    assert_carries(pods["worker"], WORKER_TEMPLATE)
    head_container = pods["head"]["spec"]["containers"][0]
    assert head_container["resources"] == HEAD_TEMPLATE["spec"]["containers"][0]["resources"]
    assert pods["worker"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1"  # from cpusPerActor
    assert "not-a-real-password" not in kube.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout
