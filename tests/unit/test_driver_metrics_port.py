"""The driver's metrics port: from the flag or $EMBEDJOB_DRIVER_METRICS_PORT; a bad or busy one costs the metrics only."""

from __future__ import annotations

import logging
import socket
import urllib.request

import pytest

from embedjob_worker.core.metrics import DriverMetrics, metrics_port_from_env


@pytest.mark.parametrize("value, port", [(None, None), ("", None), ("0", 0), ("8090", 8090), ("65535", 65535)])
def test_the_env_names_a_port_or_none(value, port):
    assert metrics_port_from_env(value) == port


@pytest.mark.parametrize("value", ["-1", "65536", "80 90", "8090\n", "0x1f", "٨٠٩٠", "x" * 10_000])
def test_a_value_that_is_not_a_port_is_logged_and_serves_nothing(value, caplog):
    with caplog.at_level(logging.WARNING):
        assert metrics_port_from_env(value) is None
    assert "metrics_port_invalid" in caplog.text and len(caplog.text) < 1000


def test_a_busy_port_is_logged_and_the_run_goes_on(caplog):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        with caplog.at_level(logging.WARNING):
            DriverMetrics().serve(taken.getsockname()[1])
    assert "metrics_port_unavailable" in caplog.text


def test_a_free_port_serves_the_drivers_metrics():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics = DriverMetrics()
    metrics.batches.labels("succeeded").inc()
    metrics.serve(port)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'embedjob_batches_total{state="succeeded"} 1.0' in body
