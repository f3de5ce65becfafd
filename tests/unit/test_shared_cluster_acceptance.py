"""A job on an existing RayCluster (spec.clusterSelector) is accepted only when the container its
driver runs in takes EMBEDJOB_DATABASE_URL from the job's own Secret and key; the URL never
travels in the RayJob or Ray job metadata. Every refusal names the cluster, what was expected
and what was found, never a URL."""

import asyncio

import pytest

from controller import acceptance, reconcile
from controller.metrics import JobStates
from controller.settings import Settings
from embedjob import api
from embedjob.contract import DATABASE_URL_ENV, SOURCE_DATABASE_URL_ENV
from support.manifests import MINIMAL_SPEC, merged

SECRET = {"data": {"url": "cG9zdGdyZXNxbDovL3NlY3JldEBkYi9l"}}
FROM_JOB_SECRET = {"name": DATABASE_URL_ENV, "valueFrom": {"secretKeyRef": {"name": "embedjob-db", "key": "url"}}}


def spec(**selector: str) -> api.EmbeddingJobSpec:
    return api.parse_spec(merged(MINIMAL_SPEC, {"clusterSelector": {"ray.io/cluster": "shared", **selector}}))


def raycluster(head_env=(FROM_JOB_SECRET,), worker_env=(), head_sidecar_env=None, labels=None, head_env_from=None):
    head = {"name": "ray-head", "image": "worker", "env": list(head_env)}
    if head_env_from:
        head["envFrom"] = head_env_from
    containers = [head]
    if head_sidecar_env is not None:
        containers.append({"name": "sidecar", "image": "proxy", "env": list(head_sidecar_env)})
    return {
        "metadata": {"name": "shared", "namespace": "team", "labels": labels or {}},
        "spec": {"headGroupSpec": {"template": {"spec": {"containers": containers}}},
                 "workerGroupSpecs": [{"groupName": "cpu", "template": {"spec": {"containers": [
                     {"name": "ray-worker", "image": "worker", "env": list(worker_env)}]}}}]},
    }


def secret_ref(name: str, key: str) -> dict:
    return {"name": DATABASE_URL_ENV, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}


def test_the_head_taking_the_url_from_the_jobs_secret_is_accepted():
    assert acceptance.review(spec(), SECRET, raycluster()).accepted
    # the shape the real-path test uses: head and workers both from the job's Secret
    assert acceptance.review(spec(), SECRET, raycluster(worker_env=[FROM_JOB_SECRET])).accepted


def test_a_job_with_its_own_cluster_needs_no_raycluster():
    assert acceptance.review(api.parse_spec(MINIMAL_SPEC), SECRET, None).accepted


@pytest.mark.parametrize("cluster, found", [
    (raycluster(head_env=[]), f"it does not set {DATABASE_URL_ENV}"),
    (raycluster(head_env=[{"name": DATABASE_URL_ENV, "value": "postgresql://u:hunter2@db/e"}]), "a literal value"),
    (raycluster(head_env=[secret_ref("other-team-db", "url")]), "Secret 'other-team-db' key 'url'"),
    (raycluster(head_env=[secret_ref("embedjob-db", "admin-url")]), "Secret 'embedjob-db' key 'admin-url'"),
    (raycluster(head_env=[{"name": DATABASE_URL_ENV, "valueFrom": {"configMapKeyRef": {"name": "c", "key": "u"}}}]),
     "configMapKeyRef, not a Secret"),
    (raycluster(head_env=[FROM_JOB_SECRET, secret_ref("other-team-db", "url")]),  # the last one wins
     "Secret 'other-team-db' key 'url'"),
    (raycluster(head_env=[], head_sidecar_env=[FROM_JOB_SECRET]),
     "container 'sidecar' sets it, but Ray runs in the first container"),
])
def test_the_head_must_take_the_url_from_exactly_the_jobs_secret_and_key(cluster, found):
    verdict = acceptance.review(spec(), SECRET, cluster)
    assert (verdict.accepted, verdict.reason) == (False, "SharedClusterDatabaseMismatch")
    assert "RayCluster 'shared'" in verdict.message and "'ray-head'" in verdict.message
    assert "Secret 'embedjob-db' key 'url'" in verdict.message and found in verdict.message
    assert "hunter2" not in verdict.message and "postgresql://" not in verdict.message


@pytest.mark.parametrize("head_env, head_env_from", [
    ([FROM_JOB_SECRET, {"name": "RAY_JOB_ALLOW_DRIVER_ON_WORKER_NODES", "value": "1"}], None),
    ([FROM_JOB_SECRET, {"name": "RAY_JOB_ALLOW_DRIVER_ON_WORKER_NODES",
                        "valueFrom": {"configMapKeyRef": {"name": "ray", "key": "drivers"}}}], None),
    ([FROM_JOB_SECRET], [{"configMapRef": {"name": "ray-settings"}}]),  # may hold the switch
])
def test_when_ray_may_place_the_driver_on_a_worker_the_workers_need_the_secret_too(head_env, head_env_from):
    cluster = raycluster(head_env=head_env, head_env_from=head_env_from)
    verdict = acceptance.review(spec(), SECRET, cluster)
    assert verdict.reason == "SharedClusterDatabaseMismatch" and "worker group 'cpu'" in verdict.message
    assert "'ray-worker'" in verdict.message
    fixed = raycluster(head_env=head_env, head_env_from=head_env_from, worker_env=[FROM_JOB_SECRET])
    assert acceptance.review(spec(), SECRET, fixed).accepted


def test_the_switch_set_to_0_keeps_the_driver_on_the_head():
    head_env = [FROM_JOB_SECRET, {"name": "RAY_JOB_ALLOW_DRIVER_ON_WORKER_NODES", "value": "0"}]
    assert acceptance.review(spec(), SECRET, raycluster(head_env=head_env,
                                                        head_env_from=[{"configMapRef": {"name": "x"}}])).accepted


def test_a_missing_cluster_is_refused():
    verdict = acceptance.review(spec(), SECRET, None)
    assert (verdict.accepted, verdict.reason) == (False, "SharedClusterNotFound")
    assert "RayCluster 'shared'" in verdict.message and "job's namespace" in verdict.message


def test_a_cluster_without_pods_templates_is_refused_not_a_traceback():
    verdict = acceptance.review(spec(), SECRET, {"metadata": {"name": "shared"}, "spec": {}})
    assert verdict.reason == "SharedClusterDatabaseMismatch" and "'(none)'" in verdict.message


def test_extra_selector_keys_must_be_labels_of_the_selected_cluster():
    """KubeRay picks the cluster by ray.io/cluster alone: a key it ignores must not promise more."""
    verdict = acceptance.review(spec(tier="gpu"), SECRET, raycluster(labels={"tier": "cpu"}))
    assert (verdict.reason, "tier=gpu" in verdict.message) == ("SharedClusterSelectorMismatch", True)
    assert acceptance.review(spec(tier="gpu"), SECRET, raycluster(labels={"tier": "gpu"})).accepted


class Kube:
    def __init__(self, cluster):
        self.cluster, self.read, self.created = cluster, [], []

    async def read_secret(self, namespace, name):
        return SECRET

    async def get_raycluster(self, namespace, name):
        self.read.append((namespace, name))
        return self.cluster

    async def create_or_get_rayjob(self, manifest):
        self.created.append(manifest)
        return {**manifest, "metadata": {**manifest["metadata"], "uid": "rj-1"}}

    async def set_rayjob_suspend(self, namespace, name, uid, suspend):
        pass


def launch(kube) -> acceptance.Verdict:
    job = {"metadata": {"name": "pep", "namespace": "team", "uid": "u-1", "generation": 1, "resourceVersion": "5"},
           "spec": merged(MINIMAL_SPEC, {"clusterSelector": {"ray.io/cluster": "shared"}}), "status": {}}
    ctx = reconcile.Context(settings=Settings.from_env({}), kube=kube, runs=None, job_states=JobStates())

    async def accept(body):
        return True

    return asyncio.run(reconcile.launch(job, [], ctx, accept))


def test_launch_reads_the_selected_cluster_in_the_jobs_namespace_and_creates_no_rayjob_when_refused():
    refused = Kube(raycluster(head_env=[]))
    assert launch(refused).reason == "SharedClusterDatabaseMismatch"
    assert refused.read == [("team", "shared")] and refused.created == []
    accepted = Kube(raycluster())
    assert launch(accepted).accepted and len(accepted.created) == 1


def table_spec() -> api.EmbeddingJobSpec:
    """A shared-cluster job embedding a table of its own database (spec.source.databaseSecretRef)."""
    return api.parse_spec(merged(MINIMAL_SPEC, {
        "clusterSelector": {"ray.io/cluster": "shared"},
        "source": {"uri": None, "table": {"name": "docs", "idColumn": "id", "textColumn": "body"},
                   "databaseSecretRef": {"name": "cms-db", "key": "dsn"}}}))


def test_a_table_source_of_its_own_database_needs_the_cluster_to_hand_that_url_to_the_driver():
    """Issue 26 item 3: the RayJob of a shared-cluster job carries no pod templates, so without this the
    driver fell back to the sink's database and embedded (and with sync.deleteMissing deleted by) a
    same-named table there."""
    verdict = acceptance.review(table_spec(), SECRET, raycluster())
    assert not verdict.accepted and verdict.reason == "SharedClusterDatabaseMismatch"
    assert f"must set {SOURCE_DATABASE_URL_ENV} from Secret 'cms-db' key 'dsn'" in verdict.message
    assert "spec.source.databaseSecretRef" in verdict.message
    assert f"it does not set {SOURCE_DATABASE_URL_ENV}" in verdict.message

    from_source_secret = {"name": SOURCE_DATABASE_URL_ENV, "valueFrom": {"secretKeyRef": {"name": "cms-db",
                                                                                          "key": "dsn"}}}
    assert acceptance.review(table_spec(), SECRET, raycluster(head_env=[FROM_JOB_SECRET, from_source_secret])).accepted
