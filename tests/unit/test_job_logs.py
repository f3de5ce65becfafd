"""`embedjob logs`: where a job's driver log is (the head's dashboard through the service proxy, or the
submitter pod), decided from the job, its RayJob and its RayCluster; and the command without a cluster."""

from __future__ import annotations

import pytest

from embedjob.contract import LOGS_HINT
from embedjob_cli.job_logs import DashboardLogs, LogsUnavailable, SubmitterLogs, locate
from support.cli import EMBEDJOB, run

NS = "team-a"


def job(**status) -> dict:
    return {"metadata": {"name": "pep", "namespace": NS}, "status": status}


def rayjob(**status) -> dict:
    return {"metadata": {"name": "ej-pep-3f2a9c1d", "namespace": NS}, "status": status}


def raycluster(status: dict | None = None, auth: dict | None = None) -> dict:
    spec = {"authOptions": auth} if auth else {}
    return {"metadata": {"name": "ej-pep-3f2a9c1d-x7k2p", "namespace": NS}, "spec": spec, "status": status or {}}


RUNNING = job(rayJobName="ej-pep-3f2a9c1d", state="Running")
SUBMITTED = rayjob(jobId="ej-pep-3f2a9c1d-abcde", rayClusterName="ej-pep-3f2a9c1d-x7k2p")


def test_a_running_cluster_is_read_through_the_service_proxy_of_its_head():
    cluster = raycluster({"head": {"serviceName": "ej-pep-3f2a9c1d-x7k2p-head-svc"},
                          "endpoints": {"dashboard": "8265", "client": "10001"}}, auth={"mode": "token"})
    where = locate(RUNNING, SUBMITTED, cluster)
    assert where == DashboardLogs(NS, "ej-pep-3f2a9c1d-x7k2p-head-svc", 8265, "ej-pep-3f2a9c1d-abcde",
                                  "ej-pep-3f2a9c1d-x7k2p")  # KubeRay's token Secret is named like the cluster
    assert where.proxy_target() == "ej-pep-3f2a9c1d-x7k2p-head-svc:8265"
    assert where.dashboard_path() == "api/jobs/ej-pep-3f2a9c1d-abcde/logs"
    assert where.proxy_url_path() == ("/api/v1/namespaces/team-a/services/ej-pep-3f2a9c1d-x7k2p-head-svc:8265"
                                      "/proxy/api/jobs/ej-pep-3f2a9c1d-abcde/logs")


def test_before_kuberay_reports_the_head_its_default_service_and_port_are_used_and_no_token_without_auth():
    where = locate(RUNNING, SUBMITTED, raycluster())
    assert (where.service, where.port, where.token_secret) == ("ej-pep-3f2a9c1d-x7k2p-head-svc", 8265, None)
    custom = locate(RUNNING, SUBMITTED, raycluster(auth={"mode": "token", "secretName": "ray-token"}))
    assert custom.token_secret == "ray-token"


def test_a_cluster_already_gone_falls_back_to_the_submitter_pod_and_says_so():
    where = locate(RUNNING, SUBMITTED, None)
    assert where == SubmitterLogs(NS, "ej-pep-3f2a9c1d", "the RayCluster ej-pep-3f2a9c1d-x7k2p is already gone")
    assert where.selector() == "batch.kubernetes.io/job-name=ej-pep-3f2a9c1d"
    assert where.kubectl() == "kubectl logs job/ej-pep-3f2a9c1d -n team-a"


def test_a_job_not_yet_submitted_reads_the_submitter_and_says_why():
    where = locate(RUNNING, rayjob(jobDeploymentStatus="Initializing", rayClusterName="c"), raycluster())
    assert isinstance(where, SubmitterLogs) and "has not submitted the driver yet" in where.cluster_gone
    assert "Initializing" in where.cluster_gone


def test_no_rayjob_means_no_driver_ran_or_its_log_is_gone():
    with pytest.raises(LogsUnavailable, match=r"has no RayJob yet \(state Pending, SecretNotFound\).*kubectl describe"):
        locate(job(state="Pending", reason="SecretNotFound"), None, None)
    with pytest.raises(LogsUnavailable, match="the RayJob ej-pep-3f2a9c1d of pep is gone"):
        locate(RUNNING, None, None)


def test_the_hint_for_condition_messages_names_the_command():
    assert LOGS_HINT.format(name="pep", namespace=NS) == (
        "the driver's log: `embedjob logs pep -n team-a` (docs/troubleshooting.md)")


def test_the_command_without_kubernetes_credentials_says_so_in_one_line(tmp_path):
    result = run([*EMBEDJOB, "logs", "pep", "-n", NS],
                 env={"KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""})
    assert result.returncode == 1, result
    assert result.stderr.startswith("embedjob: no driver log for pep: ") and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
