"""The jobs the review refused: logged once per new reason, and reviewed again every
EMBEDJOB_RETRY_DELAY_SECONDS (a Secret created later lets them proceed).

A change of a refused job's spec is reviewed at once by the kopf handler; this loop covers
what changes outside the job. A refusal is an expected outcome, not a handler error: the
handler finishes, so kopf neither logs it as an error nor holds the job's next change
back until a retry delay has passed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from .acceptance import Verdict
from .kube import KubeApi
from .reconcile import NamespaceTerminating, SpecChanged, job_ref

log = logging.getLogger("controller.refusals")


class Refusals:
    """Refused jobs by uid (namespace, name and the verdict), and their periodic re-review."""

    def __init__(self, kube: KubeApi):
        self._kube = kube
        self._review: Callable[[dict[str, Any]], Awaitable[Verdict]] | None = None
        self._refused: dict[str, tuple[dict[str, Any], Verdict]] = {}
        self._task: asyncio.Task | None = None

    def note(self, job: dict[str, Any], verdict: Verdict) -> None:
        """Remember the review's outcome; log a refusal when its reason or message is new."""
        meta = job["metadata"]
        ref = {key: meta[key] for key in ("namespace", "name", "uid")}
        before = self._refused.pop(meta["uid"], None)
        if verdict.accepted:
            if before is not None:
                log.info("accepted after it was refused (%s)", before[1].reason, extra=job_ref(ref))
            return
        self._refused[meta["uid"]] = (ref, verdict)
        if before is None or before[1] != verdict:
            log.warning("refused, reviewed again every retry delay or at its next change: %s: %s",
                        verdict.reason, verdict.message, extra=job_ref(ref))

    def forget(self, uid: str) -> None:
        self._refused.pop(uid, None)

    async def review_again(self) -> None:
        """Review each refused job again, as it is stored now."""
        for uid, (ref, _) in list(self._refused.items()):
            try:
                job = await self._kube.get_job(ref["namespace"], ref["name"])
                if job is None or job["metadata"]["uid"] != uid:
                    self.forget(uid)
                    continue
                await self._review(job)  # noted again through `note`
            except SpecChanged:
                continue  # edited since it was read: kopf's update handler reviews the new version
            except NamespaceTerminating:
                self.forget(uid)  # it goes with its namespace
            except Exception:  # the next round retries; a spec edit meanwhile is reviewed by its handler
                log.exception("re-review failed", extra=job_ref(ref))

    async def _run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.review_again()

    def start(self, interval: float, review: Callable[[dict[str, Any]], Awaitable[Verdict]]) -> None:
        """Review the refused jobs again every `interval` seconds with `review` (job -> verdict)."""
        self._review = review
        self._task = asyncio.create_task(self._run(interval))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
