"""The chart's Grafana dashboard file: well-formed for Grafana's provisioning, every query on the data source
variable and on embedjob's own series. Whether its queries return series: tests/cluster/test_monitoring.py."""

from __future__ import annotations

import json
import re

from controller.job_metrics import JOB_GAUGES
from support.paths import CHART

DASHBOARD = json.loads((CHART / "files" / "grafana-dashboard.json").read_text())
METRIC = re.compile(r"\b(embedjob_\w+?)(?:_total|_bucket|_count|_sum)?\b(?=\s*[{\[)])")


def targets():
    return [(panel, target) for panel in DASHBOARD["panels"] for target in panel["targets"]]


def test_panels_have_unique_ids_no_overlap_and_a_description():
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for panel in DASHBOARD["panels"]:
        grid = panel["gridPos"]
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not mine & cells, panel["title"]
        assert grid["x"] + grid["w"] <= 24 and panel["description"]
        cells |= mine


def test_every_query_uses_the_data_source_variable_and_names_its_series():
    assert DASHBOARD["templating"]["list"][0] == {"name": "datasource", "label": "Data source", "type": "datasource",
                                                  "query": "prometheus", "current": {}}
    for panel, target in targets():
        assert panel["datasource"]["uid"] == target["datasource"]["uid"] == "${datasource}"
        assert target["refId"] and target["expr"] and METRIC.search(target["expr"]), target


def test_the_per_job_series_the_dashboard_reads_are_the_operators():
    per_job = {name for _, target in targets() for name in METRIC.findall(target["expr"]) if name.startswith("embedjob_job_")}
    assert per_job and per_job <= JOB_GAUGES.keys()
    assert "embedjob_job_last_success_timestamp_seconds" in per_job  # the sync lag


def test_namespaced_queries_filter_on_the_namespace_variable():
    """The driver's and the per-job series carry the job's namespace; the operator's own do not."""
    for _, target in targets():
        names = set(METRIC.findall(target["expr"]))
        if names - {"embedjob_jobs", "embedjob_reconcile_duration_seconds"}:
            assert 'namespace=~"$namespace"' in target["expr"], target["expr"]
