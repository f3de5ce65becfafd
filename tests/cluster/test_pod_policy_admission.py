"""The pod policy on the real API server: the chart's rendered ValidatingAdmissionPolicy, binding and params refuse
each forbidden pod setting at `kubectl apply`, naming the field and the policy, store an allowed job, and leave Pod
Security Admission (a namespace labelled `pod-security.kubernetes.io/enforce: restricted`) refusing the pod the
operator's RayJob would have KubeRay create for a job the policy was opened for."""

from __future__ import annotations

import json
import time

import pytest

from embedjob import api
from controller import acceptance
from controller.rayjob import build_rayjob
from controller.settings import Settings
from support.chart import by_kind, render_chart
from support.kubectl import condition, create_database_secret, get_json, rayjobs, wait_for_condition
from support.manifests import MINIMAL_SPEC, ej_manifest, merged
from support.pod_settings import head_container, worker_container, workers
from support.polling import wait_until

pytestmark = pytest.mark.k8s

WORKER_REPOSITORY = "registry.example/embedjob-worker"
RELEASE_NAMESPACE = "pod-policy-system"
VALUES = {"worker": {"image": {"repository": WORKER_REPOSITORY, "tag": "1.0"}},
          "podPolicy": {"allowedServiceAccounts": ["embedder"]}}
W = "spec.workers.template.spec"
H = "spec.head.template.spec"
# (case, spec, the field the refusal names)
FORBIDDEN = [
    ("look-alike-image", {"workers": {"image": f"{WORKER_REPOSITORY}-evil:1.0"}}, "spec.workers.image"),
    ("foreign-account", {"head": {"template": {"spec": {"serviceAccountName": "cluster-admin"}}}},
     f"{H}.serviceAccountName"),
    ("host-path-root", workers({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}), f"{W}.volumes[].hostPath"),
    ("sys-admin", worker_container(securityContext={"capabilities": {"add": ["SYS_ADMIN"]}}),
     f"{W}.containers[].securityContext.capabilities.add"),
    ("run-as-root", {"head": {"template": {"spec": {"securityContext": {"runAsUser": 0}}}}},
     f"{H}[.containers[]].securityContext.runAsUser"),
    ("unconfined", head_container(securityContext={"seccompProfile": {"type": "Unconfined"}}),
     f"{H}[.containers[]].securityContext.seccompProfile.type"),
    ("escalation", worker_container(securityContext={"allowPrivilegeEscalation": True}),
     f"{W}.containers[].securityContext.allowPrivilegeEscalation"),
]
ALLOWED = merged(
    merged({"workers": {"image": f"{WORKER_REPOSITORY}:2.0"}},
           worker_container(securityContext={"runAsUser": 1000, "allowPrivilegeEscalation": False,
                                             "capabilities": {"drop": ["ALL"]},
                                             "seccompProfile": {"type": "RuntimeDefault"}})),
    {"head": {"template": {"spec": {"serviceAccountName": "embedder"}}}})


def apply(kube, namespace: str, name: str, spec: dict):
    return kube.kubectl("apply", "-n", namespace, "-f", "-", input=ej_manifest(name, **spec), check=False)


@pytest.fixture(scope="module")
def pod_policy(kube):
    """The chart's pod-policy objects (as `helm template` renders them) on the API server; the policy's name."""
    objects = render_chart(VALUES, namespace=RELEASE_NAMESPACE)
    policy_objects = [o for o in objects if o["kind"] in
                      ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")]
    (params,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-pod-policy")]
    kube.kubectl("create", "namespace", RELEASE_NAMESPACE)
    for obj in [params, *policy_objects]:
        kube.kubectl("apply", "-f", "-", input=json.dumps(obj))
    name = params["metadata"]["name"]
    try:
        yield name, params
    finally:
        for obj in policy_objects:
            kube.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found", check=False)
        kube.kubectl("delete", "namespace", RELEASE_NAMESPACE, "--wait=false", check=False)


def refused_once_enforced(kube, namespace: str, spec: dict, what: str) -> str:
    """The message refusing a job of `spec` once the API server enforces `what` (policies and their params reach
    admission through informers); a job stored before that is deleted, so each try is a create."""
    def refused():
        res = apply(kube, namespace, "probe", spec)
        if res.returncode == 0:
            kube.kubectl("delete", "ej", "probe", "-n", namespace, "--wait=false", check=False)
            return None
        return res.stderr

    return wait_until(what, refused, timeout=60)


def stored_once_enforced(kube, namespace: str, name: str, spec: dict, what: str) -> dict:
    """The job `name` of `spec`, stored once the API server enforces params that admit it."""
    def stored():
        return get_json(kube, "ej", name, "-n", namespace) if apply(kube, namespace, name, spec).returncode == 0 \
            else None

    return wait_until(what, stored, timeout=60)


def refused_by_policy(kube, namespace: str, policy: str) -> str:
    return refused_once_enforced(kube, namespace, workers({"volumes": [{"name": "probe", "hostPath": {"path": "/"}}]}),
                                 f"ValidatingAdmissionPolicy {policy} enforced")


def test_this_api_server_serves_validating_admission_policy_v1(kube, pod_policy):
    name, _ = pod_policy
    version = json.loads(kube.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert (int(version["major"]), int(version["minor"].rstrip("+"))) >= (1, 30), version  # VAP v1 is GA in 1.30
    assert get_json(kube, "validatingadmissionpolicy", name)["apiVersion"] == "admissionregistration.k8s.io/v1"


@pytest.mark.parametrize("case,spec,field", FORBIDDEN, ids=[case for case, _, _ in FORBIDDEN])
def test_each_forbidden_setting_is_refused_at_apply_naming_the_field_and_the_policy(kube, namespace, pod_policy,
                                                                                   case, spec, field):
    name, _ = pod_policy
    refused_by_policy(kube, namespace, name)
    res = apply(kube, namespace, case, spec)
    assert res.returncode != 0, f"{case} was stored: {res.stdout}"
    assert f"ValidatingAdmissionPolicy '{name}'" in res.stderr and field in res.stderr, res.stderr
    assert "embedjob pod policy" in res.stderr, res.stderr
    assert kube.kubectl("get", "ej", case, "-n", namespace, check=False).returncode != 0


def test_privileged_is_not_a_field_of_the_spec(kube, namespace, pod_policy):
    res = apply(kube, namespace, "privileged", worker_container(securityContext={"privileged": True}))
    assert res.returncode != 0 and 'unknown field "spec.workers.template.spec.containers[0].securityContext.' \
        'privileged"' in res.stderr, res.stderr


def test_an_allowed_job_is_stored_and_a_spec_edit_is_checked_again(kube, namespace, pod_policy):
    name, _ = pod_policy
    refused_by_policy(kube, namespace, name)
    res = apply(kube, namespace, "allowed", ALLOWED)
    assert res.returncode == 0, res.stderr
    assert get_json(kube, "ej", "allowed", "-n", namespace)["spec"]["workers"]["image"] == f"{WORKER_REPOSITORY}:2.0"
    res = apply(kube, namespace, "allowed", merged(ALLOWED, {"workers": {"image": "docker.io/attacker/miner:1"}}))
    assert res.returncode != 0 and "spec.workers.image" in res.stderr, res.stderr


def test_the_operators_review_refuses_what_its_own_policy_does_not_allow(kube, namespace, pod_policy,
                                                                         start_operator):
    """Where the admission policy lets a job through (on a cluster without it, every job), the operator's own
    policy, here the restrictive default for its worker image, refuses it naming the field and creates no RayJob."""
    create_database_secret(kube, namespace, "postgresql://writer:not-a-real-password@db.example:5432/embed")
    start_operator(kube, namespace)  # EMBEDJOB_WORKER_IMAGE embedjob-worker:test, no EMBEDJOB_POD_POLICY
    image = f"{WORKER_REPOSITORY}:2.0"  # under the chart's allowed prefix, not under the operator's worker image
    assert apply(kube, namespace, "other-image", {"workers": {"image": image}}).returncode == 0
    refusal = condition(wait_for_condition(kube, namespace, "other-image", "Accepted", "False"), "Accepted")
    assert refusal["reason"] == "PodPolicyViolation", refusal
    assert refusal["message"].startswith(f"spec.workers.image: {image!r} is not under an allowed image prefix "
                                         "(embedjob-worker)") and "podPolicy.allowedImagePrefixes" in refusal["message"]
    assert rayjobs(kube, namespace) == []


def set_params(kube, name: str, data: dict[str, str]) -> None:
    kube.kubectl("patch", "configmap", name, "-n", RELEASE_NAMESPACE, "--type=merge", "-p", json.dumps({"data": data}))


def test_a_job_stored_before_the_policy_was_tightened_can_still_be_labelled_finalized_and_deleted(
        kube, namespace, pod_policy):
    name, params = pod_policy
    refused_by_policy(kube, namespace, name)
    assert apply(kube, namespace, "earlier", ALLOWED).returncode == 0
    set_params(kube, name, {**params["data"], "allowedServiceAccounts": ""})
    try:
        refused_once_enforced(kube, namespace, ALLOWED, "the tightened policy enforced")
        # what the operator writes on a job (labels, its finalizer) leaves the spec alone: never refused
        kube.kubectl("label", "ej", "earlier", "-n", namespace, "team=search")
        for finalizers in (["embedjob.dev/cleanup"], None):
            kube.kubectl("patch", "ej", "earlier", "-n", namespace, "--type=merge", "-p",
                         json.dumps({"metadata": {"finalizers": finalizers}}))
        kube.kubectl("delete", "ej", "earlier", "-n", namespace, "--timeout=30s")
        res = apply(kube, namespace, "earlier", ALLOWED)
        assert res.returncode != 0 and f"{H}.serviceAccountName" in res.stderr, res.stderr
    finally:
        kube.kubectl("apply", "-f", "-", input=json.dumps(params))


def test_a_path_prefix_allows_the_repositories_under_it_and_no_look_alike(kube, namespace, pod_policy):
    name, params = pod_policy
    # the admin's list as a person might edit the ConfigMap: a space after the comma
    set_params(kube, name, {**params["data"], "allowedImagePrefixes": f"registry.example/team/, {WORKER_REPOSITORY}"})
    try:
        stored_once_enforced(kube, namespace, "team", {"workers": {"image": "registry.example/team/embed:1"}},
                             "the new prefixes")
        stored = apply(kube, namespace, "worker", {"workers": {"image": f"{WORKER_REPOSITORY}:3"}})
        assert stored.returncode == 0, stored.stderr
        for look_alike in ("registry.example/team-evil/embed:1", "registry.example/team/", "registry.example/team"):
            res = apply(kube, namespace, "look-alike", {"workers": {"image": look_alike}})
            assert res.returncode != 0 and "spec.workers.image" in res.stderr, (look_alike, res.stderr)
    finally:
        kube.kubectl("apply", "-f", "-", input=json.dumps(params))


def test_restricted_pod_security_refuses_the_pods_of_a_job_the_policy_was_opened_for(kube, namespace, pod_policy):
    name, params = pod_policy
    opened = {**params["data"], "allowAddedCapabilities": "true"}
    set_params(kube, name, opened)
    try:
        opened_pod_refused_by_pod_security(kube, namespace, opened)
    finally:
        kube.kubectl("apply", "-f", "-", input=json.dumps(params))


def opened_pod_refused_by_pod_security(kube, namespace: str, opened: dict[str, str]) -> None:
    kube.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    spec = worker_container(securityContext={"capabilities": {"add": ["SYS_ADMIN"]}})
    job = stored_once_enforced(kube, namespace, "opened", spec, "the job the opened policy admits")
    settings = Settings.from_env({"EMBEDJOB_WORKER_IMAGE": f"{WORKER_REPOSITORY}:1.0",
                                  "EMBEDJOB_POD_POLICY": json.dumps(opened)})
    parsed = api.parse_spec(merged(MINIMAL_SPEC, spec))
    assert acceptance.review(parsed, {"data": {"url": "x"}}, None, settings.pod_policy).accepted
    template = build_rayjob(job, parsed, settings)["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ray-worker", "namespace": namespace},
           "spec": template["spec"]}
    res = kube.kubectl("create", "-f", "-", input=json.dumps(pod), check=False)
    assert res.returncode != 0, res.stdout
    assert 'violates PodSecurity "restricted:latest"' in res.stderr and "SYS_ADMIN" in res.stderr, res.stderr


def test_a_policy_left_without_its_params_refuses_nothing(kube, namespace, pod_policy):
    """The release's namespace deleted without `helm uninstall`: the cluster-scoped policy and binding stay and
    their ConfigMap is gone. They must not refuse every job of the cluster (nor the finalizer removals that
    deleting a namespace needs): each try over 10 s, after the policy reached admission, is stored."""
    left = [o for o in render_chart(VALUES, namespace="pod-policy-gone")
            if o["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")]
    for obj in left:
        kube.kubectl("apply", "-f", "-", input=json.dumps(obj))
    try:
        time.sleep(5)  # policies reach admission through informers
        for attempt in range(5):
            res = apply(kube, namespace, f"left-{attempt}", ALLOWED)
            assert res.returncode == 0, res.stderr
            time.sleep(2)
    finally:
        for obj in left:
            kube.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found", check=False)
