"""Every cluster example renders into the RayJob the operator would create (the local ones, with a source path relative
to the manifest, run with `embedjob run` in the integration tier)."""

import json

import pytest
import yaml

from controller.settings import Settings
from embedjob.contract import decode_job_config
from embedjob.manifest import check_envelope, load_manifest
from embedjob_cli.render import render
from support.paths import REPO

def embedding_jobs(path) -> list[dict]:
    """The EmbeddingJobs of an example file (some hold other objects beside, e.g. Kueue's queues)."""
    return [check_envelope(doc) for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] == "EmbeddingJob"]


def for_a_cluster(path) -> bool:
    uri = embedding_jobs(path)[0]["spec"]["source"].get("uri") or "/"
    return uri.startswith("/") or "://" in uri


CLUSTER_EXAMPLES = [p for p in sorted((REPO / "examples").glob("*.yaml")) if for_a_cluster(p)]
# What the examples' ServiceAccounts and images need the chart's podPolicy to allow.
POLICY = {"allowedServiceAccounts": "embedjob-s3-reader,embedjob-gcs-reader", "allowedImagePrefixes": "registry.example.com/ml/"}


def test_the_cloud_examples_are_among_them():
    assert {"s3-irsa.yaml", "s3-dataset-and-model.yaml", "gcs-workload-identity.yaml",
            "gpu-node-pool.yaml"} <= {p.name for p in CLUSTER_EXAMPLES}


@pytest.mark.parametrize("example", CLUSTER_EXAMPLES, ids=lambda p: p.name)
def test_each_cluster_example_renders_a_rayjob(example):
    settings = Settings.from_env({"EMBEDJOB_POD_POLICY": json.dumps(POLICY)})
    for job in embedding_jobs(example):
        rayjob = render(job, settings)
        assert rayjob["kind"] == "RayJob" and rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]


def test_the_storage_example_keeps_its_model_uri_and_dataset_in_the_entrypoint():
    rayjob = render(load_manifest(REPO / "examples" / "s3-dataset-and-model.yaml"),
                    Settings.from_env({"EMBEDJOB_POD_POLICY": json.dumps(POLICY)}))
    workers = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert workers["serviceAccountName"] == "embedjob-s3-reader"
    assert {"name": "model-cache", "mountPath": "/tmp/embedjob-models"} in workers["containers"][0]["volumeMounts"]
    encoded = rayjob["spec"]["entrypoint"].split("--config-b64", 1)[1].split()[0]
    spec = decode_job_config(encoded)["spec"]
    assert spec["source"]["uri"] == "s3://my-corpus/paragraphs/2026/"
    assert (spec["model"]["uri"], spec["model"]["revision"]) == ("s3://my-models/e5-small/", "7e54b3bcd8c7bda9")


def test_a_scheduled_example_renders_its_next_runs_rayjob():
    rayjob = render(load_manifest(REPO / "examples" / "scheduled-sync.yaml"), Settings.from_env({}))
    job_name = rayjob["metadata"]["labels"]["embedjob.dev/job-name"]
    assert job_name.startswith("scheduled-sync-") and job_name.rsplit("-", 1)[1].isdigit()
    encoded = rayjob["spec"]["entrypoint"].split("--config-b64", 1)[1].split()[0]
    assert "schedule" not in decode_job_config(encoded)["spec"]  # a run's spec
