"""`embedjob logs NAME`: the driver's log of an EmbeddingJob on a cluster, from the Ray head or the submitter pod.

The driver runs on the head of the job's RayCluster; its log is kept there as the Ray
job's log, which the head's dashboard serves (`GET /api/jobs/<submission id>/logs`).
The dashboard is read through the API server's service proxy, so nothing but the
kubeconfig is needed; with KubeRay's token authentication the token comes from the
cluster's Secret and travels as `X-Ray-Authorization` (the API server strips an
`Authorization` header it has authenticated). Once the cluster is gone (its
`ttlSecondsAfterFinished` passed, or the job was suspended), the submitter pod's log is
the copy that stays: KubeRay keeps the submitter Job, and its `ray job logs --follow`
printed the driver's output.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from dataclasses import dataclass
from typing import Any

from controller.ray_jobs_client import AUTH_TOKEN_KEY, DASHBOARD_PORT, HEAD_SERVICE_SUFFIX, auth_secret_name
from controller.rayjob import RAY_GROUP, RAY_PLURAL, RAY_VERSION
from embedjob import api
from embedjob.contract import ExitCode

COMMAND = "logs"
# KubeRay's submitter Job is named like the RayJob; the Job controller labels its pods.
SUBMITTER_JOB_LABEL = "batch.kubernetes.io/job-name"
SUBMITTER_CONTAINER = "ray-job-submitter"
RAY_AUTH_HEADER = "X-Ray-Authorization"
HTTP_TIMEOUT_SECONDS = 30


class LogsUnavailable(Exception):
    """Why there is no driver log to show (yet, or any more); the message says where to look."""


@dataclass(frozen=True)
class DashboardLogs:
    """The Ray job's log on a running head, through the service proxy."""

    namespace: str
    service: str
    port: int
    submission_id: str
    token_secret: str | None  # the Secret with the cluster's Ray token; None without token auth

    def proxy_target(self) -> str:
        """The Service and port the API server proxies to (`<head-svc>:8265`)."""
        return f"{self.service}:{self.port}"

    def dashboard_path(self) -> str:
        """The Ray Jobs API's path of the job's logs on the dashboard."""
        return f"api/jobs/{self.submission_id}/logs"

    def proxy_url_path(self) -> str:
        """The whole request path on the API server."""
        return f"/api/v1/namespaces/{self.namespace}/services/{self.proxy_target()}/proxy/{self.dashboard_path()}"


@dataclass(frozen=True)
class SubmitterLogs:
    """The submitter pod's log: the copy that outlives the cluster."""

    namespace: str
    job_name: str  # the submitter Job (= the RayJob's name)
    cluster_gone: str  # why the head cannot be asked, for the message if this fails too

    def selector(self) -> str:
        return f"{SUBMITTER_JOB_LABEL}={self.job_name}"

    def kubectl(self) -> str:
        return f"kubectl logs job/{self.job_name} -n {self.namespace}"


def locate(job: dict[str, Any], rayjob: dict[str, Any] | None,
           raycluster: dict[str, Any] | None) -> DashboardLogs | SubmitterLogs:
    """Where the driver's log of `job` is, given its RayJob and RayCluster as they are now (None:
    gone or not made). Raises LogsUnavailable when there is none yet or none any more."""
    meta, status = job["metadata"], job.get("status") or {}
    name, namespace = meta["name"], meta["namespace"]
    rayjob_name = status.get("rayJobName")
    if not rayjob_name:
        reason = status.get("reason") or "not reviewed yet"
        raise LogsUnavailable(f"{name} has no RayJob yet (state {status.get('state', 'Pending')}, {reason}), so no "
                              f"driver ran: `kubectl describe ej {name} -n {namespace}` says why")
    if rayjob is None:
        raise LogsUnavailable(f"the RayJob {rayjob_name} of {name} is gone, and with it the submitter Job that held "
                              "the driver's log")
    ray_status = rayjob.get("status") or {}
    submission_id = ray_status.get("jobId")
    if raycluster is not None and submission_id:
        head = (raycluster.get("status") or {}).get("head") or {}
        port = ((raycluster.get("status") or {}).get("endpoints") or {}).get("dashboard") or DASHBOARD_PORT
        service = head.get("serviceName") or f"{raycluster['metadata']['name']}{HEAD_SERVICE_SUFFIX}"
        return DashboardLogs(namespace, service, int(port), submission_id, auth_secret_name(raycluster))
    if raycluster is None and ray_status.get("rayClusterName"):
        gone = f"the RayCluster {ray_status['rayClusterName']} is already gone"
    elif raycluster is None:
        gone = "the job has no RayCluster now (suspended, finished, or not started)"
    else:
        gone = f"the RayJob {rayjob_name} has not submitted the driver yet " \
               f"(jobDeploymentStatus {ray_status.get('jobDeploymentStatus', 'unknown')})"
    return SubmitterLogs(namespace, rayjob_name, gone)


def _kube():
    import kubernetes

    from controller.kube import api_client

    try:
        client = api_client()
    except kubernetes.config.ConfigException as exc:
        raise LogsUnavailable(f"no Kubernetes credentials (in-cluster or kubeconfig): {exc}") from None
    return client, kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)


def _get(call, *args) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    from controller.kube import NOT_FOUND

    try:
        return call(*args)
    except ApiException as exc:
        if exc.status == NOT_FOUND:
            return None
        raise


def _read_dashboard(client, core, where: DashboardLogs) -> str:
    from kubernetes.client.exceptions import ApiException

    if where.token_secret:
        secret = _get(core.read_namespaced_secret, where.token_secret, where.namespace)
        token = (secret.data or {}).get(AUTH_TOKEN_KEY) if secret else None
        if not token:
            raise LogsUnavailable(f"the Ray token Secret {where.token_secret} (key {AUTH_TOKEN_KEY}) is missing")
        # this client serves this one command: the header goes only to the API server and, through it, the head
        client.set_default_header(RAY_AUTH_HEADER, f"Bearer {base64.b64decode(token).decode()}")
    try:
        response = core.connect_get_namespaced_service_proxy_with_path(
            where.proxy_target(), where.namespace, where.dashboard_path(), _preload_content=False,
            _request_timeout=HTTP_TIMEOUT_SECONDS)
        status, body = response.status, response.data
    except ApiException as exc:  # older clients raise on an error status
        status, body = exc.status, exc.body
    if status != 200:
        raise LogsUnavailable(f"the Ray dashboard answered HTTP {status} to GET {where.proxy_url_path()}: "
                              f"{_detail(body)}")
    return json.loads(body).get("logs", "")


def _detail(body: str | bytes | None) -> str:
    """The start of an error response's body, on one line."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body or ""
    return " ".join(text.split())[:300]


def _read_submitter(core, where: SubmitterLogs) -> str:
    from kubernetes.client.exceptions import ApiException

    pods = core.list_namespaced_pod(where.namespace, label_selector=where.selector()).items
    if not pods:
        raise LogsUnavailable(f"{where.cluster_gone}, and the submitter Job {where.job_name} has no pod to read")
    newest = max(pods, key=lambda pod: pod.metadata.creation_timestamp)
    try:
        return core.read_namespaced_pod_log(newest.metadata.name, where.namespace, container=SUBMITTER_CONTAINER,
                                            _request_timeout=HTTP_TIMEOUT_SECONDS)
    except ApiException as exc:
        raise LogsUnavailable(f"{where.cluster_gone}, and the submitter pod {newest.metadata.name}'s log could not "
                              f"be read (HTTP {exc.status}: {_detail(exc.body) or exc.reason}); try "
                              f"`{where.kubectl()}`") from None


def driver_log(name: str, namespace: str) -> str:
    """The driver's log of the EmbeddingJob `name`; raises LogsUnavailable saying why not."""
    from controller.kube import RAYCLUSTERS

    client, core, custom = _kube()
    job = _get(custom.get_namespaced_custom_object, api.GROUP, api.VERSION, namespace, api.PLURAL, name)
    if job is None:
        raise LogsUnavailable(f"no EmbeddingJob {name!r} in namespace {namespace!r}")
    rayjob_name = (job.get("status") or {}).get("rayJobName")
    rayjob = rayjob_name and _get(custom.get_namespaced_custom_object, RAY_GROUP, RAY_VERSION, namespace,
                                  RAY_PLURAL, rayjob_name)
    cluster_name = ((rayjob or {}).get("status") or {}).get("rayClusterName")
    raycluster = cluster_name and _get(custom.get_namespaced_custom_object, RAY_GROUP, RAY_VERSION, namespace,
                                       RAYCLUSTERS, cluster_name)
    where = locate(job, rayjob or None, raycluster or None)
    if isinstance(where, DashboardLogs):
        return _read_dashboard(client, core, where)
    print(f"embedjob: {where.cluster_gone}; showing the submitter pod's copy of the driver's log", file=sys.stderr)
    return _read_submitter(core, where)


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(COMMAND, help="print the driver's log of an EmbeddingJob on the cluster")
    parser.add_argument("name", help="the EmbeddingJob's name")
    parser.add_argument("-n", "--namespace", default=None,
                        help="its namespace (default: the kubeconfig context's, else default)")


def run(args: argparse.Namespace) -> int:
    namespace = args.namespace or _context_namespace()
    try:
        sys.stdout.write(driver_log(args.name, namespace))
    except LogsUnavailable as exc:
        print(f"embedjob: no driver log for {args.name}: {exc}", file=sys.stderr)
        return ExitCode.JOB_FAILED
    except Exception as exc:  # an API or network error: one line, never a traceback
        print(f"embedjob: reading the driver log of {args.name} failed: {type(exc).__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr)
        return ExitCode.JOB_FAILED
    return ExitCode.SUCCEEDED


def _context_namespace() -> str:
    import kubernetes

    try:
        _, context = kubernetes.config.list_kube_config_contexts()
    except (kubernetes.config.ConfigException, OSError):
        return "default"
    return (context or {}).get("context", {}).get("namespace") or "default"
