"""The quality gate of a reduced precision: a sample of the job's first texts embedded both ways, checked against spec.model.minCosine.

A reduced precision (float16, bfloat16, int8) changes the vectors; how much depends on the model and
on the texts, so the run measures it on its own: once its actors are ready and before the first batch
is sent, one actor embeds the first `SAMPLE_TEXTS` texts of the run's batches with the job's model and
with the same weights in float32 torch. The mean and the least cosine go into the run row (and so the
EmbeddingJob's status.progress); a mean below spec.model.minCosine refuses the run before any vector is
written.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

from embedjob.api import ModelPrecision

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.logs import log_event
from embedjob_worker.core.tally import RunTally
from embedjob_worker.core.worker_reports import PrecisionCheck
from embedjob_worker.plan.batching import Batch

SAMPLE_TEXTS = 256
log = logging.getLogger("embedjob_worker.encode.precision")


def first_texts(batches: Iterator[Batch], count: int) -> tuple[list[str], Iterator[Batch]]:
    """The first `count` texts of `batches`, and the batches again from the first (those looked at included)."""
    looked_at: list[Batch] = []
    texts: list[str] = []
    for batch in batches:
        looked_at.append(batch)
        texts.extend(batch.texts)
        if len(texts) >= count:
            break
    return texts[:count], itertools.chain(looked_at, batches)


def verdict(check: PrecisionCheck, precision: str, min_cosine: float) -> JobFailed | None:
    """PrecisionBelowMinimum, naming both figures, when the sample's mean cosine is below `min_cosine`."""
    if check.mean >= min_cosine:
        return None
    return JobFailed("PrecisionBelowMinimum",
                     f"spec.model.minCosine {min_cosine}: precision {precision} gave a mean cosine of {check.mean:.4f} "
                     f"(least {check.minimum:.4f}) to float32 over the job's first {check.texts} texts; use a "
                     "higher precision, or lower minCosine if these vectors are good enough")


def checked_precision(actor, precision: str, min_cosine: float, batches: Iterator[Batch], tally: RunTally,
                      timeout_s: float) -> Iterator[Batch]:
    """`batches`, once a reduced precision has passed its gate on `actor` (float32: unchecked); JobFailed when
    it does not, or when the actor cannot say."""
    import ray  # here: the gate's pure parts are tested without Ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    if precision == ModelPrecision.float32.value:
        return batches
    texts, batches = first_texts(batches, SAMPLE_TEXTS)
    if not texts:
        return batches
    try:
        check: PrecisionCheck = ray.get(actor.check_precision.remote(texts), timeout=timeout_s)
    except GetTimeoutError:
        raise JobFailed("WorkersUnavailable", f"the precision check took more than {timeout_s:.0f}s") from None
    except (RayActorError, RayTaskError) as exc:
        raise JobFailed("WorkersUnavailable", f"the precision check failed: {exc}"[:4000]) from None
    tally.precision_checked(check)
    log_event(log, "precision_checked", precision=precision, texts=check.texts, cosine_mean=check.mean,
              cosine_min=check.minimum, min_cosine=min_cosine)
    failure = verdict(check, precision, min_cosine)
    if failure is not None:
        raise failure
    tally.start_embedding()  # texts per second count the batches, not the check before them
    return batches
