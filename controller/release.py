"""`python -m controller.release`: releases every EmbeddingJob from the operator, so deleting it never waits.

Run before the operator goes for good (the chart's pre-delete hook runs it on
`helm uninstall`). Each job in the watched namespaces (`EMBEDJOB_WATCH_NAMESPACES`,
empty: all) gets the annotation `embedjob.dev/released` and loses the finalizer
`embedjob.dev/cleanup`. An operator that still runs no longer guards a released job
(its deletion handler skips them, so kopf neither adds the finalizer back nor waits on
it); deleting the jobs, their namespaces or the CRD afterwards completes, and the
RayJobs go with their owner through the garbage collector. It needs what the operator
has: `list` and `patch` on EmbeddingJobs.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from embedjob import api

from .kube import CONFLICT, NOT_FOUND, api_client
from .settings import Settings

FINALIZER = f"{api.GROUP}/cleanup"
RELEASED = f"{api.GROUP}/released"
ATTEMPTS = 5
REQUEST_TIMEOUT_SECONDS: float | tuple[float, float] = 30
# How often an operator with watchNamespaces looks for a watched namespace being deleted (release_terminating),
# and the bounds (connect, read) of that round's calls, made by a client that does not retry them: a read
# retried 3 times by urllib3 held a round for 2 minutes after an API server restart; the next round retries.
TERMINATING_POLL_SECONDS = 5.0
TERMINATING_REQUEST_TIMEOUT = (5.0, 10.0)
log = logging.getLogger("controller.release")


def release_patch(job: dict[str, Any]) -> dict[str, Any]:
    """A merge patch that marks the job released and drops our finalizer; the resourceVersion
    makes it fail (409) rather than drop a finalizer someone added meanwhile."""
    meta = job["metadata"]
    return {"metadata": {
        "resourceVersion": meta["resourceVersion"],
        "annotations": {RELEASED: "true"},
        "finalizers": [f for f in meta.get("finalizers") or [] if f != FINALIZER],
    }}


def _release_one(custom: kubernetes.client.CustomObjectsApi, job: dict[str, Any],
                 timeout: float | tuple[float, float]) -> None:
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    for _ in range(ATTEMPTS):
        try:
            custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                                  release_patch(job), _request_timeout=timeout)
            return
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                return
            if exc.status != CONFLICT:
                raise
        try:
            job = custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                                      _request_timeout=timeout)
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                return
            raise
    raise RuntimeError(f"{namespace}/{name}: kept changing, not released after {ATTEMPTS} attempts")


def guarded(job: dict[str, Any]) -> bool:
    """Whether the job is not released yet: it has our finalizer or lacks the released annotation."""
    meta = job["metadata"]
    return FINALIZER in (meta.get("finalizers") or []) or (meta.get("annotations") or {}).get(RELEASED) != "true"


def release_jobs(custom: kubernetes.client.CustomObjectsApi, namespaces: tuple[str, ...],
                 guarded_only: bool = False,
                 timeout: float | tuple[float, float] = REQUEST_TIMEOUT_SECONDS) -> list[str]:
    """Release every job in `namespaces` (empty: all), or only those not released yet; returns their
    `namespace/name`s. `timeout`: each call's."""
    if namespaces:
        listings = [custom.list_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL,
                                                         _request_timeout=timeout)
                    for ns in namespaces]
    else:
        try:
            listings = [custom.list_cluster_custom_object(api.GROUP, api.VERSION, api.PLURAL,
                                                          _request_timeout=timeout)]
        except ApiException as exc:
            if exc.status != NOT_FOUND:  # the CRD is gone already: nothing to release
                raise
            listings = []
    released = []
    for job in (job for listing in listings for job in listing.get("items", [])):
        if guarded_only and not guarded(job):
            continue
        _release_one(custom, job, timeout)
        released.append(f"{job['metadata']['namespace']}/{job['metadata']['name']}")
    return released


def release_terminating(client: kubernetes.client.ApiClient, namespaces: tuple[str, ...]) -> list[str]:
    """Release the guarded jobs of the watched `namespaces` that are being deleted; returns those released.
    kopf cannot be relied on there: it never watches a namespace that is already terminating when it starts,
    and it stops watching one whose deletion conditions all read False for a moment, while our finalizer
    still holds it; so the jobs' finalizers would never come off and the namespace would stay Terminating.
    The namespace controller deletes their RayJobs."""
    # One list a round, whatever the number of watched namespaces (namespaced mode may list them: kopf does).
    listed = kubernetes.client.CoreV1Api(client).list_namespace(_request_timeout=TERMINATING_REQUEST_TIMEOUT)
    terminating = [ns.metadata.name for ns in listed.items
                   if ns.metadata.name in namespaces and ns.metadata.deletion_timestamp is not None]
    # never release_jobs(()): that releases every job of the cluster
    return release_jobs(kubernetes.client.CustomObjectsApi(client), tuple(terminating), guarded_only=True,
                        timeout=TERMINATING_REQUEST_TIMEOUT) if terminating else []


async def release_terminating_forever(client: kubernetes.client.ApiClient, namespaces: tuple[str, ...],
                                      interval_seconds: float = TERMINATING_POLL_SECONDS) -> None:
    """release_terminating every `interval_seconds`, from the operator's start (watchNamespaces only: cluster-wide,
    kopf watches every namespace with a ClusterRole that a namespace's deletion cannot take away)."""
    while True:
        try:
            for job in await asyncio.to_thread(release_terminating, client, namespaces):
                log.info(f"released {job}: its namespace is being deleted")
        except Exception as exc:  # noqa: BLE001 - an API server away for a while: the next round tries again
            log.warning(f"releasing the jobs of watched namespaces being deleted failed, tried again in "
                        f"{interval_seconds:g} s: {exc}")
        await asyncio.sleep(interval_seconds)


def main() -> None:
    settings = Settings.from_env()
    released = release_jobs(kubernetes.client.CustomObjectsApi(api_client()), settings.watch_namespaces)
    for job in released:
        print(f"released {job}")
    print(f"{len(released)} EmbeddingJob(s) released from the operator", file=sys.stderr)


if __name__ == "__main__":
    main()
