"""The chart's podDefaults (rendered by the real helm): they reach the operator's settings and the RayJobs it
builds, and malformed ones are refused by values.schema.json before anything is installed."""

from __future__ import annotations

import json

import pytest

from controller.pod_templates import wire
from controller.settings import POD_DEFAULTS_ENV, Settings
from embedjob.api import PodDefaults
from support.chart import RELEASE, assert_refused, container_env, helm, render_chart, values_args
from support.manifests import quickstart_rayjob
from support.paths import CHART
from support.pod_settings import HEAD_TEMPLATE, WORKER_TEMPLATE

POD_DEFAULTS = {"head": HEAD_TEMPLATE, "workers": WORKER_TEMPLATE}


def operator_env(values: dict | None) -> dict[str, str]:
    return {name: e["value"] for name, e in container_env(render_chart(values)).items() if "value" in e}


def test_the_default_values_set_no_pod_settings():
    env = operator_env(None)
    assert wire(Settings.from_env(env).pod_defaults) == {"head": {}, "workers": {}}  # empty templates
    without = {name: value for name, value in env.items() if name != POD_DEFAULTS_ENV}
    assert quickstart_rayjob(env) == quickstart_rayjob(without)


def test_pod_defaults_reach_the_operator_and_its_rayjobs():
    env = operator_env({"podDefaults": POD_DEFAULTS})
    assert json.loads(env[POD_DEFAULTS_ENV]) == POD_DEFAULTS
    assert Settings.from_env(env).pod_defaults == PodDefaults.model_validate(POD_DEFAULTS)
    rayjob = quickstart_rayjob(env)["spec"]
    cluster = rayjob["rayClusterSpec"]
    for template, given in ((cluster["headGroupSpec"]["template"], HEAD_TEMPLATE),
                            (cluster["workerGroupSpecs"][0]["template"], WORKER_TEMPLATE)):
        for field in ("nodeSelector", "tolerations", "affinity", "serviceAccountName", "volumes"):
            assert template["spec"][field] == given["spec"][field], field
        assert template["metadata"]["labels"]["team"] == "search"
    assert rayjob["submitterPodTemplate"]["spec"]["serviceAccountName"] == HEAD_TEMPLATE["spec"]["serviceAccountName"]


@pytest.mark.parametrize(("pod_defaults", "message"), [
    ({"workers": {"spec": {"tolerations": [{"key": "a", "operator": "Maybe"}]}}},
     "at '/podDefaults/workers/spec/tolerations/0/operator'"),
    ({"head": {"spec": {"volumes": [{"name": "Bad_Name", "emptyDir": {}}]}}},
     "at '/podDefaults/head/spec/volumes/0/name'"),
    ({"workers": {"spec": {"containers": [{"name": "ray-worker", "resources": {}}]}}},
     "additional properties 'resources' not allowed"),
    ({"pods": {}}, "additional properties 'pods' not allowed"),
], ids=["toleration-operator", "volume-name", "worker-resources", "unknown-key"])
def test_malformed_pod_defaults_are_refused_by_the_schema(pod_defaults, message):
    res = helm("template", RELEASE, str(CHART), *values_args({"podDefaults": pod_defaults}), check=False)
    assert_refused(res, message)
