"""The real path from the real images, nothing from this checkout in a pod: the operator from its controller image,
installed by the chart (a Deployment, in-cluster credentials of the chart's ServiceAccount), and KubeRay's head,
worker and submitter pods from the worker image with the model baked in, every container run by the test node with
runc from its image, so `ray start`, `ray job submit` and `python -m embedjob_worker.driver` are the image's own.
The job reaches Complete and the vectors equal a direct encode here with the same model files.

The model: the worker image built with MODEL_PACKAGE would be another ~15-minute build, so the pods run the
`worker-model` image, model.Containerfile FROM the cached worker image (what MODEL_PACKAGE adds: the package,
the hub switched off; seconds to build). The input reaches the head as a ConfigMap volume (`spec.head.template`),
since no path of this machine is in an image.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from embedjob import api
from envtest.images.build import Image
from plugins.harness_images import worker_image_timeout
from support.chart import RELEASE, helm, values_args
from support.kubectl import apply_job, condition, create_database_secret
from support.paths import CHART, SAMPLE
from support.project import pinned_ray_version
from support.real_path import MODEL, PodWatcher, diagnostics, wait_complete
from support.sql import query
from embedjob_worker.encode.model import load_model, resolve_model

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
RECORDS = 40
INPUT_DIR = "/mnt/input"  # under an existing directory of the image: the mount point is made there


def repository_and_tag(image: Image) -> dict:
    repository, tag = image.reference.rsplit(":", 1)
    return {"repository": repository, "tag": tag}


class OperatorPod:
    """The chart's operator pod as `diagnostics` reads an operator: its log, from the test node."""

    def __init__(self, real_node, namespace: str):
        self.real_node, self.namespace = real_node, namespace

    def log(self) -> str:
        pods = [p for p in self.real_node.pods_run(self.namespace) if p.startswith(RELEASE)]
        return "\n".join(self.real_node.container_log(self.namespace, p, "operator") for p in pods) or "(no pod)"


@worker_image_timeout
def test_job_runs_to_complete_from_the_controller_and_worker_images(
        model_image, controller_image, kube, real_node, kuberay_operator, namespace, pod_database_url):
    # model_image first: without a cached worker image the test skips before the control plane starts
    create_database_secret(kube, namespace, pod_database_url)
    values = {"watchNamespaces": [namespace], "image": {**repository_and_tag(controller_image), "pullPolicy": "Never"},
              "worker": {"image": repository_and_tag(model_image), "rayVersion": pinned_ray_version()},
              "database": {"secretName": "embedjob-db"}, "progressIntervalSeconds": 1, "logFormat": "plain",
              "releaseJobsOnUninstall": False}  # the test deletes its job first
    rows = SAMPLE.read_text().splitlines()[:RECORDS]
    kube.kubectl("create", "configmap", "corpus", "-n", namespace, "--from-file=pep.jsonl=/dev/stdin",
                 input="\n".join(rows) + "\n")
    head = {"spec": {"volumes": [{"name": "corpus", "configMap": {"name": "corpus"}}],
                     "containers": [{"name": "ray-head", "volumeMounts": [
                         {"name": "corpus", "mountPath": INPUT_DIR, "readOnly": True}]}]}}
    operator = OperatorPod(real_node, namespace)
    started = time.monotonic()
    helm("install", RELEASE, str(CHART), "--namespace", namespace, *values_args(values), kubeconfig=kube.kubeconfig)
    try:
        rollout = kube.kubectl("rollout", "status", f"deployment/{RELEASE}", "-n", namespace, "--timeout=300s",
                               check=False, timeout=320)
        assert rollout.returncode == 0, (rollout.stderr, operator.log()[-3000:], real_node.log_tail(30))
        rolled_out = time.monotonic() - started
        with PodWatcher(kube, namespace) as watcher:
            apply_job(kube, namespace, "imaged", source={"uri": f"{INPUT_DIR}/pep.jsonl"}, model=MODEL,
                      batching={"batchSize": 16}, ttlSecondsAfterFinished=0, head={"template": head})
            job = wait_complete(kube, namespace, "imaged", lambda: diagnostics(kube, namespace, real_node,
                                                                                 kuberay_operator, operator, watcher))
            time.sleep(1.5)
        print(f"\nfrom the images: operator rolled out {rolled_out:.0f}s after helm install, job Complete after "
              f"{time.monotonic() - started:.0f}s; pods:\n{watcher.summary()}")
        operator_log = operator.log()
    finally:
        # the operator from the image takes its finalizer off as it deletes the job; then the chart goes
        kube.kubectl("delete", "ej", "imaged", "-n", namespace, "--ignore-not-found", "--timeout=180s",
                     check=False, timeout=200)
        helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout=120s", check=False,
             kubeconfig=kube.kubeconfig)

    status = job["status"]
    assert status["state"] == "Complete" and status["reason"] == "Succeeded", status
    assert status["progress"]["recordsEmbedded"] == RECORDS and status["progress"]["recordsFailed"] == 0
    assert condition(job, "Failed")["status"] == "False"
    assert "Traceback" not in operator_log, operator_log[-3000:]

    # every pod of the job ran from the worker image with the model, the operator's from the controller image
    heads, workers, submitters = watcher.of_kind("head"), watcher.of_kind("worker"), watcher.submitters()
    assert len(heads) == 1 and len(workers) == 1 and len(submitters) == 1, watcher.summary()
    for pod in [*heads, *workers, *submitters]:
        images = {c["image"] for c in watcher.pods[pod]["spec"]["containers"]}
        assert images == {model_image.reference}, (pod, images)
    assert "Running" in watcher.phases[heads[0]] and watcher.phases[submitters[0]][-1] == "Succeeded", \
        watcher.summary()
    [operator_pod] = [p for p in watcher.pods if p.startswith(RELEASE)]
    assert [c["image"] for c in watcher.pods[operator_pod]["spec"]["containers"]] == [controller_image.reference]

    # the vectors the image's driver and actors wrote are those of the same model files here
    written = query(pod_database_url, "SELECT record_id, text, revision, embedding::text AS embedding FROM embeddings")
    ids = sorted(json.loads(row)["id"] for row in rows)
    assert sorted(r.record_id for r in written) == ids  # one row per record, no duplicates
    resolved = resolve_model(api.Model.model_validate(MODEL))
    assert {r.revision for r in written} == {resolved.revision}  # the image's model files hash as these do
    reference = load_model(resolved, device="cpu").encode([r.text for r in written], normalize_embeddings=True,
                                                         convert_to_numpy=True)
    np.testing.assert_allclose(np.array([json.loads(r.embedding) for r in written]), reference, atol=1e-5)
