"""The only writer of the EmbeddingJobs' status: `StatusKeeper`, one sync at a time per job."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable, Mapping

from kubernetes.client.exceptions import ApiException

from . import events, metrics, status
from .acceptance import REVIEWED, Verdict
from .kube import CONFLICT, refused_as_namespace_goes
from .reconcile import Context, job_ref, observe, own_rayjob
from .scheduled_runs import LABEL_SCHEDULED_BY_UID, runs_of, schedule_spec

log = logging.getLogger("controller.keeper")

# Conflicts from writes that left the spec alone, retried before the acceptance gives up.
ACCEPT_ATTEMPTS = 5


async def sync_status(job: dict[str, Any], current: dict[str, Any], obs: status.Observation,
                      ctx: Context) -> tuple[dict[str, Any], list[events.Transition]]:
    """Write what changed in the status; return the status now stored and the transitions. A final
    state is never decided on a failed read of the run row (it would be frozen with whatever that
    read missed): the status stays as it is, and the next refresh reads the run again."""
    desired = status.desired_status(current, obs)
    if desired is None or (obs.progress_error and status.is_final(desired) and not status.is_final(current)):
        return current, []
    patch = status.status_patch(current, desired)
    if not patch:
        return current, []
    meta = job["metadata"]
    stored = await ctx.kube.patch_job_status(meta["namespace"], meta["name"], patch)
    return stored, events.transitions(current, desired)


class StatusKeeper:
    """The only writer of EmbeddingJob status, one sync at a time per job.

    A sync is asked for by a review, by a change of the job's RayJob and, for jobs not
    yet finished, by a periodic refresh (progress, and recovery from a failed write).
    The jobs and their RayJobs come from kopf's watch indexes; the status this keeper
    wrote last is fresher than the watched one, which may not have caught up yet.
    """

    def __init__(self, ctx: Context, emit: Callable[[dict[str, Any], events.Transition], None] | None = None):
        """`emit(job, transition)`: announce a transition; by default an Event on the job."""
        self._ctx, self._emit = ctx, emit or self._post_event
        self._posting: set[asyncio.Task] = set()
        self._jobs: Mapping[str, Iterable[dict[str, Any]]] = {}
        self._rayjobs: Mapping[tuple[str, str], Iterable[dict[str, Any]]] = {}
        self._verdicts: dict[str, tuple[Verdict, int]] = {}  #: the latest review's, with its generation
        self._written: dict[str, dict[str, Any]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._refresher: asyncio.Task | None = None

    def attach(self, jobs: Mapping[str, Iterable[dict[str, Any]]],
               rayjobs: Mapping[tuple[str, str], Iterable[dict[str, Any]]]) -> None:
        """The live indexes: job uid -> [job summary], (namespace, job uid) -> [RayJobs labelled so]."""
        self._jobs, self._rayjobs = jobs, rayjobs

    def note_verdict(self, uid: str, verdict: Verdict, generation: int) -> None:
        self._verdicts[uid] = (verdict, generation)

    def _live_job(self, uid: str) -> dict[str, Any] | None:
        """The job's summary, None once it is gone or being deleted: from its deletion on, the cleanup
        owns it (no status write, gauge change or Event for a job the user deleted, and nothing of it
        kept here after `forget`)."""
        job = next(iter(self._jobs.get(uid, ())), None)
        return None if job is None or job["metadata"].get("deletionTimestamp") else job

    def forget(self, uid: str) -> None:
        for memory in (self._verdicts, self._written, self._locks):
            memory.pop(uid, None)

    async def sync(self, uid: str, created: dict[str, Any] | None = None) -> None:
        """Write what changed in the job's status. `created`: the RayJob the job's review just created,
        which the watch may not hold yet; its name is in the status from then on, so a RayJob deleted
        before the watch saw it is still known to have existed."""
        if self._live_job(uid) is None:
            return
        async with self._locks.setdefault(uid, asyncio.Lock()):
            job = self._live_job(uid)
            if job is None:
                return
            current = self._written.get(uid, job.get("status") or {})
            watched = self._rayjobs.get((job["metadata"]["namespace"], uid), ())
            rayjob = own_rayjob([*watched, *([created] if created else [])], job["metadata"])
            namespace = job["metadata"]["namespace"]
            # A RayJob gone with its namespace did not end the job: the cleanup releases it, unreported.
            if rayjob is None and current.get("rayJobName") and await self._ctx.kube.namespace_terminating(namespace):
                return
            try:
                with metrics.reconcile("status"):
                    # observedGeneration names a reviewed generation only: an edit not reviewed yet is not observed
                    verdict, reviewed = self._verdicts.get(uid, (None, None))
                    generation = reviewed or current.get("observedGeneration") or job["metadata"].get("generation") or 0
                    runs = runs_of(uid, self._all_jobs()) if schedule_spec(job["spec"]) is not None else None
                    obs = await observe(job, current, rayjob, verdict, generation, self._ctx, runs)
                    stored, changes = await sync_status(job, current, obs, self._ctx)
            except ApiException as exc:
                if await refused_as_namespace_goes(self._ctx.kube, exc, namespace):
                    return
                raise
            self._written[uid] = stored
            for change in changes:
                self._emit(job, change)
            self._ctx.job_states.observe(uid, job, stored)
            if status.is_final(stored) and not status.is_final(current):
                self._ctx.pool_released(job["spec"])
        # a scheduled job's run changed state: the job's status lists its runs
        scheduler = job["metadata"].get("labels", {}).get(LABEL_SCHEDULED_BY_UID)
        if scheduler and stored.get("state") != current.get("state"):
            await self.sync(scheduler)

    def _all_jobs(self) -> list[dict[str, Any]]:
        """Every watched job, with the status this keeper wrote last where it is fresher."""
        return [{**job, "status": self._written.get(uid, job.get("status") or {})}
                for uid, jobs in self._jobs.items() for job in jobs]

    def stored_status(self, uid: str) -> dict[str, Any]:
        """The job's status as this keeper last wrote it (fresher than the watched one), else as watched."""
        job = self._live_job(uid)
        return self._written.get(uid, (job or {}).get("status") or {})

    async def accept(self, job: dict[str, Any]) -> bool:
        """Write Accepted=True (ReviewPassed) for the version of the job just reviewed, guarded by its
        resourceVersion. A conflict caused by a write that left the spec alone (the same
        generation: a status or metadata write, often the operator's own) is retried on the
        stored version; False when the spec has changed since, so the reviewed spec is not the
        stored one."""
        meta = job["metadata"]
        async with self._locks.setdefault(meta["uid"], asyncio.Lock()):
            current = self._written.get(meta["uid"], job.get("status") or {})
            generation = meta.get("generation") or 0
            desired = status.desired_status(current, await observe(job, current, None, REVIEWED, generation, self._ctx))
            version = meta["resourceVersion"]
            for _ in range(ACCEPT_ATTEMPTS):
                try:
                    stored = await self._ctx.kube.patch_job_status(
                        meta["namespace"], meta["name"], status.status_patch(current, desired), version)
                    break
                except ApiException as exc:
                    if exc.status != CONFLICT:
                        raise
                fresh = (await self._ctx.kube.get_job(meta["namespace"], meta["name"]) or {}).get("metadata", {})
                if (fresh.get("uid"), fresh.get("generation")) != (meta["uid"], meta.get("generation")):
                    return False
                version = fresh["resourceVersion"]
            else:
                return False
            # No Event: the create's outcome is announced instead (RayJobCreated, or RayJobCreateRefused)
            self._verdicts[meta["uid"]], self._written[meta["uid"]] = (REVIEWED, generation), stored
            return True

    def _post_event(self, job: dict[str, Any], change: events.Transition) -> None:
        """Post the transition's Event beside the sync, which never waits on it."""
        task = asyncio.get_running_loop().create_task(self._post(job["metadata"], change))
        self._posting.add(task)
        task.add_done_callback(self._posting.discard)

    async def _post(self, meta: dict[str, Any], change: events.Transition) -> None:
        try:
            await self._ctx.kube.post_job_event(meta["namespace"], meta["name"], meta["uid"], change.reason,
                                                f"{change.type} is {change.status}: {change.message}",
                                                warning=change.warning)
        except Exception as exc:  # an Event is a courtesy: the status holds the same
            log.warning("Event %s not posted: %s", change.reason, exc, extra=job_ref(meta))

    def unfinished(self) -> list[str]:
        return [uid for uid, jobs in self._jobs.items()
                if not any(status.is_final(self._written.get(uid, job.get("status") or {})) for job in jobs)]

    async def _refresh_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            for uid in self.unfinished():
                try:
                    await self.sync(uid)
                except Exception:  # counted by metrics.reconcile; the next round retries
                    job = next(iter(self._jobs.get(uid, ())), {"metadata": {"uid": uid}})
                    log.exception("status refresh failed", extra=job_ref(job["metadata"]))

    def start(self) -> None:
        self._refresher = asyncio.create_task(self._refresh_forever(self._ctx.settings.progress_interval_seconds))

    def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
