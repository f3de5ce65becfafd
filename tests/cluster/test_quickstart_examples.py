"""The quickstart manifests as install.md applies them, with the operator (a process, as its ServiceAccount) on
the real API server: the local example's relative source is refused for a cluster with a reason that says what
to write instead, and the cluster example (the sample in the worker image) gets its RayJob, the one
`embedjob render` prints for it."""

from __future__ import annotations

import base64
import json
import shlex

import pytest
import yaml

from controller.acceptance import SAMPLE_IN_WORKER_IMAGE
from embedjob.contract import CONFIG_FLAG
from support.cli import EMBEDJOB, run
from support.kubectl import (condition, create_database_secret, get_json, rayjobs, wait_for_condition,
                             wait_for_rayjobs)
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
    [rayjob] = wait_for_rayjobs(kube, namespace)
    entrypoint = shlex.split(rayjob["spec"]["entrypoint"])
    config = json.loads(base64.b64decode(entrypoint[entrypoint.index(CONFIG_FLAG) + 1]))
    assert config["spec"]["source"]["uri"] == SAMPLE_IN_WORKER_IMAGE

    # `embedjob render` with the operator's settings and the applied job's uid prints that RayJob
    uid = get_json(kube, "ej", "quickstart", "-n", namespace)["metadata"]["uid"]
    rendered = run([*EMBEDJOB, "render", str(REPO / "examples" / "quickstart-cluster.yaml"), "--uid", uid,
                    "-n", namespace, "--worker-image", "embedjob-worker:test"], timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    rendered = yaml.safe_load(rendered.stdout)
    assert rendered["metadata"]["name"] == rayjob["metadata"]["name"]
    assert_within(rendered["metadata"], rayjob["metadata"])
    assert_within(rendered["spec"], rayjob["spec"])


def assert_within(ours, stored, path="") -> None:
    """Every value we wrote is what the API server stored (which adds KubeRay's defaults). A
    running KubeRay operator rewrites the RayJob from its Go types, whose `omitempty` drops zero
    values (`suspend: false`), so a missing key stands for a zero value."""
    if isinstance(ours, dict):
        for key, value in ours.items():
            if key not in stored and value in (False, 0, "", [], {}, None):
                continue
            assert key in stored, f"{path}.{key} missing from the stored RayJob"
            assert_within(value, stored[key], f"{path}.{key}")
    elif isinstance(ours, list):
        assert len(ours) == len(stored), path
        for i, (a, b) in enumerate(zip(ours, stored)):
            assert_within(a, b, f"{path}[{i}]")
    else:
        assert ours == stored, f"{path}: rendered {ours!r}, stored {stored!r}"
