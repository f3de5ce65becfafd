"""What the handlers do, over the pure modules: review and launch, keep status, clean up.

`launch` makes sure one EmbeddingJob has exactly one RayJob: its name is a function of
the job's uid, an existing RayJob (from the watch index, or the 409 of a create) is
adopted only when this job owns it, and a finished job, or one whose RayJob was deleted,
never gets a new one.
`controller.keeper` is the only writer of the jobs' status.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable

from kubernetes.client.exceptions import ApiException

from . import acceptance, queueing, scheduled_runs, status, waiting
from .acceptance import ACCEPTED, SCHEDULE_ACCEPTED, Verdict
from .kube import KubeApi, refused_as_namespace_goes
from .metrics import JobStates
from .pool_sweeper import PoolSweeper
from .rayjob import build_rayjob, owned_by, rayjob_name
from .run_reader import RunReader, RunUnavailable
from .schedule_plan import Run
from .settings import Settings
from .times import rfc3339

# KubeRay deployment states in which the driver reports progress (or has reported its last).
PROGRESS_STATES = ("Running", "Complete", "Failed")
# KubeRay deployment states before the job runs: what it waits for is read from its pods.
WAITING_STATES = ("", "Initializing", "Waiting")


@dataclass
class Context:
    """What every handler shares (kept in kopf's operator-wide memo)."""

    settings: Settings
    kube: KubeApi
    runs: RunReader | None  # None without EMBEDJOB_DATABASE_URL: no progress to read
    job_states: JobStates
    pool_sweeper: PoolSweeper | None = None  # None without EMBEDJOB_DATABASE_URL: no pool leases to read

    def pool_released(self, spec: dict[str, Any]) -> None:
        """A job on a shared cluster ended or went away: its pool may become idle."""
        if self.pool_sweeper is not None and spec.get("clusterSelector"):
            self.pool_sweeper.wake()


def job_ref(meta: dict[str, Any]) -> dict[str, Any]:
    """`extra` for a log record about a job: kopf's formatters prefix `[namespace/name]` (plain)
    or add an `object` field (JSON)."""
    return {"k8s_ref": {"kind": "EmbeddingJob", "namespace": meta.get("namespace"), "name": meta.get("name"),
                        "uid": meta.get("uid")}}


class SpecChanged(Exception):
    """The job changed between its review and its acceptance: review the new version."""


class NamespaceTerminating(Exception):
    """A call of the review was refused (403) in a namespace being deleted: nothing is launched there any more."""


def own_rayjob(candidates: Iterable[dict[str, Any]], job_meta: dict[str, Any]) -> dict[str, Any] | None:
    return next((rj for rj in candidates if owned_by(rj, job_meta)), None)


async def launch(job: dict[str, Any], known_rayjobs: Iterable[dict[str, Any]], ctx: Context,
                 accept: Callable[[dict[str, Any]], Awaitable[bool]],
                 created: Callable[[dict[str, Any]], Awaitable[None]] | None = None) -> Verdict:
    """Review the job and make sure its one RayJob exists, suspended as the spec says.

    The job is marked accepted (reason ReviewPassed) (`accept`, guarded by the reviewed resourceVersion) before
    the RayJob is created: from then on the API server refuses spec edits, so the RayJob
    always runs the spec that `observedGeneration` names. An edit that came first raises
    SpecChanged, and the new version is reviewed instead. `created(rayjob)` is told of the
    RayJob as soon as it exists (the status records its name, and says RayJobCreated from then on).
    A create the API server refuses (a ResourceQuota, an admission policy) is a refusal,
    RayJobCreateRefused with the API server's message: reviewed again like any refused job.
    A call refused (403) in a namespace being deleted raises NamespaceTerminating: the namespace controller may
    delete the RoleBinding that grants the calls while kopf still runs this handler for the job (a CI run)."""
    try:
        return await _launch(job, known_rayjobs, ctx, accept, created)
    except ApiException as exc:
        if await refused_as_namespace_goes(ctx.kube, exc, job["metadata"]["namespace"]):
            raise NamespaceTerminating(f"namespace {job['metadata']['namespace']} is being deleted") from exc
        raise


async def _launch(job: dict[str, Any], known_rayjobs: Iterable[dict[str, Any]], ctx: Context,
                  accept: Callable[[dict[str, Any]], Awaitable[bool]],
                  created: Callable[[dict[str, Any]], Awaitable[None]] | None) -> Verdict:
    meta, spec = job["metadata"], job["spec"]
    if status.is_final(job.get("status") or {}):
        return ACCEPTED
    rayjob = own_rayjob(known_rayjobs, meta)
    if rayjob is None and (job.get("status") or {}).get("rayJobName"):
        return ACCEPTED  # it had one, deleted since: the status says so (RayJobDeleted); never a second run
    if rayjob is None:
        parsed = acceptance.parse(spec)
        if isinstance(parsed, Verdict):
            return parsed
        secret = await ctx.kube.read_secret(meta["namespace"], parsed.sink.database_secret_ref.name)
        shared = acceptance.selected_cluster(parsed)
        raycluster = await ctx.kube.get_raycluster(meta["namespace"], shared) if shared else None
        verdict = (queueing.refusal(parsed, ctx.settings)
                   or acceptance.review(parsed, secret, raycluster, ctx.settings.pod_policy))
        if not verdict.accepted:
            return verdict
        if (too_long := acceptance.check_scheduled_name(meta["name"], parsed)) is not None:
            return too_long
        if not status.accepted(job.get("status") or {}) and not await accept(job):
            raise SpecChanged(f"generation {meta.get('generation')} was edited during its review")
        if parsed.schedule is not None:
            return SCHEDULE_ACCEPTED  # no RayJob of its own: controller.scheduler starts its runs
        manifest = build_rayjob(job, parsed, ctx.settings)
        try:
            rayjob = await ctx.kube.create_or_get_rayjob(manifest)
        except ApiException as exc:  # a quota, an admission policy, RBAC: the job must not read as created
            if exc.status is None or exc.status >= 500 or exc.status == 429:
                raise  # the API server is busy or down, not refusing: kopf retries the handler
            return create_refused(manifest["metadata"]["name"], exc)
        if not owned_by(rayjob, meta):
            return Verdict(False, "RayJobConflict",
                           f"RayJob {rayjob['metadata']['name']!r} exists and is not owned by this job")
        if created is not None:
            await created(rayjob)
    # Kueue owns a queued RayJob's suspend (it unsuspends an admitted one). The desired value is sent
    # whatever the watched copy says, which may be stale (a patch that changes nothing writes nothing).
    if queueing.queue_of(rayjob) is None:
        await ctx.kube.set_rayjob_suspend(meta["namespace"], rayjob["metadata"]["name"], rayjob["metadata"]["uid"],
                                          bool(spec.get("suspend")))
    return ACCEPTED


def create_refused(name: str, exc: ApiException) -> Verdict:
    """The API server's refusal to create the RayJob, with its own message (e.g. the quota's)."""
    try:
        message = json.loads(exc.body or "")["message"]
    except (ValueError, TypeError, KeyError):
        message = exc.body or ""
    detail = f": {message}" if message else ""
    return Verdict(False, "RayJobCreateRefused",
                   f"the API server refused to create RayJob {name!r} ({exc.status} {exc.reason}){detail}")


def _now() -> str:
    return rfc3339(dt.datetime.now(dt.UTC))


async def rayjob_deleted(job: dict[str, Any], current: dict[str, Any], rayjob: dict[str, Any] | None,
                         ctx: Context) -> bool:
    """The unfinished job's RayJob existed (its name is in the status), is not in the watch
    index, and the API server confirms it is gone (the index alone may lag behind); a RayJob of
    that name that the job does not own is not its RayJob."""
    name = current.get("rayJobName")
    if rayjob is not None or not name or status.is_final(current):
        return False
    stored = await ctx.kube.get_rayjob(job["metadata"]["namespace"], name)
    return stored is None or not owned_by(stored, job["metadata"])


async def observe_waiting(job: dict[str, Any], rayjob: dict[str, Any] | None,
                          ctx: Context) -> waiting.Waiting | None:
    """What a job whose RayJob has not started waits for: its RayCluster, its pods and its
    submitter's pod. None for other jobs: the reads happen only while a job waits, at the pace
    of its status syncs (RayJob changes, EMBEDJOB_PROGRESS_INTERVAL_SECONDS)."""
    rj_status = (rayjob or {}).get("status") or {}
    if rayjob is None or rj_status.get("jobDeploymentStatus", "") not in WAITING_STATES or job["spec"].get("suspend"):
        return None
    namespace, cluster = job["metadata"]["namespace"], rj_status.get("rayClusterName")
    if not cluster:
        return waiting.waiting_for(None, None, [], [])
    try:
        raycluster = await ctx.kube.get_raycluster(namespace, cluster)
        pods = await ctx.kube.list_pods(namespace, f"{waiting.CLUSTER_LABEL}={cluster}")
        submitter = await ctx.kube.list_pods(namespace, f"{waiting.JOB_NAME_LABEL}={rayjob['metadata']['name']}")
    except ApiException as exc:
        return waiting.Waiting(waiting.INITIALIZING, f"RayCluster {cluster}: its pods cannot be read "
                               f"({exc.status} {exc.reason})")
    return waiting.waiting_for(cluster, raycluster, pods, submitter)


async def observe(job: dict[str, Any], current: dict[str, Any], rayjob: dict[str, Any] | None,
                  verdict: Verdict | None, generation: int, ctx: Context,
                  runs: list[Run] | None = None) -> status.Observation:
    """What the status is computed from now; `generation`: the one the verdict was given for; `runs`: a
    scheduled job's (controller.scheduled_runs)."""
    schedule = scheduled_runs.schedule_spec(job["spec"])
    if schedule is not None and (status.accepted(current) or (verdict is not None and verdict.accepted)):
        return status.Observation(
            generation=generation, suspend=bool(job["spec"].get("suspend")), verdict=verdict, rayjob=None, run=None,
            progress_error=None, now=_now(),
            schedule=scheduled_runs.view(current, schedule, bool(job["spec"].get("suspend")), runs or [],
                                         dt.datetime.now(dt.UTC)))
    run, progress_error = None, None
    deployment = ((rayjob or {}).get("status") or {}).get("jobDeploymentStatus")
    deleted = await rayjob_deleted(job, current, rayjob, ctx)
    if ctx.runs is not None and (deployment in PROGRESS_STATES or deleted) and not status.is_final(current):
        try:
            meta = job["metadata"]
            run = await asyncio.to_thread(ctx.runs.latest, meta["uid"], meta["namespace"], meta["name"])
        except RunUnavailable as exc:
            progress_error = str(exc)
    return status.Observation(
        generation=generation,
        suspend=bool(job["spec"].get("suspend")),
        verdict=verdict,
        rayjob=rayjob,
        rayjob_deleted=deleted,
        run=run,
        progress_error=progress_error,
        waiting=await observe_waiting(job, rayjob, ctx) if not status.is_final(current) else None,
        now=_now(),
    )


# How often the finalizer looks whether the RayJob is gone.
CLEANUP_POLL_SECONDS = 1.0


async def cleanup(job: dict[str, Any], ctx: Context) -> bool:
    """Delete the job's RayJob (no garbage collector is relied on) and wait until it is
    gone; False when it is still there after EMBEDJOB_CLEANUP_TIMEOUT_SECONDS. A RayJob of
    that name that the job does not own is never touched: the delete carries the owned one's uid.
    In a namespace being deleted nothing is asked of the RayJob: the namespace controller deletes it,
    and may already have deleted the RoleBinding that grants the operator its RayJob calls."""
    meta = job["metadata"]
    ctx.job_states.forget(meta["uid"])
    ctx.pool_released(job["spec"])
    namespace = meta["namespace"]
    if await ctx.kube.namespace_terminating(namespace):
        return True
    if scheduled_runs.schedule_spec(job["spec"]) is not None:
        # its runs go with it (each one's own finalizer deletes its RayJob); it has no RayJob of its own
        for run in await ctx.kube.list_jobs(namespace):
            if (run["metadata"].get("labels") or {}).get(scheduled_runs.LABEL_SCHEDULED_BY_UID) == meta["uid"]:
                await ctx.kube.delete_job(namespace, run["metadata"]["name"])
        return True
    name = (job.get("status") or {}).get("rayJobName") or rayjob_name(meta["name"], meta["uid"])
    deadline = time.monotonic() + ctx.settings.cleanup_timeout_seconds
    while (rayjob := await ctx.kube.get_rayjob(namespace, name)) is not None and owned_by(rayjob, meta):
        if time.monotonic() >= deadline:
            return False
        if rayjob["metadata"].get("deletionTimestamp"):
            await asyncio.sleep(CLEANUP_POLL_SECONDS)
        else:
            await ctx.kube.delete_rayjob(namespace, name, rayjob["metadata"]["uid"])
    return True
