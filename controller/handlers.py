"""The kopf handlers: thin adapters from kopf's callbacks to `controller.reconcile`.

- create / resume / change of spec.suspend -> `launch` (review, the one RayJob);
  a refused job is retried after EMBEDJOB_RETRY_DELAY_SECONDS (or on its next change);
- a change of a job's RayJob -> the job's status (`StatusKeeper.sync`), which also
  refreshes unfinished jobs every EMBEDJOB_PROGRESS_INTERVAL_SECONDS;
- deletion -> `cleanup` behind the finalizer `embedjob.dev/cleanup`, except for jobs
  released from the operator (`python -m controller.release`, before an uninstall):
  kopf guards those with no finalizer, and takes it off one that still has it.

Jobs and RayJobs are kept in kopf indexes as small summaries, not whole bodies, and no
task runs per job: memory stays flat with thousands of jobs.
"""

from __future__ import annotations

import copy
from typing import Any

import kopf

from embedjob import api

from . import metrics, reconcile
from .rayjob import LABEL_JOB_UID, LABEL_MANAGED_BY, MANAGED_BY, RAY_GROUP, RAY_PLURAL, RAY_VERSION
from .release import RELEASED
from .status import Transition

JOBS = (api.GROUP, api.VERSION, api.PLURAL)
RAYJOBS = (RAY_GROUP, RAY_VERSION, RAY_PLURAL)
OUR_RAYJOBS = {LABEL_MANAGED_BY: MANAGED_BY}


def plain(body: kopf.Body) -> dict[str, Any]:
    return copy.deepcopy(dict(body))


@kopf.index(*JOBS)
async def jobs_by_uid(body: kopf.Body, **_: Any) -> dict[str, Any]:
    """Each job by uid: what its status is computed from (and an Event needs)."""
    meta = body.metadata
    return {
        meta.uid: {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid,
                         "generation": meta.get("generation")},
            "spec": {"suspend": body.spec.get("suspend", False),
                     "clusterSelector": copy.deepcopy(body.spec.get("clusterSelector"))},
            "status": copy.deepcopy(dict(body.status)),
        }
    }


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


def post_event(job: dict[str, Any], change: Transition) -> None:
    kind = "Warning" if change.warning else "Normal"
    kopf.event(job, type=kind, reason=change.reason, message=f"{change.type} is {change.status}: {change.message}")


@kopf.on.startup()
async def start_status_refresh(memo: kopf.Memo, jobs_by_uid: kopf.Index, rayjobs_by_job: kopf.Index,
                               **_: Any) -> None:
    memo.keeper.attach(jobs_by_uid, rayjobs_by_job)
    memo.keeper.start()


@kopf.on.cleanup()
async def stop_status_refresh(memo: kopf.Memo, **_: Any) -> None:
    memo.keeper.stop()


@kopf.on.event(*RAYJOBS, labels=OUR_RAYJOBS)
async def rayjob_changed(labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    if labels.get(LABEL_JOB_UID):
        await memo.keeper.sync(labels[LABEL_JOB_UID])


@kopf.on.resume(*JOBS)
@kopf.on.create(*JOBS)
@kopf.on.update(*JOBS, field="spec.suspend")
async def launch(body: kopf.Body, memo: kopf.Memo, rayjobs_by_job: kopf.Index, **_: Any) -> None:
    ctx: reconcile.Context = memo.context
    uid = body.metadata.uid
    with metrics.reconcile("launch"):
        try:
            verdict = await reconcile.launch(plain(body), rayjobs_by_job.get(uid, []), ctx, memo.keeper.accept)
        except reconcile.SpecChanged as exc:
            raise kopf.TemporaryError(f"{exc}; reviewing the new version", delay=1) from None
    memo.keeper.note_verdict(uid, verdict)
    if not verdict.accepted:
        # An accepted job's status follows its RayJob's watch events instead.
        await memo.keeper.sync(uid)
        raise kopf.TemporaryError(f"{verdict.reason}: {verdict.message}", delay=ctx.settings.retry_delay_seconds)


@kopf.on.delete(*JOBS, annotations={RELEASED: kopf.ABSENT})
async def cleanup(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    ctx: reconcile.Context = memo.context
    memo.keeper.forget(body.metadata.uid)
    with metrics.reconcile("cleanup"):
        gone = await reconcile.cleanup(plain(body), ctx)
    if not gone:
        kopf.warn(body, reason="CleanupTimedOut",
                  message=f"the RayJob was still being deleted after {ctx.settings.cleanup_timeout_seconds:.0f}s; "
                  "the job is released anyway")
