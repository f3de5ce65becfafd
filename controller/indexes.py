"""What the operator's watch indexes keep of each EmbeddingJob and each RayJob (pure functions).

Small summaries, not whole bodies: memory stays flat with thousands of jobs. The handlers
(`controller.handlers`) register these with kopf.
"""

from __future__ import annotations

import copy
from typing import Any

from embedjob import api

from . import queueing
from .rayjob import LABEL_JOB_NAME, LABEL_JOB_UID
from .scheduled_runs import ANNOTATION_SCHEDULED_TIME, LABEL_SCHEDULED_BY_UID


def job_entry(job: dict[str, Any]) -> dict[str, Any]:
    """A job by uid: what its status is computed from (and an Event needs)."""
    meta, spec = job["metadata"], job.get("spec") or {}
    return {
        meta["uid"]: {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                         "generation": meta.get("generation"), "deletionTimestamp": meta.get("deletionTimestamp"),
                         "creationTimestamp": meta.get("creationTimestamp"),
                         # a scheduled job's run: whose, and for which tick (controller.scheduled_runs)
                         "labels": {key: value for key, value in (meta.get("labels") or {}).items()
                                    if key == LABEL_SCHEDULED_BY_UID},
                         "annotations": {key: value for key, value in (meta.get("annotations") or {}).items()
                                         if key == ANNOTATION_SCHEDULED_TIME}},
            "spec": {"suspend": spec.get("suspend", False),
                     "clusterSelector": copy.deepcopy(spec.get("clusterSelector")),
                     "schedule": copy.deepcopy(spec.get("schedule")),
                     # what the job writes: its last success is the sync of this collection (job_metrics)
                     "sink": {key: (spec.get("sink") or {}).get(key) for key in ("table", "collection")}},
            "status": copy.deepcopy(job.get("status") or {}),
        }
    }


def rayjob_entry(rayjob: dict[str, Any]) -> dict[tuple[str, str], Any] | None:
    """A RayJob by (namespace, uid of its EmbeddingJob), only what the operator reads of it; None without
    the job label. The label is anyone's to write: a RayJob is looked up in its job's own namespace only,
    and counts only with a controller reference to the job (`rayjob.owned_by`)."""
    meta = rayjob["metadata"]
    labels = meta.get("labels") or {}
    uid = labels.get(LABEL_JOB_UID)
    if not uid:
        return None
    return {
        (meta["namespace"], uid): {
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid"),
                         "ownerReferences": copy.deepcopy(meta.get("ownerReferences") or []),
                         # the job's name: a failed job's message says where its driver's log is
                         "labels": {**queueing.kueue_labels_of(labels),
                                    LABEL_JOB_NAME: labels.get(LABEL_JOB_NAME, "")}},
            "spec": {"suspend": (rayjob.get("spec") or {}).get("suspend", False)},
            "status": copy.deepcopy(rayjob.get("status") or {}),
        }
    }
