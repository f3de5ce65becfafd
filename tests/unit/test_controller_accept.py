"""`StatusKeeper.accept` with a stand-in API: a conflict from a write that left the spec alone is
retried on the stored version; one from a spec edit (a new generation) is not, so the old spec is
never launched."""

import asyncio
import json

import pytest
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
    accepted_condition = next(c for c in patch["conditions"] if c["type"] == "Accepted")
    # the spec is pinned, but nothing says "created" before the RayJob exists (issue 26 item 8)
    assert (accepted_condition["status"], accepted_condition["reason"]) == ("True", "ReviewPassed"), patch
    assert emitted == []  # the create's outcome is what is announced


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


QUOTA_REFUSAL = ('{"kind":"Status","status":"Failure","message":"rayjobs.ray.io \\"ej-pep-1\\" is forbidden: '
                 'exceeded quota: no-rayjobs, requested: count/rayjobs.ray.io=1, used: count/rayjobs.ray.io=0, '
                 'limited: count/rayjobs.ray.io=0","reason":"Forbidden","code":403}')


class RefusingKube(StandInKube):
    """The API server refuses the RayJob's create, as a ResourceQuota does (or fails it with `status`)."""

    def __init__(self, status=403):
        super().__init__()
        self.status = status

    async def create_or_get_rayjob(self, manifest):
        refused = ApiException(status=self.status, reason="Forbidden")
        refused.body = QUOTA_REFUSAL  # as the client sets it from the response (its constructor's arguments vary)
        raise refused


def launch_and_sync(kube) -> list:
    """A review as the handler runs it: launch, note its verdict, sync a refusal; the Events announced."""
    ctx = Context(settings=Settings.from_env({}), kube=kube, runs=None, job_states=JobStates())
    emitted = []
    keeper = StatusKeeper(ctx, emit=lambda job, change: emitted.append(change))
    keeper.attach({"u-1": [{**job(), "spec": {"suspend": False}}]}, {})

    async def review():
        verdict = await reconcile.launch(job(), [], ctx, keeper.accept, lambda rj: keeper.sync("u-1", created=rj))
        keeper.note_verdict("u-1", verdict, 1)
        if not verdict.accepted:
            await keeper.sync("u-1")
    asyncio.run(review())
    return emitted


def test_a_refused_create_is_a_warning_naming_the_api_servers_message_never_created():
    """Issue 26 item 8: the quota's refusal is the status and a Warning; nothing says RayJobCreated."""
    kube = RefusingKube()
    [refused] = launch_and_sync(kube)
    assert (refused.type, refused.status, refused.reason, refused.warning) == (
        "Accepted", "False", "RayJobCreateRefused", True)
    assert "exceeded quota: no-rayjobs" in refused.message and "403 Forbidden" in refused.message
    last = kube.patches[-1][0]
    assert last["reason"] == "RayJobCreateRefused" and "rayJobName" not in last


@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_create_the_api_server_could_not_answer_is_retried_not_reported_refused(status):
    """A busy or failing API server refuses nothing: the handler fails for kopf to retry, and the status says
    neither RayJobCreateRefused nor RayJobCreated."""
    kube = RefusingKube(status)
    with pytest.raises(ApiException):
        launch_and_sync(kube)
    written = json.dumps([patch for patch, _ in kube.patches])
    assert "ReviewPassed" in written and "RayJobCreateRefused" not in written and "RayJobCreated" not in written


def test_rayjob_created_is_announced_once_the_rayjob_exists():
    [created] = launch_and_sync(StandInKube())
    assert (created.type, created.status, created.reason, created.warning) == (
        "Accepted", "True", "RayJobCreated", False)
