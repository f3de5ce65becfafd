"""Settings, permissions and the controller's imports (no cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from controller import permissions
from controller.kube import REQUEST_TIMEOUT
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
    # namespaces: only read, whether one is being deleted (issue 26 item 4); kopf watches them namespaced only
    assert [r["verbs"] for r in clusterwide if r["resources"] == ["namespaces"]] == [["get"]]
    namespaced = doc["namespaced"]
    assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]} in namespaced["clusterRole"]
    assert not any(r["resources"] == ["secrets"] for r in namespaced["clusterRole"])
    # cluster-wide, what kopf needs to release the jobs of a namespace being deleted once its RoleBinding is
    # gone: never a RayJob's get, create, patch or delete
    assert [r["verbs"] for r in namespaced["clusterRole"] if r["resources"] == ["embeddingjobs"]] == [
        ["get", "list", "watch", "patch"]]
    assert [r["verbs"] for r in namespaced["clusterRole"] if r["resources"] == ["rayjobs"]] == [["list", "watch"]]
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


def _operator(env: dict[str, str], code: str | None = None) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDJOB_")}
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "controller"]
    return subprocess.run(command, capture_output=True, text=True, env={**inherited, **env}, timeout=60)


@pytest.mark.parametrize("name, value, expected", [
    ("EMBEDJOB_PROGRESS_INTERVAL_SECONDS", "abc", "EMBEDJOB_PROGRESS_INTERVAL_SECONDS='abc' is not a number"),
    ("EMBEDJOB_HEALTH_PORT", "80.5", "EMBEDJOB_HEALTH_PORT='80.5' is not an integer"),
    ("EMBEDJOB_LOG_FORMAT", "xml", "EMBEDJOB_LOG_FORMAT='xml' must be json or plain"),
])
def test_a_bad_setting_stops_the_operator_with_one_line(name, value, expected):
    out = _operator({name: value})
    assert out.returncode != 0
    assert out.stderr.splitlines() == [f"embedjob-operator: {expected}"], out.stderr


def test_kopf_has_request_timeouts_and_posts_events_as_the_operator():
    code = (
        "import json\n"
        "from controller.__main__ import kopf_settings\n"
        "s = kopf_settings()\n"
        "print(json.dumps([s.networking.connect_timeout, s.networking.request_timeout, s.watching.connect_timeout,\n"
        "                  s.watching.server_timeout, s.watching.client_timeout, s.posting.reporting_component]))\n"
    )
    out = _operator({}, code)
    assert out.returncode == 0, out.stderr
    connect, request, watch_connect, server, client, component = json.loads(out.stdout)
    assert (connect, request, watch_connect) == (REQUEST_TIMEOUT[0], REQUEST_TIMEOUT[1], REQUEST_TIMEOUT[0])
    assert 0 < request <= 60 and 0 < server < client and isinstance(server, int)  # a query parameter
    assert component == "embedjob-operator"


def test_api_calls_give_up_on_a_server_that_never_answers():
    """A server that accepts connections and never answers: each call fails after its timeout."""
    import asyncio
    import socket
    import time

    import kubernetes

    from controller.kube import KubeApi

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        config = kubernetes.client.Configuration()
        config.host = f"http://127.0.0.1:{silent.getsockname()[1]}"
        kube = KubeApi(kubernetes.client.ApiClient(config), request_timeout=(0.5, 0.5))
        for call in (lambda: kube.read_secret("ns", "db"), lambda: kube.list_pods("ns", "ray.io/cluster=c"),
                     lambda: kube.get_job("ns", "pep")):
            started = time.monotonic()
            with pytest.raises(Exception, match="(?i)timed? ?out"):
                asyncio.run(call())
            assert time.monotonic() - started < 5
