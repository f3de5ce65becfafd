"""The few Kubernetes API calls the operator makes itself (kopf does the watching).

The official client is synchronous; every call runs in a worker thread so the event
loop (and with it every other job) never waits on one request, and every call has a
request timeout (connect, read), so a hung API server cannot hold a thread for ever.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any, Callable

import kubernetes
from kubernetes.client.exceptions import ApiException

from embedjob import api

from .rayjob import RAY_GROUP, RAY_PLURAL, RAY_VERSION

RAYCLUSTERS = "rayclusters"
EVENT_SOURCE = "embedjob-operator"

FORBIDDEN, NOT_FOUND, CONFLICT = 403, 404, 409

# Seconds to connect to the API server, and to wait for its answer.
REQUEST_TIMEOUT = (10.0, 30.0)


def api_client(retries: int | None = None) -> kubernetes.client.ApiClient:
    """In-cluster credentials, else the kubeconfig ($KUBECONFIG or ~/.kube/config). `retries`: how often
    urllib3 retries a call that failed to connect or read (None: its default, 3)."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    configuration = kubernetes.client.Configuration.get_default_copy()
    if retries is not None:
        configuration.retries = retries
    return kubernetes.client.ApiClient(configuration)


async def refused_as_namespace_goes(kube: "KubeApi", exc: ApiException, namespace: str) -> bool:
    """Whether `exc` is a 403 in a namespace being deleted: with watchNamespaces the namespace controller may
    delete the chart's RoleBinding before the operator's objects there, so such a refusal is no defect."""
    return exc.status == FORBIDDEN and await kube.namespace_terminating(namespace)


class KubeApi:
    """The operator's own calls to the Kubernetes API (one client for the whole operator)."""

    def __init__(self, client: kubernetes.client.ApiClient,
                 request_timeout: tuple[float, float] = REQUEST_TIMEOUT):
        self._client = client
        self._core = kubernetes.client.CoreV1Api(client)
        self._custom = kubernetes.client.CustomObjectsApi(client)
        self._timeout = request_timeout

    async def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API call in a worker thread, bounded by the request timeout."""
        return await asyncio.to_thread(method, *args, _request_timeout=self._timeout, **kwargs)

    @classmethod
    def from_environment(cls) -> "KubeApi":
        return cls(api_client())

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret's `data` map (values stay base64), None if it does not exist."""
        try:
            secret = await self._call(self._core.read_namespaced_secret, name, namespace)
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                return None
            raise
        return {"data": secret.data or {}}

    async def _create_or_get(self, group: str, version: str, plural: str, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create the custom object; if one of that name exists already, return that one."""
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        try:
            return await self._call(self._custom.create_namespaced_custom_object, group, version, namespace, plural,
                                    manifest)
        except ApiException as exc:
            if exc.status != CONFLICT:
                raise
        return await self._get_custom(group, version, namespace, plural, name)

    async def create_or_get_rayjob(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return await self._create_or_get(RAY_GROUP, RAY_VERSION, RAY_PLURAL, manifest)

    async def create_or_get_job(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """A scheduled job's run (controller.scheduled_runs)."""
        return await self._create_or_get(api.GROUP, api.VERSION, api.PLURAL, manifest)

    async def set_rayjob_suspend(self, namespace: str, name: str, uid: str, suspend: bool) -> None:
        """Set the RayJob's spec.suspend, if it is still the object `uid` (metadata.uid is immutable:
        the API server refuses the patch for another object of that name)."""
        await self._call(
            self._custom.patch_namespaced_custom_object,
            RAY_GROUP, RAY_VERSION, namespace, RAY_PLURAL, name,
            {"metadata": {"uid": uid}, "spec": {"suspend": suspend}},
        )

    async def _get_custom(self, group: str, version: str, namespace: str, plural: str,
                          name: str) -> dict[str, Any] | None:
        """A custom object, None if it does not exist."""
        try:
            return await self._call(self._custom.get_namespaced_custom_object, group, version, namespace, plural, name)
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                return None
            raise

    async def get_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get_custom(RAY_GROUP, RAY_VERSION, namespace, RAY_PLURAL, name)

    async def _delete(self, group: str, version: str, plural: str, namespace: str, name: str, uid: str | None) -> None:
        """Ask for the deletion of the object, only if it is the object `uid` (a precondition); one
        already gone, or replaced by another of that name, is left as it is."""
        try:
            await self._call(
                self._custom.delete_namespaced_custom_object, group, version, namespace, plural, name,
                propagation_policy="Background", body={"preconditions": {"uid": uid}} if uid else None,
            )
        except ApiException as exc:
            if exc.status not in (NOT_FOUND, CONFLICT):
                raise

    async def delete_rayjob(self, namespace: str, name: str, uid: str) -> None:
        await self._delete(RAY_GROUP, RAY_VERSION, RAY_PLURAL, namespace, name, uid)

    async def delete_job(self, namespace: str, name: str) -> None:
        """A scheduled job's run (its own finalizer deletes its RayJob)."""
        await self._delete(api.GROUP, api.VERSION, api.PLURAL, namespace, name, None)

    async def get_raycluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get_custom(RAY_GROUP, RAY_VERSION, namespace, RAYCLUSTERS, name)

    async def namespace_terminating(self, namespace: str) -> bool:
        """Whether the namespace is being deleted (or is gone)."""
        try:
            found = await self._call(self._core.read_namespace, namespace)
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                return True
            raise
        return found.metadata.deletion_timestamp is not None

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The EmbeddingJob as stored now, None if it is gone."""
        return await self._get_custom(api.GROUP, api.VERSION, namespace, api.PLURAL, name)

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The pods that carry the labels, as the API server returns them (camelCase dicts)."""
        pods = await self._call(self._core.list_namespaced_pod, namespace, label_selector=label_selector)
        return self._client.sanitize_for_serialization(pods).get("items", [])

    async def post_job_event(self, namespace: str, name: str, uid: str, reason: str, message: str,
                             warning: bool = False) -> None:
        """An Event on the EmbeddingJob, from the component `embedjob-operator` (kopf's own
        Events carry the same component: `kopf_settings`)."""
        now = dt.datetime.now(dt.UTC)
        event = kubernetes.client.CoreV1Event(
            metadata=kubernetes.client.V1ObjectMeta(generate_name=f"{name}.", namespace=namespace),
            involved_object=kubernetes.client.V1ObjectReference(
                api_version=api.API_VERSION, kind=api.KIND, name=name, namespace=namespace, uid=uid),
            reason=reason, message=message[:1024], type="Warning" if warning else "Normal", count=1,
            first_timestamp=now, last_timestamp=now,
            source=kubernetes.client.V1EventSource(component=EVENT_SOURCE),
        )
        await self._call(self._core.create_namespaced_event, namespace, event)

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any],
                               resource_version: str | None = None) -> dict[str, Any]:
        """JSON-merge-patch the EmbeddingJob's status subresource; return the new status. With
        `resource_version`, only if the job is still that version (else ApiException 409)."""
        body: dict[str, Any] = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        job = await self._call(
            self._custom.patch_namespaced_custom_object_status,
            api.GROUP, api.VERSION, namespace, api.PLURAL, name, body,
        )
        return job.get("status") or {}

    async def list_jobs(self, namespace: str) -> list[dict[str, Any]]:
        """The EmbeddingJobs that exist in the namespace."""
        jobs = await self._call(
            self._custom.list_namespaced_custom_object, api.GROUP, api.VERSION, namespace, api.PLURAL
        )
        return jobs.get("items", [])
