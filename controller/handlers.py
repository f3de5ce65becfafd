"""The kopf handlers: thin adapters from kopf's callbacks to `controller.reconcile`.

- create / resume / change of spec.suspend -> `launch` (review, the one RayJob);
  a refused job is retried after EMBEDJOB_RETRY_DELAY_SECONDS (or on its next change);
- a daemon per job -> `track` (the status, woken by its RayJob's changes);
- deletion -> `cleanup` behind the finalizer `embedjob.dev/cleanup`.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf

from embedjob import api

from . import metrics, reconcile
from .rayjob import LABEL_JOB_UID, LABEL_MANAGED_BY, MANAGED_BY, RAY_GROUP, RAY_PLURAL, RAY_VERSION
from .status import Transition

JOBS = (api.GROUP, api.VERSION, api.PLURAL)
RAYJOBS = (RAY_GROUP, RAY_VERSION, RAY_PLURAL)
OUR_RAYJOBS = {LABEL_MANAGED_BY: MANAGED_BY}
VERDICT = "verdict"  # key in a job's kopf memo, shared by its handlers and its daemon


def plain(body: kopf.Body) -> dict[str, Any]:
    return copy.deepcopy(dict(body))


@kopf.index(*RAYJOBS, labels=OUR_RAYJOBS)
async def rayjobs_by_job(body: kopf.Body, labels: kopf.Labels, **_: Any) -> dict[str, Any] | None:
    """RayJobs by the uid of their EmbeddingJob: only what the operator reads of them."""
    uid = labels.get(LABEL_JOB_UID)
    if not uid:
        return None
    return {
        uid: {
            "metadata": {"name": body.metadata.name, "ownerReferences": body.metadata.get("ownerReferences", [])},
            "spec": {"suspend": body.spec.get("suspend", False)},
            "status": copy.deepcopy(dict(body.status)),
        }
    }


@kopf.on.event(*RAYJOBS, labels=OUR_RAYJOBS)
async def rayjob_changed(labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    memo.context.wakeups.wake(labels.get(LABEL_JOB_UID))


@kopf.on.resume(*JOBS)
@kopf.on.create(*JOBS)
@kopf.on.update(*JOBS, field="spec.suspend")
async def launch(body: kopf.Body, memo: kopf.Memo, rayjobs_by_job: kopf.Index, **_: Any) -> None:
    ctx: reconcile.Context = memo.context
    with metrics.reconcile("launch"):
        verdict = await reconcile.launch(plain(body), rayjobs_by_job.get(body.metadata.uid, []), ctx)
    memo[VERDICT] = verdict
    ctx.wakeups.wake(body.metadata.uid)
    if not verdict.accepted:
        raise kopf.TemporaryError(f"{verdict.reason}: {verdict.message}", delay=ctx.settings.retry_delay_seconds)


async def _sleep(wakeup: asyncio.Event, stopped: kopf.DaemonStopped, timeout: float) -> None:
    waiters = [asyncio.ensure_future(wakeup.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


@kopf.daemon(*JOBS, cancellation_timeout=10, backoff=5)
async def track(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped,
                rayjobs_by_job: kopf.Index, **_: Any) -> None:
    uid = body.metadata.uid

    def emit(change: Transition) -> None:
        kind = "Warning" if change.warning else "Normal"
        kopf.event(body, type=kind, reason=change.reason, message=f"{change.type} is {change.status}: {change.message}")

    tracker = reconcile.Tracker(
        job=lambda: plain(body),
        rayjobs=lambda: rayjobs_by_job.get(uid, []),
        verdict=lambda: memo.get(VERDICT),
        stopped=lambda: bool(stopped),
        sleep=lambda wakeup, timeout: _sleep(wakeup, stopped, timeout),
        emit=emit,
    )
    await reconcile.track(tracker, memo.context)


@kopf.on.delete(*JOBS)
async def cleanup(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    ctx: reconcile.Context = memo.context
    with metrics.reconcile("cleanup"):
        gone = await reconcile.cleanup(plain(body), ctx)
    if not gone:
        kopf.warn(body, reason="CleanupTimedOut",
                  message=f"the RayJob was still being deleted after {ctx.settings.cleanup_timeout_seconds:.0f}s; "
                  "the job is released anyway")
