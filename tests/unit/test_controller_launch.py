"""`reconcile.launch` with a stand-in API: a job is accepted before its RayJob is created, and an edit
made during the review means no RayJob for the old version."""

import asyncio

import pytest
from kubernetes.client.exceptions import ApiException

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
        return {**manifest, "metadata": {**manifest["metadata"], "uid": "rj-1"}}

    async def set_rayjob_suspend(self, namespace, name, uid, suspend):
        pass

    async def namespace_terminating(self, namespace):
        return False


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


class OwningKube(StandInKube):
    """Stores RayJobs by name as the API server would (uids given at creation); deletes honour a uid
    precondition."""

    def __init__(self, stored: dict | None = None):
        super().__init__()
        self.stored, self.suspends, self.deletes = dict(stored or {}), [], []

    async def create_or_get_rayjob(self, manifest):
        name = manifest["metadata"]["name"]
        if name not in self.stored:
            self.created.append(manifest)
            self.stored[name] = {**manifest, "metadata": {**manifest["metadata"], "uid": f"rj-{len(self.created)}"}}
        return self.stored[name]

    async def set_rayjob_suspend(self, namespace, name, uid, suspend):
        self.suspends.append((namespace, name, uid, suspend))

    async def get_rayjob(self, namespace, name):
        rayjob = self.stored.get(name)
        return rayjob if rayjob and rayjob["metadata"]["namespace"] == namespace else None

    async def delete_rayjob(self, namespace, name, uid):
        self.deletes.append((namespace, name, uid))
        if name in self.stored and self.stored[name]["metadata"]["uid"] == uid:
            del self.stored[name]


def test_the_suspend_the_spec_asks_for_is_sent_whatever_the_watched_copy_says():
    """The watch index's copy may be stale (a quick suspend then resume): the desired value goes out
    each time, to the RayJob the job owns (by its uid)."""
    kube, accepted = OwningKube(), {"conditions": [{"type": "Accepted", "status": "True"}]}

    async def accept(body):
        return True

    asyncio.run(reconcile.launch(job(), [], context(kube), accept))
    [rayjob] = kube.stored.values()
    stale = {**rayjob, "spec": {**rayjob["spec"], "suspend": False}}
    asyncio.run(reconcile.launch(job(accepted), [stale], context(kube), accept))
    assert [s[2:] for s in kube.suspends] == [("rj-1", False), ("rj-1", False)]
    assert len(kube.created) == 1


def test_a_foreign_rayjob_naming_the_job_is_ignored_and_its_own_is_created():
    """A RayJob in another namespace with the job's uid in its label and ownerReference: not the job's."""
    kube = OwningKube()

    async def accept(body):
        return True

    foreign = {"metadata": {"name": "ej-pep-x", "namespace": "team-a", "uid": "f-1", "labels": {},
                            "ownerReferences": [{"kind": "EmbeddingJob", "uid": "u-1", "controller": True}]},
               "spec": {"suspend": False}, "status": {"jobDeploymentStatus": "Complete"}}
    assert asyncio.run(reconcile.launch(job(), [foreign], context(kube), accept)).accepted
    assert len(kube.created) == 1 and kube.created[0]["metadata"]["namespace"] == "ns"
    assert {s[1] for s in kube.suspends} == {kube.created[0]["metadata"]["name"]}


def test_cleanup_deletes_only_the_rayjob_the_job_owns_and_by_its_uid():
    meta = job()["metadata"]
    name = reconcile.rayjob_name(meta["name"], meta["uid"])
    other = {"metadata": {"name": name, "namespace": "ns", "uid": "someone-else", "ownerReferences": []}}
    kube = OwningKube({name: other})
    assert asyncio.run(reconcile.cleanup(job(), context(kube)))
    assert kube.deletes == [] and kube.stored == {name: other}  # not the job's: left alone

    owned = {"metadata": {"name": name, "namespace": "ns", "uid": "rj-9", "ownerReferences": [
        {"kind": "EmbeddingJob", "uid": meta["uid"], "controller": True}]}}
    kube = OwningKube({name: owned})
    assert asyncio.run(reconcile.cleanup(job(), context(kube)))
    assert kube.deletes == [("ns", name, "rj-9")] and kube.stored == {}


class TerminatingNamespaceKube(OwningKube):
    """Every RayJob call refused, as once the namespace controller deleted the chart's RoleBinding."""

    async def namespace_terminating(self, namespace):
        return True

    async def get_rayjob(self, namespace, name):
        raise AssertionError("a RayJob read in a namespace being deleted")

    async def delete_rayjob(self, namespace, name, uid):
        raise AssertionError("a RayJob delete in a namespace being deleted")


def test_cleanup_in_a_namespace_being_deleted_releases_the_job_without_rayjob_calls():
    """Issue 26 item 4: the namespace controller deletes the RayJob (and maybe the RoleBinding first)."""
    assert asyncio.run(reconcile.cleanup(job({"rayJobName": "ej-pep-1"}), context(TerminatingNamespaceKube())))


class RoleBindingGoneKube(StandInKube):
    """The namespace is being deleted and the RoleBinding that grants the operator its calls there is gone."""

    def __init__(self, terminating: bool):
        super().__init__()
        self.terminating = terminating

    async def read_secret(self, namespace, name):
        raise ApiException(status=403, reason="Forbidden")

    async def namespace_terminating(self, namespace):
        return self.terminating


def test_a_refusal_in_a_namespace_being_deleted_launches_nothing_and_is_no_error():
    """A CI run: the launch handler ran once the namespace's deletion had begun and its RoleBinding was gone;
    the Secret's read was refused (403), and the operator logged it as an error."""
    async def accept(body):
        raise AssertionError("accepted in a namespace being deleted")

    kube = RoleBindingGoneKube(terminating=True)
    with pytest.raises(reconcile.NamespaceTerminating, match="namespace ns is being deleted"):
        asyncio.run(reconcile.launch(job(), [], context(kube), accept))
    assert kube.created == []

    # the same refusal in a namespace that stays is a real one (RBAC): kopf retries the handler
    with pytest.raises(ApiException):
        asyncio.run(reconcile.launch(job(), [], context(RoleBindingGoneKube(terminating=False)), accept))
