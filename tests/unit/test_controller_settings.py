"""Settings, permissions and the controller's imports (no cluster)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from controller import permissions
from controller.settings import DEFAULT_RAY_VERSION, Settings, SettingsError


def test_defaults():
    s = Settings.from_env({})
    assert s.clusterwide and s.watch_namespaces == ()
    assert s.worker_image.startswith("embedjob-worker:") and s.ray_version == DEFAULT_RAY_VERSION
    assert s.database_url is None
    assert (s.health_port, s.metrics_port, s.progress_interval_seconds, s.log_format) == (8080, 9090, 10.0, "json")


def test_values_from_the_environment():
    s = Settings.from_env({
        "EMBEDJOB_WATCH_NAMESPACES": " team-a, team-b ,,",
        "EMBEDJOB_WORKER_IMAGE": "reg/worker:2",
        "EMBEDJOB_RAY_VERSION": "2.61.0",
        "EMBEDJOB_DATABASE_URL": "postgresql://reader@db/embed",
        "EMBEDJOB_HEALTH_PORT": "8081",
        "EMBEDJOB_METRICS_PORT": "0",
        "EMBEDJOB_PROGRESS_INTERVAL_SECONDS": "2.5",
        "EMBEDJOB_LOG_FORMAT": "PLAIN",
    })
    assert s.watch_namespaces == ("team-a", "team-b") and not s.clusterwide
    assert (s.worker_image, s.ray_version, s.database_url) == ("reg/worker:2", "2.61.0", "postgresql://reader@db/embed")
    assert (s.health_port, s.metrics_port, s.progress_interval_seconds, s.log_format) == (8081, 0, 2.5, "plain")


@pytest.mark.parametrize("name, value", [
    ("EMBEDJOB_HEALTH_PORT", "http"), ("EMBEDJOB_PROGRESS_INTERVAL_SECONDS", "0"),
    ("EMBEDJOB_LOG_FORMAT", "xml"), ("EMBEDJOB_METRICS_PORT", "-1"),
])
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


def _all_rules(doc):
    for mode in doc.values():
        for rules in mode.values():
            yield from rules


def test_permissions_are_explicit():
    doc = permissions.as_document()
    for rule in _all_rules(doc):
        assert rule["verbs"] and rule["resources"] and "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
    clusterwide = doc["clusterwide"]["clusterRole"]
    assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]} in clusterwide
    assert {"apiGroups": ["embedjob.dev"], "resources": ["embeddingjobs/status"], "verbs": ["patch"]} in clusterwide
    assert not any(r["resources"] == ["namespaces"] for r in clusterwide)
    namespaced = doc["namespaced"]
    assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]} in namespaced["clusterRole"]
    assert not any(r["resources"] == ["secrets"] for r in namespaced["clusterRole"])
    assert namespaced["role"] == permissions.policy_rules(permissions.NAMESPACED_RULES)


def test_permissions_cli_prints_the_document():
    out = subprocess.run([sys.executable, "-m", "controller.permissions"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == permissions.as_document()


def test_controller_never_imports_ray_torch_or_sentence_transformers():
    code = (
        "import sys, controller.__main__, controller.handlers, controller.reconcile, controller.run_reader\n"
        "heavy = sorted(m for m in ('ray', 'torch', 'sentence_transformers', 'embedjob_worker') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
