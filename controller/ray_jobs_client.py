"""The Ray Jobs REST API of a shared RayCluster's dashboard: where it is, its token Secret, and the client.

The operator does not import Ray: it runs jobs on a cluster (such as
`python -m embedjob_worker.pools remove`) through the dashboard's REST API, with the
cluster's token as `Authorization: Bearer`. Errors never carry the token.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

# KubeRay's defaults: the head Service `<cluster>-head-svc`, the dashboard on 8265, and
# the token Secret named like the cluster with the key `auth_token`.
DASHBOARD_PORT = 8265
HEAD_SERVICE_SUFFIX = "-head-svc"
AUTH_TOKEN_KEY = "auth_token"
HTTP_TIMEOUT_SECONDS = 10
JOB_POLL_SECONDS = 0.5
FINISHED_JOB_STATES = ("SUCCEEDED", "FAILED", "STOPPED")


def dashboard_url(raycluster: dict[str, Any]) -> str:
    """The dashboard of a RayCluster as KubeRay reports it: the head Service's cluster IP
    (or its DNS name until the IP is known) and the `dashboard` endpoint's port."""
    meta, status = raycluster["metadata"], raycluster.get("status") or {}
    head = status.get("head") or {}
    port = (status.get("endpoints") or {}).get("dashboard") or DASHBOARD_PORT
    service = head.get("serviceName") or f"{meta['name']}{HEAD_SERVICE_SUFFIX}"
    host = head.get("serviceIP") or f"{service}.{meta['namespace']}.svc"
    return f"http://{host}:{port}"


def auth_secret_name(raycluster: dict[str, Any]) -> str | None:
    """The Secret holding the cluster's Ray token (key `auth_token`); None without token auth.
    KubeRay uses `authOptions.secretName`, else generates one named like the cluster."""
    auth = (raycluster.get("spec") or {}).get("authOptions") or {}
    if auth.get("mode") != "token":
        return None
    return auth.get("secretName") or raycluster["metadata"]["name"]


class DashboardError(Exception):
    """A call to a Ray dashboard failed; the message never holds the token."""


class RayJobsClient:
    """The Ray Jobs REST API of one cluster (POST /api/jobs/, GET /api/jobs/<id>)."""

    def __init__(self, url: str, token: str | None):
        self.url = url.rstrip("/")
        self._token = token

    def __repr__(self) -> str:  # never the token
        return f"RayJobsClient({self.url!r})"

    def _call(self, method: str, path: str, body: dict | None = None) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(self.url + path, method=method, headers=headers,
                                         data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECONDS) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read(300).decode(errors="replace").strip()
            raise DashboardError(f"{method} {self.url}{path}: HTTP {exc.code} {detail}") from None
        except (OSError, ValueError) as exc:
            raise DashboardError(f"{method} {self.url}{path}: {type(exc).__name__}: {exc}") from None

    def submit(self, entrypoint: str, submission_id: str) -> str:
        reply = self._call("POST", "/api/jobs/", {"entrypoint": entrypoint, "submission_id": submission_id})
        return reply.get("submission_id", submission_id)

    def job(self, submission_id: str) -> dict[str, Any]:
        return self._call("GET", f"/api/jobs/{submission_id}")

    def logs(self, submission_id: str) -> str:
        return self._call("GET", f"/api/jobs/{submission_id}/logs").get("logs", "")

    def stop(self, submission_id: str) -> None:
        self._call("POST", f"/api/jobs/{submission_id}/stop")

    def run(self, entrypoint: str, submission_id: str, timeout_s: float) -> str:
        """Submit a job, wait for it to finish; its logs if it succeeded. A job still running
        after `timeout_s` is stopped (and the error says whether stopping worked)."""
        self.submit(entrypoint, submission_id)
        deadline = time.monotonic() + timeout_s
        while (status := self.job(submission_id).get("status")) not in FINISHED_JOB_STATES:
            if time.monotonic() > deadline:
                try:
                    self.stop(submission_id)
                    stopped = "stopped"
                except DashboardError as exc:
                    stopped = f"stopping it failed: {exc}"
                raise DashboardError(f"Ray job {submission_id} still {status} after {timeout_s:.0f}s; {stopped}")
            time.sleep(JOB_POLL_SECONDS)
        if status != "SUCCEEDED":
            raise DashboardError(f"Ray job {submission_id} {status}: {self.logs(submission_id)[-500:]}")
        return self.logs(submission_id)
