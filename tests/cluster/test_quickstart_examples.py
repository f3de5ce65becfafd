"""The quickstart manifests as install.md applies them, with the operator (a process, as its ServiceAccount) on
the real API server: the local example's relative source is refused for a cluster with a reason that says what
to write instead, and the cluster example (the sample in the worker image) gets its RayJob."""

from __future__ import annotations

import base64
import json
import shlex

import pytest

from controller.acceptance import SAMPLE_IN_WORKER_IMAGE
from embedjob.contract import CONFIG_FLAG
from support.kubectl import condition, create_database_secret, rayjobs, wait_for_condition
from support.paths import REPO

pytestmark = pytest.mark.k8s

DB_URL = "postgresql://writer:not-a-real-password@db.example:5432/embed"


def test_the_local_quickstart_is_refused_on_a_cluster_and_the_cluster_one_runs_the_image_sample(
        kube, namespace, start_operator):
    start_operator(kube, namespace, EMBEDJOB_RETRY_DELAY_SECONDS="2")
    create_database_secret(kube, namespace, DB_URL)

    kube.kubectl("apply", "-n", namespace, "-f", str(REPO / "examples" / "quickstart.yaml"))
    refused = condition(wait_for_condition(kube, namespace, "quickstart", "Accepted", "False"), "Accepted")
    assert refused["reason"] == "RelativeSourcePath", refused
    assert "'pep-sample.jsonl' is a relative path" in refused["message"] and SAMPLE_IN_WORKER_IMAGE in refused["message"]
    assert rayjobs(kube, namespace) == []  # no RayJob whose driver could only fail

    # the cluster example is the same job (same name): not accepted yet, so its spec may still change
    kube.kubectl("apply", "-n", namespace, "-f", str(REPO / "examples" / "quickstart-cluster.yaml"))
    wait_for_condition(kube, namespace, "quickstart", "Accepted", "True", timeout=90)
    [rayjob] = rayjobs(kube, namespace)
    entrypoint = shlex.split(rayjob["spec"]["entrypoint"])
    config = json.loads(base64.b64decode(entrypoint[entrypoint.index(CONFIG_FLAG) + 1]))
    assert config["spec"]["source"]["uri"] == SAMPLE_IN_WORKER_IMAGE
