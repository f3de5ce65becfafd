"""Pod settings of the head and the workers: rendered into the RayJob by the operator's builder (through `embedjob
render`), merged over the operator's defaults, and refused at parse time naming the field."""

from __future__ import annotations

import copy
import json

import pytest

from controller.pod_templates import SUBMITTER_CONTAINER, SUBMITTER_POD_FIELDS, strategic_merge
from controller.rayjob import HEAD_RESOURCES
from controller.settings import Settings
from embedjob import api, contract
from embedjob.api import RESERVED_ENV_PREFIX
from embedjob.crd import spec_as_stored
from embedjob.manifest import load_manifest
from embedjob_cli.render import render
from support.manifests import MINIMAL_SPEC, merged
from support.paths import REPO
from support.pod_settings import EVERY_POD_SETTING, HEAD_TEMPLATE, MALFORMED_POD_SETTINGS, WORKER_TEMPLATE

CLUSTER_EXAMPLE = REPO / "examples" / "quickstart-cluster.yaml"
OURS = {"embedjob.dev/job-name", "embedjob.dev/job-uid", "app.kubernetes.io/managed-by"}
# An operator whose admin opened the pod policy for what these manifests ask for (render checks it as the
# operator's review does; the policy's own tests: test_pod_policy.py).
OPENED_POLICY = {"EMBEDJOB_POD_POLICY": json.dumps({
    "allowedImagePrefixes": f"{Settings.from_env({}).worker_image.rpartition(':')[0]},registry.example.com/",
    "allowedServiceAccounts": "embedder,embedjob-s3-reader",
    **dict.fromkeys(("allowHostPath", "allowPrivilegeEscalation", "allowAddedCapabilities", "allowRunAsRoot",
                     "allowUnconfinedSeccomp"), "true")})}


def operator_settings(**env: str) -> Settings:
    return Settings.from_env({**OPENED_POLICY, **env})


def rendered(spec_fields: dict, settings: Settings | None = None) -> dict:
    manifest = load_manifest(CLUSTER_EXAMPLE)
    manifest["spec"] = merged(manifest["spec"], spec_fields)
    return render(manifest, settings or operator_settings())["spec"]


def templates(rayjob_spec: dict) -> tuple[dict, dict]:
    cluster = rayjob_spec["rayClusterSpec"]
    return cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]


@pytest.mark.parametrize("group", ["head", "workers"])
def test_every_pod_setting_reaches_its_template(group):
    spec = rendered(EVERY_POD_SETTING)
    head, worker = templates(spec)
    template, given = (head, HEAD_TEMPLATE) if group == "head" else (worker, WORKER_TEMPLATE)
    assert template["metadata"]["labels"] == {**{k: template["metadata"]["labels"][k] for k in OURS}, "team": "search"}
    assert template["metadata"]["annotations"] == given["metadata"]["annotations"]
    for field, value in given["spec"].items():
        if field != "containers":
            assert template["spec"][field] == value, field
    (container,) = template["spec"]["containers"]
    (wanted,) = given["spec"]["containers"]
    ours = len(contract.DRIVER_ENV)
    assert [e["name"] for e in container["env"][:ours]] == list(contract.DRIVER_ENV)  # ours first, then the job's
    assert container["env"][ours:] == wanted["env"]
    for field in ("envFrom", "volumeMounts", "securityContext"):
        assert container[field] == wanted[field], field
    assert container["image"] == Settings.from_env({}).worker_image
    if group == "head":
        assert container["resources"] == HEAD_TEMPLATE["spec"]["containers"][0]["resources"]
    else:
        assert container["resources"] == {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}  # from cpusPerActor


def test_the_submitter_pod_gets_the_heads_placement_identity_and_pull_secrets():
    spec = rendered(EVERY_POD_SETTING)
    head, _ = templates(spec)
    submitter = spec["submitterPodTemplate"]
    assert submitter["metadata"] == head["metadata"]
    for field in SUBMITTER_POD_FIELDS:
        assert submitter["spec"][field] == head["spec"][field], field
    assert "volumes" not in submitter["spec"] and submitter["spec"]["restartPolicy"] == "Never"
    (container,) = submitter["spec"]["containers"]
    assert container["name"] == SUBMITTER_CONTAINER and container["image"] == head["spec"]["containers"][0]["image"]
    assert container["securityContext"] == head["spec"]["containers"][0]["securityContext"]
    assert "env" not in container  # KubeRay gives it what `ray job submit` needs; the database URL it never needs


def test_without_pod_settings_the_rayjob_is_what_it_was():
    spec = rendered({})
    head, worker = templates(spec)
    assert "submitterPodTemplate" not in spec
    assert set(head["spec"]) == {"containers"} and set(worker["spec"]) == {"containers"}
    assert head["spec"]["containers"][0]["resources"] == HEAD_RESOURCES
    # settings that do not concern the submitter (labels, volumes) leave KubeRay's default submitter
    assert "submitterPodTemplate" not in rendered({"head": {"template": {"metadata": {"labels": {"a": "b"}}}}})


def test_the_jobs_settings_merge_over_the_operators_defaults():
    defaults = {
        "workers": {
            "metadata": {"labels": {"team": "platform", "cost-center": "42"}},
            "spec": {
                "nodeSelector": {"pool": "cpu", "zone": "a"},
                "tolerations": [{"key": "batch", "operator": "Exists"}],
                "imagePullSecrets": [{"name": "platform-registry"}],
                "volumes": [{"name": "cache", "emptyDir": {}}],
                "containers": [{"name": "ray-worker", "env": [{"name": "HF_HOME", "value": "/defaults"},
                                                              {"name": "TZ", "value": "UTC"}],
                                "envFrom": [{"configMapRef": {"name": "proxy"}}],
                                "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
            },
        },
        "head": {"spec": {"containers": [{"name": "ray-head", "resources": {"requests": {"cpu": "4"}}}]}},
    }
    settings = operator_settings(EMBEDJOB_POD_DEFAULTS=json.dumps(defaults))
    job = {"workers": {"template": {
        "metadata": {"labels": {"team": "search"}},
        "spec": {
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "batch", "operator": "Exists"}, {"key": "nvidia.com/gpu", "operator": "Exists"}],
            "imagePullSecrets": [{"name": "team-registry"}],
            "volumes": [{"name": "cache", "emptyDir": {"medium": "Memory"}}],
            "containers": [{"name": "ray-worker", "env": [{"name": "HF_HOME", "value": "/cache"}],
                            "envFrom": [{"secretRef": {"name": "s3"}}],
                            "volumeMounts": [{"name": "cache", "mountPath": "/cache", "readOnly": True}]}],
        }}}}
    head, worker = templates(rendered(job, settings))
    labels = worker["metadata"]["labels"]
    assert (labels["team"], labels["cost-center"]) == ("search", "42") and OURS <= set(labels)
    pod = worker["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu", "zone": "a"}  # maps: key by key, the job's value wins
    assert pod["tolerations"] == [{"key": "batch", "operator": "Exists"},  # appended, not repeated
                                  {"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert pod["imagePullSecrets"] == [{"name": "platform-registry"}, {"name": "team-registry"}]  # by name
    assert pod["volumes"] == [{"name": "cache", "emptyDir": {"medium": "Memory"}}]  # by name, merged
    (container,) = pod["containers"]
    assert [(e["name"], e.get("value")) for e in container["env"]] == [
        (contract.DATABASE_URL_ENV, None), (contract.SOURCE_DATABASE_URL_ENV, ""), (contract.FAULT_INJECTION_ENV, ""),
        (contract.DRIVER_METRICS_PORT_ENV, "8090"), ("HF_HOME", "/cache"), ("TZ", "UTC")]  # by name, in place
    assert container["envFrom"] == [{"configMapRef": {"name": "proxy"}}, {"secretRef": {"name": "s3"}}]  # appended
    assert container["volumeMounts"] == [{"name": "cache", "mountPath": "/cache", "readOnly": True}]  # by mountPath
    # the head: the operator's default resources replace ours whole (no 2Gi memory limit left under them)
    assert head["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "4"}}


def test_head_resources_replace_the_default_and_other_lists_are_replaced():
    base = {"resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
            "affinity": {"nodeAffinity": {"x": {"nodeSelectorTerms": [{"a": 1}, {"b": 2}]}}}}
    overlay = {"resources": {"requests": {"memory": "8Gi"}},
               "affinity": {"nodeAffinity": {"x": {"nodeSelectorTerms": [{"c": 3}]}}}}
    out = strategic_merge(base, overlay)
    assert out["resources"] == {"requests": {"memory": "8Gi"}}
    assert out["affinity"]["nodeAffinity"]["x"]["nodeSelectorTerms"] == [{"c": 3}]
    assert base["resources"]["limits"] == {"memory": "2Gi"}  # the base is not modified


def problems_of(spec_fields: dict) -> list[tuple[str, str]]:
    with pytest.raises(api.SpecError) as refused:
        api.parse_spec(merged(copy.deepcopy(MINIMAL_SPEC), spec_fields))
    return refused.value.problems


def python_form(path: str) -> str:
    return path.replace("[", ".").replace("]", "")


@pytest.mark.parametrize("spec_fields, field", [
    pytest.param(s, f, id=i) for i, s, f, checked_here in MALFORMED_POD_SETTINGS if checked_here])
def test_malformed_pod_settings_are_refused_naming_the_field(spec_fields, field):
    """The path named is the field, or the object whose rule it breaks (a rule across its fields)."""
    wanted = python_form(field)
    problems = problems_of(spec_fields)
    assert any(path == wanted or wanted.startswith(path + ".") and path.count(".") >= 2
               or wanted in path for path, _ in problems), problems


def test_overriding_our_env_says_why():
    (problem,) = problems_of({"head": {"template": {"spec": {"containers": [
        {"name": "ray-head", "env": [{"name": contract.DATABASE_URL_ENV, "value": "postgresql://elsewhere"}]}]}}}})
    assert problem[0] == "spec.head.template.spec.containers.0.env.0"
    assert "set by embedjob or KubeRay and cannot be overridden" in problem[1]


def test_the_reserved_env_prefix_covers_every_variable_of_the_contract():
    names = [value for name, value in vars(contract).items() if name.endswith("_ENV") and isinstance(value, str)]
    assert contract.DATABASE_URL_ENV in names and contract.FAULT_INJECTION_ENV in names
    assert all(name.startswith(RESERVED_ENV_PREFIX) for name in names), names


def test_huge_and_hostile_values_get_a_reason_not_a_traceback():
    for fields in ({"workers": {"template": {"spec": {"volumes": [{"name": f"v{i}", "emptyDir": {}}
                                                                  for i in range(1000)]}}}},
                   {"head": {"template": {"metadata": {"labels": {f"k{i}": "v" for i in range(10_000)}}}}},
                   {"head": {"template": {"spec": {"serviceAccountName": "x" * 10_000}}}},
                   {"head": {"template": "not an object"}},
                   {"workers": {"template": {"spec": {"tolerations": [None]}}}}):
        problems = problems_of(fields)
        assert problems and all(path.startswith("spec.") for path, _ in problems), problems


def example(name: str) -> dict:
    return render(load_manifest(REPO / "examples" / name), operator_settings())["spec"]


def test_the_gpu_node_pool_example_puts_the_workers_on_the_tainted_pool():
    spec = example("gpu-node-pool.yaml")
    head, worker = templates(spec)
    assert worker["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert worker["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert worker["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "tolerations" not in head["spec"] and "nodeSelector" not in head["spec"]  # the head stays off the pool
    assert head["spec"]["priorityClassName"] == worker["spec"]["priorityClassName"] == "batch-low"


def test_the_s3_example_runs_the_head_as_the_serviceaccount_with_the_region():
    spec = example("s3-irsa.yaml")
    head, worker = templates(spec)
    assert head["spec"]["serviceAccountName"] == "embedjob-s3-reader" and "serviceAccountName" not in worker["spec"]
    container = head["spec"]["containers"][0]
    assert container["envFrom"] == [{"configMapRef": {"name": "embedjob-aws"}}]
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    assert spec["submitterPodTemplate"]["spec"]["serviceAccountName"] == "embedjob-s3-reader"


def test_the_private_registry_example_gives_every_pod_the_pull_secret():
    spec = example("private-registry.yaml")
    head, worker = templates(spec)
    pods = [head["spec"], worker["spec"], spec["submitterPodTemplate"]["spec"]]
    assert all(pod["imagePullSecrets"] == [{"name": "regcred"}] for pod in pods)
    assert {pod["containers"][0]["image"] for pod in pods} == {"registry.example.com/ml/embedjob-worker:0.1.0"}


def test_the_drivers_config_leaves_the_pod_settings_out():
    """They are the operator's: the entrypoint (one argument of the submitter, at most 128 KiB) stays the size it
    was, and the driver parses what it is given."""
    with_settings, without = rendered(EVERY_POD_SETTING), rendered({})
    assert with_settings["entrypoint"] == without["entrypoint"]
    config = contract.decode_job_config(without["entrypoint"].rsplit(" ", 1)[-1])
    assert "head" not in config["spec"] and "template" not in config["spec"]["workers"]
    api.parse_spec(config["spec"])


def test_optional_parts_get_no_schema_default():
    """An unset optional object stays absent as stored: a `default: {}` would add every volume source (refused as
    two sources) and a head to every job."""
    stored = spec_as_stored(merged(MINIMAL_SPEC, {"workers": {"template": {"spec": {
        "volumes": [{"name": "v", "emptyDir": {}}]}}}}))
    assert "head" not in stored
    assert stored["workers"]["template"] == {"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}
    api.parse_spec(stored)
