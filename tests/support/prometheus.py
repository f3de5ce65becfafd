"""A real Prometheus (Debian's binary, tests/envtest/setup) on loopback, and its HTTP API."""

from __future__ import annotations

import json
import math
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

from support.net import free_port
from support.processes import serving

#: scrape and rule evaluation interval: a run of seconds still leaves enough samples for rate()
INTERVAL = "1s"


class PrometheusApi:
    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params: Any) -> Any:
        """`data` of a /api/v1 answer; AssertionError with Prometheus' error for anything but success."""
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as resp:
                answer = json.load(resp)
        except urllib.error.HTTPError as exc:
            answer = json.load(exc)
        assert answer.get("status") == "success", f"{path} {params}: {answer.get('errorType')}: {answer.get('error')}"
        return answer["data"]

    def query_range(self, expr: str, start: float, end: float | None = None, step: float = 1.0) -> list[dict]:
        """The series `expr` returns over [start, end] (each with `metric` and `values`). The steps count back
        from `end` (Prometheus counts them on from `start`): a sample scraped just before `end` is seen."""
        end = end or time.time()
        start = end - math.ceil((end - start) / step) * step
        data = self.get("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")
        return data["result"]

    def query(self, expr: str) -> list[dict]:
        return self.get("query", query=expr)["result"]


@contextmanager
def running_prometheus(binary: str, workdir: Path, scrape_configs: list[dict],
                       rule_groups: list[dict] | None = None) -> Iterator[PrometheusApi]:
    """Prometheus scraping `scrape_configs` every INTERVAL, evaluating `rule_groups` as often."""
    workdir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
                              "scrape_configs": scrape_configs}
    if rule_groups is not None:
        rules = workdir / "rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": rule_groups}))
        config["rule_files"] = [str(rules)]
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    args = [binary, f"--config.file={config_path}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}"]
    with serving("prometheus", args, port, workdir / "prometheus.log"):
        yield PrometheusApi(f"http://127.0.0.1:{port}")
