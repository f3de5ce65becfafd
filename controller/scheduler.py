"""Starts the runs of scheduled EmbeddingJobs at their ticks: `Scheduler`, one loop for every job.

Each second it looks at the accepted, scheduled jobs that are due a look (`schedule_plan.plan`
says when: at the next tick, sooner while a Forbid tick waits), and carries out the plan:
deletes the replaced run and the runs beyond the history limits, creates the tick's run from
the job as stored now, and asks the keeper (the only status writer) to write the job's status.
Each look sets the job's `embedjob_schedule_pending_ticks` (`Plan.pending`); forgetting the job removes it.
The plan is recomputed from what is stored each time, so an operator restarted at any point
starts no tick twice (a run's name is its tick) and the latest missed one once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from typing import Any, Iterable, Mapping

from . import metrics, status
from .keeper import StatusKeeper
from .reconcile import Context, job_ref
from .schedule_plan import plan
from .scheduled_runs import last_scheduled, run_manifest, runs_of, schedule_spec
from .times import parse_time, rfc3339

log = logging.getLogger("controller.scheduler")

LOOP_S = 1.0
WARNINGS = ("MissedSchedule", "TooManyMissedTimes")


class Scheduler:
    def __init__(self, ctx: Context, keeper: StatusKeeper):
        self._ctx, self._keeper = ctx, keeper
        self._jobs: Mapping[str, Iterable[dict[str, Any]]] = {}
        self._look_at: dict[str, float] = {}  #: uid -> monotonic time of its next look
        self._warned: dict[tuple[str, str], str] = {}  #: (uid, reason) -> the message last posted: said once
        self._pending_series: dict[str, tuple[str, str]] = {}  #: uid -> (namespace, name) of its pending ticks gauge
        self._task: asyncio.Task | None = None

    def attach(self, jobs: Mapping[str, Iterable[dict[str, Any]]]) -> None:
        self._jobs = jobs

    def wake(self, uid: str) -> None:
        """Look at the job at the next round (its spec or a run changed)."""
        self._look_at.pop(uid, None)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(LOOP_S)
            now = time.monotonic()
            for uid, entries in list(self._jobs.items()):
                job = next(iter(entries), None)
                if job is None or schedule_spec(job["spec"]) is None or self._look_at.get(uid, 0.0) > now:
                    continue
                try:
                    with metrics.reconcile("schedule"):
                        await self.step(uid)
                except Exception:  # counted by metrics.reconcile; the next round tries again
                    log.exception("schedule step failed", extra=job_ref(job["metadata"]))
                    self._look_at[uid] = now + 5 * LOOP_S

    async def step(self, uid: str) -> None:
        """Carry out the job's plan for now."""
        job = next(iter(self._jobs.get(uid, ())), None)
        spec = schedule_spec(job["spec"]) if job is not None else None
        current = self._keeper.stored_status(uid)
        if job is None or spec is None or job["metadata"].get("deletionTimestamp") or not status.accepted(current):
            self._look_at.pop(uid, None)
            self._drop_pending(uid)
            return
        meta = job["metadata"]
        now = dt.datetime.now(dt.UTC)
        runs = runs_of(uid, (entry for entries in self._jobs.values() for entry in entries))
        last = last_scheduled(current, runs)
        created = parse_time(meta.get("creationTimestamp")) or now
        todo = plan(meta["name"], spec, bool(job["spec"].get("suspend")), created, last, runs, now)
        self._pending_series[uid] = (meta["namespace"], meta["name"])
        metrics.SCHEDULE_PENDING_TICKS.labels(meta["namespace"], meta["name"]).set(todo.pending)
        for name in todo.delete:
            await self._ctx.kube.delete_job(meta["namespace"], name)
        if todo.start is not None:
            stored = await self._ctx.kube.get_job(meta["namespace"], meta["name"])
            if stored is None or stored["metadata"].get("uid") != uid:
                return
            run = await self._ctx.kube.create_or_get_job(run_manifest(stored, todo.start))
            await self._announce(job, "RunStarted", f"run {run['metadata']['name']} for the tick {rfc3339(todo.start)}"
                                 + (f", replacing {', '.join(todo.delete)}" if todo.delete else ""))
        for reason, message in todo.events:  # each step sees a missed tick again until a later one starts
            if self._warned.get((uid, reason)) != message:
                self._warned[(uid, reason)] = message
                await self._announce(job, reason, message)
        if todo.start is not None or todo.delete:
            await self._keeper.sync(uid)
        self._look_at[uid] = time.monotonic() + todo.look_again_s

    async def _announce(self, job: dict[str, Any], reason: str, message: str) -> None:
        meta = job["metadata"]
        try:
            await self._ctx.kube.post_job_event(meta["namespace"], meta["name"], meta["uid"], reason, message,
                                                warning=reason in WARNINGS)
        except Exception as exc:  # an Event is a courtesy: the status holds the same
            log.warning("Event %s not posted: %s", reason, exc, extra=job_ref(meta))

    def forget(self, uid: str) -> None:
        self._look_at.pop(uid, None)
        self._warned = {key: message for key, message in self._warned.items() if key[0] != uid}
        self._drop_pending(uid)

    def _drop_pending(self, uid: str) -> None:
        series = self._pending_series.pop(uid, None)
        if series is not None:
            metrics.SCHEDULE_PENDING_TICKS.remove(*series)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
