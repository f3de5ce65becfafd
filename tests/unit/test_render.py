"""`embedjob render`: the operator's own RayJob for a manifest, and the review's refusals, offline."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import yaml

from controller.rayjob import build_rayjob, rayjob_name
from controller.settings import Settings
from embedjob import api
from embedjob.contract import ExitCode
from embedjob.crd import spec_as_stored
from embedjob.manifest import load_manifest
from embedjob_cli.render import PLACEHOLDER_UID, RenderRefused, render, settings_of
from support.cli import EMBEDJOB, run
from support.paths import REPO

CLUSTER_EXAMPLE = REPO / "examples" / "quickstart-cluster.yaml"
LOCAL_EXAMPLE = REPO / "examples" / "quickstart.yaml"
UID = "6f1c1f38-2a4e-4c55-9d7e-0c1f5b7d9a11"


def test_render_is_the_operators_builder_on_the_applied_job():
    manifest = load_manifest(CLUSTER_EXAMPLE)
    settings = Settings.from_env({})
    rendered = render(manifest, settings, UID)
    applied = {**manifest, "metadata": {**manifest["metadata"], "uid": UID, "namespace": "default"},
               "spec": spec_as_stored(manifest["spec"])}
    assert rendered == build_rayjob(applied, api.parse_spec(manifest["spec"]), settings)
    assert rendered["metadata"]["name"] == rayjob_name(manifest["metadata"]["name"], UID)
    assert rendered["metadata"]["ownerReferences"][0]["uid"] == UID


def test_render_without_a_uid_uses_the_placeholder_and_the_manifests_namespace():
    manifest = load_manifest(CLUSTER_EXAMPLE)
    manifest["metadata"]["namespace"] = "team-a"
    rendered = render(manifest, Settings.from_env({}))
    assert rendered["metadata"]["namespace"] == "team-a"
    assert rendered["metadata"]["ownerReferences"][0]["uid"] == PLACEHOLDER_UID
    assert render(manifest, Settings.from_env({}), namespace="team-b")["metadata"]["namespace"] == "team-b"


def test_the_spec_is_rendered_as_stored_with_the_schemas_defaults():
    stored = spec_as_stored({"source": {"uri": "/x.jsonl"}, "model": {"name": "m", "package": "p"},
                             "sink": {"databaseSecretRef": {"name": "db"}, "collection": "c"},
                             "workers": {"replicas": 2}})
    assert stored["retry"] == {"attemptsPerBatch": 3, "backoffLimit": 0, "failedBatchesTolerated": 0}
    assert stored["workers"] == {"replicas": 2, "cpusPerActor": 1, "gpusPerActor": 0}
    assert stored["source"]["format"] == "jsonl" and stored["suspend"] is False
    assert "clusterSelector" not in stored  # no default: stays absent


@pytest.mark.parametrize("edit, reason, field", [
    (lambda spec: spec["source"].update(uri="pep-sample.jsonl"), "RelativeSourcePath", "spec.source.uri"),
    (lambda spec: spec["source"].update(uri="ftp://host/x.jsonl"), "UnsupportedSource", "spec.source.uri"),
    (lambda spec: spec["workers"].update(replicas=0), "InvalidSpec", "workers.replicas"),
    (lambda spec: spec.update(model={"name": "org/model", "revision": "main"}), "ModelNotPinned",
     "spec.model.revision"),
])
def test_render_refuses_what_the_operators_review_refuses(edit, reason, field):
    manifest = load_manifest(CLUSTER_EXAMPLE)
    edit(manifest["spec"])
    with pytest.raises(RenderRefused) as refused:
        render(manifest, Settings.from_env({}))
    assert refused.value.verdict.reason == reason and field in refused.value.verdict.message


def test_the_command_prints_yaml_with_the_settings_and_refuses_in_one_line(tmp_path):
    env = {"EMBEDJOB_RAY_VERSION": "2.60.0"}
    ok = run([*EMBEDJOB, "render", str(CLUSTER_EXAMPLE), "--uid", UID, "--worker-image", "registry.example/w:1"],
             env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    rayjob = yaml.safe_load(ok.stdout)
    assert rayjob["kind"] == "RayJob" and rayjob["metadata"]["ownerReferences"][0]["uid"] == UID
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"] == "registry.example/w:1"
    manifest = load_manifest(CLUSTER_EXAMPLE)
    settings = dataclasses.replace(Settings.from_env({}), worker_image="registry.example/w:1")
    assert rayjob == render(manifest, settings, UID)

    refused = run([*EMBEDJOB, "render", str(LOCAL_EXAMPLE)], timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "RelativeSourcePath: spec.source.uri" in refused.stderr

    bad_setting = run([*EMBEDJOB, "render", str(CLUSTER_EXAMPLE)], env={"EMBEDJOB_LOG_FORMAT": "xml"}, timeout=120)
    assert bad_setting.returncode == 2 and "EMBEDJOB_LOG_FORMAT='xml'" in bad_setting.stderr

    missing = run([*EMBEDJOB, "render", str(tmp_path / "nope.yaml")], timeout=120)
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr and "Traceback" not in missing.stderr


HOST_PATH_WORKERS = {"template": {"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}}}


def test_render_refuses_what_the_pod_policy_refuses_and_a_policy_file_opens_it(tmp_path):
    manifest = load_manifest(CLUSTER_EXAMPLE)
    manifest["spec"]["workers"].update(HOST_PATH_WORKERS)
    with pytest.raises(RenderRefused) as refused:
        render(manifest, Settings.from_env({}))
    assert refused.value.verdict.reason == "PodPolicyViolation"
    assert "spec.workers.template.spec.volumes[root].hostPath" in refused.value.verdict.message
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"allowedImagePrefixes": "registry.example/w", "allowHostPath": "true"}))
    worker_image = ["--worker-image", "registry.example/w:1"]
    env = {"EMBEDJOB_RAY_VERSION": "2.60.0"}
    refused_by_default = run([*EMBEDJOB, "render", str(path), *worker_image], env=env, timeout=120)
    assert refused_by_default.returncode == ExitCode.INVALID_CONFIG
    assert "the operator would refuse" in refused_by_default.stderr and "PodPolicyViolation" in refused_by_default.stderr
    opened = run([*EMBEDJOB, "render", str(path), *worker_image, "--pod-policy", str(policy)], env=env, timeout=120)
    assert opened.returncode == 0, opened.stderr
    assert yaml.safe_load(opened.stdout)["kind"] == "RayJob"


def test_the_worker_image_flag_is_what_the_default_pod_policy_allows():
    """The restrictive default policy allows the worker image's repository: the one the flag names, not the
    environment's that the flag replaces."""
    manifest = load_manifest(CLUSTER_EXAMPLE)
    manifest["spec"]["workers"]["image"] = "registry.example/w:2"
    args = argparse.Namespace(worker_image="registry.example/w:1", ray_version=None, pod_defaults=None,
                              pod_policy=None)
    settings = settings_of(args, {"EMBEDJOB_WORKER_IMAGE": "other.example/worker:1"})
    assert settings.worker_image == "registry.example/w:1"
    render(manifest, settings)  # the flag's repository, another tag: allowed
    manifest["spec"]["workers"]["image"] = "other.example/worker:1"
    with pytest.raises(RenderRefused) as refused:
        render(manifest, settings)
    assert refused.value.verdict.reason == "PodPolicyViolation" and "spec.workers.image" in refused.value.verdict.message
