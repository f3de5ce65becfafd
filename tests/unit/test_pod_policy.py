"""The pod policy in the operator's review (for clusters without the admission policy): each forbidden setting refused
naming its field and the policy, the admin's switches opening them, its parameters from EMBEDJOB_POD_POLICY, and the
chart's copy of the rules and defaults kept equal to embedjob/pod_policy.py."""

from __future__ import annotations

import json

import pytest
import yaml

from controller import acceptance
from controller.settings import Settings, SettingsError
from embedjob import api, pod_policy
from embedjob.pod_policy import PodPolicy
from support.manifests import MINIMAL_SPEC, merged
from support.paths import CHART
from support.pod_settings import EVERY_POD_SETTING, head_container, worker_container, workers

SECRET = {"data": {"url": "cG9zdGdyZXNxbDovL3g="}}
ALLOWED_REPOSITORY = "registry.example/embedjob-worker"
POLICY = PodPolicy(allowed_image_prefixes=(ALLOWED_REPOSITORY,), allowed_service_accounts=("embedder",))
W, H = "spec.workers.template.spec", "spec.head.template.spec"
# (case, spec, the field the refusal names, the switch or list that opens it)
FORBIDDEN = [
    ("look-alike-image", {"workers": {"image": f"{ALLOWED_REPOSITORY}-evil:1.0"}}, "spec.workers.image",
     "allowedImagePrefixes"),
    ("foreign-registry", {"workers": {"image": "docker.io/attacker/miner"}}, "spec.workers.image",
     "allowedImagePrefixes"),
    ("prefix-then-path", {"workers": {"image": f"{ALLOWED_REPOSITORY}/../evil:1"}}, "spec.workers.image",
     "allowedImagePrefixes"),
    ("foreign-account", {"head": {"template": {"spec": {"serviceAccountName": "cluster-admin"}}}},
     f"{H}.serviceAccountName", "allowedServiceAccounts"),
    ("host-path-root", workers({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
     f"{W}.volumes[root].hostPath", "allowHostPath"),
    ("sys-admin", worker_container(securityContext={"capabilities": {"add": ["SYS_ADMIN"]}}),
     f"{W}.containers[ray-worker].securityContext.capabilities.add", "allowAddedCapabilities"),
    ("pod-run-as-root", {"head": {"template": {"spec": {"securityContext": {"runAsUser": 0}}}}},
     f"{H}.securityContext.runAsUser", "allowRunAsRoot"),
    ("container-run-as-root", worker_container(securityContext={"runAsUser": 0}),
     f"{W}.containers[ray-worker].securityContext.runAsUser", "allowRunAsRoot"),
    ("unconfined", head_container(securityContext={"seccompProfile": {"type": "Unconfined"}}),
     f"{H}.containers[ray-head].securityContext.seccompProfile.type", "allowUnconfinedSeccomp"),
    ("pod-unconfined", workers({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
     f"{W}.securityContext.seccompProfile.type", "allowUnconfinedSeccomp"),
    ("escalation", worker_container(securityContext={"allowPrivilegeEscalation": True}),
     f"{W}.containers[ray-worker].securityContext.allowPrivilegeEscalation", "allowPrivilegeEscalation"),
]


def review(spec: dict, policy: PodPolicy = POLICY) -> acceptance.Verdict:
    return acceptance.review(api.parse_spec(merged(MINIMAL_SPEC, spec)), SECRET, None, policy)


@pytest.mark.parametrize("case,spec,field,opened_by", FORBIDDEN, ids=[c for c, *_ in FORBIDDEN])
def test_each_forbidden_setting_is_refused_naming_the_field_and_the_policy(case, spec, field, opened_by):
    verdict = review(spec)
    assert not verdict.accepted and verdict.reason == "PodPolicyViolation"
    assert verdict.message.startswith(f"{field}: ") and "embedjob pod policy" in verdict.message, verdict.message
    assert f"podPolicy.{opened_by}" in verdict.message


@pytest.mark.parametrize("case,spec,field,opened_by", [f for f in FORBIDDEN if f[3] in pod_policy.SWITCHES],
                         ids=[c for c, _, _, o in FORBIDDEN if o in pod_policy.SWITCHES])
def test_the_admins_switch_opens_its_rule(case, spec, field, opened_by):
    opened = PodPolicy(**{**POLICY.__dict__, pod_policy._snake(opened_by): True})
    assert review(spec, opened).accepted


def test_the_restrictive_default_refuses_what_the_review_is_given_no_policy_for():
    parsed = api.parse_spec(merged(MINIMAL_SPEC, {"workers": {"image": f"{ALLOWED_REPOSITORY}:1"}}))
    assert acceptance.review(parsed, SECRET).reason == "PodPolicyViolation"


def test_privileged_cannot_be_written_at_all():
    with pytest.raises(api.SpecError, match=r"securityContext\.privileged"):
        api.parse_spec(merged(MINIMAL_SPEC, worker_container(securityContext={"privileged": True})))


@pytest.mark.parametrize("image,prefix", [
    (f"{ALLOWED_REPOSITORY}", ALLOWED_REPOSITORY), (f"{ALLOWED_REPOSITORY}:1.0", ALLOWED_REPOSITORY),
    (f"{ALLOWED_REPOSITORY}@sha256:{'a' * 64}", ALLOWED_REPOSITORY),
    ("registry.example/team/embed:2", "registry.example/team/"),
])
def test_allowed_images(image, prefix):
    assert pod_policy.image_allowed(image, prefix)


@pytest.mark.parametrize("image,prefix", [
    (f"{ALLOWED_REPOSITORY}-evil", ALLOWED_REPOSITORY), (f"{ALLOWED_REPOSITORY}evil:1", ALLOWED_REPOSITORY),
    (f"{ALLOWED_REPOSITORY}/sub:1", ALLOWED_REPOSITORY), (f"{ALLOWED_REPOSITORY}:1/../x", ALLOWED_REPOSITORY),
    ("registry.example/team-evil/x", "registry.example/team"), ("registry.example/team/", "registry.example/team/"),
    ("anything", ""),
])
def test_look_alike_images(image, prefix):
    assert not pod_policy.image_allowed(image, prefix)


def test_every_allowed_setting_passes():
    spec = merged(EVERY_POD_SETTING, {"workers": {"image": f"{ALLOWED_REPOSITORY}:2.0"}})
    assert review(spec).accepted


def test_the_operators_default_policy_allows_its_worker_image_and_pod_defaults_account():
    settings = Settings.from_env({"EMBEDJOB_WORKER_IMAGE": f"{ALLOWED_REPOSITORY}:1.0", "EMBEDJOB_POD_DEFAULTS":
                                  json.dumps({"workers": {"spec": {"serviceAccountName": "ray-runner"}}})})
    assert settings.pod_policy == PodPolicy(allowed_image_prefixes=(ALLOWED_REPOSITORY,),
                                            allowed_service_accounts=("ray-runner",))


def test_the_policy_from_the_chart_configmaps_data():
    data = {"allowedImagePrefixes": "a.example/w, b.example/", "allowedServiceAccounts": "embedder",
            **{switch: "false" for switch in pod_policy.SWITCHES}, "allowHostPath": "true"}
    settings = Settings.from_env({"EMBEDJOB_POD_POLICY": json.dumps(data)})
    assert settings.pod_policy == PodPolicy(("a.example/w", "b.example/"), ("embedder",), allow_host_path=True)


@pytest.mark.parametrize("text,named", [
    ('{"allowHostPath": "yes"}', "allowHostPath"), ('{"allowHostPath": true}', "allowHostPath"),
    ('{"allowPrivileged": "true"}', "allowPrivileged"), ('["allowHostPath"]', "expected an object"),
    ("{not json", "not JSON"),
])
def test_hostile_policy_parameters_are_refused_naming_the_key(text, named):
    with pytest.raises(SettingsError, match=named) as refused:
        Settings.from_env({"EMBEDJOB_POD_POLICY": text})
    assert "EMBEDJOB_POD_POLICY" in str(refused.value)


def test_the_charts_admission_rules_are_the_policys():
    document = json.loads((CHART / "files" / "pod-policy.json").read_text())
    assert document == {"validations": pod_policy.admission_validations()}, (
        "charts/embedjob-operator/files/pod-policy.json is stale: "
        "python -m embedjob.pod_policy > charts/embedjob-operator/files/pod-policy.json")


def test_the_charts_defaults_are_the_restrictive_policy():
    values = yaml.safe_load((CHART / "values.yaml").read_text())["podPolicy"]
    assert set(values) == {"admissionPolicy", *pod_policy.LISTS, *pod_policy.SWITCHES}
    assert PodPolicy.from_data({k: str(v).lower() for k, v in values.items() if k in pod_policy.SWITCHES},
                               "values.yaml") == PodPolicy()
    assert values["allowedImagePrefixes"] == [] and values["allowedServiceAccounts"] == []
