"""The pod policy: which images, ServiceAccounts and security settings a job's pod settings may ask for.

Creating an EmbeddingJob makes KubeRay create pods, so without a policy `create
embeddingjobs` would be `create pods` with any image, identity or privilege. Each rule
here is written once in Python (the operator's review, for clusters without the
admission policy) and once in CEL (the chart's ValidatingAdmissionPolicy, which refuses
the job at apply time); `python -m embedjob.pod_policy` writes the CEL into the chart's
files/pod-policy.json, and a unit test keeps that file current. The policy's parameters
are the data of a ConfigMap (string values, lists comma-separated): the admission
policy's params, and the operator's EMBEDJOB_POD_POLICY. docs/install.md explains them.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .api import EmbeddingJobSpec

# A tag and/or a digest after a repository (the image reference grammar of distribution/reference).
TAG_OR_DIGEST = r"^(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@[a-z0-9]+([+._-][a-z0-9]+)*:[0-9a-fA-F]{32,})?$"
# A repository path below a prefix ending in '/', then a tag and/or a digest.
PATH_TAG_OR_DIGEST = r"^[a-z0-9]+([._/-][a-z0-9]+)*" + TAG_OR_DIGEST[1:]
# A ServiceAccount that every namespace has: the pods' identity when none is named.
NAMESPACE_DEFAULT_ACCOUNT = "default"
# The switches of the policy: each opens one rule (the chart's podPolicy values of the same names).
SWITCHES = ("allowHostPath", "allowPrivilegeEscalation", "allowAddedCapabilities", "allowRunAsRoot",
            "allowUnconfinedSeccomp")
LISTS = ("allowedImagePrefixes", "allowedServiceAccounts")
GROUPS = ("head", "workers")
REFUSED = "refused by the embedjob pod policy (the platform admin opens it with the chart's value podPolicy.{})"


class PodPolicyError(ValueError):
    """Policy parameters the operator cannot use."""


@dataclass(frozen=True)
class PodPolicy:
    """The parameters; the defaults are the restrictive policy (no image but the operator's worker image)."""

    allowed_image_prefixes: tuple[str, ...] = ()
    allowed_service_accounts: tuple[str, ...] = ()
    allow_host_path: bool = False
    allow_privilege_escalation: bool = False
    allow_added_capabilities: bool = False
    allow_run_as_root: bool = False
    allow_unconfined_seccomp: bool = False

    def opens(self, switch: str) -> bool:
        return getattr(self, _snake(switch))

    @classmethod
    def from_data(cls, data: Any, source: str) -> "PodPolicy":
        """The policy from a ConfigMap's data (strings; lists comma-separated); PodPolicyError naming the key."""
        if not isinstance(data, dict):
            raise PodPolicyError(f"{source}: expected an object with the keys {', '.join(LISTS + SWITCHES)}")
        unknown = sorted(set(data) - set(LISTS + SWITCHES))
        if unknown:
            raise PodPolicyError(f"{source}: unknown key {', '.join(map(str, unknown))}")
        fields: dict[str, Any] = {}
        for key, value in data.items():
            if not isinstance(value, str):
                raise PodPolicyError(f"{source}: {key} must be a string (ConfigMap data), not {value!r}")
            if key in LISTS:
                fields[_snake(key)] = tuple(item.strip() for item in value.split(",") if item.strip())
            elif value not in ("true", "false"):
                raise PodPolicyError(f"{source}: {key} must be \"true\" or \"false\", not {value!r}")
            else:
                fields[_snake(key)] = value == "true"
        return cls(**fields)


def _snake(name: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), name)


def image_allowed(image: str, prefix: str) -> bool:
    """`prefix` is a repository (any tag or digest of it) or, ending in '/', a path (any repository under it);
    `registry.example/embedjob-worker` does not allow `registry.example/embedjob-worker-evil`."""
    if not prefix or not image.startswith(prefix):
        return False
    rest = image[len(prefix):]
    return bool(re.fullmatch(PATH_TAG_OR_DIGEST if prefix.endswith("/") else TAG_OR_DIGEST, rest))


def repository(image: str) -> str:
    """The repository of an image reference (without its tag and digest)."""
    name = image.split("@", 1)[0]
    return name[:name.rindex(":")] if ":" in name.rsplit("/", 1)[-1] else name


@dataclass(frozen=True)
class Rule:
    """One rule of the policy: `violations(spec, policy)` in Python, `cel(group)` for the admission policy."""

    opened_by: str  # the chart value (and ConfigMap key) that opens it
    violations: Callable[[EmbeddingJobSpec, PodPolicy], Iterator[str]]  # the messages of each violation
    cel: Callable[[str], tuple[str, str]]  # group -> (CEL that must hold, message naming the field)


def _pod(spec: EmbeddingJobSpec, group: str):
    template = getattr(spec, group).template if getattr(spec, group) else None
    return template.spec if template and template.spec else None


def _pods(spec: EmbeddingJobSpec) -> Iterator[tuple[str, Any]]:
    for group in GROUPS:
        pod = _pod(spec, group)
        if pod is not None:
            yield f"spec.{group}.template.spec", pod


def _security_contexts(spec: EmbeddingJobSpec) -> Iterator[tuple[str, Any]]:
    """(field, securityContext) of the pods and of their Ray containers."""
    for field, pod in _pods(spec):
        if pod.security_context:
            yield f"{field}.securityContext", pod.security_context
        for container in pod.containers or ():
            if container.security_context:
                yield f"{field}.containers[{container.name}].securityContext", container.security_context


def _cel_pod(group: str) -> str:
    return f"object.spec.?{group}.?template.?spec"


def _cel_contexts(group: str, test: str) -> str:
    """CEL: `test` (over `s`, a securityContext) holds for the pod's and each container's securityContext."""
    pod = _cel_pod(group)
    return (f"[{pod}.?securityContext.orValue({{}})].all(s, {test}) && "
            f"{pod}.?containers.orValue([]).all(c, [c.?securityContext.orValue({{}})].all(s, {test}))")


def _cel_list(key: str) -> str:
    """CEL: the items of a comma-separated list of the params, trimmed as `PodPolicy.from_data` trims them."""
    return f"params.data.?{key}.orValue('').split(',').map(item, item.trim())"


def _images(spec: EmbeddingJobSpec, policy: PodPolicy) -> Iterator[str]:
    image = spec.workers.image
    if image and not any(image_allowed(image, prefix) for prefix in policy.allowed_image_prefixes):
        allowed = ", ".join(policy.allowed_image_prefixes) or "none"
        yield f"spec.workers.image: {image!r} is not under an allowed image prefix ({allowed})"


def _images_cel(group: str) -> tuple[str, str]:
    rest = f"image.substring(size(p)).matches(p.endsWith('/') ? '{PATH_TAG_OR_DIGEST}' : '{TAG_OR_DIGEST}')"
    test = f"{_cel_list('allowedImagePrefixes')}.exists(p, p != '' && image.startsWith(p) && {rest})"
    return (f"!has(object.spec.workers) || !has(object.spec.workers.image) || "
            f"[object.spec.workers.image].all(image, {test})",
            "spec.workers.image: the image is not under an allowed image prefix")


def _accounts(spec: EmbeddingJobSpec, policy: PodPolicy) -> Iterator[str]:
    for field, pod in _pods(spec):
        name = pod.service_account_name
        if name and name != NAMESPACE_DEFAULT_ACCOUNT and name not in policy.allowed_service_accounts:
            allowed = ", ".join((NAMESPACE_DEFAULT_ACCOUNT, *policy.allowed_service_accounts))
            yield f"{field}.serviceAccountName: {name!r} is not an allowed ServiceAccount ({allowed})"


def _accounts_cel(group: str) -> tuple[str, str]:
    name = f"{_cel_pod(group)}.?serviceAccountName.orValue('{NAMESPACE_DEFAULT_ACCOUNT}')"
    return (f"{name} == '{NAMESPACE_DEFAULT_ACCOUNT}' || "
            f"{name} in {_cel_list('allowedServiceAccounts')}",
            f"spec.{group}.template.spec.serviceAccountName: the ServiceAccount is not an allowed one")


def _host_paths(spec: EmbeddingJobSpec, policy: PodPolicy) -> Iterator[str]:
    for field, pod in _pods(spec):
        for volume in pod.volumes or ():
            if volume.host_path is not None:
                yield f"{field}.volumes[{volume.name}].hostPath: hostPath volumes ({volume.host_path.path}) are off"


def _security_rule(opened_by: str, setting: str, test: Callable[[Any], bool], cel_test: str, refusal: str,
                   pod_level: bool = True) -> Rule:
    """A rule over one securityContext `setting` (its wire path in the context) of the pods' (unless not
    `pod_level`: the pod's context has no such field) and their Ray containers' contexts."""
    where = "[.containers[]]" if pod_level else ".containers[]"

    def violations(spec: EmbeddingJobSpec, policy: PodPolicy) -> Iterator[str]:
        for field, context in _security_contexts(spec):
            if test(context):
                yield f"{field}.{setting}: {refusal}"

    return Rule(opened_by, violations, lambda group: (
        _cel_contexts(group, cel_test), f"spec.{group}.template.spec{where}.securityContext.{setting}: {refusal}"))


RULES = (
    Rule("allowedImagePrefixes", _images, _images_cel),
    Rule("allowedServiceAccounts", _accounts, _accounts_cel),
    Rule("allowHostPath", _host_paths,
         lambda g: (f"!{_cel_pod(g)}.?volumes.orValue([]).exists(v, has(v.hostPath))",
                    f"spec.{g}.template.spec.volumes[].hostPath: hostPath volumes are off")),
    _security_rule("allowPrivilegeEscalation", "allowPrivilegeEscalation",
                   lambda c: getattr(c, "allow_privilege_escalation", None) is True,
                   "s.?allowPrivilegeEscalation.orValue(false) != true", "true is off", pod_level=False),
    _security_rule("allowAddedCapabilities", "capabilities.add",
                   lambda c: bool(getattr(c, "capabilities", None) and c.capabilities.add),
                   "size(s.?capabilities.?add.orValue([])) == 0", "added capabilities are off", pod_level=False),
    _security_rule("allowRunAsRoot", "runAsUser", lambda c: c.run_as_user == 0, "s.?runAsUser.orValue(1) != 0",
                   "0 (root) is off"),
    _security_rule("allowUnconfinedSeccomp", "seccompProfile.type",
                   lambda c: bool(c.seccomp_profile and c.seccomp_profile.type == "Unconfined"),
                   "s.?seccompProfile.?type.orValue('') != 'Unconfined'", "Unconfined is off"),
)


def violations(spec: EmbeddingJobSpec, policy: PodPolicy) -> list[str]:
    """Each setting of the spec the policy refuses, naming its field and the chart value that would open it."""
    found = []
    for rule in RULES:
        if rule.opened_by in SWITCHES and policy.opens(rule.opened_by):
            continue
        found += [f"{message}: {REFUSED.format(rule.opened_by)}"
                  for message in rule.violations(spec, policy)]
    return found


def admission_validations() -> list[dict[str, str]]:
    """The ValidatingAdmissionPolicy's validations: each rule for each group (the image once), switchable."""
    validations = []
    for rule in RULES:
        for group in GROUPS if rule.opened_by != "allowedImagePrefixes" else GROUPS[-1:]:
            expression, message = rule.cel(group)
            if rule.opened_by in SWITCHES:
                expression = f"params.data.?{rule.opened_by}.orValue('false') == 'true' || ({expression})"
            validations.append({"expression": expression, "reason": "Forbidden",
                                "message": f"{message}: {REFUSED.format(rule.opened_by)}"})
    return validations


if __name__ == "__main__":
    json.dump({"validations": admission_validations()}, sys.stdout, indent=2)
    sys.stdout.write("\n")
