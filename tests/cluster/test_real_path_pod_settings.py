"""Pod settings through the real path: KubeRay's pods, scheduled by the real kube-scheduler onto the test node and
run by it, get the job's placement, identity, volumes and env, and the driver reads its input from a ConfigMap
mounted into the head by `spec.head.template` (a source on a volume, as docs/pod-settings.md describes)."""

from __future__ import annotations

import json
import time

import pytest

from envtest.realnode import NODE_NAME
from support.kubectl import apply_job, rayjobs
from support.polling import wait_until
from support.real_path import MODEL, PodWatcher, diagnostics, wait_complete
from support.real_path import pod_visible_dir, real_path  # noqa: F401 - fixtures
from support.paths import REPO
from support.pod_settings import SERVICE_ACCOUNT
from support.sql import vectors

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
RECORDS = 40


def placement(container: str, **container_fields) -> dict:
    return {"metadata": {"labels": {"team": "search"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
                     "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "embedding",
                                      "effect": "NoSchedule"}],
                     "serviceAccountName": SERVICE_ACCOUNT,
                     "containers": [{"name": container, **container_fields}]}}


def test_the_pods_run_with_the_pod_settings_and_the_driver_reads_a_mounted_input(
        real_path, real_node, kuberay_operator, pod_database_url):
    kube, namespace, operator = real_path
    rows = (REPO / "examples" / "pep-sample.jsonl").read_text().splitlines()[:RECORDS]
    ids = [json.loads(row)["id"] for row in rows]
    kube.kubectl("create", "serviceaccount", SERVICE_ACCOUNT, "-n", namespace)
    kube.kubectl("create", "configmap", "corpus", "-n", namespace, "--from-file=pep.jsonl=/dev/stdin",
                 input="\n".join(rows) + "\n")
    kube.kubectl("create", "configmap", "tuning", "-n", namespace, "--from-literal=EMBED_TEAM=search")
    # below /mnt: the test node makes a mount point only under an existing directory other than /
    head = placement("ray-head", envFrom=[{"configMapRef": {"name": "tuning"}}],
                     volumeMounts=[{"name": "corpus", "mountPath": "/mnt/input", "readOnly": True}])
    head["spec"]["volumes"] = [{"name": "corpus", "configMap": {"name": "corpus"}}]
    workers = placement("ray-worker", env=[{"name": "EMBED_ROLE", "value": "worker"}])

    with PodWatcher(kube, namespace) as watcher:
        apply_job(kube, namespace, "placed", source={"uri": "/mnt/input/pep.jsonl"}, model=MODEL,
                  batching={"batchSize": 16}, ttlSecondsAfterFinished=0,
                  head={"template": head}, workers={"template": workers})
        job = wait_complete(kube, namespace, "placed", lambda: diagnostics(kube, namespace, real_node,
                                                                               kuberay_operator, operator, watcher))
        time.sleep(1.5)

    assert job["status"]["state"] == "Complete", job["status"]
    assert sorted(r[0] for r in vectors(pod_database_url)) == sorted(ids)
    # ttlSecondsAfterFinished 0 as the RayJob carries it: KubeRay removes the cluster at once
    [rayjob] = rayjobs(kube, namespace)
    assert rayjob["spec"]["ttlSecondsAfterFinished"] == 0 and rayjob["spec"]["shutdownAfterJobFinishes"] is True
    cluster = job["status"]["rayClusterName"]
    wait_until("the RayCluster removed (shutdownAfterJobFinishes, ttlSecondsAfterFinished 0)", lambda: kube.kubectl(
        "get", "raycluster", cluster, "-n", namespace, check=False).returncode != 0, timeout=120)
    heads, workers_, submitters = watcher.of_kind("head"), watcher.of_kind("worker"), watcher.submitters()
    assert len(heads) == 1 and len(workers_) == 1 and len(submitters) == 1, watcher.summary()
    for name in [*heads, *workers_, *submitters]:  # the submitter gets the head's placement and identity
        pod = watcher.pods[name]
        assert pod["spec"]["nodeName"] == NODE_NAME and pod["spec"]["serviceAccountName"] == SERVICE_ACCOUNT, name
        assert {"key": "dedicated", "operator": "Equal", "value": "embedding",
                "effect": "NoSchedule"} in pod["spec"]["tolerations"], name
        assert pod["metadata"]["labels"]["team"] == "search", name
    head_pod = watcher.pods[heads[0]]["spec"]
    assert {"name": "corpus", "mountPath": "/mnt/input", "readOnly": True} in head_pod["containers"][0]["volumeMounts"]
    assert head_pod["containers"][0]["envFrom"] == [{"configMapRef": {"name": "tuning"}}]
    worker_env = {e["name"]: e for e in watcher.pods[workers_[0]]["spec"]["containers"][0]["env"]}
    assert worker_env["EMBED_ROLE"]["value"] == "worker" and "EMBEDJOB_DATABASE_URL" in worker_env
