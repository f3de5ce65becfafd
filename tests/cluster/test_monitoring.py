"""Issue 31 item 4: the chart's Grafana dashboard and PrometheusRule, checked by a real Prometheus (Debian's
package) that scrapes the operator and a real run's driver. The operator runs as a ServiceAccount against
the API server; `RayJobRunner` runs each RayJob's entrypoint on a local Ray with the packaged model and
PostgreSQL, so the driver's metrics are a real run's. Every panel query must return series whose labels
its legend names; every alert rule must load, evaluate and select series that exist; a failed job's
alert must go pending; the sync lag must be the job's, in its own namespace (honorLabels). A scheduled job
whose cron does not tick during the test gives the schedule's series (its pending ticks, at 0)."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
import yaml

from envtest.binaries import find_binaries
from support.chart import by_kind, render_chart, the
from support.kubectl import apply_job
from support.net import free_port
from support.polling import wait_until
from support.prometheus import PrometheusApi, running_prometheus
from support.standin_jobs import MODEL, finished, sample

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

#: the chart's monitoring parts, as a user switches them on
VALUES = {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}
#: where the operator would run: its scrape target's own namespace label, which the per-job series must win over
OPERATOR_NAMESPACE = "embedjob-system"
#: what Grafana puts in for $__rate_interval at a 1 s scrape interval (at least 4 scrapes)
RATE_INTERVAL = "10s"
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
SELECTOR = re.compile(r"\bembedjob_\w+(?:\{[^}]*\})?")


def chart_monitoring() -> tuple[list[dict], dict]:
    """(the PrometheusRule's groups, the dashboard) as the chart renders them."""
    objects = render_chart(VALUES)
    (dashboard,) = [c for c in by_kind(objects, "ConfigMap") if "embedjob.json" in c.get("data", {})]
    return the(objects, "PrometheusRule")["spec"]["groups"], json.loads(dashboard["data"]["embedjob.json"])


def panel_queries(dashboard: dict, namespace: str) -> list[tuple[str, str, str]]:
    """(panel title, expr with the dashboard's variables filled in, legend) of every target."""
    return [(panel["title"], target["expr"].replace("$namespace", namespace).replace("$__rate_interval", RATE_INTERVAL),
             target.get("legendFormat", "")) for panel in dashboard["panels"] for target in panel["targets"]]


def test_promtool_accepts_the_charts_rules(tmp_path):
    groups, _ = chart_monitoring()
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    res = subprocess.run([find_binaries().promtool, "check", "rules", str(rules)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 4 rules found" in res.stdout, res.stdout


def test_every_panel_and_alert_works_on_what_the_operator_and_a_real_driver_serve(e2e, tmp_path):
    kube, namespace, operator, runner = e2e
    groups, dashboard = chart_monitoring()
    driver_port = free_port()
    runner(EMBEDJOB_DRIVER_METRICS_PORT=str(driver_port))
    scrape = [
        # as the chart's ServiceMonitor: the target's namespace is the operator's; honorLabels keeps the jobs'
        {"job_name": "embedjob-operator", "honor_labels": True,
         "static_configs": [{"targets": [f"127.0.0.1:{operator.metrics_port}"],
                             "labels": {"namespace": OPERATOR_NAMESPACE}}]},
        # as the chart's PodMonitor: the head pod's namespace, and the job's name from the pod's label
        {"job_name": "embedjob-drivers",
         "static_configs": [{"targets": [f"127.0.0.1:{driver_port}"],
                             "labels": {"namespace": namespace, "embeddingjob": "pep"}}]},
    ]
    started = time.time()
    with running_prometheus(find_binaries().prometheus, tmp_path / "prometheus", scrape, groups) as prometheus:
        uri, ids = sample(tmp_path, 300)
        apply_job(kube, namespace, "yearly", source={"uri": uri}, model=MODEL, schedule={"cron": "@yearly"})
        apply_job(kube, namespace, "pep", source={"uri": uri}, model=MODEL, batching={"batchSize": 16})
        job = wait_until("pep to finish", lambda: finished(kube, namespace, "pep"), timeout=300)
        assert job["status"]["state"] == "Complete", (job["status"], operator.log()[-3000:])
        # a job that fails: its input does not exist
        apply_job(kube, namespace, "missing", source={"uri": str(tmp_path / "absent.jsonl")}, model=MODEL)
        job = wait_until("missing to finish", lambda: finished(kube, namespace, "missing"), timeout=300)
        assert job["status"]["state"] == "Failed", job["status"]

        pending = wait_until("EmbeddingJobFailed to go pending", lambda: [
            alert for alert in prometheus.get("alerts")["alerts"]
            if alert["labels"]["alertname"] == "EmbeddingJobFailed"], timeout=60)
        assert [(a["labels"]["namespace"], a["labels"]["embeddingjob"]) for a in pending] == [(namespace, "missing")]
        assert_panels(prometheus, dashboard, namespace, started)
        assert_alert_rules(prometheus, groups, started)
        assert_sync_lag_is_the_jobs(prometheus, namespace)
        (pending,) = prometheus.query("embedjob_schedule_pending_ticks")
        assert (pending["metric"]["namespace"], pending["metric"]["embeddingjob"], pending["value"][1]) == (
            namespace, "yearly", "0"), pending


def assert_panels(prometheus: PrometheusApi, dashboard: dict, namespace: str, started: float) -> None:
    """Every target returns series over the test's time, with every label its legend names."""
    problems = []
    for title, expr, legend in panel_queries(dashboard, namespace):
        series = prometheus.query_range(expr, started)
        if not series:
            problems.append(f"{title}: no series: {expr}")
        problems += [f"{title}: no series has label {label!r}: {expr}" for label in LEGEND_LABEL.findall(legend)
                     if series and not any(label in s["metric"] for s in series)]
    assert not problems, "\n".join(problems)
    # the namespace variable's query (label_values(embedjob_job_state, namespace)) offers the job's namespace
    series = prometheus.get("series", **{"match[]": "embedjob_job_state", "start": f"{started:.3f}"})
    assert namespace in {s["namespace"] for s in series}


def assert_alert_rules(prometheus: PrometheusApi, groups: list[dict], started: float) -> None:
    """Every rule is loaded and evaluated without error, and each series it selects exists."""
    loaded = {rule["name"]: rule for group in prometheus.get("rules")["groups"] for rule in group["rules"]}
    expected = {rule["alert"]: rule for group in groups for rule in group["rules"]}
    assert loaded.keys() == expected.keys()
    problems = [f"{name}: {rule['health']} {rule.get('lastError', '')}" for name, rule in loaded.items()
                if (rule["health"], rule.get("lastError", "")) != ("ok", "")]
    for name, rule in expected.items():
        selectors = SELECTOR.findall(rule["expr"])
        problems += [f"{name}: selects nothing" for _ in [0] if not selectors]
        problems += [f"{name}: {selector} selects no series" for selector in selectors
                     if not prometheus.query_range(selector, started)]
    assert not problems, "\n".join(problems)


def assert_sync_lag_is_the_jobs(prometheus: PrometheusApi, namespace: str) -> None:
    (lag,) = prometheus.query(
        "time() - max by (namespace, vectors_table, collection) (embedjob_job_last_success_timestamp_seconds)")
    assert lag["metric"]["namespace"] == namespace, lag  # not the operator's namespace: honorLabels
    assert 0 <= float(lag["value"][1]) < 600, lag
