"""Refusals are logged once per new reason, naming the job (no cluster)."""

from __future__ import annotations

import asyncio
import logging

from controller.acceptance import ACCEPTED, Verdict
from controller.reconcile import NamespaceTerminating
from controller.refusals import Refusals

JOB = {"metadata": {"namespace": "team-a", "name": "pep", "uid": "u-1"}}
NOT_FOUND = Verdict(False, "SecretNotFound", "Secret 'embedjob-db' does not exist")
KEY_MISSING = Verdict(False, "SecretKeyMissing", "Secret 'embedjob-db' has no key 'url'")


def test_a_refusal_is_logged_once_per_reason_and_names_the_job(caplog):
    refusals = Refusals(kube=None)
    with caplog.at_level(logging.INFO, logger="controller.refusals"):
        for verdict in (NOT_FOUND, NOT_FOUND, NOT_FOUND, KEY_MISSING, KEY_MISSING, ACCEPTED, ACCEPTED):
            refusals.note(JOB, verdict)
    records = [(r.levelname, r.getMessage(), r.k8s_ref["namespace"], r.k8s_ref["name"]) for r in caplog.records]
    assert records == [
        ("WARNING", "refused, reviewed again every retry delay or at its next change: SecretNotFound: "
                    "Secret 'embedjob-db' does not exist", "team-a", "pep"),
        ("WARNING", "refused, reviewed again every retry delay or at its next change: SecretKeyMissing: "
                    "Secret 'embedjob-db' has no key 'url'", "team-a", "pep"),
        ("INFO", "accepted after it was refused (SecretKeyMissing)", "team-a", "pep"),
    ]



def test_a_refused_job_whose_namespace_goes_is_forgotten_without_an_error(caplog):
    class StoredKube:
        async def get_job(self, namespace, name):
            return JOB

    reviews = []

    async def review(job):
        reviews.append(job)
        raise NamespaceTerminating("namespace team-a is being deleted")

    refusals = Refusals(kube=StoredKube())
    refusals.note(JOB, NOT_FOUND)
    refusals._review = review
    with caplog.at_level(logging.INFO, logger="controller.refusals"):
        asyncio.run(refusals.review_again())
        asyncio.run(refusals.review_again())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(reviews) == 1  # forgotten: not reviewed again
