"""`StatusKeeper.accept` with a stand-in API: a conflict from a write that left the spec alone is
retried on the stored version; one from a spec edit (a new generation) is not, so the old spec is
never launched."""

import asyncio

from kubernetes.client.exceptions import ApiException

from controller import keeper as keeper_module
from controller.keeper import StatusKeeper
from controller import reconcile
from controller.reconcile import Context
from controller.metrics import JobStates
from controller.settings import Settings
from support.manifests import MINIMAL_SPEC


class StandInKube:
    """Stores one job; `writes_between` status-only writes (or `edit` spec edits) land between the
    operator's read and its guarded patch."""

    def __init__(self, writes_between=0, edit=False):
        self.version, self.generation = 5, 1
        self.writes_between, self.edit = writes_between, edit
        self.patches: list[tuple[dict, str]] = []

    def _someone_writes(self):
        self.version += 1
        if self.edit:
            self.generation += 1

    async def patch_job_status(self, namespace, name, patch, resource_version=None):
        if self.writes_between > 0:
            self.writes_between -= 1
            self._someone_writes()
        if resource_version is not None and resource_version != str(self.version):
            raise ApiException(status=409, reason="Conflict")
        self.version += 1
        self.patches.append((patch, resource_version))
        return patch

    async def read_secret(self, namespace, name):
        return {"data": {"url": "eA=="}}

    async def create_or_get_rayjob(self, manifest):
        return {**manifest, "metadata": {**manifest["metadata"], "uid": "rj-1"}}

    async def set_rayjob_suspend(self, namespace, name, uid, suspend):
        pass

    async def get_job(self, namespace, name):
        return {"metadata": {"name": name, "namespace": namespace, "uid": "u-1", "generation": self.generation,
                             "resourceVersion": str(self.version)}}


def job() -> dict:
    return {"apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
            "metadata": {"name": "pep", "namespace": "ns", "uid": "u-1", "generation": 1, "resourceVersion": "5"},
            "spec": MINIMAL_SPEC, "status": {}}


def accept(kube) -> tuple[bool, list]:
    ctx = Context(settings=Settings.from_env({}), kube=kube, runs=None, job_states=JobStates())
    emitted = []
    accepted = asyncio.run(StatusKeeper(ctx, emit=lambda job, change: emitted.append(change.reason)).accept(job()))
    return accepted, emitted


def test_a_status_write_in_between_is_not_an_edit_the_acceptance_is_retried_on_the_stored_version():
    kube = StandInKube(writes_between=2)
    accepted, emitted = accept(kube)
    assert accepted
    [(patch, version)] = kube.patches
    assert version == "7"  # the version stored after the two writes, read again
    assert any(c["type"] == "Accepted" and c["status"] == "True" for c in patch["conditions"]), patch
    assert emitted


def test_a_spec_edit_in_between_refuses_the_acceptance_of_the_old_version():
    kube = StandInKube(writes_between=1, edit=True)
    assert accept(kube) == (False, [])
    assert kube.patches == []


def test_writes_that_never_stop_give_up_after_the_bounded_attempts():
    kube = StandInKube(writes_between=keeper_module.ACCEPT_ATTEMPTS)
    assert accept(kube) == (False, [])
    assert kube.patches == []



def test_the_created_rayjobs_name_is_in_the_status_before_the_watch_has_seen_it():
    """Issue 26 item 6: the review that creates the RayJob records its name at once, so a RayJob deleted
    before the watch saw it is known to have existed: the job ends RayJobDeleted, never stays Pending,
    and a restarted operator makes no second one."""
    kube = StandInKube()
    ctx = Context(settings=Settings.from_env({}), kube=kube, runs=None, job_states=JobStates())
    keeper = StatusKeeper(ctx, emit=lambda job, change: None)
    keeper.attach({"u-1": [{**job(), "spec": {"suspend": False}}]}, {})  # no RayJob in the watch yet

    verdict = asyncio.run(reconcile.launch(job(), [], ctx, keeper.accept,
                                           lambda rayjob: keeper.sync("u-1", created=rayjob)))
    assert verdict.accepted
    [(accepted, _), (named, _)] = kube.patches
    assert "rayJobName" not in accepted  # the acceptance comes before the RayJob exists
    assert named["rayJobName"] == reconcile.rayjob_name("pep", "u-1")
