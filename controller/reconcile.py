"""What the handlers do, over the pure modules: review and launch, track status, clean up.

`launch` makes sure one EmbeddingJob has exactly one RayJob: its name is a function of
the job's uid, an existing RayJob (from the watch index, or the 409 of a create) is
adopted only when this job owns it, and a finished job never gets a new one.
`track` is the only writer of the job's status.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable

from . import acceptance, metrics, status
from .acceptance import ACCEPTED, Verdict
from .kube import Cluster
from .metrics import JobStates
from .progress import ProgressReader, ProgressUnavailable
from .rayjob import build_rayjob, owned_by, rayjob_name
from .settings import Settings

# KubeRay deployment states in which the driver reports progress (or has reported its last).
PROGRESS_STATES = ("Running", "Complete", "Failed")


class Wakeups:
    """Per-job events that wake a job's status tracker early (a RayJob changed, a review ended)."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def register(self, uid: str) -> asyncio.Event:
        return self._events.setdefault(uid, asyncio.Event())

    def wake(self, uid: str | None) -> None:
        event = self._events.get(uid) if uid else None
        if event is not None:
            event.set()

    def forget(self, uid: str) -> None:
        self._events.pop(uid, None)


@dataclass
class Context:
    """What every handler shares (kept in kopf's operator-wide memo)."""

    settings: Settings
    cluster: Cluster
    progress: ProgressReader | None
    wakeups: Wakeups
    job_states: JobStates


def own_rayjob(candidates: Iterable[dict[str, Any]], job_uid: str) -> dict[str, Any] | None:
    return next((rj for rj in candidates if owned_by(rj, job_uid)), None)


async def launch(job: dict[str, Any], known_rayjobs: Iterable[dict[str, Any]], ctx: Context) -> Verdict:
    """Review the job and make sure its one RayJob exists, suspended as the spec says."""
    meta, spec = job["metadata"], job["spec"]
    if status.is_final(job.get("status") or {}):
        return ACCEPTED
    rayjob = own_rayjob(known_rayjobs, meta["uid"])
    if rayjob is None:
        parsed = acceptance.parse(spec)
        if isinstance(parsed, Verdict):
            return parsed
        secret = await ctx.cluster.read_secret(meta["namespace"], parsed.sink.database_secret_ref.name)
        verdict = acceptance.review(parsed, secret)
        if not verdict.accepted:
            return verdict
        rayjob = await ctx.cluster.create_or_get_rayjob(build_rayjob(job, ctx.settings))
        if not owned_by(rayjob, meta["uid"]):
            return Verdict(False, "RayJobConflict",
                           f"RayJob {rayjob['metadata']['name']!r} exists and is not owned by this job")
    suspend = bool(spec.get("suspend"))
    if bool((rayjob.get("spec") or {}).get("suspend")) != suspend:
        await ctx.cluster.set_rayjob_suspend(meta["namespace"], rayjob["metadata"]["name"], suspend)
    return ACCEPTED


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def observe(job: dict[str, Any], current: dict[str, Any], rayjob: dict[str, Any] | None,
                  verdict: Verdict | None, ctx: Context) -> status.Observation:
    run, progress_error = None, None
    deployment = ((rayjob or {}).get("status") or {}).get("jobDeploymentStatus")
    if ctx.progress is not None and deployment in PROGRESS_STATES and not status.is_final(current):
        try:
            run = await asyncio.to_thread(ctx.progress.latest, job["metadata"]["uid"])
        except ProgressUnavailable as exc:
            progress_error = str(exc)
    return status.Observation(
        generation=job["metadata"].get("generation") or 0,
        suspend=bool(job["spec"].get("suspend")),
        verdict=verdict,
        rayjob=rayjob,
        run=run,
        progress_error=progress_error,
        now=_now(),
    )


async def sync_status(job: dict[str, Any], current: dict[str, Any], obs: status.Observation,
                      ctx: Context) -> tuple[dict[str, Any], list[status.Transition]]:
    """Write what changed in the status; return the status now stored and the transitions."""
    desired = status.desired_status(current, obs)
    if desired is None:
        return current, []
    patch = status.status_patch(current, desired)
    if not patch:
        return current, []
    meta = job["metadata"]
    stored = await ctx.cluster.patch_job_status(meta["namespace"], meta["name"], patch)
    return stored, status.transitions(current, desired)


@dataclass
class Tracker:
    """Inputs of `track` that kopf provides per job (live views, read on every round)."""

    job: Callable[[], dict[str, Any]]  # the job as kopf saw it last
    rayjobs: Callable[[], Iterable[dict[str, Any]]]  # RayJobs labelled with the job's uid
    verdict: Callable[[], Verdict | None]  # the latest review of this operator
    stopped: Callable[[], bool]
    sleep: Callable[[asyncio.Event, float], Awaitable[None]]
    emit: Callable[[status.Transition], None]  # post an Event


async def track(tracker: Tracker, ctx: Context) -> None:
    """Keep the job's status up to date until it is final (or the operator stops)."""
    job = tracker.job()
    uid = job["metadata"]["uid"]
    wakeup = ctx.wakeups.register(uid)
    # This loop is the only writer of the status: what it wrote last is fresher than
    # the watched body, which may not have caught up yet.
    current = job.get("status") or {}
    try:
        while not tracker.stopped():
            wakeup.clear()
            job = tracker.job()
            rayjob = own_rayjob(tracker.rayjobs(), uid)
            with metrics.reconcile("status"):
                obs = await observe(job, current, rayjob, tracker.verdict(), ctx)
                current, changes = await sync_status(job, current, obs, ctx)
            for change in changes:
                tracker.emit(change)
            if current.get("state"):
                ctx.job_states.set(uid, current["state"])
            if status.is_final(current):
                return
            await tracker.sleep(wakeup, ctx.settings.progress_interval_seconds)
    finally:
        ctx.wakeups.forget(uid)


# How often the finalizer looks whether the RayJob is gone.
CLEANUP_POLL_SECONDS = 1.0


async def cleanup(job: dict[str, Any], ctx: Context) -> bool:
    """Delete the job's RayJob (no garbage collector is relied on) and wait until it is
    gone; False when it is still there after EMBEDJOB_CLEANUP_TIMEOUT_SECONDS."""
    meta = job["metadata"]
    ctx.job_states.forget(meta["uid"])
    name = (job.get("status") or {}).get("rayJobName") or rayjob_name(meta["name"], meta["uid"])
    deadline = time.monotonic() + ctx.settings.cleanup_timeout_seconds
    while not await ctx.cluster.delete_rayjob(meta["namespace"], name):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(CLEANUP_POLL_SECONDS)
    return True
