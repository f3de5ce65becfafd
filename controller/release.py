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
REQUEST_TIMEOUT_SECONDS = 30


def release_patch(job: dict[str, Any]) -> dict[str, Any]:
    """A merge patch that marks the job released and drops our finalizer; the resourceVersion
    makes it fail (409) rather than drop a finalizer someone added meanwhile."""
    meta = job["metadata"]
    return {"metadata": {
        "resourceVersion": meta["resourceVersion"],
        "annotations": {RELEASED: "true"},
        "finalizers": [f for f in meta.get("finalizers") or [] if f != FINALIZER],
    }}


def _release_one(custom: kubernetes.client.CustomObjectsApi, job: dict[str, Any]) -> None:
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    for _ in range(ATTEMPTS):
        try:
            custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                                  release_patch(job), _request_timeout=REQUEST_TIMEOUT_SECONDS)
            return
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                return
            if exc.status != CONFLICT:
                raise
        try:
            job = custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                                      _request_timeout=REQUEST_TIMEOUT_SECONDS)
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                return
            raise
    raise RuntimeError(f"{namespace}/{name}: kept changing, not released after {ATTEMPTS} attempts")


def release_jobs(custom: kubernetes.client.CustomObjectsApi, namespaces: tuple[str, ...]) -> list[str]:
    """Release every job in `namespaces` (empty: all); returns their `namespace/name`s."""
    if namespaces:
        listings = [custom.list_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL,
                                                         _request_timeout=REQUEST_TIMEOUT_SECONDS)
                    for ns in namespaces]
    else:
        try:
            listings = [custom.list_cluster_custom_object(api.GROUP, api.VERSION, api.PLURAL,
                                                          _request_timeout=REQUEST_TIMEOUT_SECONDS)]
        except ApiException as exc:
            if exc.status != NOT_FOUND:  # the CRD is gone already: nothing to release
                raise
            listings = []
    released = []
    for job in (job for listing in listings for job in listing.get("items", [])):
        _release_one(custom, job)
        released.append(f"{job['metadata']['namespace']}/{job['metadata']['name']}")
    return released


def release_terminating(client: kubernetes.client.ApiClient, namespaces: tuple[str, ...]) -> list[str]:
    """At the start of an operator watching `namespaces`: release the jobs of those already being
    deleted. kopf never watches a namespace that is terminating when it starts, so their finalizer
    would never come off and the namespace would stay Terminating; the namespace controller
    deletes their RayJobs."""
    core = kubernetes.client.CoreV1Api(client)
    terminating = []
    for namespace in namespaces:
        try:
            found = core.read_namespace(namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS)
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                continue
            raise
        if found.metadata.deletion_timestamp is not None:
            terminating.append(namespace)
    # never release_jobs(()): that releases every job of the cluster
    return release_jobs(kubernetes.client.CustomObjectsApi(client), tuple(terminating)) if terminating else []


def main() -> None:
    settings = Settings.from_env()
    released = release_jobs(kubernetes.client.CustomObjectsApi(api_client()), settings.watch_namespaces)
    for job in released:
        print(f"released {job}")
    print(f"{len(released)} EmbeddingJob(s) released from the operator", file=sys.stderr)


if __name__ == "__main__":
    main()
