"""The RayJob manifest builder (pure; no cluster)."""

from __future__ import annotations

import json
import re

import pytest

from controller.rayjob import (
    GPU_RESOURCE,
    MAX_RAYJOB_NAME,
    build_rayjob,
    owned_by,
    rayjob_name,
    worker_layout,
)
from controller.settings import Settings
from embedjob import api, contract
from embedjob.contract import decode_job_config
from support.manifests import MINIMAL_SPEC, merged

SETTINGS = Settings.from_env({"EMBEDJOB_WORKER_IMAGE": "registry.example/worker:1", "EMBEDJOB_RAY_VERSION": "2.60.0"})
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def job(name: str = "pep", uid: str = "0b5c6d3e-1111-2222-3333-444455556666", **spec) -> dict:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name, "namespace": "team-a", "uid": uid, "annotations": {"note": "not copied"}},
        "spec": merged(MINIMAL_SPEC, spec),
        "status": {"state": "Pending"},
    }


def rayjob_of(job: dict) -> dict:
    return build_rayjob(job, api.parse_spec(job["spec"]), SETTINGS)


@pytest.mark.parametrize("name", ["pep", "a" * 63, "my.job.v2", "x-" * 31 + "y", "9lives", "UPPER.case"])
def test_rayjob_name_is_a_short_dns_label(name):
    out = rayjob_name(name, "uid-1")
    assert len(out) <= MAX_RAYJOB_NAME and DNS_1035.match(out), out
    assert out == rayjob_name(name, "uid-1")  # deterministic
    assert out != rayjob_name(name, "uid-2")  # a re-created job of the same name gets its own


def test_manifest_ties_back_to_the_job():
    manifest = rayjob_of(job())
    meta = manifest["metadata"]
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayJob"
    assert meta["namespace"] == "team-a" and meta["name"] == rayjob_name("pep", job()["metadata"]["uid"])
    assert meta["labels"] == {
        "embedjob.dev/job-name": "pep",
        "embedjob.dev/job-uid": job()["metadata"]["uid"],
        "app.kubernetes.io/managed-by": "embedjob",
    }
    assert meta["ownerReferences"] == [{
        "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob", "name": "pep",
        "uid": job()["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True,
    }]
    meta = job()["metadata"]
    assert owned_by(manifest, meta)
    assert not owned_by(manifest, {**meta, "uid": "other"})


def test_a_rayjob_of_another_namespace_or_without_a_controller_reference_to_the_job_is_not_its_own():
    """Labels, names and ownerReferences are anyone's to write: a RayJob in another namespace that names
    the job's uid is never the job's (the garbage collector ignores such a reference too)."""
    manifest = rayjob_of(job())
    meta = job()["metadata"]
    foreign = {**manifest, "metadata": {**manifest["metadata"], "namespace": "team-b"}}
    assert not owned_by(foreign, meta)
    reference = manifest["metadata"]["ownerReferences"][0]
    for forged in ({**reference, "controller": False}, {**reference, "kind": "ConfigMap"}):
        assert not owned_by({**manifest, "metadata": {**manifest["metadata"], "ownerReferences": [forged]}}, meta)


def test_entrypoint_runs_the_driver_with_the_job_config_and_no_credentials():
    manifest = rayjob_of(job())
    words = manifest["spec"]["entrypoint"].split()
    assert words[:4] == ["python", "-m", "embedjob_worker.driver", "--config-b64"] and len(words) == 5
    config = decode_job_config(words[4])
    assert config["metadata"] == {"name": "pep", "namespace": "team-a", "uid": job()["metadata"]["uid"]}
    assert config["spec"] == job()["spec"]
    assert "status" not in config and "annotations" not in json.dumps(config)


def test_database_url_comes_only_from_the_secret():
    manifest = rayjob_of(job(sink={"databaseSecretRef": {"name": "pg", "key": "dsn"}}))
    cluster = manifest["spec"]["rayClusterSpec"]
    containers = [cluster["headGroupSpec"]["template"]["spec"]["containers"][0]] + [
        g["template"]["spec"]["containers"][0] for g in cluster["workerGroupSpecs"]
    ]
    for container in containers:
        assert container["env"] == [
            {"name": "EMBEDJOB_DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "pg", "key": "dsn"}}},
            {"name": "EMBEDJOB_SOURCE_DATABASE_URL", "value": ""}, {"name": "EMBEDJOB_FAULT_INJECTION", "value": ""},
            {"name": "EMBEDJOB_DRIVER_METRICS_PORT", "value": "8090"},
        ]
    assert "postgresql://" not in json.dumps(manifest)


def test_an_env_from_without_a_prefix_cannot_set_the_drivers_own_variables():
    """Issue 27 item 9: the kubelet lets `env` win over `envFrom`, so every variable the driver reads is in
    `env`, ours, in each Ray container, whatever Secret or ConfigMap a template brings in without a prefix."""
    from_config_map = {"containers": [{"name": "ray-head", "envFrom": [{"configMapRef": {"name": "everything"}}]}]}
    manifest = rayjob_of(job(head={"template": {"spec": from_config_map}},
                             workers={"template": {"spec": {"containers": [
                                 {"name": "ray-worker", "envFrom": [{"secretRef": {"name": "everything"}}]}]}}}))
    cluster = manifest["spec"]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        (container,) = group["template"]["spec"]["containers"]
        assert container["envFrom"] and "prefix" not in container["envFrom"][0]
        set_in_env = {var["name"]: var.get("value", "from its Secret") for var in container["env"]}
        assert {name: set_in_env.get(name) for name in contract.DRIVER_ENV} == {
            "EMBEDJOB_DATABASE_URL": "from its Secret", "EMBEDJOB_SOURCE_DATABASE_URL": "",
            "EMBEDJOB_FAULT_INJECTION": "", "EMBEDJOB_DRIVER_METRICS_PORT": "8090"}


def test_the_head_names_the_drivers_metrics_port_for_a_pod_monitor():
    cluster = rayjob_of(job())["spec"]["rayClusterSpec"]
    (head,) = cluster["headGroupSpec"]["template"]["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in head["ports"]}
    assert ports["driver-metrics"] == 8090
    # KubeRay's own defaults (utils.getDefaultPorts but serve), which it drops once a port is declared
    assert ports.items() >= {"gcs-server": 6379, "dashboard": 8265, "client": 10001, "metrics": 8080}.items()
    (worker,) = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"]
    assert "ports" not in worker


def test_cluster_spec_defaults():
    spec = rayjob_of(job())["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["suspend"] is False and spec["backoffLimit"] == 0
    assert spec["submissionMode"] == "K8sJobMode"
    assert "clusterSelector" not in spec and "activeDeadlineSeconds" not in spec
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == "2.60.0"
    assert cluster["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0"}
    group = cluster["workerGroupSpecs"][0]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 1
    container = group["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/worker:1"
    assert container["resources"] == {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}


def test_spec_fields_are_mapped():
    spec = rayjob_of(job(
        workers={"replicas": 3, "cpusPerActor": 2, "gpusPerActor": 1, "memory": "6Gi", "image": "mine:2"},
        retry={"backoffLimit": 2}, activeDeadlineSeconds=3600, ttlSecondsAfterFinished=60, suspend=True,
    ))["spec"]
    assert spec["backoffLimit"] == 2 and spec["activeDeadlineSeconds"] == 3600
    assert spec["ttlSecondsAfterFinished"] == 60 and spec["suspend"] is True
    group = spec["rayClusterSpec"]["workerGroupSpecs"][0]
    container = group["template"]["spec"]["containers"][0]
    assert group["replicas"] == 3 and container["image"] == "mine:2"
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "6Gi"},
        "limits": {"cpu": "2", "memory": "6Gi", GPU_RESOURCE: "1"},
    }
    assert spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == "mine:2"


@pytest.mark.parametrize("ttl, kept", [(None, api.DEFAULT_TTL_SECONDS_AFTER_FINISHED), (0, 0), (3600, 3600)])
def test_a_finished_jobs_cluster_is_kept_for_the_ttl_ten_minutes_unless_set(ttl, kept):
    """KubeRay's default (0) would delete the cluster, and the driver's log on its head, at once."""
    assert api.DEFAULT_TTL_SECONDS_AFTER_FINISHED == 600
    spec = rayjob_of(job(ttlSecondsAfterFinished=ttl))["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] == kept


def test_cluster_selector_runs_on_an_existing_cluster():
    spec = rayjob_of(job(clusterSelector={"ray.io/cluster": "shared"}, ttlSecondsAfterFinished=None))["spec"]
    assert spec["clusterSelector"] == {"ray.io/cluster": "shared"}
    assert spec["shutdownAfterJobFinishes"] is False
    assert "rayClusterSpec" not in spec and "ttlSecondsAfterFinished" not in spec


@pytest.mark.parametrize(
    "replicas, gpus, cpus, pods, per_pod, cpu_per_pod, gpu_per_pod",
    [
        (4, 0, 1, 4, 1, 1, 0),  # CPU only: one actor per pod
        (2, 2, 4, 2, 1, 4, 2),  # whole GPUs: one actor per pod
        (4, 0.5, 1, 2, 2, 2, 1),  # two actors share each pod's GPU
        (4, 0.3, 0.5, 2, 3, 1.5, 1),  # three actors per GPU, the last pod partly used
        (1, 0.25, 1, 1, 1, 1, 1),  # never more actors per pod than replicas
    ],
)
def test_worker_layout(replicas, gpus, cpus, pods, per_pod, cpu_per_pod, gpu_per_pod):
    layout = worker_layout(api.Workers(replicas=replicas, gpus_per_actor=gpus, cpus_per_actor=cpus))
    assert (layout.pods, layout.actors_per_pod, layout.cpus_per_pod, layout.gpus_per_pod) == (
        pods, per_pod, cpu_per_pod, gpu_per_pod)
    assert layout.pods * layout.actors_per_pod >= replicas


def test_fractional_cpus_become_millicores():
    container = rayjob_of(job(workers={"cpusPerActor": 0.25, "gpusPerActor": 0.5, "replicas": 2}))[
        "spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["cpu"] == "500m"
