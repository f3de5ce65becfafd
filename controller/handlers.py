"""The kopf handlers: thin adapters from kopf's callbacks to `controller.reconcile`.

- create / resume / change of the spec -> `launch` (review, the one RayJob); a refused
  job is reviewed again at its next change and every EMBEDJOB_RETRY_DELAY_SECONDS
  (`controller.refusals`);
- a change of a job's RayJob -> the job's status (`StatusKeeper.sync`), which also
  refreshes unfinished jobs every EMBEDJOB_PROGRESS_INTERVAL_SECONDS;
- a job with spec.schedule has no RayJob: `controller.scheduler` starts its runs (child jobs);
- deletion -> `cleanup` behind the finalizer `embedjob.dev/cleanup`, except for jobs
  released from the operator (`python -m controller.release`, before an uninstall):
  kopf guards those with no finalizer, and takes it off one that still has it.

Jobs and RayJobs are kept in kopf indexes as small summaries (`controller.indexes`), and no
task runs per job: memory stays flat with thousands of jobs.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import kopf

from embedjob import api

from . import indexes, metrics, reconcile
from .acceptance import Verdict
from .rayjob import LABEL_JOB_UID, LABEL_MANAGED_BY, MANAGED_BY, RAY_GROUP, RAY_PLURAL, RAY_VERSION
from .release import RELEASED

JOBS = (api.GROUP, api.VERSION, api.PLURAL)
RAYJOBS = (RAY_GROUP, RAY_VERSION, RAY_PLURAL)
OUR_RAYJOBS = {LABEL_MANAGED_BY: MANAGED_BY}


def plain(body: kopf.Body) -> dict[str, Any]:
    return copy.deepcopy(dict(body))


@kopf.index(*JOBS)
async def jobs_by_uid(body: kopf.Body, **_: Any) -> dict[str, Any]:
    return indexes.job_entry(dict(body))


@kopf.index(*RAYJOBS, labels=OUR_RAYJOBS)
async def rayjobs_by_job(body: kopf.Body, **_: Any) -> dict[tuple[str, str], Any] | None:
    return indexes.rayjob_entry(dict(body))


async def review(job: dict[str, Any], memo: kopf.Memo, rayjobs_by_job: Mapping[str, Any]) -> Verdict:
    """Review the job (and launch it when accepted); a refusal is noted and shown in its status."""
    ctx: reconcile.Context = memo.context
    uid = job["metadata"]["uid"]
    with metrics.reconcile("launch"):
        verdict = await reconcile.launch(job, rayjobs_by_job.get((job["metadata"]["namespace"], uid), []), ctx,
                                         memo.keeper.accept, lambda rayjob: memo.keeper.sync(uid, created=rayjob))
    memo.keeper.note_verdict(uid, verdict, job["metadata"].get("generation") or 0)
    memo.scheduler.wake(uid)
    memo.refusals.note(job, verdict)
    if not verdict.accepted:
        # An accepted job's status follows its RayJob's watch events instead.
        await memo.keeper.sync(uid)
    return verdict


@kopf.on.startup()
async def start_background(memo: kopf.Memo, jobs_by_uid: kopf.Index, rayjobs_by_job: kopf.Index,
                           **_: Any) -> None:
    ctx: reconcile.Context = memo.context
    memo.keeper.attach(jobs_by_uid, rayjobs_by_job)
    memo.keeper.start()
    memo.scheduler.attach(jobs_by_uid)
    memo.scheduler.start()
    memo.refusals.start(ctx.settings.retry_delay_seconds, lambda job: review(job, memo, rayjobs_by_job))


@kopf.on.cleanup()
async def stop_background(memo: kopf.Memo, **_: Any) -> None:
    memo.keeper.stop()
    memo.scheduler.stop()
    memo.refusals.stop()


@kopf.on.event(*RAYJOBS, labels=OUR_RAYJOBS)
async def rayjob_changed(labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    if labels.get(LABEL_JOB_UID):
        await memo.keeper.sync(labels[LABEL_JOB_UID])


@kopf.on.resume(*JOBS)
@kopf.on.create(*JOBS)
@kopf.on.update(*JOBS, field="spec")
async def launch(body: kopf.Body, memo: kopf.Memo, rayjobs_by_job: kopf.Index, logger: kopf.Logger,
                 **_: Any) -> None:
    try:
        await review(plain(body), memo, rayjobs_by_job)
    except reconcile.SpecChanged as exc:
        # Not an error: the edit's own change event brings the new version to this handler.
        logger.info(f"{exc}; the new version is reviewed at its change")
    except reconcile.NamespaceTerminating as exc:
        # Not an error: the job goes with its namespace, and its cleanup releases it.
        logger.info(f"{exc}; nothing is launched")


@kopf.on.delete(*JOBS, annotations={RELEASED: kopf.ABSENT})
async def cleanup(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    ctx: reconcile.Context = memo.context
    memo.keeper.forget(body.metadata.uid)
    memo.scheduler.forget(body.metadata.uid)
    memo.refusals.forget(body.metadata.uid)
    with metrics.reconcile("cleanup"):
        gone = await reconcile.cleanup(plain(body), ctx)
    if not gone:
        kopf.warn(body, reason="CleanupTimedOut",
                  message=f"the RayJob was still being deleted after {ctx.settings.cleanup_timeout_seconds:.0f}s; "
                  "the job is released anyway")
