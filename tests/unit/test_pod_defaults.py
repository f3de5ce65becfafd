"""The operator's default pod settings: read from its environment or a file, refused naming the field, taken by
`embedjob render` (flag or environment), and the chart's values.schema.json generated from the same models."""

from __future__ import annotations

import json

import pytest
import yaml

from controller.settings import POD_DEFAULTS_ENV, POD_DEFAULTS_FILE_ENV, Settings, SettingsError
from embedjob import chart_schema
from embedjob.api import PodDefaults
from embedjob.manifest import load_manifest
from embedjob_cli.render import render
from support.cli import EMBEDJOB, run
from support.paths import REPO

EXAMPLE = REPO / "examples" / "quickstart-cluster.yaml"
DEFAULTS = {"workers": {"spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                  "effect": "NoSchedule"}],
                                 "imagePullSecrets": [{"name": "regcred"}]}},
            "head": {"spec": {"imagePullSecrets": [{"name": "regcred"}]}}}


def test_defaults_come_from_the_environment_as_yaml_or_json_or_from_a_file(tmp_path):
    wanted = PodDefaults.model_validate(DEFAULTS)
    assert Settings.from_env({}).pod_defaults == PodDefaults()
    assert Settings.from_env({POD_DEFAULTS_ENV: json.dumps(DEFAULTS)}).pod_defaults == wanted
    assert Settings.from_env({POD_DEFAULTS_ENV: yaml.safe_dump(DEFAULTS)}).pod_defaults == wanted
    file = tmp_path / "pod-defaults.yaml"
    file.write_text(yaml.safe_dump(DEFAULTS))
    assert Settings.from_env({POD_DEFAULTS_FILE_ENV: str(file)}).pod_defaults == wanted


@pytest.mark.parametrize("env, message", [
    ({POD_DEFAULTS_ENV: '{"workers": {"spec": {"tolerations": [{"key": "a", "operator": "Maybe"}]}}}'},
     "EMBEDJOB_POD_DEFAULTS: podDefaults.workers.spec.tolerations.0.operator"),
    ({POD_DEFAULTS_ENV: '{"head": {"spec": {"containers": [{"name": "ray-head", "env": '
                        '[{"name": "EMBEDJOB_DATABASE_URL", "value": "x"}]}]}}}'},
     "podDefaults.head.spec.containers.0.env.0: Value error, env name is set by embedjob"),
    ({POD_DEFAULTS_ENV: '{"pods": {}}'}, "podDefaults.pods: Extra inputs are not permitted"),
    ({POD_DEFAULTS_ENV: "[1, 2]"}, "expected an object with head and/or workers"),
    ({POD_DEFAULTS_ENV: "{unclosed"}, "EMBEDJOB_POD_DEFAULTS: not YAML or JSON"),
    ({POD_DEFAULTS_FILE_ENV: "/nonexistent/pod-defaults.yaml"}, "cannot read it"),
    ({POD_DEFAULTS_ENV: "{}", POD_DEFAULTS_FILE_ENV: "/x"}, "not both"),
])
def test_bad_defaults_stop_the_operator_with_the_field_named(env, message):
    with pytest.raises(SettingsError) as refused:
        Settings.from_env(env)
    assert message in str(refused.value)


def test_render_takes_the_defaults_from_a_flag_or_the_environment(tmp_path):
    file = tmp_path / "pod-defaults.yaml"
    file.write_text(yaml.safe_dump(DEFAULTS))
    expected = render(load_manifest(EXAMPLE), Settings.from_env({POD_DEFAULTS_ENV: json.dumps(DEFAULTS)}))
    worker = expected["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["tolerations"] == DEFAULTS["workers"]["spec"]["tolerations"]
    assert expected["spec"]["submitterPodTemplate"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    by_flag = run([*EMBEDJOB, "render", str(EXAMPLE), "--pod-defaults", str(file)], timeout=120)
    by_env = run([*EMBEDJOB, "render", str(EXAMPLE)], env={POD_DEFAULTS_ENV: json.dumps(DEFAULTS)}, timeout=120)
    for result in (by_flag, by_env):
        assert result.returncode == 0, result.stderr
        assert yaml.safe_load(result.stdout) == expected
    file.write_text("workers: {spec: {volumes: [{name: Bad_Name, emptyDir: {}}]}}")
    refused = run([*EMBEDJOB, "render", str(EXAMPLE), "--pod-defaults", str(file)], timeout=120)
    assert refused.returncode == 2 and "podDefaults.workers.spec.volumes.0.name" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_charts_schema_for_pod_defaults_is_generated_from_the_models():
    text = chart_schema.VALUES_SCHEMA.read_text()
    assert chart_schema.rewritten(text) == text, "stale: run `python -m embedjob.chart_schema`"
    schema = json.loads(text)
    assert schema["definitions"]["podDefaults"] == chart_schema.pod_defaults_schema()
    assert schema["properties"]["podDefaults"]["$ref"] == "#/definitions/podDefaults"
