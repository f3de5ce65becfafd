"""`reconcile.launch` with a stand-in API: a job is accepted before its RayJob is created, and an edit
made during the review means no RayJob for the old version."""

import asyncio

import pytest

from controller import reconcile
from controller.metrics import JobStates
from controller.settings import Settings
from support.manifests import MINIMAL_SPEC

SECRET = {"data": {"url": "eA=="}}


class StandInKube:
    def __init__(self):
        self.created: list[dict] = []

    async def read_secret(self, namespace, name):
        return SECRET

    async def create_or_get_rayjob(self, manifest):
        self.created.append(manifest)
        return manifest


def job(status=None) -> dict:
    return {"apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
            "metadata": {"name": "pep", "namespace": "ns", "uid": "u-1", "generation": 1, "resourceVersion": "5"},
            "spec": MINIMAL_SPEC, "status": status or {}}


def context(kube) -> reconcile.Context:
    return reconcile.Context(settings=Settings.from_env({}), kube=kube, runs=None, job_states=JobStates())


def test_accepted_first_then_the_rayjob():
    kube, order = StandInKube(), []

    async def accept(body):
        order.append(("accept", body["metadata"]["resourceVersion"], len(kube.created)))
        return True

    verdict = asyncio.run(reconcile.launch(job(), [], context(kube), accept))
    assert verdict.accepted and order == [("accept", "5", 0)] and len(kube.created) == 1


def test_an_edit_during_the_review_creates_no_rayjob():
    kube = StandInKube()

    async def edited_meanwhile(body):
        return False

    with pytest.raises(reconcile.SpecChanged):
        asyncio.run(reconcile.launch(job(), [], context(kube), edited_meanwhile))
    assert kube.created == []


def test_an_already_accepted_job_is_not_accepted_again():
    kube = StandInKube()
    accepted = {"conditions": [{"type": "Accepted", "status": "True", "reason": "RayJobCreated"}]}

    async def must_not_run(body):
        raise AssertionError("accepted twice")

    assert asyncio.run(reconcile.launch(job(accepted), [], context(kube), must_not_run)).accepted
    assert len(kube.created) == 1
