"""No database password in what the cluster keeps of a job (issue 27, the secret-grep target): the
EmbeddingJob's status, its Events, the RayJob (spec, entrypoint, metadata) and the operator's log, after a
job that succeeds with a password in the sink URL's query and one that fails on a source URL whose
unescaped `@` puts the end of the password into the host name libpq reports.

The operator (as a ServiceAccount, its run reader on the same query-password URL), the API server, Ray,
the driver and PostgreSQL are real; `RayJobRunner` plays KubeRay + kubelet. The driver's own output and the
run rows: tests/integration/test_url_secrets.py."""

from __future__ import annotations

import json

import pytest

from plugins.standin import RayJobRunner
from support.kubectl import apply_job, create_database_secret
from support.polling import wait_until
from support.standin_jobs import MODEL, finished

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

QUERY_PASSWORD, SSL_PASSWORD = "qpwc1u5t3rse", "sslpwc1u5t3r"
AT_BEFORE, AT_AFTER = "atprec1u5t3r", "atpostc1u5t3r"
SECRETS = (QUERY_PASSWORD, SSL_PASSWORD, AT_BEFORE, AT_AFTER)


def test_no_password_reaches_status_events_rayjobs_or_the_operator_log(
        kube_without_kuberay, standin_namespace, local_ray, database_url, start_operator, tmp_path):
    kube, namespace = kube_without_kuberay, standin_namespace
    sink_url = f"{database_url}{'&' if '?' in database_url else '?'}password={QUERY_PASSWORD}&sslpassword={SSL_PASSWORD}"
    source_url = f"postgresql://cms:{AT_BEFORE}@{AT_AFTER}@127.0.0.1:1/cms?sslpassword={SSL_PASSWORD}"
    create_database_secret(kube, namespace, sink_url)
    create_database_secret(kube, namespace, source_url, name="cms-db", key="dsn")
    operator = start_operator(kube, namespace, EMBEDJOB_DATABASE_URL=sink_url)
    texts = tmp_path / "in.jsonl"
    texts.write_text("".join(json.dumps({"id": f"r{i}", "text": f"text number {i}"}) + "\n" for i in range(5)))
    with RayJobRunner(kube, namespace, local_ray, tmp_path, {}) as runner:
        apply_job(kube, namespace, "file-job", source={"uri": str(texts)}, model=MODEL)
        apply_job(kube, namespace, "table-job", model=MODEL, source={"uri": None,
            "table": {"name": "docs", "idColumn": "id", "textColumn": "body"},
            "databaseSecretRef": {"name": "cms-db", "key": "dsn"}})
        done = {name: wait_until(f"{name} to finish", lambda name=name: finished(kube, namespace, name), timeout=300)
                for name in ("file-job", "table-job")}
        driver_logs = "".join(run.log_path.read_text(errors="replace") for runs in runner.runs.values() for run in runs)
    assert done["file-job"]["status"]["state"] == "Complete", done["file-job"]["status"]
    failed = done["table-job"]["status"]
    assert failed["state"] == "Failed" and "***@127.0.0.1" in json.dumps(failed), failed
    kept = {
        "EmbeddingJobs": kube.kubectl("get", "ej", "-n", namespace, "-o", "json").stdout,
        "Events": kube.kubectl("get", "events", "-n", namespace, "-o", "json").stdout,
        "RayJobs": kube.kubectl("get", "rayjobs", "-n", namespace, "-o", "json").stdout,
        "operator log": operator.log(),
        "driver logs": driver_logs,
    }
    assert "password=***&sslpassword=***" in kept["driver logs"]  # the driver did log the URL, masked
    leaks = {where: [s for s in SECRETS if s in text] for where, text in kept.items()}
    assert not any(leaks.values()), leaks
